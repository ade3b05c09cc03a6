package caddymodule

import (
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/aovhq/aov/apierr"
)

func init() {
	caddy.RegisterModule(RequestRateLimit{})
	httpcaddyfile.RegisterHandlerDirective("aov_rate_limit", parseRequestRateLimit)
	// Its directive order is registered with x402's (caddyfile.go): it
	// must come right after the gate.
}

// RequestRateLimit bounds how many requests one client may make (Caddyfile
// directive `aov_rate_limit`), for the routes no x402 gate guards: the
// free routes (/reputation, /health, the docs, the discovery documents,
// the agent card) each cost little, but without a bound an unpaid client
// can make the gateway and the daemons behind it do unlimited work. Every
// request that reaches it counts one event in its zone; a client with
// Events requests within Window is answered 429 rate_limited with
// Retry-After (the gate's answer, SPEC §6) until its budget refills,
// before any later handler runs. A refused request is not counted, and the
// wallet proofs a wallet_auth before it claimed for the request are given
// back (refusedForNow): the client retries the same request after
// Retry-After.
//
// It is the gate's limiter (RateLimit: a token bucket per client, the same
// client as the gate and the free allowance count, bounded tables, state
// kept across reloads), counting requests instead of refusals, in zones of
// its own: a zone name it shares with a gate's rate_limit is still two
// budgets (zoneRequests).
//
// Behind an x402 gate (the MCP endpoint, where the gate passes initialize,
// tools/list, notifications and unpriced tools on free) it counts only what
// the gate passes on free: a call the gate serves, paid or from the free
// allowance, is neither counted nor refused, since a buyer cannot pay past
// a site limit, and is bounded by the payment and the allowance already.
// That is why the directive is ordered right after x402.
//
// CORS preflights do not reach it where x402_cors is used: x402_cors runs
// before it and answers them itself, without upstream work. They are the
// browser's, one per actual request (which counts), and a 429 to a
// preflight would reach the page as a network error without Retry-After;
// the 429 of the actual request carries the CORS headers, so the page can
// read it and wait.
type RequestRateLimit struct {
	RateLimit

	zone    *rateZone // nil when off
	key     string
	proxies *proxyWatch
	logger  *zap.Logger
}

// CaddyModule returns the Caddy module information.
func (RequestRateLimit) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.aov_rate_limit",
		New: func() caddy.Module { return new(RequestRateLimit) },
	}
}

// Provision loads the zone, shared with every aov_rate_limit naming it
// (and the same events and window), and with the previous config's.
func (h *RequestRateLimit) Provision(ctx caddy.Context) error {
	h.RateLimit.provision()
	if err := h.RateLimit.validate(); err != nil {
		return fmt.Errorf("aov_rate_limit: %v", err)
	}
	if h.Off {
		return nil
	}
	var err error
	if h.zone, h.key, err = loadZone(&h.RateLimit, zoneRequests); err != nil {
		return fmt.Errorf("aov_rate_limit: loading zone: %v", err)
	}
	h.logger = ctx.Logger()
	srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	h.proxies = watchProxies(srv, true, h.logger)
	return nil
}

// Cleanup lets go of the zone; a reload's new config holds it already.
func (h *RequestRateLimit) Cleanup() error {
	if h.zone == nil {
		return nil
	}
	_, err := rateZones.Delete(h.key)
	return err
}

// ServeHTTP counts the request, or answers 429 when its client's budget is
// spent.
func (h *RequestRateLimit) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if h.zone == nil || servedByGate(r) {
		return next.ServeHTTP(w, r)
	}
	h.proxies.check(r)
	if wait := h.zone.take(clientAddr(r)); wait > 0 {
		e := apierr.RateLimited(wait)
		refusedForNow(r, e, h.logger)
		apierr.Write(w, e)
		return nil
	}
	return next.ServeHTTP(w, r)
}

// servedByGate reports whether an x402 gate before the handler is serving
// r as a paid or free-allowance call. The gate says so to the upstream in
// X-Aov-Payment, and only the gate can have set it: the first gate on a
// request (the one that marks varGated) removes every client copy.
func servedByGate(r *http.Request) bool {
	return caddyhttp.GetVar(r.Context(), varGated) != nil && r.Header.Get(HeaderUpstreamPayment) != ""
}

// parseRequestRateLimit parses
//
//	aov_rate_limit [<matcher>] off | [<events> <window>] {
//	    events <n>
//	    window <duration>
//	    zone   <name>
//	}
func parseRequestRateLimit(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	rl := new(RequestRateLimit)
	err := rl.UnmarshalCaddyfile(h.Dispenser)
	return rl, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens, in the
// form of the gate's rate_limit.
func (h *RequestRateLimit) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	return h.RateLimit.unmarshal(d)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*RequestRateLimit)(nil)
	_ caddy.CleanerUpper          = (*RequestRateLimit)(nil)
	_ caddyhttp.MiddlewareHandler = (*RequestRateLimit)(nil)
	_ caddyfile.Unmarshaler       = (*RequestRateLimit)(nil)
)
