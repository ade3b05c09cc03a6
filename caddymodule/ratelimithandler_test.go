package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// send makes one request from the client named by hdr's X-Forwarded-For
// (the test servers trust 127.0.0.1 as a proxy) and returns the answer
// with its body read.
func send(t *testing.T, method, url, body string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func from(ip string) map[string]string { return map[string]string{"X-Forwarded-For": ip} }

// wantRateLimited fails t unless the answer is the contract's 429: code
// rate_limited, retryable, nothing charged, with Retry-After (retryAfter,
// when not "").
func wantRateLimited(t *testing.T, resp *http.Response, body []byte, retryAfter string) {
	t.Helper()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429: %.300s", resp.StatusCode, body)
	}
	if got := resp.Header.Get("Retry-After"); got == "" || (retryAfter != "" && got != retryAfter) {
		t.Fatalf("Retry-After %q, want %q", got, retryAfter)
	}
	var e map[string]any
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("the 429 body is not JSON: %.300s", body)
	}
	if e["code"] != "rate_limited" || e["status"] != 429.0 || e["retryable"] != true || e["charged"] != false ||
		fmt.Sprint(e["retry_after"]) != resp.Header.Get("Retry-After") {
		t.Fatalf("the 429 body is not the contract's: %s", body)
	}
}

// freeRateSite is the free routes of Caddyfile.example with aov_rate_limit
// 3 per minute in one zone, behind x402_cors and a trusted proxy on
// 127.0.0.1 (so a test names its client in X-Forwarded-For).
func freeRateSite(up string) string {
	return fmt.Sprintf(`:{port} {
	x402_cors {
		origins *
	}
	@free path /reputation/* /health
	handle @free {
		aov_rate_limit 3 1m {
			zone free
		}
		reverse_proxy %s
	}
	handle /llms.txt {
		aov_rate_limit 3 1m {
			zone free
		}
		aov_docs
	}
}
`, strings.TrimPrefix(up, "http://"))
}

