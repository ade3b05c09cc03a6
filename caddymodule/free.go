package caddymodule

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/store"
)

// FreeAllowance is a daily number of free calls per client, counted in a
// named pool: routes (and the MCP tool) that name the same pool share one
// allowance. A call is counted only when it ends below 400; it resets at the
// next UTC midnight.
type FreeAllowance struct {
	// Pool names the shared counter. Default "default".
	Pool string `json:"pool,omitempty"`
	// PerDay is the number of free calls per client per UTC day.
	PerDay int `json:"per_day"`
	// Key identifies the client: "ip" (default; clientAddr: Caddy's resolved
	// client IP, which honours the server's trusted_proxies and never a raw
	// header, an IPv6 client per /64, as the rate limit counts it) or
	// "wallet" (the address verified by wallet_auth; a request without one
	// gets no free calls).
	Key string `json:"key,omitempty"`
	// MaxBody is the largest request body served free (larger ones go to
	// payment). Default 64 KiB.
	MaxBody int64 `json:"max_body,omitempty"`
	// MCPURL is where the same allowance is available over MCP, for the
	// free_trial document and the docs. Default: <site origin>/mcp, the
	// origin being the gate's public_base_url, else the request's.
	// Placeholders known when the config loads ({env.NAME}) are expanded
	// then, as in public_base_url; the result must be an absolute http(s)
	// URL.
	MCPURL string `json:"mcp_url,omitempty"`
	// Tool is the MCP tool that shares the allowance. Default verify_schema.
	Tool string `json:"tool,omitempty"`
	// Origins are the web pages on other origins that are served free
	// calls (exact origins, as x402_cors's, or "*" for any). Default none:
	// a browser sends its visitor's own address, and the allowance is the
	// visitor's; were any page a visitor opens served from it (x402_cors
	// letting it read the answers), a site could spend every visitor's free
	// calls as its own. Such a page gets the 402 offer instead, which it
	// may pay. A request without Origin (an agent, curl; with
	// public_base_url, only one whose Host is its host, an IP address or
	// localhost: servesOrigin) and a page of the site itself (on
	// public_base_url when the gate has one, else on the request's Host)
	// are served free whatever this says, unless the browser's
	// Sec-Fetch-Site says another site sent it (fromAnotherSite).
	Origins []string `json:"origins,omitempty"`

	perDay    string          // PerDay, formatted for Free-Allowance-Limit
	store     string          // the identity of the store its counts are kept in (storeIdentity)
	origins   map[string]bool // Origins, normalized (normalizeOrigin)
	anyOrigin bool            // Origins names "*"
}

func (f *FreeAllowance) provision() error {
	if f.MCPURL != "" {
		s, err := mcpEndpoint(f.MCPURL, false)
		if err != nil {
			return err
		}
		f.MCPURL = s
	}
	if f.Pool == "" {
		f.Pool = "default"
	}
	if f.Key == "" {
		f.Key = "ip"
	}
	if f.MaxBody == 0 {
		f.MaxBody = defaultFreeMaxBody
	}
	if f.Tool == "" {
		f.Tool = "verify_schema"
	}
	f.perDay = strconv.Itoa(f.PerDay)
	f.origins = map[string]bool{}
	for _, o := range f.Origins {
		if o == "*" {
			f.anyOrigin = true
			continue
		}
		norm, err := normalizeOrigin(o)
		if err != nil {
			return fmt.Errorf("origin %q: %v", o, err)
		}
		f.origins[norm] = true
	}
	return nil
}

// servesOrigin reports whether r may be served from the allowance by the
// page that sent it: a request without Origin (not a browser's
// cross-origin call; with base, on base's host), a page of the site
// itself, or a page on an origin Origins lists. Anything else, "null" (a
// sandboxed or file page) included, is a page on another origin spending
// its visitor's free calls. So is a
// request the browser says another site made (fromAnotherSite), whatever
// its Origin, unless that Origin is listed: a GET for an <img> or a
// no-cors fetch carries no Origin, and without this any page could burn
// its visitors' free calls, unread, with an image.
//
// The site's own origin is base, the gate's public_base_url, when it has
// one. Only without it is an Origin whose host is the request's Host the
// site's own: Host is the client's choice, and a DNS-rebinding page
// (Origin and Host both rebind.evil.example, the name pointed at this
// site's address) passes that test while the browser lets it read the
// answers as its own. The same page's GET carries no Origin at all (a
// same-origin GET), and on a page over plain http, where rebinding works
// (over https the site's certificate does not name the attacker's host),
// Chromium sends no Sec-Fetch-Site either: such a request looks like an
// agent's in every header but Host. So with base a request without Origin
// is served free only when its Host is base's host (sameHostAsBase) or a
// name no page can be rebound from (unrebindableHost): an agent calling
// the gate by another DNS name gets the 402 offer, as a page would.
func (f *FreeAllowance) servesOrigin(r *http.Request, base string) bool {
	if f.anyOrigin {
		return true
	}
	o := r.Header.Get("Origin")
	if fromAnotherSite(r) {
		norm, err := normalizeOrigin(o)
		return err == nil && f.origins[norm]
	}
	if o == "" {
		return base == "" || unrebindableHost(r.Host) || sameHostAsBase(r, base)
	}
	norm, err := normalizeOrigin(o)
	if err != nil {
		return false
	}
	if f.origins[norm] || norm == base {
		return true
	}
	if base != "" {
		return false
	}
	_, host, _ := strings.Cut(norm, "://")
	own, _ := withoutDefaultPort(strings.ToLower(r.Host), "80", "443")
	return host == own
}

