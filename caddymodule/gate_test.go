package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// The gate tests run the whole paid flow for real: Caddy in process, the
// project's EVM facilitator settling on the in-process devnet (reached over
// its HTTP facilitator API, as a remote facilitator would be), real Badger
// state, and a real HTTP upstream.

var (
	devnetOnce sync.Once
	devnet     *evmfacilitator.Devnet
	facURL     string
	devnetErr  error
)

// payTo receives every test payment: development account 9.
var payTo = evmfacilitator.DevAccounts()[9].Address

// sharedDevnet starts one devnet and one facilitator server for the test
// binary (the devnet registers its token as the devnet USDC, a process-wide
// fact).
func sharedDevnet(t testing.TB) (*evmfacilitator.Devnet, string) {
	t.Helper()
	devnetOnce.Do(func() {
		devnet, facURL, _, devnetErr = startDevnetFacilitator()
	})
	if devnetErr != nil {
		t.Fatalf("starting devnet: %v", devnetErr)
	}
	return devnet, facURL
}

// startDevnetFacilitator starts a devnet and our facilitator on it over
// HTTP; stop closes both.
func startDevnetFacilitator() (d *evmfacilitator.Devnet, url string, stop func(), err error) {
	d, err = evmfacilitator.StartDevnet(evmfacilitator.DevnetConfig{RPCListen: "127.0.0.1:0"})
	if err != nil {
		return nil, "", nil, err
	}
	f, err := d.NewFacilitator()
	if err != nil {
		d.Close()
		return nil, "", nil, err
	}
	srv := httptest.NewServer(x402.NewFacilitatorHandler(f))
	return d, srv.URL, func() { srv.Close(); d.Close() }, nil
}

// balance reads an address's test USDC balance from the chain, at its
// settled head: a read at latest right after a settlement may still see
// the block before it (evmfacilitator.SettledHead).
func balance(t *testing.T, d *evmfacilitator.Devnet, who common.Address) *big.Int {
	t.Helper()
	head, err := evmfacilitator.SettledHead(context.Background(), d.Client())
	if err != nil {
		t.Fatalf("reading the devnet's head: %v", err)
	}
	token := d.Token()
	data := append(common.FromHex("0x70a08231"), common.LeftPadBytes(who.Bytes(), 32)...)
	out, err := d.Client().CallContract(context.Background(), ethereum.CallMsg{To: &token, Data: data}, head)
	if err != nil {
		t.Fatalf("balanceOf: %v", err)
	}
	return new(big.Int).SetBytes(out)
}

// upstream is a real HTTP server standing in for verifierd or a seller's
// agent: it answers with the status in the X-Test-Status request header and
// echoes what the gateway told it.
type upstream struct {
	*httptest.Server
	calls atomic.Int64
	// during runs inside the upstream call, between verification and
	// settlement of a payment.
	during func()
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.calls.Add(1)
		if u.during != nil {
			u.during()
		}
		status := http.StatusOK
		if s := r.Header.Get("X-Test-Status"); s != "" {
			fmt.Sscan(s, &status)
		}
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(map[string]any{
			"paid_content":      true,
			"payment":           r.Header.Get(HeaderUpstreamPayment),
			"payer":             r.Header.Get(HeaderUpstreamPayer),
			"network":           r.Header.Get(HeaderUpstreamNetwork),
			"answer_by":         r.Header.Get(HeaderUpstreamAnswerBy),
			"settlement":        r.Header.Get(HeaderUpstreamSettlement),
			"wallet":            r.Header.Get(HeaderUpstreamWallet),
			"wallet_agent":      r.Header.Get(HeaderUpstreamWalletAgent),
			"payment_signature": r.Header.Get(x402.HeaderPaymentSignature),
			"body_bytes":        len(body),
		})
	}))
	t.Cleanup(u.Close)
	return u
}

