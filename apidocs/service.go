package apidocs

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/x402"
)

// Service is what the documents describe: who the service is, where it is
// reached, and the payment-gated routes as they are configured right now.
type Service struct {
	// Name is the service's name in titles ("Agent Output Verifier").
	Name string
	// BaseURL is the public origin, scheme://host[:port] without a trailing
	// slash; every absolute URL in the documents starts with it.
	BaseURL string
	// MCPURL is the Streamable HTTP MCP endpoint. Default BaseURL + "/mcp".
	MCPURL string
	// Version is the document's info.version. Default "1".
	Version string
	// ScoreMethod is markdown describing how the trust score is computed.
	// Default: the method of package score with its default parameters.
	ScoreMethod string
	// Routes are the live payment-gated routes. A contract route (SPEC §2)
	// missing here is documented as not priced in this configuration; a
	// route here that the contract does not know is documented generically.
	Routes []Route
}

// Route is one live payment-gated route: how it is named, what it costs and
// which free allowance applies.
type Route struct {
	// Method and Path name the route; Path uses OpenAPI templates
	// ("/score/{agent_id}"). ParseRoute turns "GET /score/{agent_id}" or
	// "GET /score/:agent_id" into them.
	Method, Path string
	// Tool is the MCP tool the route prices ("" for the whole route): the
	// tools of one MCP endpoint are a Route each, with the same Method and
	// Path.
	Tool string
	// Description and MimeType are the operator's, as PAYMENT-REQUIRED
	// carries them.
	Description, MimeType string
	// Accepts are the server's own payment requirements, one per way to pay.
	Accepts []x402.PaymentRequirements
	// Free is the route's daily free allowance, nil when it has none.
	Free *Free
	// Settle is "after" (the upstream answers first, errors are never
	// charged) or "before" (streaming upstreams).
	Settle string
}

// Free is a daily free allowance as configured.
type Free struct {
	// Pool names the shared counter: routes naming the same pool share one
	// allowance per client.
	Pool string
	// PerDay is the number of free calls per client per UTC day.
	PerDay int
	// Key identifies the client: "ip" or "wallet".
	Key string
	// MaxBody is the largest request body served free, in bytes.
	MaxBody int64
	// Store identifies the store the counts are kept in: routes share an
	// allowance only when they name one pool in one store. Never
	// published; "" is one store.
	Store string
}

var colonParam = regexp.MustCompile(`/:([A-Za-z_][A-Za-z0-9_]*)`)

// ParseRoute splits a route name "METHOD /path" (the gateway's `route`
// option) into an upper-case method and an OpenAPI path template; ":name"
// segments become "{name}". ok is false when s is not of that form.
func ParseRoute(s string) (method, path string, ok bool) {
	method, path, ok = strings.Cut(strings.TrimSpace(s), " ")
	path = strings.TrimSpace(path)
	if !ok || method == "" || !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \t") {
		return "", "", false
	}
	for _, c := range method {
		if (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') {
			return "", "", false
		}
	}
	return strings.ToUpper(method), colonParam.ReplaceAllString(path, "/{$1}"), true
}

// key is the "METHOD /path" name a route is looked up by.
func (r Route) key() string { return r.Method + " " + r.Path }

// route returns the live route named method+path.
func (s *Service) route(method, path string) (Route, bool) {
	for _, r := range s.Routes {
		if r.Method == method && r.Path == path {
			return r, true
		}
	}
	return Route{}, false
}

// endpoint returns the live route that prices the MCP endpoint
// method+path as a whole (a gate without a Tool): it charges every
// message, each priced tool on top.
func (s *Service) endpoint(method, path string) (Route, bool) {
	for _, r := range s.Routes {
		if r.Tool == "" && r.Method == method && r.Path == path {
			return r, true
		}
	}
	return Route{}, false
}

// tools returns the live routes that price a tool of the MCP endpoint
// method+path, by tool name: each tool's price and free allowance are its
// own gate's, whatever a REST route of the same purpose costs.
func (s *Service) tools(method, path string) []Route {
	var out []Route
	for _, r := range s.Routes {
		if r.Tool != "" && r.Method == method && r.Path == path {
			out = append(out, r)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Tool < out[j].Tool })
	return out
}