// sameHostAsBase reports whether r's Host is the host of base (a
// publicOrigin), both normalized as an Origin is (normalizeOrigin, with
// base's scheme, so its default port is dropped from Host too). Only the
// host is compared: behind a TLS-terminating proxy the gate sees http for
// the site's https pages.
func sameHostAsBase(r *http.Request, base string) bool {
	scheme, host, _ := strings.Cut(base, "://")
	if r.Host == host && !strings.HasSuffix(host, ".") && !strings.Contains(host, ".:") {
		// base's host as it is, the usual agent's Host: normalizing it
		// would give base again (it runs on every free call, so it is
		// not parsed).
		return true
	}
	own, err := normalizeOrigin(scheme + "://" + withoutRootDot(r.Host))
	return err == nil && own == base
}

// withoutRootDot is hostport without the trailing dot of a fully
// qualified name (site.example.:443 is site.example:443): the same name,
// which DNS and browsers resolve alike.
func withoutRootDot(hostport string) string {
	name, port := hostport, ""
	if h, p, err := net.SplitHostPort(hostport); err == nil && !strings.Contains(h, ":") {
		name, port = h, ":"+p
	}
	return strings.TrimSuffix(name, ".") + port
}

// unrebindableHost reports whether a request's Host is one no DNS-rebinding
// page can have as its own: an IP address (a page on it is served from
// this address, so by this site) or localhost (which browsers resolve to
// the loopback address themselves, never asking DNS).
func unrebindableHost(hostport string) bool {
	h := hostport
	if name, _, err := net.SplitHostPort(hostport); err == nil {
		h = name
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	if a, err := netip.ParseAddr(h); err == nil && a.Zone() == "" {
		return true
	}
	return strings.EqualFold(strings.TrimSuffix(h, "."), "localhost")
}

// fromAnotherSite reports whether the browser that sent r says a page of
// another origin made it: its Sec-Fetch-Site is present and neither
// same-origin nor none (the user typed the URL, or opened a bookmark), so
// cross-site, same-site (another origin of the same site) or a value yet
// to be defined. A navigation the user made (a link clicked, a form sent:
// Sec-Fetch-Mode navigate, Sec-Fetch-User ?1) is the visitor's own call
// and is not, as a link to the API from another site is meant to work; a
// navigation without the user's gesture (a script's, a frame's loading)
// is. Clients that are not browsers send none of these headers, and a
// browser does not let a page set them.
func fromAnotherSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return false
	}
	return r.Header.Get("Sec-Fetch-Mode") != "navigate" || r.Header.Get("Sec-Fetch-User") != "?1"
}

func (f *FreeAllowance) validate() error {
	if f.PerDay < 0 {
		return errors.New("per_day must not be negative")
	}
	// A negative max_body would make every request too large for the
	// allowance: it would load, and never grant a free call.
	if f.MaxBody < 0 {
		return errors.New("max_body must not be negative")
	}
	if f.Key != "ip" && f.Key != "wallet" {
		return fmt.Errorf("key must be ip or wallet, not %q", f.Key)
	}
	return nil
}

// The longest a free call may hold its reserved unit. serveFree reserves
// the unit before the upstream runs and commits it after the answer is
// judged, and every store lets a reservation lapse after
// store.DefaultReservationTTL: a call that outlived it would have its
// commit refused (the call never counted) while the lapsed unit was granted
// again, so concurrent calls could exceed per_day. Between the two the gate
// waits for the upstream, bounded by upstream_timeout, and for a
// verify_response later in the route, whose call to the verifier keeps its
// own verifier_timeout after the gate's deadline (it must finish even when
// the client leaves). Each gets a ceiling, and both together, with a
// minute's margin for the rest (the commit, scheduling), stay below the
// reservation's lifetime.
const (
	maxVerifierTimeout = time.Minute
	maxUpstreamTimeout = store.DefaultReservationTTL - maxVerifierTimeout - time.Minute
)