// The free routes count every request of a client (its resolved IP, an
// IPv6 client per /64) in one zone: past the limit, 429 rate_limited with
// Retry-After before the upstream is reached; other clients are not
// affected; a preflight is still answered by x402_cors; a reload keeps the
// state, one that changes the limits starts from empty; the budget refills
// across the window.
func TestFreeRoutesAreRateLimitedPerClient(t *testing.T) {
	up := newUpstream(t)
	site := freeRateSite(up.URL)
	const proxies = "\t\ttrusted_proxies static 127.0.0.1/32"
	base := startCaddyServers(t, proxies, "", site)

	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now = func() time.Time { return t0 }
	t.Cleanup(func() { now = time.Now })

	a := from("203.0.113.1")
	for _, path := range []string{"/health", "/reputation/agent-1", "/llms.txt"} {
		if resp, body := send(t, http.MethodGet, base+path, "", a); resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s within the limit: %d %.200s", path, resp.StatusCode, body)
		}
	}
	calls := up.calls.Load()
	for _, path := range []string{"/health", "/reputation/agent-1", "/llms.txt"} {
		resp, body := send(t, http.MethodGet, base+path, "", a)
		wantRateLimited(t, resp, body, "20")
	}
	if up.calls.Load() != calls {
		t.Fatalf("the upstream was reached %d times past the limit", up.calls.Load()-calls)
	}

	t.Run("another client is not affected", func(t *testing.T) {
		if resp, _ := send(t, http.MethodGet, base+"/health", "", from("203.0.113.2")); resp.StatusCode != http.StatusOK {
			t.Fatalf("another client: %d", resp.StatusCode)
		}
	})

	t.Run("an IPv6 client is its /64", func(t *testing.T) {
		for i := 1; i <= 3; i++ {
			if resp, _ := send(t, http.MethodGet, base+"/health", "", from(fmt.Sprintf("2001:db8:1:2::%x", i))); resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d of the /64: %d", i, resp.StatusCode)
			}
		}
		resp, body := send(t, http.MethodGet, base+"/health", "", from("2001:db8:1:2:ffff::9"))
		wantRateLimited(t, resp, body, "20")
		if resp, _ := send(t, http.MethodGet, base+"/health", "", from("2001:db8:1:3::1")); resp.StatusCode != http.StatusOK {
			t.Fatalf("the next /64: %d", resp.StatusCode)
		}
	})

	t.Run("a preflight is answered by x402_cors; the 429 is readable cross-origin", func(t *testing.T) {
		hdr := from("203.0.113.1")
		hdr["Origin"] = "https://app.example.com"
		hdr["Access-Control-Request-Method"] = "GET"
		resp, _ := send(t, http.MethodOptions, base+"/health", "", hdr)
		if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "*" {
			t.Fatalf("preflight of a client over its limit: %d, Allow-Origin %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
		}
		delete(hdr, "Access-Control-Request-Method")
		resp, body := send(t, http.MethodGet, base+"/health", "", hdr)
		wantRateLimited(t, resp, body, "20")
		if resp.Header.Get("Access-Control-Allow-Origin") != "*" || !headerHasToken(resp.Header, "Access-Control-Expose-Headers", "Retry-After") {
			t.Fatalf("a page cannot read the 429: Allow-Origin %q, Expose %q", resp.Header.Get("Access-Control-Allow-Origin"), resp.Header.Get("Access-Control-Expose-Headers"))
		}
	})

	// A reload keeps the zone's state.
	loadCaddyServers(t, portOf(t, base), proxies, "", site)
	resp, body := send(t, http.MethodGet, base+"/health", "", a)
	wantRateLimited(t, resp, body, "20")

	// A reload that changes the zone's events or window starts it from
	// empty, as README says (the state is keyed by zone name, events and
	// window): the client has a full budget, and so again after a reload
	// back to the old limits, whose state went with the config.
	for _, limits := range []string{"aov_rate_limit 4 1m", "aov_rate_limit 3 1m"} {
		loadCaddyServers(t, portOf(t, base), proxies, "", strings.ReplaceAll(site, "aov_rate_limit 3 1m", limits))
		if resp, body := send(t, http.MethodGet, base+"/health", "", a); resp.StatusCode != http.StatusOK {
			t.Fatalf("after a reload to %s: %d %.200s, want a full budget", limits, resp.StatusCode, body)
		}
	}
	for i := 0; i < 2; i++ {
		send(t, http.MethodGet, base+"/health", "", a)
	}
	resp, body = send(t, http.MethodGet, base+"/health", "", a)
	wantRateLimited(t, resp, body, "20")

	// The budget refills across the window: one request every 20 s.
	now = func() time.Time { return t0.Add(20 * time.Second) }
	if resp, _ := send(t, http.MethodGet, base+"/reputation/agent-1", "", a); resp.StatusCode != http.StatusOK {
		t.Fatalf("after the refill: %d", resp.StatusCode)
	}
	resp, body = send(t, http.MethodGet, base+"/health", "", a)
	wantRateLimited(t, resp, body, "20")
	if got := up.calls.Load() - calls; got != 10 {
		// another client, three of the /64, the next /64, four after the
		// reloads that changed the limits, the refill
		t.Errorf("the upstream was reached %d times after the limit, want 10", got)
	}
}

