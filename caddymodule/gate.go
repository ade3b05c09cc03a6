package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/aovhq/aov/apidocs"
	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/growread"
	"github.com/aovhq/aov/internal/inflight"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

func init() {
	caddy.RegisterModule(Gate{})
}

// now is the gateway's clock; tests move it to cross UTC midnight.
var now = time.Now

// Headers the gateway sets for the upstream. Client copies are always
// removed first, so an upstream can trust them exactly as far as it trusts
// the gateway (verifierd additionally requires X-Aov-Gateway-Token).
const (
	HeaderUpstreamPayment = "X-Aov-Payment" // "paid" or "free"
	HeaderUpstreamPayer   = "X-Aov-Payer"   // the payer's address, paid calls only
	HeaderUpstreamNetwork = "X-Aov-Network" // CAIP-2 network of the payment
	// HeaderUpstreamAnswerBy is when the gate stops waiting for the
	// upstream's answer (Unix milliseconds, the upstream_timeout deadline);
	// for an answer streamed to a buyer already charged (runSettled), for
	// its beginning. verifierd records no verification it finishes later:
	// its answer would never be delivered.
	HeaderUpstreamAnswerBy = "X-Aov-Answer-By"
)

// The headers the gateway tells the upstream, all of them, in two lists by
// who sets them: the one place that says which headers are the gateway's,
// so that a header added to what it sets is never one a client can also
// send. The gateway must not rely on a site-wide strip of X-Aov-* in the
// Caddyfile: verifierd believes every one of them (with the gateway token
// the proxy adds), and a route may lack the strip.
var (
	// upstreamHeaders are the gate's (HeaderUpstreamSettlement is in
	// pending.go).
	upstreamHeaders = []string{
		HeaderUpstreamPayment, HeaderUpstreamPayer, HeaderUpstreamNetwork,
		HeaderUpstreamAnswerBy, HeaderUpstreamSettlement,
	}
	// walletHeaders are wallet_auth's (walletauth.go): the proven wallet
	// and the agent_id it binds.
	walletHeaders = []string{HeaderUpstreamWallet, HeaderUpstreamWalletAgent}
)

// clearUpstreamHeaders removes every client copy of the headers the gate
// tells the upstream.
func clearUpstreamHeaders(h http.Header) {
	for _, k := range upstreamHeaders {
		h.Del(k)
	}
}

// clearWalletHeaders removes every copy of the headers wallet_auth tells
// the upstream.
func clearWalletHeaders(h http.Header) {
	for _, k := range walletHeaders {
		h.Del(k)
	}
}

// clearClientHeaders removes from a request every client copy of the
// headers the gateway tells the upstream: the gate's, and wallet_auth's
// unless wallet_auth set them on this request (varWalletProven). Without
// it a gated route with no wallet_auth would pass a client's own
// X-Aov-Wallet and X-Aov-Wallet-Agent on, and verifierd would bind and
// authenticate any agent_id for any wallet the client names. The client's
// own credentials are another rule's (setAsideClientCredentials).
func clearClientHeaders(r *http.Request) {
	clearUpstreamHeaders(r.Header)
	if caddyhttp.GetVar(r.Context(), varWalletProven) == nil {
		clearWalletHeaders(r.Header)
	}
}

// Canonical forms of the protocol's request headers that the gate and
// wallet_auth read and remove on every request. The protocols spell them
// in capitals (PAYMENT-SIGNATURE, SIGN-IN-WITH-X), and http.Header's Get,
// Values and Del canonicalize such a key, allocating its canonical string,
// on every call; these are canonicalized once. The request's header map
// holds the canonical form of every name a client sent (net/http
// canonicalizes them when it reads the request).
var (
	keyPaymentSignature = http.CanonicalHeaderKey(x402.HeaderPaymentSignature)
	keySIWX             = http.CanonicalHeaderKey(walletauth.SIWXHeaderName)
	keyWalletAuth       = http.CanonicalHeaderKey(walletauth.HeaderName)
)

// firstValue is h.Get(key) for a key already canonical.
func firstValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// varGated marks a request some gate has already cleaned of client copies
// of the upstream headers.
const varGated = "aov.x402.gated"

// varRoutePriced marks a request a gate without mcp_tool has taken: a
// later such gate of the request passes it on (ServeHTTP).
const varRoutePriced = "aov.x402.route_priced"

// Free allowance headers on answers served from the allowance (SPEC §7).
const (
	HeaderFreeRemaining = "Free-Allowance-Remaining"
	HeaderFreeLimit     = "Free-Allowance-Limit"
	HeaderFreeResets    = "Free-Allowance-Resets"
)

// exposedHeaders lets browser clients read the payment and allowance headers
// (without it fetch() in a browser cannot see PAYMENT-REQUIRED at all).
var exposedHeaders = strings.Join([]string{
	x402.HeaderPaymentRequired, x402.HeaderPaymentResponse,
	HeaderFreeRemaining, HeaderFreeLimit, HeaderFreeResets,
	HeaderVerificationReceipt, HeaderVerificationStatus,
}, ", ")

// assetDecimalsRange is what a refused asset_decimals is told, by the
// Caddyfile parser and by Accept.requirements alike.
var assetDecimalsRange = fmt.Sprintf("is not a whole number from 1 to %d (price a token without decimals with amount)", x402.MaxDecimals)

// Defaults for the limits an operator can change.
const (
	defaultMaxBody         = 1 << 20
	defaultMaxBuffer       = 10 << 20
	defaultFreeMaxBody     = 64 << 10
	defaultMaxTimeout      = 60
	defaultSettleTimeout   = 30 * time.Second // a call to a facilitator that states no bounds of its own (facilitatorTimeouts); the gate's longest wait (maxFacilitatorWait)
	defaultUpstreamTimeout = 30 * time.Second
	// gateSchemaCache is how many compiled schemas the gate's precheck
	// keeps: it compiles only for requests it answers itself.
	gateSchemaCache = 8
)