// checkFreeUpstreamTimeout refuses an upstream_timeout a free call could
// outlive its reservation with.
func checkFreeUpstreamTimeout(d time.Duration) error {
	if d > maxUpstreamTimeout {
		return fmt.Errorf("upstream_timeout %s is too long for a route with a free allowance: a free call's reserved unit lapses after %s, and the upstream call plus a verify_response check (verifier_timeout, at most %s) must end before it; use at most %s",
			d, store.DefaultReservationTTL, maxVerifierTimeout, maxUpstreamTimeout)
	}
	return nil
}

// WalletPlaceholder holds the address wallet_auth verified for the request.
const WalletPlaceholder = "http.auth.wallet.address"

// client returns the allowance key of the request's client, or "" when it
// has none (key wallet without a verified wallet).
func (f *FreeAllowance) client(r *http.Request) string {
	if f.Key == "wallet" {
		if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
			if v, ok := repl.GetString(WalletPlaceholder); ok && v != "" {
				return "wallet:" + v
			}
		}
		return ""
	}
	return "ip:" + clientAddr(r)
}

// nextMidnight is the next UTC midnight after t: when today's allowance resets.
func nextMidnight(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

// serveFree serves the call from the caller's allowance, or answers with a
// demand for payment when it has none left. The unit is reserved first and
// committed only for a billable answer (serveCharged), so errors never cost
// the caller a free call.
//
// Each free call served also takes one event from the client's (IP's) free
// budget (zoneFree, rate_limit's events per window): with key wallet the
// allowance is per wallet, a key anyone mints, so the budget is what bounds
// one client's free work. Past it the call is not served free: it gets the
// demand for payment (with Retry-After: when it may be free again), which
// counts against the client's refusals as every 402 does. The budget is not
// the one a payment must pass (Gate.rateWait), so a paying client is never
// refused for the free calls it used. It is taken before the upstream runs,
// so concurrent calls cannot overdraw it, and given back (refund) when
// nothing ran for the call: the allowance had no unit, or the unit was
// released for a call the upstream never worked for (Gate.unsettled). A
// released call the upstream did work for (an error answer, a timeout)
// keeps its event, which is what bounds such work done free.
func (g *Gate) serveFree(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, ex exchange) error {
	f := g.Free
	client := f.client(r)
	if client == "" || f.PerDay == 0 {
		return ex.demand(w, r, http.StatusPaymentRequired, "Payment required", "", nil)
	}
	if !f.servesOrigin(r, g.base) {
		return ex.demand(w, r, http.StatusPaymentRequired, "Payment required: free calls are not served to web pages on other origins; pay, or call from the site itself or without a browser", "", nil)
	}
	var budget rateSpend
	if g.freeRates != nil {
		var wait int
		if budget, wait = g.freeRates.spend(clientAddr(r)); wait > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(wait))
			return ex.demand(w, r, http.StatusPaymentRequired, "Payment required: this client's free calls are used for now; pay, or call free again after Retry-After seconds", "", nil)
		}
	}
	t := now()
	res, err := g.state.Allowance().Reserve(r.Context(), f.Pool, client, t, f.PerDay)
	if err != nil {
		budget.refund()
	}
	if errors.Is(err, store.ErrExhausted) {
		return ex.demand(w, r, http.StatusPaymentRequired, "Payment required: today's free allowance is used", codeFreeTrialExhausted, nil)
	}
	if err != nil {
		return ex.refuse(w, r, apierr.Unavailable("free allowance store", 1, err))
	}
	r.Header.Set(HeaderUpstreamPayment, "free")
	return g.serveCharged(w, r, next, ex, &freeCharge{g: g, res: res, at: t, budget: budget})
}

// setHeaders adds the Free-Allowance-* headers of an answer served from
// reservation res at instant t.
func (f *FreeAllowance) setHeaders(h http.Header, res store.Reservation, t time.Time) {
	// The keys are canonical already: assigned, not canonicalized again.
	// The three values share one array (one allocation, as Header.Clone
	// does); each slice is capped at its one value, so a later Add to one
	// header appends to a copy and never writes over the next one's.
	v := [...]string{strconv.Itoa(res.Remaining), f.perDay, resetsAt(t)}
	h[HeaderFreeRemaining] = v[0:1:1]
	h[HeaderFreeLimit] = v[1:2:2]
	h[HeaderFreeResets] = v[2:3:3]
}

// resetsAt is nextMidnight(t) in RFC 3339, formatted once per UTC day.
func resetsAt(t time.Time) string {
	next := nextMidnight(t)
	if c := resets.Load(); c != nil && c.at.Equal(next) {
		return c.text
	}
	c := &midnight{at: next, text: next.Format(time.RFC3339)}
	resets.Store(c)
	return c.text
}

type midnight struct {
	at   time.Time
	text string
}

var resets atomic.Pointer[midnight]

// codeFreeTrialExhausted is the code of a 402 after the day's free calls.
const codeFreeTrialExhausted = "free_trial_exhausted"

