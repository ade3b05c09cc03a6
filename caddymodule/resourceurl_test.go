package caddymodule

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// The two URLs the gateway builds from what a client sends: the resource
// URL of a 402 (PAYMENT-REQUIRED) and the route URLs of /.well-known/x402.

// get sends a GET with the given Host (none: the URL's) and headers.
func getWith(t *testing.T, url, host string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// postPaidOn POSTs the valid verification request to url as sent to
// host (one process serving several gateways by name), with sig as its
// PAYMENT-SIGNATURE when it is not empty.
func postPaidOn(t *testing.T, url, host, sig string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	if sig != "" {
		req.Header.Set(x402.HeaderPaymentSignature, sig)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// TestResourceURLLeavesOutTheQuery: the 402 names the route's URL without
// the request's query, so an unpaid client cannot make PAYMENT-REQUIRED
// grow with what it sends (a 7 KB query made a 16.5 KB header, past the
// header limit of many proxies and clients). A payment signed for that
// 402 is still accepted on the retry, query and all, and settled.
func TestResourceURLLeavesOutTheQuery(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, ""))
	long := base + "/score/agent-1?q=" + strings.Repeat("x", 7000)

	short := getWith(t, base+"/score/agent-1", "", nil)
	resp := getWith(t, long, "", nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("status %d, want 402", resp.StatusCode)
	}
	pr := paymentRequired(t, resp)
	if pr.Resource.URL != base+"/score/agent-1" {
		t.Errorf("resource.url %.120q, want %s (the route's URL, without the query)", pr.Resource.URL, base+"/score/agent-1")
	}
	if got, want := len(resp.Header.Get(x402.HeaderPaymentRequired)), len(short.Header.Get(x402.HeaderPaymentRequired)); got != want {
		t.Errorf("PAYMENT-REQUIRED is %d bytes with a 7 KB query, %d without: it grows with the query", got, want)
	}
	body, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(body), "xxxxxxxx") {
		t.Errorf("the 402 body repeats the query (%d bytes)", len(body))
	}

	payer := evmfacilitator.DevAccounts()[5].Address
	before := balance(t, d, payer)
	paid := getWith(t, long, "", map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 5)})
	if paid.StatusCode != http.StatusOK || paid.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("paid retry: status %d, PAYMENT-RESPONSE %q", paid.StatusCode, paid.Header.Get(x402.HeaderPaymentResponse))
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(10000)) != 0 {
		t.Fatalf("charged %v, want 10000", got)
	}
}

// longURLSite is a priced route with a free allowance of one call a day
// under a prefix, so a request can carry a path of any length, and the
// same offer without an allowance at /probe, whose 402 a payment is
// signed from.
func longURLSite(up, fac, extra string) string {
	return fmt.Sprintf(`:{port} {
	route /score/* {
		x402 {
			accept devnet $0.01 %[3]s
			route "GET /score/{agent_id}"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			free_allowance {
				pool long
				per_day 1
			}
			%[4]s
		}
		reverse_proxy %[1]s
	}
	route /probe {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
	x402_discovery /.well-known/x402
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex(), extra)
}

// TestOverlongURLIsRefusedBeforePayment: a request whose URL (without its
// query) is longer than a resource URL may be is 414 uri_too_long in the
// error shape, before any payment logic: its payment is neither claimed
// nor charged, no free call is spent, the upstream never runs, and the
// answer repeats nothing of the request.
func TestOverlongURLIsRefusedBeforePayment(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, longURLSite(up.URL, fac, ""))
	sig := signFor(t, paymentRequired(t, getWith(t, base+"/probe", "", nil)), 8)
	payer := evmfacilitator.DevAccounts()[8].Address
	before := balance(t, d, payer)

	longPath := base + "/score/" + strings.Repeat("a", 3000)
	cases := []struct {
		desc, url, host string
		hdr             map[string]string
	}{
		{"a long path with a payment", longPath, "", map[string]string{x402.HeaderPaymentSignature: sig}},
		{"a long path without one", longPath, "", nil},
		{"a long Host", base + "/score/agent-1", strings.Repeat("h", 3000) + ".example", nil},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			resp := getWith(t, tc.url, tc.host, tc.hdr)
			raw, _ := io.ReadAll(resp.Body)
			var e struct {
				Code    string `json:"code"`
				Status  int    `json:"status"`
				Charged bool   `json:"charged"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(raw, &e); err != nil {
				t.Fatalf("status %d, body not JSON: %.200s", resp.StatusCode, raw)
			}
			if resp.StatusCode != http.StatusRequestURITooLong || e.Code != "uri_too_long" || e.Status != 414 || e.Charged {
				t.Fatalf("status %d, body %.300s; want 414 uri_too_long, charged false", resp.StatusCode, raw)
			}
			if !strings.Contains(e.Message, "2048") || strings.Contains(string(raw), "aaaa") || strings.Contains(string(raw), "hhhh") {
				t.Errorf("message %q: it must name the limit and repeat nothing of the request", e.Message)
			}
			if resp.Header.Get(x402.HeaderPaymentRequired) != "" || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
				t.Error("a refused URL got payment headers")
			}
		})
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("the upstream ran %d times", n)
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("a refused URL was charged")
	}
	// The day's one free call is still there, and the payment was never
	// claimed: it pays for a request the route can name.
	if resp := getWith(t, base+"/score/agent-1", "", nil); resp.StatusCode != 200 || resp.Header.Get(HeaderFreeRemaining) != "0" {
		t.Fatalf("free call: status %d, remaining %q; the refusals must not spend it", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
	}
	if resp := getWith(t, base+"/score/agent-1", "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("the payment sent with a refused URL: status %d, want it still good: %.400s", resp.StatusCode, b)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(10000)) != 0 {
		t.Fatalf("charged %v, want 10000 once", got)
	}
}