// Gate is the x402 payment gate (Caddyfile directive `x402`). It answers an
// unpaid request with 402 and PAYMENT-REQUIRED, verifies a PAYMENT-SIGNATURE
// through a facilitator, runs the upstream into a bounded buffer, settles
// only when the upstream answered below 400, and replays the upstream
// response with PAYMENT-RESPONSE. Optionally it serves requests free from a
// daily allowance and checks verification requests wherever it would answer
// for payment itself, so a request that can never succeed is refused with
// 422 instead of being sold. It rate limits the refusals it answers per
// client.
//
// Each authorization is claimed in the store (by payer+nonce and by payload
// hash) before it is verified and stays claimed until after it expires, so a
// replayed or concurrently repeated PAYMENT-SIGNATURE is refused and never
// settled twice.
type Gate struct {
	// Accepts lists the ways a client may pay; at least one is required.
	Accepts []Accept `json:"accepts,omitempty"`

	// Description and MimeType describe the resource in PAYMENT-REQUIRED and
	// in /.well-known/x402.
	Description string `json:"description,omitempty"`
	MimeType    string `json:"mime_type,omitempty"`

	// Resource is the resource URL sent in PAYMENT-REQUIRED. Default: the
	// request's URL without its query (PublicBaseURL, or the request's
	// scheme://host, then the path): the route is what is priced, and a
	// query, unlike a path, is neither matched nor bounded by the route, so
	// it stays out of the header an unpaid client gets. Placeholders
	// allowed.
	Resource string `json:"resource,omitempty"`

	// PublicBaseURL is the site's public origin (https://verify.example.com)
	// for the default resource URL and the browser paywall's URL, instead
	// of the scheme and Host of each request: the Host is the client's
	// choice, and behind a TLS-terminating proxy the gate sees http. Env
	// placeholders are expanded when the config loads.
	PublicBaseURL string `json:"public_base_url,omitempty"`

	// Route names this route in /.well-known/x402 as "METHOD /path"
	// (e.g. "POST /verify/schema"). Without it the route is not listed.
	// With it, the gate answers any other method (but a CORS preflight,
	// answered 204 with Allow, and HEAD when the method is GET) with 405
	// and Allow, before any payment logic: a request the route cannot
	// serve is never offered for sale.
	Route string `json:"route,omitempty"`

	// FacilitatorRaw is the facilitator that verifies and settles payments
	// (a module in the x402.facilitators namespace: `evm`, `http`).
	FacilitatorRaw json.RawMessage `json:"facilitator,omitempty" caddy:"namespace=x402.facilitators inline_key=type"`

	// StoreRaw keeps the free allowance counters and the replay claims (a
	// module in the x402.stores namespace). Default: Badger under Caddy's
	// data directory, in the folder x402.
	StoreRaw json.RawMessage `json:"store,omitempty" caddy:"namespace=x402.stores inline_key=type"`

	// Settle is "after" (default): the upstream runs first into a buffer and
	// the payment is settled only if it answered below 400. "before" settles
	// first and then streams the upstream response, for streaming upstreams
	// (SSE): the client pays even if the upstream then fails or refuses the
	// request. With validate verify_request the gate checks the request
	// before it settles, evaluation included, with verifierd's default
	// budgets (an invalid one is 422, nothing charged); without it the
	// gate cannot tell, and an invalid request is charged for the
	// upstream's refusal.
	Settle string `json:"settle,omitempty"`

	// SettleOn is "pass" or "any". "pass" settles a payment only when
	// verify_response (later in the same route) found the output passing;
	// any other answer below 400 (a fail receipt, an unverified or
	// unchecked response) is released without charging and without
	// PAYMENT-RESPONSE, and the payment can be used again; but one with
	// a body or a Location (a redirect) that no verify_response checked
	// (unchecked, or none handled the request) is withheld
	// (uncheckedContent). "any" settles
	// every answer below 400. Default: "pass" when verify_response handled
	// the request, "any" otherwise. Needs settle after.
	SettleOn string `json:"settle_on,omitempty"`

	// MaxBuffer caps the buffered upstream response in "after" mode. A larger
	// response is an error (502) and nothing is settled. Default 10 MiB.
	MaxBuffer int64 `json:"max_buffer,omitempty"`

	// UpstreamTimeout bounds the whole upstream call of a charged request,
	// from sending it to the last byte of the answer (the transport's own
	// timeouts bound each step, not the total). Past it the call fails
	// (reverse_proxy answers 504, which handle_errors can turn into 503
	// upstream_unavailable), nothing is charged, the free unit is kept and
	// the payment can be sent again. An answer streamed to a buyer already
	// charged (settle before, a run again) it bounds only up to the
	// upstream's header (runSettled). Keep it well under the offers' max
	// timeout, so a retried authorization is still valid. Default 30s; at
	// most maxUpstreamTimeout (3m) with a free allowance, whose reserved
	// unit must outlive the call.
	UpstreamTimeout caddy.Duration `json:"upstream_timeout,omitempty"`

	// MaxBody is the absolute request body limit (413) applied when the gate
	// reads the body (free allowance or validation). Default 1 MiB.
	MaxBody int64 `json:"max_body,omitempty"`

	// Validator names a request validator. "score_request" is the score
	// request: the agent id of GET /score/{agent_id} (the path after the
	// route's path up to {agent_id}, "/score/" without a route) or of the
	// score tool's arguments, checked with verifierd's own rule
	// (score.CheckAgent: 1 to 200 characters, never a test- id; for a path
	// also score.PathNamesAgent, the clean path verifierd's router
	// requires: no trailing slash, empty, "." or ".." segment). It is
	// cheap, so it runs first, before any payment is read: a refused
	// request is 422 (a tool error over MCP), never a demand, and a payment
	// sent with it is neither verified nor settled.
	// "verify_request" is the verification request of POST /verify/schema
	// (read with the same parser verifierd uses: strict JSON, every field,
	// the schema compiled but never evaluated). It runs whenever the gate
	// would answer for payment itself (402, a refused payment, an outage):
	// a request it refuses gets 422 and is never offered for sale. With
	// settle before it also runs before a verified payment is settled,
	// and once the payment verified the request is also evaluated as
	// verifierd evaluates it, with its default budgets (then the upstream
	// checks the request a second time). Any other
	// call the gate lets through, free or with a verified payment, is
	// checked once, by the upstream, and its 422 is neither charged nor
	// counted.
	// With a validator, a POST without any body is the x402 discovery probe
	// and gets the 402.
	Validator string `json:"validate,omitempty"`

	// Free grants a daily free allowance on this route.
	Free *FreeAllowance `json:"free_allowance,omitempty"`

	// MCPTool prices one tool of an MCP Streamable HTTP endpoint instead of
	// the whole route: only a tools/call of this tool is gated (payment in
	// params._meta["x402/payment"], x402's MCP transport); every other
	// JSON-RPC message passes free. With validate verify_request, the
	// tool's arguments are validated. Chain one x402 per priced tool.
	MCPTool string `json:"mcp_tool,omitempty"`

	// RateLimit bounds the refused and unpaid answers one client may get
	// (see RateLimit). Default: on, 120 per minute per client, shared by
	// every gate of the server.
	RateLimit *RateLimit `json:"rate_limit,omitempty"`

	// SIWX advertises x402's sign-in-with-x extension in PAYMENT-REQUIRED:
	// a wallet that already paid for this resource may sign in instead of
	// paying again (wallet_auth with siwx verifies the proof and lets the
	// request skip the gate; see its documentation). Not with MCPTool: a
	// payment over MCP records no sign-in-with-x access (noteSettled).
	SIWX bool `json:"siwx,omitempty"`
	// SIWXDomain is the site name the sign-in challenge asks wallets to
	// sign for: one of wallet_auth's domains, which are the only names a
	// proof is accepted for. Default: the host of public_base_url, else
	// the request's Host, which a client controls, so set one of them
	// whenever clients may reach the site under a name wallet_auth does
	// not list (their proof would then be refused). The challenge's uri
	// is on this name (wallet_auth requires it), with the scheme of
	// public_base_url (else the request's).
	SIWXDomain string `json:"siwx_domain,omitempty"`

	// Paywall is what browsers get with a 402: the static page (default),
	// the official @x402/paywall wallet app, or no page (see Paywall).
	Paywall *Paywall `json:"paywall,omitempty"`

	// PaymentIdentifier enables x402's payment-identifier extension:
	// idempotent retries of a paid call (see idempotency.go).
	PaymentIdentifier *PaymentIdentifier `json:"payment_identifier,omitempty"`

	facilitator x402.Facilitator
	state       gateStore
	verifier    *verify.Verifier
	offers      []x402.PaymentRequirements
	decimals    []int             // the decimals of each offer's asset (requirements), which the demand itself does not carry
	offersJSON  []json.RawMessage // offers, encoded once (encodeOffers)
	bazaar      map[string]any    // x402's bazaar extension, for routes that validate
	allow       []string          // the methods Route names (a CORS preflight is always answered); nil: any
	base        string            // PublicBaseURL as checked (publicOrigin); "": the request's
	rates       *rateZone         // nil when rate_limit is off
	ratesKey    string
	freeRates   *rateZone // free calls' own budget (zoneFree); nil when rate_limit is off or nothing is free
	freeKey     string
	logger      *zap.Logger
	ctx         caddy.Context
	// uses counts this config's requests in flight: the store and the
	// facilitator modules close what they hold only after the last one
	// (internal/inflight).
	uses *inflight.Config
	// route is the way to this gate's upstream, from the first request it
	// served (pending.go: reports whose own way was lost in a restart).
	// Set in Provision; a pointer because a Gate is copied by value.
	route *atomic.Pointer[reporter]
	// stopped is set by Cleanup (stopResolver): the gate's requests may
	// still be running, but nothing keyed by the gate may be created any
	// more, as nothing would drop it (reportBatched). Set in Provision, a
	// pointer like route.
	stopped *atomic.Bool
	// background are the gate's reports in the background, which its
	// Cleanup waits for and stops (waitBackground).
	background *backgroundReports
	// shadowed is set once the gate has warned that an earlier gate of
	// the same request prices its route or its MCP tool (warnShadowed). Set in
	// Provision, a pointer like route.
	shadowed *atomic.Bool
	// mcpRead is how far an mcp_tool gate reads a JSON-RPC message: the
	// largest max_body of its server's mcp_tool gates (mcpReadLimit).
	// Set in Provision, shared by those gates.
	mcpRead *atomic.Int64
	// unanswered is set once the gate has logged that nothing behind it
	// answers (noUpstream). Set in Provision, a pointer like route.
	unanswered *atomic.Bool
	// verified is set once verify_response handled a request behind the
	// gate (noteVerified): its route checks answers, and an upgrade
	// request is refused before it is offered for sale (sellsSwitch). Set
	// in Provision, a pointer like route.
	verified *atomic.Bool

	// server is where rates is registered for wallet_auth (serverZones).
	server *caddyhttp.Server
	// upstream names what the gate's requests go on to (upstreamOf), part
	// of its gateID. Set in Provision.
	upstream string
	// others names the other servers of its Caddy (othersOf), the rest of
	// its gateID, once its config has started. Set in Provision.
	others *otherServers
	// proxies warns of a trusted proxy that lets clients choose their
	// client IP (proxyWatch); nil when there is nothing to warn of.
	proxies *proxyWatch
	// live is the offers a buyer is shown and may pay (liveOffers): all of
	// offers, less the Solana offers whose fee payer is still being
	// learned (learnFeePayers). nil on a gate never provisioned.
	live *atomic.Pointer[offerSet]
	// stopLearn ends learnFeePayers (Cleanup); nil when it never ran.
	stopLearn context.CancelFunc
}