// On an MCP endpoint aov_rate_limit runs after the x402 gates: it counts
// the messages they pass on free (initialize, tools/list, notifications,
// unpriced tools, GET and DELETE), while a priced tool call the gate serves,
// from the free allowance or paid, is never counted nor refused: a site
// limit must not stop a buyer who pays.
func TestMCPUnpricedMessagesAreRateLimitedPaidCallsAreNot(t *testing.T) {
	d, fac := sharedDevnet(t)
	mcpUp := newMCPUpstream(t)
	var reached atomic.Int64
	target, _ := url.Parse(mcpUp.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	site := strings.Replace(mcpSite(front.URL, fac, 1), "\t\treverse_proxy", "\t\taov_rate_limit 3 1h\n\t\treverse_proxy", 1)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32", "", site)
	endpoint := base + "/mcp"
	a := from("203.0.113.7")

	unpriced := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`,
	}
	for i, m := range unpriced {
		if resp, body := send(t, http.MethodPost, endpoint, m, a); resp.StatusCode >= 300 {
			t.Fatalf("unpriced message %d within the limit: %d %.300s", i, resp.StatusCode, body)
		}
	}
	n := reached.Load()
	for _, m := range append(unpriced, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"unpriced_tool","arguments":{}}}`) {
		resp, body := send(t, http.MethodPost, endpoint, m, a)
		wantRateLimited(t, resp, body, "")
	}
	resp, body := send(t, http.MethodGet, endpoint, "", a)
	wantRateLimited(t, resp, body, "")
	if reached.Load() != n {
		t.Fatalf("the MCP server was reached %d times past the limit", reached.Load()-n)
	}

	call := func(meta string) (*http.Response, []byte) {
		args, _ := json.Marshal(verifyArgs)
		return send(t, http.MethodPost, endpoint, fmt.Sprintf(`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"verify_schema","arguments":%s%s}}`, args, meta), a)
	}
	// The free allowance's call is served over the limit.
	if resp, body := call(""); resp.StatusCode != http.StatusOK || !servedTool(body) || mcpUp.lastPaid.Load() != "free" {
		t.Fatalf("a free-allowance call over the limit: %d %.300s", resp.StatusCode, body)
	}
	// The gate's demand for payment, then a paid call: served and settled.
	_, body = call("")
	var demand struct {
		Result struct {
			StructuredContent x402.PaymentRequired `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.Unmarshal(body, &demand); err != nil || len(demand.Result.StructuredContent.Accepts) == 0 {
		t.Fatalf("no payment-required result: %.300s", body)
	}
	pr := demand.Result.StructuredContent
	payer := evmfacilitator.DevAccounts()[2].Address
	before := balance(t, d, payer)
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(2), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	payment, _ := json.Marshal(p)
	resp, body = call(fmt.Sprintf(`,"_meta":{"x402/payment":%s}`, payment))
	if resp.StatusCode != http.StatusOK || !servedTool(body) || mcpUp.lastPaid.Load() != "paid" {
		t.Fatalf("a paid call over the limit: %d %.300s", resp.StatusCode, body)
	}
	if got := before.Sub(before, balance(t, d, payer)); got.Int64() != 20000 {
		t.Fatalf("the paid call was charged %v, want 20000", got)
	}
	// Served calls give no budget back: unpriced messages stay limited.
	resp, body = send(t, http.MethodPost, endpoint, unpriced[2], a)
	wantRateLimited(t, resp, body, "")
	// Another client's unpriced messages are not affected.
	if resp, body := send(t, http.MethodPost, endpoint, unpriced[2], from("203.0.113.8")); resp.StatusCode != http.StatusOK {
		t.Fatalf("another client's tools/list: %d %.300s", resp.StatusCode, body)
	}
}

// A client cannot pass as a call the gate serves by sending the header the
// gate tells the upstream: on a route without a gate X-Aov-Payment is the
// client's, and it counts like any request.
func TestFreeRateLimitIgnoresAClientsPaymentHeader(t *testing.T) {
	up := newUpstream(t)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32", "", freeRateSite(up.URL))
	hdr := from("203.0.113.3")
	hdr[HeaderUpstreamPayment] = "paid"
	for range 3 {
		send(t, http.MethodGet, base+"/health", "", hdr)
	}
	resp, body := send(t, http.MethodGet, base+"/health", "", hdr)
	wantRateLimited(t, resp, body, "")
}

func TestFreeRateLimitCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ desc, caddyfile, want string }{
		{"events must be a number", "aov_rate_limit many 1m", "aov_rate_limit events must be a positive number"},
		{"events must be positive", "aov_rate_limit {\n events 0\n}", "aov_rate_limit events must be a positive number"},
		{"the window must be a duration", "aov_rate_limit 5 soon", "aov_rate_limit window must be a positive duration"},
		{"off takes no block", "aov_rate_limit off {\n events 3\n}", "aov_rate_limit off takes no block"},
		{"one argument is not a form", "aov_rate_limit 5", "wrong argument count"},
		{"unknown options are refused", "aov_rate_limit {\n burst 3\n}", "unrecognized aov_rate_limit option 'burst'"},
		{"the documented forms adapt", "aov_rate_limit\naov_rate_limit off\naov_rate_limit 600 1m\naov_rate_limit @x 5 1s {\n zone free\n}\n@x path /x", ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptSiteError(tc.caddyfile), tc.want)
		})
	}
	// The JSON config reaches Provision unchecked: its errors, whole.
	for _, tc := range []struct{ desc, json, want string }{
		{"negative events in JSON", `{"events":-1}`, "aov_rate_limit: events must be positive, not -1"},
		{"a negative window in JSON", `{"events":5,"window":-1000000000}`, "aov_rate_limit: window must be positive, not -1s"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			_, err := ctx.LoadModuleByID("http.handlers.aov_rate_limit", json.RawMessage(tc.json))
			if err == nil || strings.TrimPrefix(err.Error(), "provision http.handlers.aov_rate_limit: ") != tc.want {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// aov_rate_limit counts per client IP like a gate, so a server without
// gates gets the gate's warning too: once, at the first request a trusted
// proxy forwarded, when X-Forwarded-For is read left to right.
func TestFreeRateLimitWarnsOfNonStrictTrustedProxies(t *testing.T) {
	up := newUpstream(t)
	for _, tc := range []struct {
		desc, servers string
		warn          bool
	}{
		{"non-strict", "\t\ttrusted_proxies static 127.0.0.1/32", true},
		{"strict", proxiedClients, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			base := startCaddyServers(t, tc.servers, logFile, freeRateSite(up.URL))
			for i := 1; i <= 3; i++ {
				send(t, http.MethodGet, base+"/health", "", from(fmt.Sprintf("203.0.113.%d, 198.51.100.7", i)))
			}
			caddy.Stop()
			log, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			// Once per handler that saw a forwarded request: here only
			// /health's.
			n := strings.Count(string(log), `"msg":"`+msgLeftmostClientIP+`"`)
			switch {
			case tc.warn && n != 1:
				t.Errorf("the warning was logged %d times, want once:\n%s", n, log)
			case !tc.warn && n != 0:
				t.Errorf("a strict server got the warning:\n%s", log)
			}
		})
	}
}

// TestFreeRateLimitGivesTheProofBack: SPEC §9, a proof whose request is
// refused with a retryable answer is not used up unless the request reached
// an upstream or was answered. aov_rate_limit after wallet_auth answers a
// client past its budget 429 rate_limited, retryable, before anything is
// proxied, and the client's retry of the same request (the same proof)
// after Retry-After is served: in a route, and behind a forward_auth,
// which Caddy's directive order puts first, and whose auth check is no
// upstream of the request. (Before: the 429 kept the nonce wallet_auth had
// claimed, and the retry was refused 401 "nonce was already used"; once it
// gave it back, it still kept it behind a forward_auth.)
func TestFreeRateLimitGivesTheProofBack(t *testing.T) {
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(auth.Close)
	const handlers = `wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		aov_rate_limit 1 1s {
			zone proof_back_%[2]d
		}
		reverse_proxy %[1]s`
	sites := map[string]string{
		"route": "route /api/* {\n\t\t" + handlers + "\n\t}",
		// handle sorts its directives in Caddy's order: forward_auth first.
		"forward_auth first": "handle /api/* {\n\t\t" + handlers + "\n\t\tforward_auth " + strings.TrimPrefix(auth.URL, "http://") + " {\n\t\t\turi /auth\n\t\t}\n\t}",
	}
	n := 0
	for what, site := range sites {
		n++
		up := walletUpstream(t)
		base := startCaddy(t, ":{port} {\n\t"+fmt.Sprintf(site, strings.TrimPrefix(up.URL, "http://"), n)+"\n}\n")
		url := base + "/api/x"
		if st, _, body := walletCall(t, "GET", url, "", nil); st != 200 {
			t.Fatalf("%s: first call (no proof): %d %v, want 200", what, st, body)
		}
		hdr := map[string]string{walletauth.HeaderName: walletProof(t, walletKey(3), "GET", url, nil)}
		st, h, body := walletCall(t, "GET", url, "", hdr)
		if st != http.StatusTooManyRequests || body["retryable"] != true {
			t.Fatalf("%s: second call over aov_rate_limit 1 1s: %d %v, want 429 retryable", what, st, body)
		}
		wait, err := time.ParseDuration(h.Get("Retry-After") + "s")
		if err != nil {
			t.Fatalf("%s: Retry-After %q: %v", what, h.Get("Retry-After"), err)
		}
		time.Sleep(wait)
		st, _, body = walletCall(t, "GET", url, "", hdr)
		if st != 200 || body["wallet"] != walletAddr(3) {
			t.Fatalf("%s: the retry of the same proof after aov_rate_limit's 429 (Retry-After %v, nothing proxied): %d %v, want 200 as %s", what, wait, st, body, walletAddr(3))
		}
	}
}