// TestPublicBaseURLNamesEveryURLOfTheDemand: with public_base_url every
// URL a 402 names is on the site's origin, whatever Host the request
// carries, and the resource URL leaves out the query: the resource, the sign-in-with-x challenge (whose uri must be
// on its domain, so the domain defaults to the public origin's host) and
// free_trial.url. With siwx naming another site, the challenge is for
// that site, on the public origin's scheme.
func TestPublicBaseURLNamesEveryURLOfTheDemand(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	for _, tc := range []struct{ siwx, domain, uri string }{
		{"siwx", "verify.example.com", "https://verify.example.com/verify/schema"},
		{"siwx localhost:8443", "localhost:8443", "https://localhost:8443/verify/schema"},
	} {
		base := startCaddy(t, gateSite(up.URL, fac, 0, "public_base_url https://verify.example.com/\n\t\t\t"+tc.siwx))
		req, err := http.NewRequest(http.MethodPost, base+"/verify/schema?x=1", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = "attacker.example"
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("%s: status %d, want 402", tc.siwx, resp.StatusCode)
		}
		pr := paymentRequired(t, resp)
		if got := pr.Resource.URL; got != "https://verify.example.com/verify/schema" {
			t.Errorf("%s: resource.url %q", tc.siwx, got)
		}
		ext, _ := pr.Extensions["sign-in-with-x"].(map[string]any)
		info, _ := ext["info"].(map[string]any)
		if info == nil || info["domain"] != tc.domain || info["uri"] != tc.uri {
			t.Errorf("%s: sign-in-with-x challenge %v, want domain %s and uri %s", tc.siwx, info, tc.domain, tc.uri)
		}
		body, _ := io.ReadAll(resp.Body)
		var m struct {
			FreeTrial struct {
				URL string `json:"url"`
			} `json:"free_trial"`
		}
		if err := json.Unmarshal(body, &m); err != nil || m.FreeTrial.URL != "https://verify.example.com/mcp" {
			t.Errorf("%s: free_trial.url %q (%v), want https://verify.example.com/mcp", tc.siwx, m.FreeTrial.URL, err)
		}
		header, _ := json.Marshal(pr)
		if strings.Contains(string(body)+string(header), "attacker.example") {
			t.Errorf("%s: the 402 names the client's Host", tc.siwx)
		}
	}
}

// TestDiscoveryPublicBaseURL: with public_base_url every URL of the
// manifest is on that origin, whatever Host the request carries, so the
// publicly cached manifest cannot be poisoned with another host's URLs.
func TestDiscoveryPublicBaseURL(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	site := strings.Replace(gateSite(up.URL, fac, 3, ""), "x402_discovery /.well-known/x402",
		"x402_discovery /.well-known/x402 {\n\t\tpublic_base_url {env.AOV_TEST_PUBLIC_BASE}\n\t}", 1)
	t.Setenv("AOV_TEST_PUBLIC_BASE", "https://Verify.Example.com/")
	base := startCaddy(t, site)
	resp := getWith(t, base+"/.well-known/x402", "attacker.example", nil)
	var doc discoveryDoc
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Items) != 2 || doc.Items[0].Resource != "https://verify.example.com/score/:agent_id" || doc.Items[1].Resource != "https://verify.example.com/verify/schema" {
		t.Fatalf("items %+v, want the routes on https://verify.example.com", doc.Items)
	}
	if cc := resp.Header.Get("Cache-Control"); cc != "public, max-age=60" {
		t.Errorf("Cache-Control %q, want public, max-age=60", cc)
	}
}