// splitRoute is a route's method and path, the one reading of a route
// that every part of the gate shares (checkRoute checked its form at
// Provision). A route without a space has no path.
func splitRoute(route string) (method, path string) {
	method, path, _ = strings.Cut(route, " ")
	return method, path
}

// routeMethods are the methods a route may name: those of HTTP's
// registry that net/http knows.
var routeMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodConnect, http.MethodOptions, http.MethodTrace}

// checkRoute checks a route's "<METHOD> <path>" form and returns its
// method. Every URL the gate lists for the route (/.well-known/x402, the
// docs, the bazaar) is an origin followed by the path, so a path without
// its leading slash would name another host (https://site.example glued to
// ".evil.example/v"); and the method is the only one the gate then lets
// through, so a misspelt one would refuse every request with 405.
func checkRoute(route string) (string, error) {
	method, path := splitRoute(route)
	if !slices.Contains(routeMethods, method) {
		return "", fmt.Errorf("want \"<METHOD> <path>\" with one of the methods %s, in upper case", strings.Join(routeMethods, ", "))
	}
	if !strings.HasPrefix(path, "/") || strings.ContainsFunc(path, func(c rune) bool { return c <= ' ' || c == 0x7f }) {
		return "", errors.New("want \"<METHOD> <path>\" with a path that starts with / and holds no space or control character")
	}
	return method, nil
}

// Accept is one way to pay: a scheme on a network, an amount of an asset,
// to an address.
type Accept struct {
	// Scheme is the x402 scheme; only "exact" is supported (the default).
	Scheme string `json:"scheme,omitempty"`
	// Network is a CAIP-2 id or a friendly name: base, base-sepolia, devnet.
	Network string `json:"network"`
	// Price in dollars ("$0.02"), converted exactly into the asset's atomic
	// units. Either Price or Amount.
	Price string `json:"price,omitempty"`
	// Amount in the asset's atomic units ("20000" is 0.02 USDC).
	Amount string `json:"amount,omitempty"`
	// Asset is the token address. Default: the network's USDC.
	Asset string `json:"asset,omitempty"`
	// AssetName and AssetVersion are the token's EIP-712 domain; default
	// from the network's USDC. Required with a custom Asset on EVM.
	AssetName    string `json:"asset_name,omitempty"`
	AssetVersion string `json:"asset_version,omitempty"`
	// AssetDecimals for Price conversion with a custom Asset. Default 6.
	// 1 to x402.MaxDecimals (checked by requirements).
	AssetDecimals int `json:"asset_decimals,omitempty"`
	// PayTo is the address that receives the payment.
	PayTo string `json:"pay_to"`
	// MaxTimeout is how long a signed payment may take to settle. Default 60s.
	MaxTimeout caddy.Duration `json:"max_timeout,omitempty"`
}

// CaddyModule returns the Caddy module information.
func (Gate) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.x402",
		New: func() caddy.Module { return new(Gate) },
	}
}

// Provision loads the facilitator and the store and turns the accept blocks
// into payment requirements.
func (g *Gate) Provision(ctx caddy.Context) error {
	g.ctx = ctx
	g.logger = ctx.Logger()
	g.uses = inflight.For(ctx)
	if g.Settle == "" {
		g.Settle = "after"
	}
	if g.UpstreamTimeout == 0 {
		g.UpstreamTimeout = caddy.Duration(defaultUpstreamTimeout)
	}
	if g.MaxBuffer == 0 {
		g.MaxBuffer = defaultMaxBuffer
	}
	if g.Paywall != nil {
		if err := g.Paywall.validate(); err != nil {
			return err
		}
	}
	if g.MaxBody == 0 {
		g.MaxBody = defaultMaxBody
	}
	// The store first: a facilitator without a store of its own (svm)
	// joins the gate's default folder as the gate opened it.
	if g.StoreRaw == nil {
		g.StoreRaw = json.RawMessage(`{"type":"badger"}`)
	}
	mod, err := ctx.LoadModule(g, "StoreRaw")
	if err != nil {
		return fmt.Errorf("loading store module: %v", err)
	}
	st, ok := mod.(gateStore)
	if !ok {
		return fmt.Errorf("store module %T does not keep allowance counters and claims", mod)
	}
	noteStore(ctx, "x402", mod)
	g.state = st
	if g.FacilitatorRaw != nil {
		mod, err := ctx.LoadModule(g, "FacilitatorRaw")
		if err != nil {
			return fmt.Errorf("loading facilitator module: %v", err)
		}
		f, ok := mod.(x402.Facilitator)
		if !ok {
			return fmt.Errorf("facilitator module %T does not verify and settle payments", mod)
		}
		g.facilitator = f
	}
	if g.PublicBaseURL != "" {
		if g.base, err = publicOrigin(g.PublicBaseURL); err != nil {
			return fmt.Errorf("x402: public_base_url: %v", err)
		}
	}
	if err := g.PaymentIdentifier.provision(g); err != nil {
		return err
	}
	if g.Route != "" {
		method, err := checkRoute(g.Route)
		if err != nil {
			return fmt.Errorf("x402: route %q: %v", g.Route, err)
		}
		g.allow = []string{method}
		if method == http.MethodGet {
			g.allow = append(g.allow, http.MethodHead)
		}
	}
	// The server this gate is provisioned for (nil outside an HTTP server).
	srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	g.upstream = upstreamOf(ctx, srv)
	g.others = othersFor(ctx, srv)
	if g.RateLimit == nil {
		g.RateLimit = new(RateLimit)
	}
	g.RateLimit.provision()
	if !g.RateLimit.Off {
		if g.rates, g.ratesKey, err = loadZone(g.RateLimit, zoneRefusals); err != nil {
			return fmt.Errorf("loading rate limit zone: %v", err)
		}
		// wallet_auth in front of the gate answers within this budget
		// (serverZones).
		if g.server = srv; srv != nil {
			addServerZone(srv, g.rates)
		}
		if g.Free != nil {
			if g.freeRates, g.freeKey, err = loadZone(g.RateLimit, zoneFree); err != nil {
				return fmt.Errorf("loading rate limit zone: %v", err)
			}
		}
	}
	if g.Validator == "verify_request" {
		// The gate only prechecks (parse and compile, no evaluation) and
		// only when it answers itself, so a small schema cache suffices;
		// with settle before it also evaluates a paid request before
		// settling (requestCheck). Its limits are verifierd's
		// defaults (no MaxBodyBytes or budget here), not the gate's
		// max_body: with settle before, a body within a larger max_body
		// but over verifierd's limit would be settled and then refused by
		// verifierd, the buyer charged (and so would anything within
		// these defaults that a verifierd run with smaller limits
		// refuses: README says not to).
		g.verifier = verify.New(verify.Config{SchemaCacheSize: gateSchemaCache})
		if g.MCPTool == "" {
			g.bazaar = apidocs.BazaarVerify()
		}
	}
	if g.bazaar == nil {
		g.bazaar = routeBazaar(g)
	}
	if g.Free != nil {
		if err := g.Free.provision(); err != nil {
			return fmt.Errorf("x402: free_allowance: %v", err)
		}
		g.Free.store = storeIdentity(mod)
		if err := checkFreePool(ctx, gateName(ctx, g.Route), g.Free); err != nil {
			return fmt.Errorf("x402: free_allowance: %v", err)
		}
	}
	g.proxies = watchProxies(srv, g.rates != nil || (g.Free != nil && g.Free.Key == "ip"), g.logger)
	g.offers = make([]x402.PaymentRequirements, 0, len(g.Accepts))
	g.decimals = make([]int, 0, len(g.Accepts))
	for i, a := range g.Accepts {
		req, decimals, err := a.requirements()
		if err != nil {
			return fmt.Errorf("accept %d: %v", i, err)
		}
		g.offers = append(g.offers, req)
		g.decimals = append(g.decimals, decimals)
	}
	if err := g.checkOffers(); err != nil {
		return err
	}
	g.warnUnreadOffers()
	waiting, err := g.fillFeePayers()
	if err != nil {
		return err
	}
	// With the fee payers known: a Solana offer is read only by the member
	// that manages its fee payer (memberReads).
	warnUnreadableWaits(g.facilitator, g.offers) // facilitator.go
	if err := g.encodeOffers(); err != nil {
		return err
	}
	g.live = new(atomic.Pointer[offerSet])
	g.live.Store(newOfferSet(g.offers, g.offersJSON, g.decimals, waiting))
	if len(waiting) > 0 {
		g.learnFeePayers(waiting)
	}
	registerMetrics(ctx)
	g.route = new(atomic.Pointer[reporter])
	g.stopped = new(atomic.Bool)
	g.background = &backgroundReports{stop: make(chan struct{})}
	g.shadowed = new(atomic.Bool)
	if g.MCPTool != "" {
		g.mcpRead = mcpReadLimit(ctx, srv, g.MaxBody)
	}
	g.unanswered = new(atomic.Bool)
	g.verified = new(atomic.Bool)
	discovery.add(g)
	g.startResolver() // hook (pending.go): resolve unknown settlements
	return nil
}