// freeTrial is the free_trial member of an unpaid 402 body (SPEC §7): the
// caller's live allowance.
type freeTrial struct {
	Available      bool   `json:"available"`
	Via            string `json:"via"`
	Transport      string `json:"transport"`
	URL            string `json:"url"`
	Tool           string `json:"tool"`
	CallsPerDay    int    `json:"calls_per_client_per_day"`
	RemainingToday int    `json:"remaining_calls_today"`
	ResetsAt       string `json:"resets_at"`
	Client         string `json:"client"`
	RESTFree       bool   `json:"rest_free"`
	Launch         bool   `json:"launch"`
	Message        string `json:"message"`
	Code           string `json:"code,omitempty"`
}

// trialReadTimeout bounds the read of the caller's allowance for
// free_trial. The member is a hint on an answer that is ready: while the
// store stalls, that answer must not wait for it (the store's own
// timeouts are a second and more). Tests change it.
var trialReadTimeout = 250 * time.Millisecond

// trial reports the caller's allowance as it stands (nil without a free
// allowance). It is nil too when the allowance cannot be read in time (the
// store is down or slow): the member is then left out, since a guess
// would tell a caller with calls left that they are used up
// (free_trial_exhausted), or promise calls the store cannot grant.
func (f *FreeAllowance) trial(r *http.Request, g *Gate) *freeTrial {
	if f == nil {
		return nil
	}
	t := now()
	remaining := 0
	if client := f.client(r); client != "" {
		ctx, cancel := context.WithTimeout(r.Context(), trialReadTimeout)
		n, err := g.state.Allowance().Remaining(ctx, f.Pool, client, t, f.PerDay)
		cancel()
		if err != nil {
			g.logger.Debug("reading the free allowance for free_trial; left out", zap.Error(err))
			return nil
		}
		remaining = n
	}
	url := f.MCPURL
	if url == "" {
		url = siteBase(g.base, r) + "/mcp"
	}
	clientDoc := "identified by request IP address; the same address's REST and MCP verification calls share one allowance"
	if f.Key == "wallet" {
		clientDoc = "identified by the wallet proven with X-Wallet-Auth; the same wallet's REST and MCP verification calls share one allowance"
	}
	ft := &freeTrial{
		Available:      remaining > 0,
		Via:            "mcp+rest",
		Transport:      "streamable-http",
		URL:            url,
		Tool:           f.Tool,
		CallsPerDay:    f.PerDay,
		RemainingToday: remaining,
		ResetsAt:       resetsAt(t),
		Client:         clientDoc,
		RESTFree:       true,
		Launch:         true,
	}
	if ft.Available {
		ft.Message = fmt.Sprintf("You have %d free calls left today: send the request without a payment (at most %d bytes) to use one.", remaining, f.MaxBody)
	} else {
		ft.Code = codeFreeTrialExhausted
		ft.Message = "Today's free calls are used up; pay with x402 using PAYMENT-REQUIRED, or come back after " + ft.ResetsAt + "."
	}
	return ft
}

// statusWriter calls onHeader with the status that starts the answer
// (startsAnswer) just before the header is written, so the gate can add
// headers that depend on the outcome. A handler that hijacks the
// connection (Hijack) starts the answer too.
type statusWriter struct {
	http.ResponseWriter
	status   int
	onHeader func(http.Header, int)
}

// startsAnswer reports whether a header of status code starts the answer:
// a final status, or a protocol switch (101, a websocket), after which the
// connection is the answer. Any other 1xx (100 Continue, 103 Early Hints)
// only goes before the answer.
func startsAnswer(code int) bool {
	return code >= 200 || code == http.StatusSwitchingProtocols
}

func (s *statusWriter) WriteHeader(code int) {
	s.start(code)
	s.ResponseWriter.WriteHeader(code)
}

// start calls onHeader once, for the first header of status code that
// starts the answer.
func (s *statusWriter) start(code int) {
	if s.status == 0 && startsAnswer(code) {
		s.status = code
		s.onHeader(s.ResponseWriter.Header(), code)
	}
}

// Hijack hands the connection to a handler that writes its answer on it
// itself: one that switches protocols as gorilla/websocket's Upgrader
// does, hijacking first and writing its 101 raw, never calls WriteHeader.
// A successful hijack is that protocol switch (startsAnswer): onHeader is
// called then, before the handler has the connection to write on. A
// failed one starts nothing; the handler answers as it would.
// http.ResponseController finds this method before it unwraps the writer.
func (s *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(s.ResponseWriter).Hijack()
	if err == nil {
		s.start(http.StatusSwitchingProtocols)
	}
	return c, rw, err
}

func (s *statusWriter) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.WriteHeader(http.StatusOK)
	}
	return s.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the real writer (flushing).
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