// TestDiscoveryWithoutPublicBaseURLIsNotSharedCacheable: without
// public_base_url the manifest's URLs come from the request's Host, so no
// shared cache may keep one client's copy for another.
func TestDiscoveryWithoutPublicBaseURLIsNotSharedCacheable(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 3, ""))
	resp := getWith(t, base+"/.well-known/x402", "attacker.example", nil)
	var doc discoveryDoc
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Items) == 0 || !strings.HasPrefix(doc.Items[0].Resource, "http://attacker.example/") {
		t.Fatalf("items %+v", doc.Items)
	}
	cc := resp.Header.Get("Cache-Control")
	if strings.Contains(cc, "public") || !strings.Contains(cc, "private") {
		t.Errorf("Cache-Control %q for Host-derived URLs, want private", cc)
	}
	if resp.Header.Get("Vary") != "Host" {
		t.Errorf("Vary %q, want Host", resp.Header.Get("Vary"))
	}
}

// TestPublicBaseURLIsAnOrigin: public_base_url is checked when the config
// loads: an http(s) origin, nothing after it; env placeholders expanded.
func TestPublicBaseURLIsAnOrigin(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	for _, bad := range []string{"https://verify.example.com/api", "ftp://verify.example.com", "https://verify.example.com?x=1", "verify.example.com", "https://{http.request.host}", "https://user@verify.example.com"} {
		for _, where := range []string{"gate", "discovery"} {
			t.Run(where+" "+bad, func(t *testing.T) {
				site := longURLSite(up.URL, fac, "public_base_url "+bad)
				if where == "discovery" {
					site = longURLSite(up.URL, fac, "")
					site = strings.Replace(site, "x402_discovery /.well-known/x402", "x402_discovery /.well-known/x402 {\n\t\tpublic_base_url "+bad+"\n\t}", 1)
				}
				wantErr(t, tryLoadCaddy(t, freePort(t), site), "public_base_url")
			})
		}
	}
}

// TestMCPOverlongURLIsAToolError: a priced tool call on an endpoint URL
// over the limit is an isError tool result with uri_too_long, before any
// payment logic: the tool does not run and no free call is spent.
func TestMCPOverlongURLIsAToolError(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, strings.Replace(mcpSite(up.URL, fac, 1), "route /mcp {", "route /mcp* {", 1))
	call := `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t-long","expected_schema":{"type":"object"},"submitted_output":{"ok":true}}}}`
	resp := post(t, base+"/mcp/"+strings.Repeat("m", 3000), call, map[string]string{"Accept": "application/json, text/event-stream"})
	var rpc struct {
		Result struct {
			IsError           bool `json:"isError"`
			StructuredContent struct {
				Code    string `json:"code"`
				Status  int    `json:"status"`
				Charged bool   `json:"charged"`
			} `json:"structuredContent"`
		} `json:"result"`
	}
	raw, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(raw, &rpc); err != nil || !rpc.Result.IsError || rpc.Result.StructuredContent.Code != "uri_too_long" || rpc.Result.StructuredContent.Charged {
		t.Fatalf("status %d, body %.300s; want an isError result with uri_too_long", resp.StatusCode, raw)
	}
	if strings.Contains(string(raw), "mmmm") {
		t.Error("the answer repeats the URL")
	}
	if up.calls.Load() != 0 {
		t.Fatalf("the tool ran %d times", up.calls.Load())
	}
	// The day's free call is still there.
	s := mcpSession(t, base+"/mcp")
	if res := callTool(t, s, "verify_schema", verifyArgs, nil); res.IsError {
		t.Fatalf("the free call after the refusal: %+v", res)
	}
}

// strippedSite prices GET /api/score/{agent_id} and GET /v2/score/{agent_id}
// behind handle_path, which hands the upstream /score/{agent_id} for both:
// every URL the gate names, and the request a payment pays for, must be
// the one the client sent, not the stripped one (another route's URL, or
// none). extra is added to both gates.
func strippedSite(up, fac, extra string) string {
	gate := func(prefix string) string {
		return fmt.Sprintf(`
	handle_path /%[4]s/* {
		x402 {
			accept devnet $0.01 %[3]s
			route "GET /%[4]s/score/{agent_id}"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			%[5]s
		}
		reverse_proxy %[1]s
	}`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex(), prefix, extra)
	}
	return ":{port} {" + gate("api") + gate("v2") + "\n\tx402_discovery /.well-known/x402\n}\n"
}