// Validate checks the configuration before it is used.
func (g *Gate) Validate() error {
	if len(g.offers) == 0 {
		return errors.New("x402: at least one accept block is required")
	}
	if err := g.Paywall.checkOffer(g.offers[0], g.decimals[0]); err != nil {
		return err
	}
	if g.facilitator == nil {
		return errors.New("x402: a facilitator is required")
	}
	if g.Settle != "after" && g.Settle != "before" {
		return fmt.Errorf("x402: settle must be 'after' or 'before', not %q", g.Settle)
	}
	if err := g.validateSettleOn(); err != nil {
		return err
	}
	if g.Validator != "" && g.Validator != "verify_request" && g.Validator != validateScore {
		return fmt.Errorf("x402: unknown validator %q (validators: verify_request, score_request)", g.Validator)
	}
	if g.MCPTool != "" && g.Settle == "before" {
		return errors.New("x402: an MCP tool is settled after its result (settle before cannot tell a tool error from a success)")
	}
	if g.MCPTool != "" && g.SIWX {
		return errors.New("x402: siwx cannot be set with mcp_tool: a payment for one tool grants no sign-in-with-x access (that is per path, shared by every tool of the endpoint)")
	}
	if g.UpstreamTimeout <= 0 {
		// A JSON config skips the Caddyfile's check (0 is the default,
		// set in Provision): every charged or free call would start past
		// its deadline and fail at once.
		return fmt.Errorf("x402: upstream_timeout %s must be positive (leave it out for the default %s)", time.Duration(g.UpstreamTimeout), defaultUpstreamTimeout)
	}
	if g.Free != nil {
		if err := g.Free.validate(); err != nil {
			return fmt.Errorf("x402: free_allowance: %v", err)
		}
		if err := checkFreeUpstreamTimeout(time.Duration(g.UpstreamTimeout)); err != nil {
			return fmt.Errorf("x402: %v", err)
		}
	}
	if err := g.RateLimit.validate(); err != nil {
		return fmt.Errorf("x402: rate_limit: %v", err)
	}
	if g.MaxBuffer < 0 || g.MaxBody < 0 {
		return errors.New("x402: limits must be positive")
	}
	return nil
}

// Cleanup stops the resolver, waits for the first attempt of the
// reports in the background, at most reportTimeout (waitBackground: a stop's
// exit would lose them), withdraws the route from the facilitator's
// discovery list and lets go of the rate limit zone.
func (g *Gate) Cleanup() error {
	g.stopResolver() // hook (pending.go)
	if g.stopLearn != nil {
		g.stopLearn()
	}
	g.waitBackground()
	discovery.remove(g)
	if g.freeRates != nil {
		if _, err := rateZones.Delete(g.freeKey); err != nil {
			return err
		}
	}
	if g.rates != nil {
		if g.server != nil {
			removeServerZone(g.server, g.rates)
		}
		_, err := rateZones.Delete(g.ratesKey)
		return err
	}
	return nil
}

// noteRefusal counts an answer nobody paid for that served nothing (a
// refusal, a paid call the upstream worked for that settled nothing:
// unsettled) against the client's rate limit, even past an empty budget
// (rateZone.note). Free calls count in their own budget (serveFree).
func (g *Gate) noteRefusal(r *http.Request) {
	if g.rates != nil {
		g.rates.note(clientAddr(r))
	}
}

// warnUnreadOffers warns of each offer on a network readPayment does not
// read (neither EVM nor Solana: a CAIP-2 id only a remote facilitator
// settles). The gate checks nothing of what a payment on it signs, so the
// facilitator's verdict alone decides what the payment pays: one that
// judged the payload by itself would settle, and the gate serve, 1 atom or
// a transfer to another account. Such an offer is allowed (README); the
// operator is told to name there only a facilitator trusted with that
// check.
func (g *Gate) warnUnreadOffers() {
	for i, o := range g.offers {
		if !x402.IsEVM(o.Network) && !x402.IsSolana(o.Network) {
			g.logger.Warn("the gateway cannot read a payment on this accept's network: the facilitator's verdict alone decides what it pays; name only a facilitator you trust to check a payment against the offer",
				zap.Int("accept", i), zap.String("network", o.Network))
		}
	}
}

// minMaxTimeout is the shortest max_timeout an offer may have when the
// gate settles right after verifying (settle before): the facilitator
// settles an EVM authorization only while x402.ValidBeforeMargin of it is
// left, the buyer's validBefore counts whole seconds from when it signed,
// and the signature still has to reach the gate, hence a second more.
const minMaxTimeout = x402.ValidBeforeMargin + time.Second

// checkOffers refuses offers no buyer can complete, or that let a buyer
// choose what the operator did not mean, before any buyer signs for them:
//   - an offer on a network the gate's own facilitator does not settle
//     (every payment would be refused invalid_network, again and again).
//     Only an embedded facilitator's networks are known here; a remote
//     one's are its to say, and are not asked for at load (fillFeePayers
//     asks for Solana offers only, which cannot be made without it);
//   - a max_timeout an authorization cannot be settled within: the
//     facilitator needs x402.ValidBeforeMargin of it left when it settles,
//     and with settle after (the default) it settles only once the
//     upstream answered, up to upstream_timeout later;
//   - two offers of one asset on one network: a buyer shown both pays the
//     cheaper.
func (g *Gate) checkOffers() error {
	settled, known := settledNetworks(g.facilitator)
	for i, o := range g.offers {
		if known && !slices.Contains(settled, o.Network) {
			return fmt.Errorf("accept %d: network %s: the facilitator settles on %s only", i, o.Network, strings.Join(settled, ", "))
		}
		least := minMaxTimeout
		if g.Settle != "before" && x402.IsEVM(o.Network) {
			least += time.Duration(g.UpstreamTimeout)
		}
		if offered := time.Duration(o.MaxTimeoutSeconds) * time.Second; offered < least {
			given := "max_timeout " + time.Duration(g.Accepts[i].MaxTimeout).String()
			if g.Accepts[i].MaxTimeout == 0 {
				given = "the default max_timeout"
			}
			why := "an authorization must have " + x402.ValidBeforeMargin.String() + " left when it is settled"
			if least > minMaxTimeout {
				why += ", and settle after settles it only once the upstream answered, up to upstream_timeout " + time.Duration(g.UpstreamTimeout).String() + " later"
			}
			// Offers state whole seconds: the least whole number of them.
			return fmt.Errorf("accept %d: %s (offered as %s) is too short: use at least %s (%s)",
				i, given, offered, (least + time.Second - 1).Truncate(time.Second), why)
		}
		for j, p := range g.offers[:i] {
			if x402.SameAsset(o, p) {
				return fmt.Errorf("accept %d: offers the asset of accept %d (%s on %s) again: a buyer shown both pays whichever it likes, the cheaper when the prices differ; offer each asset once per network", i, j, p.Asset, p.Network)
			}
		}
	}
	return nil
}