func (s *Service) mcpURL() string {
	if s.MCPURL != "" {
		return s.MCPURL
	}
	return s.BaseURL + "/mcp"
}

func (s *Service) name() string {
	if s.Name != "" {
		return s.Name
	}
	return "Agent Output Verifier"
}

// Price is one way to pay for a route, in the units people and machines
// read: dollars when the asset is the network's USDC, atomic units always.
type Price struct {
	// USD is the price in dollars without a sign ("0.02"); "" when the asset
	// is not a known dollar stablecoin.
	USD string `json:"usd,omitempty"`
	// Display is for people: "$0.02 USDC" or "1500 atomic units of <asset>".
	Display string `json:"display"`
	// Amount is the exact price in the asset's atomic units ("20000").
	Amount   string `json:"amount"`
	Decimals int    `json:"decimals,omitempty"`
	Asset    string `json:"asset"`
	// AssetName is the token's EIP-712 name when known ("USD Coin").
	AssetName         string `json:"assetName,omitempty"`
	Network           string `json:"network"`
	Scheme            string `json:"scheme"`
	PayTo             string `json:"payTo"`
	MaxTimeoutSeconds int    `json:"maxTimeoutSeconds"`
}

// PriceOf describes one payment requirement.
func PriceOf(p x402.PaymentRequirements) Price {
	out := Price{
		Amount: p.Amount, Asset: p.Asset, Network: p.Network, Scheme: p.Scheme,
		PayTo: p.PayTo, MaxTimeoutSeconds: p.MaxTimeoutSeconds,
		Display: p.Amount + " atomic units of " + p.Asset + " on " + p.Network,
	}
	if a, ok := x402.LookupAsset(p.Network, p.Asset); ok {
		out.Decimals = a.Decimals
		out.AssetName = a.Name
		out.USD = x402.FormatAmount(p.Amount, a.Decimals)
		out.Display = "$" + dollars(out.USD) + " USDC"
	}
	return out
}

// dollars pads a decimal dollar amount to at least cents: "0.1" → "0.10",
// "2" → "2.00", "0.001" stays.
func dollars(s string) string {
	whole, frac, _ := strings.Cut(s, ".")
	for len(frac) < 2 {
		frac += "0"
	}
	return whole + "." + frac
}

func (s *Service) scoreMethod() string {
	if s.ScoreMethod != "" {
		return s.ScoreMethod
	}
	return defaultScoreMethod
}

// defaultScoreMethod describes package score's method with its default
// parameters, from the package's own constants.
var defaultScoreMethod = func() string {
	m := score.Default()
	p := m.Params()
	// The examples are computed, not written down, so they follow the method.
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	passes := func(n int) float64 {
		ev := make([]score.Evidence, n)
		for i := range ev {
			ev[i] = score.Evidence{At: at, Pass: true, Authenticated: true}
		}
		return m.Score(at, true, ev).Score
	}
	return fmt.Sprintf("Method `%s` version %s. "+
		"Of an agent_id with an owner (its address for an account id, else the first wallet that bound it with X-Wallet-Auth) only the verifications its owner authenticated are evidence, so nobody else can move its score; of an agent_id without an owner every verification is, as a bare label. "+
		"The newest %d pieces of evidence no older than %g days count, among at most the newest %d records of the id read for one score, evidence or not (a paid call whose settlement is pending or failed is never evidence; where such calls outnumber the window, `inputs.window.truncated` is true). "+
		"Each weighs 2^(−age / %g days), times %g when it is a bare label. "+
		"With P and F the weighted passes and fails and n = P + F, the score is the lower bound of the Wilson interval of p = P/n at z = %g: "+
		"(p + z²/2n − z·√(p(1−p)/n + z²/4n²)) / (1 + z²/n), 0 without evidence, rounded to 6 decimals. "+
		"Few data points leave the bound low: 3 authenticated passes out of 3 today score %.2f, 300 out of 300 score %.2f. "+
		"These are the default parameters: every score response states the ones in force (`method.params`) and the inputs it used (`inputs`), so anyone can recompute it.",
		score.MethodName, score.MethodVersion, p.MaxRecords, p.HorizonDays, m.ReadLimit(), p.HalfLifeDays, p.UnauthenticatedWeight, p.Z, passes(3), passes(300))
}()