// TestResourceURLIsThePathTheClientSent: behind handle_path the 402 names
// the URL the client asked for (the priced one, that catalogs record), as
// do the sign-in-with-x challenge's uri and the official paywall's
// currentUrl (the URL the page fetches again with the payment), and
// /.well-known/x402 lists the same URL; a payment signed for it is
// accepted on the retry and settled once.
func TestResourceURLIsThePathTheClientSent(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, strippedSite(up.URL, fac, "siwx\n\t\t\tpaywall official"))
	public := base + "/api/score/agent-1"

	resp := getWith(t, public+"?x=1", "", nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("status %d, want 402", resp.StatusCode)
	}
	pr := paymentRequired(t, resp)
	if pr.Resource.URL != public {
		t.Errorf("resource.url %q, want %q (the URL the client asked for and pays for)", pr.Resource.URL, public)
	}
	ext, _ := pr.Extensions["sign-in-with-x"].(map[string]any)
	info, _ := ext["info"].(map[string]any)
	if info == nil || info["uri"] != public {
		t.Errorf("sign-in-with-x challenge %v, want uri %s", info, public)
	}

	if _, page := getHTML(t, public+"?x=1"); officialConfigOf(t, page).CurrentURL != public+"?x=1" {
		t.Errorf("the paywall page fetches %q again, want %s?x=1", officialConfigOf(t, page).CurrentURL, public)
	}

	var doc discoveryDoc
	if err := json.NewDecoder(getWith(t, base+"/.well-known/x402", "", nil).Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Items) != 2 || doc.Items[0].Resource != base+"/api/score/:agent_id" {
		t.Errorf("discovery items %+v, want %s/api/score/:agent_id first", doc.Items, base)
	}

	payer := evmfacilitator.DevAccounts()[7].Address
	before := balance(t, d, payer)
	paid := getWith(t, public, "", map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 7)})
	if paid.StatusCode != http.StatusOK || paid.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("paid retry: status %d, PAYMENT-RESPONSE %q", paid.StatusCode, paid.Header.Get(x402.HeaderPaymentResponse))
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(10000)) != 0 {
		t.Fatalf("charged %v, want 10000", got)
	}
}

// A request target that is not a path (RFC 9112 §3.2: an opaque
// absolute-form "http:.evil.example/x", the asterisk-form "*", an
// absolute-form without a path) names no resource on this origin: it is
// 400 invalid_request before any payment logic, the upstream not run.
// (Before: it was priced, the paywall's currentUrl public_base_url glued to
// the opaque part, https://site.example.evil.example/x, a host of
// evil.example, and the signed resource not a valid URI.) An absolute-form
// target with a path is the same request as its path.
func TestNonOriginFormTargetIsRefusedBeforePayment(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, `:{port} {
	x402 {
		accept devnet $0.01 `+payTo.Hex()+`
		facilitator http {
			url `+fac+`
		}
		public_base_url https://site.example
		store badger {data}/gate
		paywall official
	}
	reverse_proxy `+strings.TrimPrefix(up.URL, "http://")+`
}
`)
	send := func(target string) (*http.Response, string) {
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: site.example\r\nAccept: text/html\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n", target)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	for _, target := range []string{"http:.evil.example/x?y=1", "*", "http://site.example", "http://site.example?y=1"} {
		resp, body := send(target)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_request"`) || resp.Header.Get(x402.HeaderPaymentRequired) != "" {
			t.Errorf("GET %s: %d %s; want 400 invalid_request, nothing offered", target, resp.StatusCode, body)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("the upstream ran %d times for targets that are not paths", n)
	}
	resp, body := send("http://site.example/x?y=1")
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("GET http://site.example/x?y=1: %d %s; want the 402 offer", resp.StatusCode, body)
	}
	if cfg := officialConfigOf(t, body); cfg.CurrentURL != "https://site.example/x?y=1" || cfg.PaymentRequired.Resource.URL != "https://site.example/x" {
		t.Errorf("absolute-form target: currentUrl %q, resource %q; want https://site.example/x?y=1 and https://site.example/x", cfg.CurrentURL, cfg.PaymentRequired.Resource.URL)
	}
}