// requirements builds the server's own payment requirements for one accept
// block; these, never the client's copy, are what get verified and settled.
// It also returns the decimals of the asset, the ones the price was read in
// (0 for an amount on an asset whose decimals the config does not give):
// the requirements carry the amount in atomic units only, and a page that
// states it in whole tokens (the official paywall) must read it in these.
func (a Accept) requirements() (x402.PaymentRequirements, int, error) {
	scheme := a.Scheme
	if scheme == "" {
		scheme = x402.SchemeExact
	}
	if scheme != x402.SchemeExact {
		return x402.PaymentRequirements{}, 0, fmt.Errorf("scheme %q is not supported (use exact)", scheme)
	}
	network, err := x402.ResolveNetwork(a.Network)
	if err != nil {
		return x402.PaymentRequirements{}, 0, err
	}
	if a.PayTo == "" {
		return x402.PaymentRequirements{}, 0, errors.New("pay_to is required")
	}
	if a.MaxTimeout < 0 {
		return x402.PaymentRequirements{}, 0, fmt.Errorf("max_timeout %s is negative", time.Duration(a.MaxTimeout))
	}
	// Checked here, not only by the Caddyfile parser, so a JSON config
	// gets it too, and an amount offer as well as a priced one: the
	// decimals also state the amount to buyers (the paywall, 402 pages).
	// 0 is unset (6); a token without decimals is priced with amount.
	if a.AssetDecimals < 0 || a.AssetDecimals > x402.MaxDecimals {
		return x402.PaymentRequirements{}, 0, fmt.Errorf("asset_decimals %d %s", a.AssetDecimals, assetDecimalsRange)
	}
	asset := x402.Asset{Network: network, Address: a.Asset, Name: a.AssetName, Version: a.AssetVersion, Decimals: a.AssetDecimals}
	// USDC by default, or when asset is its address: compared by the
	// network's rule (LookupAsset), so an EVM address in any letter case is
	// USDC but a Solana mint only exactly (base58 is case-sensitive).
	if a.Asset == "" {
		if usdc, ok := x402.USDC(network); ok {
			asset = usdc
		}
	} else if usdc, ok := x402.LookupAsset(network, a.Asset); ok {
		asset = usdc
	}
	if asset.Address == "" {
		return x402.PaymentRequirements{}, 0, fmt.Errorf("network %s has no known USDC: set asset, asset_name, asset_version (on devnet, load the devnet facilitator first)", network)
	}
	// The known USDC's decimals are a fact of its contract: a price read
	// in others would be off by powers of ten, so a line that says
	// otherwise is refused rather than silently ignored.
	if a.AssetDecimals != 0 && asset.Decimals != 0 && a.AssetDecimals != asset.Decimals {
		return x402.PaymentRequirements{}, 0, fmt.Errorf("asset_decimals %d contradicts the %d decimals of the network's USDC (drop it)", a.AssetDecimals, asset.Decimals)
	}
	if err := x402.CheckPayTo(network, a.PayTo, asset.Address); err != nil {
		return x402.PaymentRequirements{}, 0, fmt.Errorf("pay_to: %v", err)
	}
	// A price is read in the asset's decimals, 6 when the config gives
	// none. An amount is atomic and needs none; decimals the config does
	// not give are then unknown (0), and a page must not state the amount
	// in whole tokens of guessed ones (Paywall.checkOffer).
	decimals := asset.Decimals
	if decimals == 0 && a.Price != "" {
		decimals = 6
	}
	if x402.IsEVM(network) && (asset.Name == "" || asset.Version == "") {
		return x402.PaymentRequirements{}, 0, errors.New("a custom EVM asset needs asset_name and asset_version (its EIP-712 domain)")
	}
	var amount string
	switch {
	case a.Price != "" && a.Amount != "":
		return x402.PaymentRequirements{}, 0, errors.New("set price or amount, not both")
	case a.Price != "":
		amount, err = x402.ParsePrice(a.Price, decimals)
	case a.Amount != "":
		amount, err = x402.ParseAmount(a.Amount)
	default:
		return x402.PaymentRequirements{}, 0, errors.New("price or amount is required")
	}
	if err != nil {
		return x402.PaymentRequirements{}, 0, err
	}
	timeout := defaultMaxTimeout
	if a.MaxTimeout > 0 {
		timeout = int(time.Duration(a.MaxTimeout).Seconds())
	}
	return x402.PaymentRequirements{
		Scheme:            scheme,
		Network:           network,
		Amount:            amount,
		Asset:             asset.Address,
		PayTo:             a.PayTo,
		MaxTimeoutSeconds: timeout,
		Extra:             asset.Extra(),
	}, decimals, nil
}