// gateSite is the Caddyfile of the tests: the verify route with validation,
// free allowance and payment; a score route that is never free; discovery.
func gateSite(up, fac string, perDay int, extra string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			description "Verify an agent's JSON output"
			route "POST /verify/schema"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			validate verify_request
			free_allowance {
				pool verify
				per_day %[4]d
				max_body 2KiB
			}
			%[5]s
		}
		reverse_proxy %[1]s
	}
	route /score/* {
		x402 {
			accept {
				network devnet
				price $0.01
				pay_to %[3]s
			}
			route "GET /score/{agent_id}"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
	x402_discovery /.well-known/x402
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex(), perDay, extra)
}

const validRequest = `{"task_id":"t-1","expected_schema":{"type":"object","required":["ok"],"properties":{"ok":{"type":"boolean"}}},"submitted_output":{"ok":true}}`

func post(t *testing.T, url, body string, hdr map[string]string) *http.Response {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(http.MethodPost, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if h := hdr["Host"]; h != "" {
		req.Host = h // Go sends req.Host, never a Host header
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func readJSON(t *testing.T, resp *http.Response) map[string]any {
	t.Helper()
	var m map[string]any
	body, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body is not JSON (%v): %.300s", err, body)
	}
	return m
}

// paymentRequired decodes a 402's PAYMENT-REQUIRED header.
func paymentRequired(t *testing.T, resp *http.Response) x402.PaymentRequired {
	t.Helper()
	h := resp.Header.Get(x402.HeaderPaymentRequired)
	if h == "" {
		t.Fatalf("status %d without PAYMENT-REQUIRED", resp.StatusCode)
	}
	var pr x402.PaymentRequired
	if err := x402.DecodeHeader(h, &pr); err != nil {
		t.Fatalf("PAYMENT-REQUIRED does not decode: %v", err)
	}
	return pr
}

// signFor signs a payment from development account payer for the first
// offer of a 402.
func signFor(t *testing.T, pr x402.PaymentRequired, payer int) string {
	t.Helper()
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(payer), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatalf("signing payment: %v", err)
	}
	h, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestFreeAllowanceThenPayment(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 2, ""))
	url := base + "/verify/schema"

	for i, want := range []string{"1", "0"} {
		resp := post(t, url, validRequest, map[string]string{HeaderUpstreamPayment: "paid", HeaderUpstreamPayer: "0xforged"})
		if resp.StatusCode != 200 {
			t.Fatalf("free call %d: status %d", i+1, resp.StatusCode)
		}
		if got := resp.Header.Get(HeaderFreeRemaining); got != want {
			t.Errorf("free call %d: %s %q, want %q", i+1, HeaderFreeRemaining, got, want)
		}
		if resp.Header.Get(HeaderFreeLimit) != "2" || resp.Header.Get(HeaderFreeResets) == "" {
			t.Errorf("free call %d: allowance headers %v", i+1, resp.Header)
		}
		body := readJSON(t, resp)
		if body["payment"] != "free" || body["payer"] != "" {
			t.Errorf("upstream was told payment=%v payer=%v; client copies must be replaced", body["payment"], body["payer"])
		}
	}

	// The day's allowance is used: 402 with the live free_trial state.
	resp := post(t, url, validRequest, nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("after the allowance: status %d, want 402", resp.StatusCode)
	}
	pr := paymentRequired(t, resp)
	body := readJSON(t, resp)
	trial, _ := body["free_trial"].(map[string]any)
	if trial == nil || trial["available"] != false || trial["code"] != "free_trial_exhausted" || trial["remaining_calls_today"] != float64(0) || trial["calls_per_client_per_day"] != float64(2) {
		t.Fatalf("free_trial %v", body["free_trial"])
	}
	if resp.Header.Get("Cache-Control") != "no-store" || !strings.Contains(resp.Header.Get("Access-Control-Expose-Headers"), "PAYMENT-REQUIRED") {
		t.Errorf("402 headers %v", resp.Header)
	}

	// Paying works: the test USDC moves from payer to payee.
	payer := evmfacilitator.DevAccounts()[1].Address
	before, payeeBefore := balance(t, d, payer), balance(t, d, payTo)
	sig := signFor(t, pr, 1)
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != 200 {
		t.Fatalf("paid call: status %d: %s", resp.StatusCode, readJSON(t, resp))
	}
	var sr x402.SettleResponse
	if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); err != nil || !sr.Success || sr.Transaction == "" {
		t.Fatalf("PAYMENT-RESPONSE %+v (%v)", sr, err)
	}
	body = readJSON(t, resp)
	if body["payment"] != "paid" || !strings.EqualFold(body["payer"].(string), payer.Hex()) || body["network"] != x402.NetworkDevnet {
		t.Errorf("upstream saw %v", body)
	}
	if body["payment_signature"] != "" {
		t.Error("PAYMENT-SIGNATURE was forwarded upstream")
	}
	amount := big.NewInt(20000)
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(amount) != 0 {
		t.Errorf("payer paid %v, want %v", got, amount)
	}
	if got := new(big.Int).Sub(balance(t, d, payTo), payeeBefore); got.Cmp(amount) != 0 {
		t.Errorf("payee received %v, want %v", got, amount)
	}

	// The same payment again is refused and settles nothing.
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusPaymentRequired || readJSON(t, resp)["reason"] != x402.ReasonPaymentAlreadyUsed {
		t.Fatalf("replay: status %d", resp.StatusCode)
	}
}

func TestAllowanceResetsAtUTCMidnight(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 1, ""))
	url := base + "/verify/schema"

	day := time.Date(2026, 11, 29, 23, 59, 0, 0, time.UTC)
	now = func() time.Time { return day }
	t.Cleanup(func() { now = time.Now })

	if resp := post(t, url, validRequest, nil); resp.StatusCode != 200 || resp.Header.Get(HeaderFreeResets) != "2026-11-30T00:00:00Z" {
		t.Fatalf("first call: %d, resets %q", resp.StatusCode, resp.Header.Get(HeaderFreeResets))
	}
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("second call the same day: %d, want 402", resp.StatusCode)
	}
	now = func() time.Time { return day.Add(2 * time.Minute) }
	if resp := post(t, url, validRequest, nil); resp.StatusCode != 200 || resp.Header.Get(HeaderFreeRemaining) != "0" {
		t.Fatalf("after midnight: %d", resp.StatusCode)
	}
}

func TestOrderOfRefusals(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, "max_body 4KiB"))
	url := base + "/verify/schema"
	big := `{"task_id":"t","expected_schema":{},"submitted_output":"` + strings.Repeat("x", 3000) + `"}`

	cases := []struct {
		desc   string
		method string
		body   string
		hdr    map[string]string
		status int
		check  func(t *testing.T, resp *http.Response)
	}{
		{"a body over the absolute limit is 413", "POST", `{"pad":"` + strings.Repeat("x", 5000) + `"}`, nil, 413, func(t *testing.T, resp *http.Response) {
			if m := readJSON(t, resp); m["code"] != "payload_too_large" || !strings.Contains(m["message"].(string), "4096") {
				t.Errorf("body %v", m)
			}
		}},
		{"an invalid request the gate would sell is 422 and never 402", "POST", `{"task_id":"","pad":"` + strings.Repeat("x", 3000) + `"}`, nil, 422, func(t *testing.T, resp *http.Response) {
			m := readJSON(t, resp)
			if m["code"] != "invalid_request" || m["charged"] != false {
				t.Errorf("body %v", m)
			}
			if resp.Header.Get(x402.HeaderPaymentRequired) != "" {
				t.Error("an invalid request was offered for sale")
			}
		}},
		{"malformed JSON is 422 without echoing it", "POST", `{"task_id": "SECRET-INPUT` + strings.Repeat("x", 3000), nil, 422, func(t *testing.T, resp *http.Response) {
			b, _ := io.ReadAll(resp.Body)
			if bytes.Contains(b, []byte("SECRET-INPUT")) {
				t.Errorf("input echoed: %s", b)
			}
		}},
		{"an invalid request with a payment that does not decode is that payment's 400", "POST", `{}`, map[string]string{x402.HeaderPaymentSignature: "bm90IGEgcGF5bWVudA=="}, 400, func(t *testing.T, resp *http.Response) {
			if m := readJSON(t, resp); !strings.HasPrefix(fmt.Sprint(m["error"]), "Invalid payment") {
				t.Errorf("body %v", m)
			}
		}},
		{"a POST with no body is the discovery probe", "POST", "", nil, 402, func(t *testing.T, resp *http.Response) {
			pr := paymentRequired(t, resp)
			if pr.X402Version != 2 || len(pr.Accepts) != 1 || pr.Accepts[0].Amount != "20000" || pr.Accepts[0].Network != x402.NetworkDevnet {
				t.Errorf("PAYMENT-REQUIRED %+v", pr)
			}
			if !strings.HasSuffix(pr.Resource.URL, "/verify/schema") {
				t.Errorf("resource %q", pr.Resource.URL)
			}
			bazaar, _ := pr.Extensions["bazaar"].(map[string]any)
			input, _ := bazaar["info"].(map[string]any)["input"].(map[string]any)
			if input["method"] != "POST" || input["bodyType"] != "json" || bazaar["schema"] == nil {
				t.Errorf("bazaar extension %v", pr.Extensions["bazaar"])
			}
			if n := len(resp.Header.Get(x402.HeaderPaymentRequired)); n > 16<<10 {
				t.Errorf("PAYMENT-REQUIRED is %d bytes, over common client header limits", n)
			}
		}},
		{"a payment that does not decode is 400 with the demand", "POST", validRequest, map[string]string{x402.HeaderPaymentSignature: "%%%"}, 400, func(t *testing.T, resp *http.Response) {
			paymentRequired(t, resp)
		}},
		{"a body too large for the free tier goes to payment", "POST", big, nil, 402, func(t *testing.T, resp *http.Response) {
			if m := readJSON(t, resp); m["free_trial"].(map[string]any)["available"] != true {
				t.Errorf("free_trial %v", m["free_trial"])
			}
		}},
		{"a browser gets a page that still carries the demand", "POST", "", map[string]string{"Accept": "text/html"}, 402, func(t *testing.T, resp *http.Response) {
			paymentRequired(t, resp)
			b, _ := io.ReadAll(resp.Body)
			if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") || !bytes.Contains(b, []byte("$0.02 USDC")) {
				t.Errorf("paywall %s: %.200s", resp.Header.Get("Content-Type"), b)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, url, strings.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json") // as verifierd requires
			for k, v := range tc.hdr {
				req.Header.Set(k, v)
			}
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d, want %d: %.300s", resp.StatusCode, tc.status, b)
			}
			if tc.check != nil {
				tc.check(t, resp)
			}
		})
	}
	if up.calls.Load() != 0 {
		t.Errorf("the upstream was called %d times for refused requests", up.calls.Load())
	}
}

// cacheableUpstream serves every method alike, with the paid content
// marked public for a day: a seller API that expects shared caches in
// front of it.
func cacheableUpstream(t *testing.T) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "public, max-age=86400")
		io.WriteString(w, `{"report":"the paid content"}`)
	}))
	t.Cleanup(u.Close)
	return u
}

// reportSite prices /report (with `route "GET /report"`) and /open (without
// route) in front of up, each with perDay free calls a day.
func reportSite(up, fac string, perDay int) string {
	site := ""
	for _, r := range []struct{ path, route string }{{"/report", `route "GET /report"`}, {"/open", ""}} {
		site += fmt.Sprintf(`
	route %[1]s {
		x402 {
			accept devnet $0.02 %[4]s
			%[2]s
			facilitator http {
				url %[3]s
			}
			store badger {data}/gate
			free_allowance {
				pool %[1]s
				per_day %[5]d
			}
		}
		reverse_proxy %[6]s
	}`, r.path, r.route, fac, payTo.Hex(), perDay, strings.TrimPrefix(up, "http://"))
	}
	return ":{port} {" + site + "\n}\n"
}

// TestFreeAnswerIsNeverStoredByASharedCache: a free answer is the paid
// content, so it goes out with Cache-Control: no-store (and the gate's
// headers exposed) as a paid answer does, whatever the upstream said; a
// shared cache (a CDN in front of the gateway) would otherwise serve it to
// every later buyer of the URL, unpaid.
func TestFreeAnswerIsNeverStoredByASharedCache(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := cacheableUpstream(t)
	base := startCaddy(t, reportSite(up.URL, fac, 1))
	resp, body := getBody(t, base+"/report", nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "0" {
		t.Fatalf("free call: %d %q %s", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining), body)
	}
	if cc := resp.Header.Values("Cache-Control"); !slices.Equal(cc, []string{"no-store"}) {
		t.Fatalf("the free answer goes out with Cache-Control %q, want no-store alone", cc)
	}
	if exp := resp.Header.Get("Access-Control-Expose-Headers"); !strings.Contains(exp, HeaderFreeRemaining) {
		t.Fatalf("Access-Control-Expose-Headers %q does not name %s", exp, HeaderFreeRemaining)
	}
	resp, _ = getBody(t, base+"/report", nil)
	if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get("Cache-Control") != "no-store" {
		t.Fatalf("then: %d, Cache-Control %q", resp.StatusCode, resp.Header.Get("Cache-Control"))
	}
}

// TestOnlyAPreflightIsAnsweredUnpaid: a CORS preflight (Origin and
// Access-Control-Request-Method) is answered by the gate unpaid, as a
// browser can add no payment to it: 204, no body, no CORS grant (that is
// x402_cors's, which answers preflights before the gate), Allow where
// `route` names the methods, and never passed to the upstream, since any
// client can send those two headers. Any other OPTIONS is a request like
// another: 405 with the route's Allow where `route` names the method, and
// priced where no route is named, or an upstream that serves every method
// alike would hand it the paid content.
func TestOnlyAPreflightIsAnsweredUnpaid(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := cacheableUpstream(t)
	base := startCaddy(t, reportSite(up.URL, fac, 0))
	options := func(path string, hdr map[string]string) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodOptions, base+path, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	preflight := map[string]string{"Origin": "https://app.example", "Access-Control-Request-Method": "GET"}
	for path, allow := range map[string]string{"/report": "GET, HEAD", "/open": ""} {
		resp, body := options(path, preflight)
		if resp.StatusCode != http.StatusNoContent || body != "" || resp.Header.Get("Allow") != allow {
			t.Fatalf("preflight of %s: %d Allow %q %q; want 204, Allow %q, no body", path, resp.StatusCode, resp.Header.Get("Allow"), body, allow)
		}
		if acao := resp.Header.Get("Access-Control-Allow-Origin"); acao != "" {
			t.Fatalf("preflight of %s: Access-Control-Allow-Origin %q without x402_cors", path, acao)
		}
		if resp.Header.Get(x402.HeaderPaymentRequired) != "" {
			t.Fatalf("preflight of %s was priced", path)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("a preflight reached the upstream %d times", n)
	}
	for _, hdr := range []map[string]string{nil, {"Access-Control-Request-Method": "GET"}, {"Origin": "https://app.example"}} {
		resp, body := options("/report", hdr)
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" || !strings.Contains(body, `"method_not_allowed"`) {
			t.Fatalf("OPTIONS %v of a route named GET: %d Allow %q %s; want 405 with Allow GET, HEAD", hdr, resp.StatusCode, resp.Header.Get("Allow"), body)
		}
		resp, body = options("/open", hdr)
		if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get(x402.HeaderPaymentRequired) == "" || strings.Contains(body, "paid content") {
			t.Fatalf("OPTIONS %v of a route without route: %d %s; want 402", hdr, resp.StatusCode, body)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("OPTIONS that is not a preflight reached the upstream %d times", n)
	}
}

// TestForgedPreflightGetsNoPaidContent: "preflight" is decided by two
// request headers the client controls. A non-browser client adds them to
// an OPTIONS; were preflights handed to the upstream unpaid, an upstream
// that serves every method alike would return the paid content and the
// gate would relay its body. A preflight needs no body at all.
func TestForgedPreflightGetsNoPaidContent(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := cacheableUpstream(t)
	base := startCaddy(t, reportSite(up.URL, fac, 0)) // no free calls at all
	for _, path := range []string{"/report", "/open"} {
		req, _ := http.NewRequest(http.MethodOptions, base+path, nil)
		req.Header.Set("Origin", "https://attacker.example")
		req.Header.Set("Access-Control-Request-Method", "GET")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), "paid content") {
			t.Errorf("forged preflight of %s: %d, Cache-Control %q, body %s: the paid content, unpaid", path, resp.StatusCode, resp.Header.Get("Cache-Control"), b)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("forged preflights reached the upstream %d times", n)
	}
}

func TestScoreIsNeverFree(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, ""))
	resp, err := testClient.Get(base + "/score/agent-1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("status %d, want 402", resp.StatusCode)
	}
	if pr := paymentRequired(t, resp); pr.Accepts[0].Amount != "10000" {
		t.Errorf("score price %s", pr.Accepts[0].Amount)
	}
}

func TestUpstreamErrorIsNeitherSettledNorCounted(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 1, ""))
	url := base + "/verify/schema"

	// A free call that fails upstream does not use the allowance.
	if resp := post(t, url, validRequest, map[string]string{"X-Test-Status": "500"}); resp.StatusCode != 500 || resp.Header.Get(HeaderFreeRemaining) != "" {
		t.Fatalf("failing free call: %d, remaining %q", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
	}
	if resp := post(t, url, validRequest, nil); resp.StatusCode != 200 || resp.Header.Get(HeaderFreeRemaining) != "0" {
		t.Fatalf("the allowance was consumed by an error: %d %q", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
	}

	// A paid call that fails upstream is not settled; the same payment then
	// works once the upstream recovers.
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[2].Address
	before := balance(t, d, payer)
	sig := signFor(t, pr, 2)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig, "X-Test-Status": "500"})
	if resp.StatusCode != 500 || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("failing paid call: %d, PAYMENT-RESPONSE %q", resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse))
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("an upstream error was charged")
	}
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		t.Fatalf("retry with the same payment: %d", resp.StatusCode)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v after the retry, want 20000", got)
	}
}

func TestFacilitatorDownIsRetryableAndFree(t *testing.T) {
	up := newUpstream(t)
	sharedDevnet(t) // registers the devnet token
	dead := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	base := startCaddy(t, gateSite(up.URL, dead, 1, ""))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 3)})
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if m := readJSON(t, resp); m["code"] != "upstream_unavailable" || m["retryable"] != true || m["charged"] != false {
		t.Errorf("body %v", m)
	}
	if up.calls.Load() != 0 {
		t.Error("the upstream ran without a verified payment")
	}
	// The free allowance is untouched.
	if resp := post(t, url, validRequest, nil); resp.StatusCode != 200 || resp.Header.Get(HeaderFreeRemaining) != "0" {
		t.Fatalf("free call after the outage: %d %q", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
	}
}

func TestSettlementFailureReleasesNoContent(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, ""))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))

	// While the upstream works (after verification, before settlement) the
	// payer spends its whole balance elsewhere: settlement must fail.
	payer := 4
	up.during = func() { drain(t, d, payer) }
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, payer)})
	up.during = nil
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("status %d, want 402: %s", resp.StatusCode, b)
	}
	if bytes.Contains(b, []byte("paid_content")) {
		t.Fatal("paid content released after a failed settlement")
	}
	var sr x402.SettleResponse
	if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); err != nil || sr.Success || sr.Transaction != "" {
		t.Fatalf("PAYMENT-RESPONSE %+v (%v)", sr, err)
	}
}

// drain moves all of a development account's test USDC to account 0, and
// back when the test ends: the devnet is shared by the package's tests,
// and a later one paying from the account would find it empty.
func drain(t *testing.T, d *evmfacilitator.Devnet, i int) {
	t.Helper()
	amount := balance(t, d, evmfacilitator.DevAccounts()[i].Address)
	if err := moveUSDC(d, i, 0, amount); err != nil {
		t.Fatalf("draining account %d: %v", i, err)
	}
	t.Cleanup(func() {
		if err := moveUSDC(d, 0, i, amount); err != nil {
			t.Errorf("refilling account %d: %v", i, err)
		}
	})
}

// moveUSDC transfers amount of the devnet's test USDC between two
// development accounts.
func moveUSDC(d *evmfacilitator.Devnet, from, to int, amount *big.Int) error {
	data := append(common.FromHex("0xa9059cbb"), common.LeftPadBytes(evmfacilitator.DevAccounts()[to].Address.Bytes(), 32)...)
	data = append(data, common.LeftPadBytes(amount.Bytes(), 32)...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	token := d.Token()
	_, err := d.SendTx(ctx, evmfacilitator.DevKey(from), &token, data)
	return err
}

func TestConcurrentReplaysSettleOnce(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, ""))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[5].Address
	before := balance(t, d, payer)
	sig := signFor(t, pr, 5)

	const n = 50
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A 503 that is retryable and charged nothing (on a loaded
			// machine, 50 calls at once can outlast a deadline) is retried
			// as a client does, a few times; any other answer counts.
			for try := 1; ; try++ {
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set(x402.HeaderPaymentSignature, sig)
				resp, err := testClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var e struct {
					Retryable bool  `json:"retryable"`
					Charged   *bool `json:"charged"`
				}
				switch {
				case resp.StatusCode == 200:
					ok.Add(1)
				case resp.StatusCode == http.StatusPaymentRequired:
					refused.Add(1)
				case resp.StatusCode == http.StatusServiceUnavailable && try < 5 &&
					json.Unmarshal(b, &e) == nil && e.Retryable && e.Charged != nil && !*e.Charged:
					t.Logf("try %d: 503 %.200s; again", try, b)
					time.Sleep(time.Second)
					continue
				default:
					t.Errorf("status %d: %.300s", resp.StatusCode, b)
				}
				return
			}
		}()
	}
	wg.Wait()
	if ok.Load() != 1 || refused.Load() != n-1 {
		t.Fatalf("%d served, %d refused; want exactly 1 served", ok.Load(), refused.Load())
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("payer charged %v, want exactly one payment of 20000", got)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times", up.calls.Load())
	}
}

func TestForwardedForFromUntrustedPeerGrantsNothing(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 1, ""))
	url := base + "/verify/schema"
	if resp := post(t, url, validRequest, map[string]string{"X-Forwarded-For": "203.0.113.1"}); resp.StatusCode != 200 {
		t.Fatalf("first call %d", resp.StatusCode)
	}
	// Another claimed address from the same untrusted peer is the same client.
	if resp := post(t, url, validRequest, map[string]string{"X-Forwarded-For": "203.0.113.2"}); resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("a forged X-Forwarded-For bought a second free call: %d", resp.StatusCode)
	}
}

func TestDiscoveryListsLiveRoutes(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 3, ""))
	resp, err := testClient.Get(base + "/.well-known/x402")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc discoveryDoc
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	want := []string{"GET /score/{agent_id}", "POST /verify/schema"}
	if fmt.Sprint(doc.Resources) != fmt.Sprint(want) || len(doc.Items) != 2 {
		t.Fatalf("resources %v", doc.Resources)
	}
	v := doc.Items[1]
	if v.Accepts[0].Amount != "20000" || v.Metadata.FreeAllowance == nil || v.Metadata.FreeAllowance.CallsPerClientPerDay != 3 {
		t.Errorf("verify item %+v", v)
	}
	if doc.Items[0].Metadata.FreeAllowance != nil {
		t.Error("score is listed with a free allowance")
	}
	if doc.Items[0].Resource != base+"/score/:agent_id" || doc.Items[1].Resource != base+"/verify/schema" {
		t.Errorf("item resources %q, %q, want the routes' URLs", doc.Items[0].Resource, doc.Items[1].Resource)
	}
	for _, it := range doc.Items {
		if _, ok := it.Extensions["bazaar"].(map[string]any); !ok {
			t.Errorf("item %s has no bazaar extension: %v", it.Resource, it.Extensions)
		}
	}
}

func TestSettleBeforeStreamsAfterPayment(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "settle before"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)

	// Settled before the upstream runs: an upstream failure is still paid
	// for (the documented trade-off of this mode), and the answer carries
	// PAYMENT-RESPONSE.
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 6), "X-Test-Status": "500"})
	if resp.StatusCode != 500 || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("status %d, PAYMENT-RESPONSE %q", resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse))
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want 20000", got)
	}
}

func TestOversizeUpstreamAnswerIsNotSettled(t *testing.T) {
	d, fac := sharedDevnet(t)
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write(bytes.Repeat([]byte("x"), 64<<10))
	}))
	defer big.Close()
	base := startCaddy(t, gateSite(big.URL, fac, 0, "max_buffer 16KiB"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[7].Address
	before := balance(t, d, payer)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 7)})
	if resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("status %d, want 502", resp.StatusCode)
	}
	if m := readJSON(t, resp); m["code"] != "upstream_response_too_large" || m["charged"] != false {
		t.Errorf("body %v", m)
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("an oversize answer was charged")
	}
}

// TestUnknownSettlementOutcomeNeverAsksToPayAgain puts a fault-injecting
// proxy (a fake, because a facilitator that loses its connection after
// settling cannot be caused otherwise) between the gate and the real
// facilitator: it forwards settle, so the money really moves, then drops the
// reply. The gate must release no content, must not invite a new payment,
// and must refuse the same payment again.
func TestUnknownSettlementOutcomeNeverAsksToPayAgain(t *testing.T) {
	d, fac := sharedDevnet(t)
	lossy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequest(r.Method, fac+r.URL.Path, r.Body)
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer resp.Body.Close()
		if strings.HasSuffix(r.URL.Path, "/settle") {
			io.Copy(io.Discard, resp.Body)
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close() // the reply is lost
			return
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	defer lossy.Close()
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, lossy.URL, 0, ""))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[8].Address
	before := balance(t, d, payer)
	sig := signFor(t, pr, 8)

	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || bytes.Contains(b, []byte("paid_content")) {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if resp.Header.Get(x402.HeaderPaymentRequired) != "" {
		t.Fatal("an unknown settlement outcome asked for a new payment")
	}
	var e map[string]any
	json.Unmarshal(b, &e)
	if e["code"] != "settlement_pending" || e["retryable"] != true {
		t.Errorf("body %s", b)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("the settlement did not go through on chain (charged %v)", got)
	}
	// The same payment cannot be used again while its outcome is unknown
	// (this facilitator cannot tell whether it settled): the retry is told
	// the outcome is still pending, never to pay again.
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusServiceUnavailable || readJSON(t, resp)["code"] != "settlement_pending" || resp.Header.Get(x402.HeaderPaymentRequired) != "" {
		t.Fatalf("retry: status %d", resp.StatusCode)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v after the retry, want exactly one payment", got)
	}
}

func TestSIWXIsAdvertisedInTheDemand(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "siwx"))
	pr := paymentRequired(t, post(t, base+"/verify/schema", "", nil))
	ext, ok := pr.Extensions["sign-in-with-x"].(map[string]any)
	if !ok {
		t.Fatalf("extensions %v", pr.Extensions)
	}
	info, _ := ext["info"].(map[string]any)
	if info == nil || !strings.HasPrefix(base, "http://"+fmt.Sprint(info["domain"])) || !strings.HasSuffix(fmt.Sprint(info["uri"]), "/verify/schema") {
		t.Fatalf("challenge %v", ext)
	}
	if !strings.Contains(fmt.Sprint(ext["supportedChains"]), "eip155:1337") {
		t.Errorf("supported chains %v", ext["supportedChains"])
	}
}

// With a domain, the challenge names the site wallet_auth accepts proofs
// for, whatever Host the client sent.
func TestSIWXChallengeNamesTheConfiguredDomain(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "siwx verify.example.com"))
	req, err := http.NewRequest(http.MethodPost, base+"/verify/schema", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = "attacker.example"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	pr := paymentRequired(t, resp)
	ext, _ := pr.Extensions["sign-in-with-x"].(map[string]any)
	info, _ := ext["info"].(map[string]any)
	if info == nil || info["domain"] != "verify.example.com" {
		t.Fatalf("challenge %v, want the domain verify.example.com", ext)
	}
}

// TestStateSurvivesAReload reloads the config (Caddy provisions the new
// gates before it cleans up the old ones, and Badger locks its folder): the
// day's allowance use and a settled payment's claim must both survive.
func TestStateSurvivesAReload(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	dir := t.TempDir()
	site := strings.ReplaceAll(gateSite(up.URL, fac, 1, ""), "{data}", dir)
	base := startCaddy(t, site)
	url := base + "/verify/schema"
	if resp := post(t, url, validRequest, nil); resp.StatusCode != 200 {
		t.Fatalf("free call: %d", resp.StatusCode)
	}
	pr := paymentRequired(t, post(t, url, "", nil))
	sig := signFor(t, pr, 1)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		t.Fatalf("paid call: %d", resp.StatusCode)
	}

	port, _ := strconv.Atoi(base[strings.LastIndex(base, ":")+1:])
	loadCaddy(t, port, strings.Replace(site, "Verify an agent's JSON output", "Verify an agent's JSON output (reloaded)", 1))

	resp := post(t, url, validRequest, nil)
	if resp.StatusCode != http.StatusPaymentRequired || readJSON(t, resp)["free_trial"].(map[string]any)["remaining_calls_today"] != float64(0) {
		t.Fatalf("after the reload the allowance was fresh again: %d", resp.StatusCode)
	}
	if pr := paymentRequired(t, post(t, url, "", nil)); pr.Resource.Description != "Verify an agent's JSON output (reloaded)" {
		t.Fatalf("the reload did not take: %q", pr.Resource.Description)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusPaymentRequired || readJSON(t, resp)["reason"] != x402.ReasonPaymentAlreadyUsed {
		t.Fatalf("after the reload a settled payment was accepted again: %d", resp.StatusCode)
	}
}

// A stalled upstream is cut at upstream_timeout (the transport here has no
// timeouts of its own): the call fails with 504, the free unit is kept and
// the payment can be sent again.
func TestUpstreamTimeoutBoundsTheWholeCall(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	var stall atomic.Bool
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	up.during = func() {
		if stall.Load() {
			<-release
		}
	}
	base := startCaddy(t, gateSite(up.URL, fac, 1, "upstream_timeout 300ms"))
	url := base + "/verify/schema"

	stall.Store(true)
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("stalled free call: %d, want 504", resp.StatusCode)
	}
	stall.Store(false)
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("the free unit was used by the stalled call: %d", resp.StatusCode)
	}

	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 1)
	stall.Store(true)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusGatewayTimeout || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("stalled paid call: %d, want 504 and no settlement", resp.StatusCode)
	}
	stall.Store(false)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("the same payment after the stall: %d, want 200 and settled", resp.StatusCode)
	}
}

// The upstream of a charged call is told when the gate stops waiting for
// its answer (X-Aov-Answer-By: the upstream_timeout deadline, Unix ms), so
// verifierd can decline to record a verification nobody will deliver; a
// client's copy of the header never reaches it.
func TestUpstreamIsToldWhenTheGateStopsWaiting(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, "upstream_timeout 7s"))
	sent := time.Now()
	resp := post(t, base+"/verify/schema", validRequest, map[string]string{HeaderUpstreamAnswerBy: "99999999999999"})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	got, err := strconv.ParseInt(readJSON(t, resp)["answer_by"].(string), 10, 64)
	if err != nil {
		t.Fatalf("answer_by: %v", err)
	}
	by := time.UnixMilli(got)
	if lo, hi := sent.Add(7*time.Second-time.Second), time.Now().Add(7*time.Second+time.Second); by.Before(lo) || by.After(hi) {
		t.Fatalf("X-Aov-Answer-By %v, want about 7 s after %v", by, sent)
	}
}

// The gate removes a client's copy of every header the gateway tells the
// upstream, on every path (a free call, a paid call in settle before mode,
// which sets no X-Aov-Settlement), without relying on a site-wide strip of
// X-Aov-* (gateSite has none). That includes wallet_auth's X-Aov-Wallet and
// X-Aov-Wallet-Agent on a route without wallet_auth: verifierd would bind
// and authenticate any agent_id for the wallet a client names in them. A
// preflight never reaches the upstream (TestOnlyAPreflightIsAnsweredUnpaid).
func TestGateClearsEveryUpstreamHeaderItOwns(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, "settle before"))
	url := base + "/verify/schema"
	forged := map[string]string{HeaderUpstreamPayment: "paid", HeaderUpstreamPayer: "0xforged",
		HeaderUpstreamNetwork: "eip155:1", HeaderUpstreamAnswerBy: "1", HeaderUpstreamSettlement: "pending",
		HeaderUpstreamWallet: "0x2222222222222222222222222222222222222222", HeaderUpstreamWalletAgent: "victim-agent"}
	if owned := len(upstreamHeaders) + len(walletHeaders); len(forged) != owned {
		t.Fatalf("the test forges %d headers, the gateway owns %d", len(forged), owned)
	}
	with := func(extra map[string]string) map[string]string {
		h := maps.Clone(forged)
		maps.Copy(h, extra)
		return h
	}
	check := func(desc string, m map[string]any, payment string) {
		t.Helper()
		if m["payment"] != payment || m["payer"] == "0xforged" || m["network"] == "eip155:1" || m["answer_by"] == "1" || m["settlement"] != "" ||
			m["wallet"] != "" || m["wallet_agent"] != "" {
			t.Errorf("%s: the upstream was told %v", desc, m)
		}
	}

	resp := post(t, url, validRequest, forged)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("free call: %d", resp.StatusCode)
	}
	check("free call", readJSON(t, resp), "free")

	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 9)
	resp = post(t, url, validRequest, with(map[string]string{x402.HeaderPaymentSignature: sig}))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("paid call: %d", resp.StatusCode)
	}
	check("paid call", readJSON(t, resp), "paid")
}