// ServeHTTP decides, in this order: a CORS preflight is answered 204
// unpaid and never passed on (answerPreflight; any other OPTIONS is a
// request like another: 405 under Route, which does not name it, else
// priced); a client over its refusal budget is 429; a URL the 402 could
// not name (checkURL) is 400 (a target that is not a path) or 414; a body
// over the absolute limit is 413; a bodyless POST is the discovery probe
// (402); a payment is verified, the upstream run and the payment settled;
// a request small enough for the free tier is served from the allowance
// while it lasts; anything else is 402. Whenever the gate answers for
// payment itself, an invalid request is 422 instead (see exchange); a call
// it lets through is checked by the upstream.
func (g *Gate) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// Before anything reads the store or asks the facilitator: a reload
	// cleans this config up while its requests still run, and what they
	// use is closed only after the last one leaves.
	if !g.uses.Enter() {
		return g.refuse(w, r, apierr.Unavailable("payment state store", 1, errUnloaded))
	}
	defer g.uses.Leave()
	defer noteRouteVars(r)() // what the routes after it may choose its upstream by
	if caddyhttp.GetVar(r.Context(), verificationStartedVar) != nil {
		// verify_response already runs around this gate: it would judge
		// the answer only after the gate settled it (see
		// verificationStartedVar). Nothing is claimed, reserved or charged.
		return g.refuse(w, r, apierr.Internal(errGateInsideVerify))
	}
	defer g.noteVerified(r)
	// The upstream must never see a client's claim to have paid, on any
	// path, preflights included. The first gate on the request removes it;
	// a later gate in the same route (one per MCP tool) must keep what an
	// earlier one set. Nor its credentials, the payment among them: every
	// gate sets them aside before anything passes the request on.
	if caddyhttp.GetVar(r.Context(), varGated) == nil {
		caddyhttp.SetVar(r.Context(), varGated, true)
		clearClientHeaders(r)
	}
	creds := setAsideClientCredentials(r)
	// One request, one price: of the gates of one request that price the
	// route (a site-wide x402 and one inside its route, say), the first
	// gates it and the later ones pass it on, as mcp_tool gates do for one
	// tool (serveMCP). The first has taken the payment, so a later gate
	// would find none: it would serve a paid call as a free one (a free
	// unit spent, the upstream told "free") or demand a second payment
	// that can never come, refusing every paid call. A gate cannot see
	// the other gates of its request when it is provisioned, so this is
	// decided per request. The mark lasts while this gate handles the
	// request, not after: handle_errors runs the same request again once
	// it has returned, and a gate there prices what it serves itself.
	if g.MCPTool == "" {
		if caddyhttp.GetVar(r.Context(), varRoutePriced) != nil {
			g.warnShadowed()
			return next.ServeHTTP(w, r)
		}
		caddyhttp.SetVar(r.Context(), varRoutePriced, true)
		defer caddyhttp.SetVar(r.Context(), varRoutePriced, nil)
	}
	if ae := screenUpgrade(r); ae != nil {
		return g.refuse(w, r, ae) // upgrade.go
	}
	if isPreflight(r) {
		if g.MCPTool != "" {
			// Only a POSTed tools/call is priced: any OPTIONS passes
			// like a GET, so the upstream's own CORS answers.
			return next.ServeHTTP(w, r)
		}
		return answerPreflight(w, g.allow)
	}
	if g.route != nil && g.route.Load() == nil {
		g.learnRoute(r, next)
	}
	g.proxies.check(r)
	if upgradeRequest(r) && !g.sellsSwitch() {
		// Within the client's budget, as any refusal: one is counted
		// even past an empty budget (rateZone.note).
		if wait := g.rateWait(r, false); wait > 0 {
			return g.refuse(w, r, apierr.RateLimited(wait))
		}
		return g.refuse(w, r, errUpgradeUnsupported()) // upgrade.go
	}
	if g.MCPTool != "" {
		// A tool call's payment is in its _meta: a PAYMENT-SIGNATURE is
		// left set aside for a gate after this one that prices the
		// endpoint, whichever order the two are written in.
		return g.serveMCP(w, r, next)
	}
	payment := creds.takePayment()
	if wait := g.rateWait(r, payment != ""); wait > 0 {
		return g.refuse(w, r, apierr.RateLimited(wait))
	}
	if g.allow != nil && !slices.Contains(g.allow, r.Method) {
		return g.refuse(w, r, apierr.MethodNotAllowed(g.allow...))
	}
	if ae := g.checkURL(r); ae != nil {
		return g.refuse(w, r, ae)
	}

	ex := &restExchange{g: g, requestCheck: requestCheck{paying: payment != ""}}
	if g.Validator == validateScore {
		if err := g.checkScorePath(r); err != nil {
			return g.refuse(w, r, err)
		}
	}
	// The body is read (at most max_body, else 413) when the gate checks
	// it, serves it free, or is paid for it: a paid call's record names
	// the request it pays for, body included (heldRequest), since once
	// settled the payment is public on chain (payer, nonce, signature) and
	// the body is what keeps an answer held for it, or its one run again
	// after a crash, the buyer's. A body announced over max_body is 413
	// on every route, before it is offered for sale.
	var body []byte
	if r.ContentLength > g.MaxBody {
		return g.refuse(w, r, apierr.TooLarge(g.MaxBody))
	}
	if g.verifier != nil || g.Free != nil || payment != "" {
		var err error
		if body, err = g.readBody(r); err != nil {
			return g.refuse(w, r, err)
		}
		if g.verifier != nil {
			if len(body) == 0 && r.Method == http.MethodPost {
				return g.paymentRequired(w, r, "Payment required", "")
			}
			if bad := bodyNotUTF8(r); bad != nil {
				return g.refuse(w, r, apierr.UnsupportedCharset(*bad))
			}
			// verifierd refuses another method than verify.Method, and
			// a body not declared as JSON, before it reads the body: the
			// same rules first, in its order, on the length the upstream
			// is sent (setBody), so settle before never charges for them
			// (whether or not route names the method).
			method, ct := r.Method, r.Header.Get("Content-Type")
			ex.check = func() error {
				if method != verify.Method {
					return apierr.MethodNotAllowed(verify.Method)
				}
				if err := verify.CheckMediaType(ct, int64(len(body))); err != nil {
					return err
				}
				return g.precheck(r, ex.verified, ex.payer, func() error {
					if err := g.verifier.Precheck(body); err != nil || !ex.verified || g.Settle != "before" {
						return err
					}
					// A settle before payment is checked once it
					// verified, just before it settles. The compile
					// passes a schema whose evaluation on this output
					// is over verifierd's budgets (steps, regular
					// expression or integrity work), which verifierd
					// refuses 422 only once it runs, after the payment
					// settled: the request is evaluated here too, with
					// the same code and default budgets, while nothing
					// is charged. Refused, it is charged nothing and
					// may be sent again, so the evaluation is work for
					// nothing as the compile is, and runs within the
					// same hold of the payer's turn and paid check slot
					// (precheck). Elsewhere the upstream's 422 is never
					// charged, and the evaluation runs once, in
					// verifierd.
					_, err := g.verifier.ParseContext(r.Context(), body)
					return err
				})
			}
		}
	}
	if payment != "" {
		pay, err := x402.DecodePayment(payment)
		if err != nil {
			return ex.demand(w, r, http.StatusBadRequest, "Invalid payment: "+err.Error(), reasonFor(err, x402.ReasonInvalidPayload), nil)
		}
		return g.servePaid(w, r, next, ex, pay, payment)
	}
	if g.Free != nil && int64(len(body)) <= g.Free.MaxBody {
		return g.serveFree(w, r, next, ex)
	}
	return ex.demand(w, r, http.StatusPaymentRequired, "Payment required", "", nil)
}

// precheckSlots bounds the gateway's schema compiles at once (precheck),
// over all its gates and clients, as verifierd's default
// -max-concurrent-verifications bounds its own: the per-client slots bound
// one address, and many addresses would otherwise multiply them.
var precheckSlots = make(chan struct{}, verify.DefaultMaxConcurrent())

// precheckWait is how long a precheck waits for its turn (and a verified
// call's for one of paidCheckSlots too), in all, before the request is
// answered 503 verification_timeout, nothing charged (verifierd's default
// Timeout); tests shorten it.
var precheckWait = verify.DefaultTimeout

// precheckSlotWait is how long a precheck that has its client's turn waits
// for one of precheckSlots before the gate answers without the check
// (errUnchecked): a few addresses, each compiling one request at a time,
// hold every slot, and a wait of precheckWait then answered every other
// client's first request 503 without the offer, so no buyer learned the
// price while they kept at it.
var precheckSlotWait = 200 * time.Millisecond

// errUnchecked is a precheck that did not run: every one of precheckSlots
// stayed busy for precheckSlotWait. The request is answered as if it
// passed, its 402 saying it was not checked (requestCheck.invalid): the
// check only spares a buyer the offer of an invalid request, and the paid
// call for one is still refused uncharged (servePaid's own check under
// settle before, verifierd's 422 under settle after).
var errUnchecked = errors.New("the gateway was too busy to check the request")

// precheckTurns holds each client's turn (clientAddr, as rate_limit counts
// it): a client compiles one unpaid request's schema at a time over the
// gateway, its others waiting behind it. A client may hold rate_limit's
// events checks at once (slotCheck), 120 in Caddyfile.example, more than
// precheckSlots; without turns one address's burst held every slot and
// its queue, and every other client's 402 waited out precheckWait.
var precheckTurns = &checkTurns{m: make(map[string]*precheckTurn)}

// paidCheckSlots bounds, as precheckSlots bounds the unpaid ones and by
// the same number, the gateway's checks at once of calls whose payment the
// facilitator verified (precheck; under settle before the compile and the
// evaluation): a pool of their own, so unpaid requests holding every one
// of precheckSlots never delay or refuse a payment.
var paidCheckSlots = make(chan struct{}, verify.DefaultMaxConcurrent())

// paidCheckTurns holds each payer's turn (payerOf; the client's address
// when the payment names none) for the check of a call whose payment the
// facilitator verified: one payer's calls are checked one at a time, its
// others waiting behind it. Keyed by payer, not by address as
// precheckTurns is, so that unpaid requests, which anyone sends for
// nothing from the address a buyer shares (a NAT, an IPv6 /64), never hold
// a payment's turn; and a payer the facilitator verified is a funded
// wallet, which costs its holder more than another address does.
var paidCheckTurns = &checkTurns{m: make(map[string]*precheckTurn)}

// checkTurns holds a turn per key (a client, a payer): one check at a time
// each.
type checkTurns struct {
	sync.Mutex
	m map[string]*precheckTurn
}

// precheckTurn is one key's turn: a token in c while one of its requests
// holds it; refs counts the requests holding or waiting for it, so the
// entry lives exactly while one does.
type precheckTurn struct {
	c    chan struct{}
	refs int
}

// join returns key's turn, counting the request in (leave).
func (ts *checkTurns) join(key string) *precheckTurn {
	ts.Lock()
	defer ts.Unlock()
	t := ts.m[key]
	if t == nil {
		t = &precheckTurn{c: make(chan struct{}, 1)}
		ts.m[key] = t
	}
	t.refs++
	return t
}

// leave counts the request out of key's turn t, dropping it with the last.
func (ts *checkTurns) leave(key string, t *precheckTurn) {
	ts.Lock()
	defer ts.Unlock()
	if t.refs--; t.refs == 0 {
		delete(ts.m, key)
	}
}

// precheck runs check, the request's parse and schema compile
// (verify.Precheck): work a request gets done before the gate answers 402
// or 422, unpaid, up to a fraction of a second and tens of MiB for a
// schema within every limit. So it is work like a paid call's, bounded
// before it starts: the request takes one of its client's slots of the
// refusal budget (slotCheck; rateZone.enter), unless it holds a paid
// call's slot already (its check is part of that work), and is answered
// 429 rate_limited when none is free or the budget is spent, nothing
// counted; then its client's turn (precheckTurns), waiting at most
// precheckWait for it, and one of the gateway's precheckSlots, waiting at
// most precheckSlotWait more, after which the check is left out
// (errUnchecked). The 402 or 422 that follows is counted as any refusal
// (note), so a client's compiles are at most events at a time and put its
// budget at most events in debt; and so is the 503 of a request that
// waited in vain for its turn, or whose client went away while it waited:
// the wait is the gateway's work too, and uncounted a client could keep
// the slots busy for nothing.
//
// A call whose payment the facilitator verified (verified, made by payer)
// is checked within servePaid, under settle before before its payment
// settles, holding its client's paid slot under rate_limit; that check
// evaluates the request too (up to verifierd's budgets and Timeout), all
// of it within the one hold taken here. The check is still work done for
// nothing when it refuses the request: the call is then charged nothing,
// its claim given back, and the same payment may be sent again, so it is
// bounded before it starts as an unpaid one is, by bounds of its own:
// its payer's turn (paidCheckTurns) and one of the gateway's
// paidCheckSlots, waiting at most precheckWait for both, after which it
// is 503 verification_timeout, counted as the unpaid wait is (never left
// out, as errUnchecked leaves an unpaid one's: a settle before payment is
// never settled for a request that was not checked). None of
// precheckSlots nor its address's turn: unpaid requests holding them never
// delay or refuse a payment. Carrying a payment is not enough: one that
// matches no offer or that the facilitator refused costs its maker
// nothing, and the 402 that answers it is bounded as an unpaid one.
func (g *Gate) precheck(r *http.Request, verified bool, payer string, check func() error) error {
	deadline := time.NewTimer(precheckWait)
	defer deadline.Stop()
	if verified {
		if payer == "" {
			payer = clientAddr(r)
		}
		turn := paidCheckTurns.join(payer)
		defer paidCheckTurns.leave(payer, turn)
		if err := g.awaitSlot(r, turn.c, deadline.C); err != nil {
			return err
		}
		defer func() { <-turn.c }()
		if err := g.awaitSlot(r, paidCheckSlots, deadline.C); err != nil {
			return err
		}
		defer func() { <-paidCheckSlots }()
		return check()
	}
	if g.rates != nil && caddyhttp.GetVar(r.Context(), varRateSlot) == nil {
		s, wait := g.rates.enter(clientAddr(r), slotCheck, false)
		if wait > 0 {
			return apierr.RateLimited(wait)
		}
		defer s.leave()
	}
	client := clientAddr(r)
	turn := precheckTurns.join(client)
	defer precheckTurns.leave(client, turn)
	if err := g.awaitSlot(r, turn.c, deadline.C); err != nil {
		return err
	}
	defer func() { <-turn.c }()
	select {
	case precheckSlots <- struct{}{}:
	default:
		busy := time.NewTimer(precheckSlotWait)
		defer busy.Stop()
		select {
		case precheckSlots <- struct{}{}:
		case <-busy.C:
			return errUnchecked
		case <-deadline.C:
			return errUnchecked
		case <-r.Context().Done():
			g.noteRefusal(r)
			return apierr.Timeout(precheckWait, r.Context().Err())
		}
	}
	defer func() { <-precheckSlots }()
	return check()
}

// awaitSlot puts a token in slots, or, when deadline fires or the client
// goes away first, counts the request against its client (noteRefusal)
// and returns 503 verification_timeout (precheck's wait for a turn or a
// verified call's slot).
func (g *Gate) awaitSlot(r *http.Request, slots chan struct{}, deadline <-chan time.Time) error {
	var err error
	select {
	case slots <- struct{}{}:
		return nil
	case <-deadline:
		err = context.DeadlineExceeded
	case <-r.Context().Done():
		err = r.Context().Err()
	}
	g.noteRefusal(r)
	return apierr.Timeout(precheckWait, err)
}

// readBody reads the whole request body, up to MaxBody, and puts it back for
// the upstream.
func (g *Gate) readBody(r *http.Request) ([]byte, error) {
	return readBodyUpTo(r, g.MaxBody)
}

// readBodyUpTo reads the whole request body, up to limit bytes (else 413),
// and puts it back for the upstream. It is the one reader of a body the
// gate reads (REST, free allowance, MCP). A body a handler in front of the
// gate limits (request_body max_size, a MaxBytesReader) and cuts off is
// over that limit, not short: 413 naming it, as verifierd answers the same
// error, never the 422 that asks for the whole body again.
func readBodyUpTo(r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, apierr.TooLarge(limit)
	}
	// The body is read to its announced length, which the server
	// enforces, or, unannounced, to one byte past limit (413).
	want := limit + 1
	if r.ContentLength > 0 {
		want = r.ContentLength
	}
	body, err := growread.Read(r.Body, want, nil)
	if err == nil && r.ContentLength > 0 && int64(len(body)) < r.ContentLength {
		err = io.ErrUnexpectedEOF
	}
	if over := (*http.MaxBytesError)(nil); errors.As(err, &over) {
		return nil, apierr.TooLarge(over.Limit)
	}
	if err != nil {
		return nil, apierr.Invalid(apierr.Field{Field: "body", Problem: "could not be read completely", Fix: "Send the whole request body with a correct Content-Length."})
	}
	if int64(len(body)) > limit {
		return nil, apierr.TooLarge(limit)
	}
	setBody(r, body)
	return body, nil
}

// bodyNotUTF8 refuses, for a gate that reads a request body to decide what
// it charges (mcp_tool, validate), a body whose Content-Type declares a
// charset other than UTF-8, or is sent twice; nil when it does not. The
// gate reads the bytes as UTF-8, but a reader behind it may decode them by
// the label: the official TypeScript MCP SDK's server (express.json())
// decodes any utf-* charset, UTF-7 included, where "+AHQ-ools/call" is
// tools/call, so one body would be a free message to the gate and a priced
// call to the seller. The labels taken are the ones notUTF8 takes for the
// answers verify_response checks: one rule for both.
func bodyNotUTF8(r *http.Request) *apierr.Field {
	ct := r.Header.Values("Content-Type")
	switch {
	case len(ct) > 1:
		return &apierr.Field{Field: "Content-Type", Problem: "is sent more than once", Fix: "Send one Content-Type: application/json."}
	case len(ct) == 1 && notUTF8(ct[0]) != "":
		return &apierr.Field{Field: "Content-Type", Problem: "declares a charset other than UTF-8", Fix: "Send the body as UTF-8, with no charset or charset=utf-8."}
	}
	return nil
}

// gateBody is a request body the gate has read: the upstream reads it as
// any body, and the gate can still name it once the upstream has
// (heldRequest, pending.go). One allocation, as io.NopCloser of a
// bytes.Reader was two.
type gateBody struct {
	bytes.Reader
	b []byte
}

func (*gateBody) Close() error { return nil }

// setBody makes body the request body the upstream reads.
func setBody(r *http.Request, body []byte) {
	gb := &gateBody{b: body}
	gb.Reset(body)
	r.Body = gb
	if r.ContentLength == int64(len(body)) {
		if v := r.Header["Content-Length"]; len(v) == 1 {
			if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n == r.ContentLength {
				return // the header already says so
			}
		}
	}
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
}

// errUnloaded is why a request is refused that reached a config after a
// reload unloaded it and its last request finished, so that what it held
// may be closed (Caddy's old server can take in a request just as it shuts
// down). The client's retry reaches the new config.
var errUnloaded = errors.New("the request reached a configuration already unloaded by a reload")

// refuse writes an error in the SPEC §6 shape and counts it (a 4xx also
// against the client's rate limit). The error is written here, not
// returned, because its body is part of the contract. It answers as HTTP:
// a call the gate has read as an exchange (restExchange, mcpExchange) is
// refused through the exchange, which over MCP answers the call's JSON-RPC
// tool result instead; only what comes before (an unloaded config, a body
// that could not be read as a JSON-RPC message) is refused here directly.
func (g *Gate) refuse(w http.ResponseWriter, r *http.Request, err error) error {
	e := apierr.From(err)
	g.counted(r, e)
	w.Header().Set("Access-Control-Expose-Headers", exposedHeaders)
	apierr.Write(w, e)
	return nil
}

// counted counts a refusal of the gate, however it is written (Gate.refuse,
// or an MCP tool error): a 4xx against the client's rate limit, a 5xx
// logged with its cause (the operator's only view of an outage or of an
// answer withheld), every one in the outcomes metric. A retryable one
// gives back the wallet proofs wallet_auth claimed for the request, unless
// its upstream ran (refusedBeforeUpstream).
func (g *Gate) counted(r *http.Request, e *apierr.Error) {
	if countsAgainstRate(e) {
		g.noteRefusal(r)
	}
	refusedBeforeUpstream(r, e, g.logger)
	if e.Status >= 500 {
		if ce := g.logger.Check(zapcore.ErrorLevel, "request refused"); ce != nil {
			ce.Write(zap.String("code", e.Code), zap.Error(e.Cause))
		}
	}
	metrics.outcomes.WithLabelValues(e.Code).Inc()
}

// resource is the resource description for PAYMENT-REQUIRED.
func (g *Gate) resource(r *http.Request) x402.Resource {
	url := g.Resource
	if url != "" {
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			url = repl.ReplaceAll(url, "")
		}
	} else {
		url = resourceURL(siteBase(g.base, r), r)
	}
	return x402.Resource{URL: url, Description: g.Description, MimeType: g.MimeType}
}

// resourceURL is the URL a 402 names for r on origin: the path as the
// client sent it, escaped as it sent it, without the query, in RFC 3986's
// canonical form (walletauth.CanonicalPath: what Go leaves raw, such as "["
// and "]", encoded; never "%2F" decoded). The default resource URL and the
// sign-in-with-x challenge's uri are both built here, so a wallet that paid
// for a resource signs in on the same URL, and that URL is a valid URI
// (which a wallet proof's uri must be) whatever the path holds.
func resourceURL(origin string, r *http.Request) string {
	_, u := sentRequest(r)
	return origin + walletauth.CanonicalPath(u.EscapedPath())
}

// checkURL refuses a request whose URL the gate could not name: 400 when
// its target is not a path (errTargetNotAPath), 414 when the URL is over
// maxResourceURL: the resource URL of its 402, and the request's own
// origin and path, which a sign-in-with-x challenge repeats. Counted
// without building the URL, so a request that passes costs no allocation;
// a configured resource is expanded only when it has placeholders.
func (g *Gate) checkURL(r *http.Request) *apierr.Error {
	_, u := sentRequest(r)
	if u.Opaque != "" || !strings.HasPrefix(u.Path, "/") {
		return errTargetNotAPath()
	}
	n := len(walletauth.CanonicalPath(u.EscapedPath())) + max(len(g.base), len("https://")+len(r.Host))
	if g.Resource != "" && strings.Contains(g.Resource, "{") {
		n = max(n, len(g.resource(r).URL))
	}
	if n > maxResourceURL {
		return apierr.URITooLong(maxResourceURL)
	}
	return nil
}

// errTargetNotAPath refuses a request target that is not a path (RFC
// 9112 §3.2): an opaque absolute-form such as "http:.evil.example/x", the
// asterisk-form "*", an absolute-form without a path. Every URL the gate
// names (the 402's resource, the paywall's current URL, a wallet proof's
// uri) is an origin followed by the request's path; glued to anything
// else it names another host ("https://site.example" + ".evil.example/x")
// or is no URI at all, so such a request is never offered for sale. It
// repeats nothing of the request.
func errTargetNotAPath() *apierr.Error {
	return &apierr.Error{
		Code:        apierr.CodeInvalidRequest,
		Message:     "The request target is not a path (origin form, such as /score/1); nothing was charged. Send the request to the resource's path.",
		Status:      http.StatusBadRequest,
		NextActions: []apierr.Action{{Action: "fix_request_fields", Fields: []string{"url"}}},
	}
}

// paymentRequired answers 402 with PAYMENT-REQUIRED. reason is the x402
// error reason of a refused payment ("" for a plain demand for payment).
func (g *Gate) paymentRequired(w http.ResponseWriter, r *http.Request, msg, reason string) error {
	set := g.liveOffers()
	live := set.offers
	if len(live) == 0 {
		return g.refuse(w, r, errFeePayersUnknown())
	}
	pr := x402.PaymentRequired{
		X402Version: x402.Version,
		Error:       msg,
		Resource:    g.resource(r),
		Accepts:     live,
	}
	if g.bazaar != nil || g.SIWX {
		pr.Extensions = map[string]any{}
		if g.bazaar != nil {
			pr.Extensions["bazaar"] = g.bazaar
		}
		if g.SIWX {
			pr.Extensions[walletauth.SIWXExtension] = g.siwxChallenge(r)
		}
	}
	pr.Extensions = g.PaymentIdentifier.declare(pr.Extensions)
	header, err := x402.EncodeHeader(pr)
	if err != nil {
		return g.refuse(w, r, apierr.Internal(fmt.Errorf("encoding PAYMENT-REQUIRED: %w", err)))
	}
	h := w.Header()
	h.Set(x402.HeaderPaymentRequired, header)
	setChargedHeaders(h)
	metrics.outcomes.WithLabelValues(outcomeLabel(reason)).Inc()
	g.noteRefusal(r)

	var trial *freeTrial
	if g.Free != nil {
		trial = g.Free.trial(r, g)
	}
	if wantsHTML(r) && g.Paywall.html() {
		// The page fetches this URL again with the payment: the request
		// as sent, query included (a page body, not a header).
		_, u := sentRequest(r)
		// The page states the first live offer's price, in its own
		// asset's decimals (a waiting offer before it is left out).
		return g.Paywall.serve(w, r, pr, set.decimals[0], trial, siteBase(g.base, r)+u.RequestURI())
	}
	body := paymentRequiredBody{PaymentRequired: pr, Reason: reason, FreeTrial: trial}
	h.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusPaymentRequired)
	return json.NewEncoder(w).Encode(body)
}

// siwxChallenge is the sign-in-with-x challenge of a 402 for r. wallet_auth
// accepts a proof whose domain it lists and whose uri is on that domain, so
// the challenge's uri is built on its domain: SIWXDomain, else the host of
// the site's base (public_base_url, else the request's), with the base's
// scheme. With either configured, the client's Host is never in it.
func (g *Gate) siwxChallenge(r *http.Request) map[string]any {
	scheme, domain, _ := strings.Cut(siteBase(g.base, r), "://")
	if g.SIWXDomain != "" {
		domain = g.SIWXDomain
	}
	return walletauth.SIWXChallenge(domain, resourceURL(scheme+"://"+domain, r), g.chains(), now())
}

// chains lists the EVM networks the gate accepts payment on, for the
// sign-in-with-x challenge.
func (g *Gate) chains() []string {
	var out []string
	for _, o := range g.offers {
		if (x402.IsEVM(o.Network) || x402.IsSolana(o.Network)) && !slices.Contains(out, o.Network) {
			out = append(out, o.Network)
		}
	}
	return out
}

// paymentRequiredBody is the JSON body of a 402: the PaymentRequired document
// itself (for clients that read the body, as x402 v1 clients did), the
// refusal reason, and the caller's live free allowance (SPEC §7).
type paymentRequiredBody struct {
	x402.PaymentRequired
	Reason    string     `json:"reason,omitempty"`
	FreeTrial *freeTrial `json:"free_trial,omitempty"`
}

// wantsHTML reports whether the caller is a browser asking for a page.
func wantsHTML(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/html")
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Gate)(nil)
	_ caddy.Validator             = (*Gate)(nil)
	_ caddy.CleanerUpper          = (*Gate)(nil)
	_ caddyhttp.MiddlewareHandler = (*Gate)(nil)
)

// gateStore is what the gate keeps between requests: allowance counters and
// replay claims. Modules in the x402.stores namespace provide it.
type gateStore interface {
	Allowance() store.Allowance
	Claims() store.Claims
}
