package caddymodule

import (
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

const corsOrigin = "http://app.example:3000"

// corsSite is a site with x402_cors in front of a priced route, a route
// whose upstream is down (handle_errors answers 503) and a free route.
func corsSite(up, fac, cors string) string {
	return fmt.Sprintf(`:{port} {
	%[4]s
	route /score/* {
		wallet_auth optional {
			store badger {data}/wallet
			domains 127.0.0.1:{port}
		}
		x402 {
			accept devnet $0.01 %[3]s
			route "GET /score/{agent_id}"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
	route /down {
		reverse_proxy 127.0.0.1:1
	}
	route /free {
		reverse_proxy %[1]s
	}
	handle_errors 502 {
		header Content-Type application/json
		header Retry-After 5
		respond `+"`"+`{"code":"upstream_unavailable"}`+"`"+` 503
	}
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex(), cors)
}

func corsDo(t *testing.T, method, url string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
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

// wantCORS fails t unless resp lets corsOrigin read it and the headers in
// expose.
func wantCORS(t *testing.T, what string, resp *http.Response, expose ...string) {
	t.Helper()
	if got := resp.Header.Get("Access-Control-Allow-Origin"); got != corsOrigin {
		t.Errorf("%s: Access-Control-Allow-Origin %q, want %q", what, got, corsOrigin)
	}
	if resp.Header.Get("Access-Control-Allow-Credentials") != "" {
		t.Errorf("%s: credentials allowed though off by default", what)
	}
	exp := strings.ToLower(strings.Join(resp.Header.Values("Access-Control-Expose-Headers"), ","))
	for _, h := range expose {
		if !strings.Contains(exp, strings.ToLower(h)) {
			t.Errorf("%s: Access-Control-Expose-Headers %q lacks %s", what, exp, h)
		}
	}
	if !headerHasToken(resp.Header, "Vary", "Origin") {
		t.Errorf("%s: Vary %q lacks Origin", what, resp.Header.Values("Vary"))
	}
}

// TestCORSThroughCaddy: a preflight is answered 204 before wallet_auth and
// the gate (the upstream never sees it), and every answer to an allowed
// origin, the gate's 402, a paid 200 and a handle_errors 503, carries the
// allow and expose headers; another origin gets none.
func TestCORSThroughCaddy(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, corsSite(up.URL, fac, "x402_cors "+corsOrigin))

	pre := corsDo(t, http.MethodOptions, base+"/score/agent-1", map[string]string{
		"Origin":                         corsOrigin,
		"Access-Control-Request-Method":  "POST",
		"Access-Control-Request-Headers": "payment-signature,content-type,x-wallet-auth,sign-in-with-x",
	})
	if pre.StatusCode != http.StatusNoContent {
		t.Fatalf("preflight: status %d, want 204", pre.StatusCode)
	}
	wantCORS(t, "preflight", pre)
	if m := pre.Header.Get("Access-Control-Allow-Methods"); !strings.Contains(m, "POST") || !strings.Contains(m, "GET") {
		t.Errorf("preflight: Access-Control-Allow-Methods %q", m)
	}
	allowHdr := strings.ToLower(pre.Header.Get("Access-Control-Allow-Headers"))
	for _, h := range []string{"payment-signature", "x-wallet-auth", "sign-in-with-x", "content-type"} {
		if !strings.Contains(allowHdr, h) {
			t.Errorf("preflight: Access-Control-Allow-Headers %q lacks %s", allowHdr, h)
		}
	}
	if pre.Header.Get("Access-Control-Max-Age") != "600" {
		t.Errorf("preflight: Access-Control-Max-Age %q, want 600", pre.Header.Get("Access-Control-Max-Age"))
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("the preflight reached the upstream (%d calls)", n)
	}

	// With an h2c offer (curl --http2 to an http:// URL), the same
	// preflight and the same grants: the offer is no switch. (Before: not
	// taken for a preflight, answered 204 by the gate without grants.)
	h2c := corsDo(t, http.MethodOptions, base+"/score/agent-1", map[string]string{
		"Origin":                         corsOrigin,
		"Access-Control-Request-Method":  "POST",
		"Access-Control-Request-Headers": "payment-signature,content-type,x-wallet-auth,sign-in-with-x",
		"Connection":                     "Upgrade, HTTP2-Settings",
		"Upgrade":                        "h2c",
		"HTTP2-Settings":                 "AAMAAABkAAQCAAAAAAIAAAAA",
	})
	for _, k := range []string{"Access-Control-Allow-Origin", "Access-Control-Allow-Methods", "Access-Control-Allow-Headers", "Access-Control-Max-Age"} {
		if h2c.StatusCode != pre.StatusCode || h2c.Header.Get(k) != pre.Header.Get(k) {
			t.Errorf("preflight with an h2c offer: %d, %s %q; without it: %d, %q", h2c.StatusCode, k, h2c.Header.Get(k), pre.StatusCode, pre.Header.Get(k))
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("a preflight with an h2c offer reached the upstream (%d calls)", n)
	}

	// Another origin's preflight: answered, but grants nothing.
	other := corsDo(t, http.MethodOptions, base+"/score/agent-1", map[string]string{
		"Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
	})
	if other.StatusCode != http.StatusNoContent || other.Header.Get("Access-Control-Allow-Origin") != "" || other.Header.Get("Access-Control-Allow-Headers") != "" {
		t.Errorf("other origin's preflight: status %d, headers %v", other.StatusCode, other.Header)
	}

	origin := map[string]string{"Origin": corsOrigin}
	resp := corsDo(t, http.MethodGet, base+"/score/agent-1", origin)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unpaid: status %d, want 402", resp.StatusCode)
	}
	wantCORS(t, "402", resp, x402.HeaderPaymentRequired, x402.HeaderPaymentResponse, HeaderFreeRemaining, HeaderFreeLimit, HeaderFreeResets, "Retry-After")
	pr := paymentRequired(t, resp)

	payer := evmfacilitator.DevAccounts()[3].Address
	before := balance(t, d, payer)
	paid := corsDo(t, http.MethodGet, base+"/score/agent-1", map[string]string{"Origin": corsOrigin, x402.HeaderPaymentSignature: signFor(t, pr, 3)})
	if paid.StatusCode != http.StatusOK || paid.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("paid: status %d, headers %v", paid.StatusCode, paid.Header)
	}
	wantCORS(t, "paid 200", paid, x402.HeaderPaymentResponse)
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(10000)) != 0 {
		t.Errorf("payer paid %v, want 10000", got)
	}

	down := corsDo(t, http.MethodGet, base+"/down", origin)
	if down.StatusCode != http.StatusServiceUnavailable || down.Header.Get("Retry-After") != "5" {
		t.Fatalf("down: status %d, headers %v", down.StatusCode, down.Header)
	}
	wantCORS(t, "handle_errors 503", down, "Retry-After")

	free := corsDo(t, http.MethodGet, base+"/free", origin)
	wantCORS(t, "free 200", free, x402.HeaderPaymentRequired)

	// No Origin (not a browser's cross-origin call), or another origin: no
	// allow header.
	for _, hdr := range []map[string]string{nil, {"Origin": "http://evil.example"}} {
		r := corsDo(t, http.MethodGet, base+"/score/agent-1", hdr)
		if r.StatusCode != http.StatusPaymentRequired || r.Header.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("origin %v: status %d, Access-Control-Allow-Origin %q", hdr, r.StatusCode, r.Header.Get("Access-Control-Allow-Origin"))
		}
	}
}

// TestCORSAnyOriginAndCredentials: "*" answers "*", without credentials;
// credentials go with named origins only, each echoed (browsers refuse
// "*" with credentials). "*" with credentials is refused at provision
// (TestCORSConfigErrors).
func TestCORSAnyOriginAndCredentials(t *testing.T) {
	for _, tc := range []struct {
		cfg, want, creds string
	}{
		{"*", "*", ""},
		{corsOrigin + " {\n\t\tcredentials\n\t}", corsOrigin, "true"},
	} {
		c := new(CORS)
		tokens := "x402_cors " + tc.cfg
		if err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tokens)); err != nil {
			t.Fatalf("%s: %v", tokens, err)
		}
		if err := c.Provision(caddy.Context{}); err != nil {
			t.Fatal(err)
		}
		if got := c.allowed(corsOrigin); got != tc.want {
			t.Errorf("%s: allowed %q, want %q", tokens, got, tc.want)
		}
		h := http.Header{}
		c.mark(h, c.allowed(corsOrigin))
		if h.Get("Access-Control-Allow-Credentials") != tc.creds {
			t.Errorf("%s: Access-Control-Allow-Credentials %q", tokens, h.Get("Access-Control-Allow-Credentials"))
		}
	}
}

func TestCORSConfigErrors(t *testing.T) {
	for _, tc := range []struct{ cfg, want string }{
		{"x402_cors", "name the allowed origins"},
		{"x402_cors https://app.example/path", "no path"},
		{"x402_cors ftp://app.example", "http or https"},
		{"x402_cors app.example", "http or https"},
		{"x402_cors * {\n\tmax_age soon\n}", "max_age"},
		{"x402_cors * {\n\tmethods\n}", "wrong argument count"},
		{"x402_cors * {\n\tcolour red\n}", "unknown option"},
		{"x402_cors * {\n\tmethods GET,POST\n}", "not an HTTP method"},
		{"x402_cors * {\n\tcredentials\n}", "`origins *` cannot be combined with `credentials`"},
		{"x402_cors https://app.example * {\n\tcredentials\n}", "`origins *` cannot be combined with `credentials`"},
		{"x402_cors {\n\torigins *\n\tcredentials\n}", "`origins *` cannot be combined with `credentials`"},
	} {
		c := new(CORS)
		err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.cfg))
		if err == nil {
			err = c.Provision(caddy.Context{})
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.cfg, err, tc.want)
		}
	}
	// The order: x402_cors runs before wallet_auth and x402 whatever the
	// order in the file.
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":8080 {\n\trespond 200\n\twallet_auth optional\n\tx402_cors *\n}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if c, w := strings.Index(string(js), `"x402_cors"`), strings.Index(string(js), `"wallet_auth"`); c < 0 || w < 0 || c > w {
		t.Errorf("x402_cors is not ordered before wallet_auth: %s", js)
	}
}

// An origin configured with its scheme's default port is the origin
// browsers send without it (they never write :443 on https or :80 on
// http); configured as written it would allow no page. Another port is
// another origin.
func TestCORSOriginWithDefaultPort(t *testing.T) {
	c := new(CORS)
	if err := c.UnmarshalCaddyfile(caddyfile.NewTestDispenser("x402_cors https://app.example.com:443 http://shop.example.com:80 https://admin.example.com:8443")); err != nil {
		t.Fatal(err)
	}
	if err := c.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	for origin, want := range map[string]string{
		"https://app.example.com":        "https://app.example.com",
		"http://shop.example.com":        "http://shop.example.com",
		"https://admin.example.com:8443": "https://admin.example.com:8443",
		"https://admin.example.com":      "",
		"http://app.example.com":         "",
		"https://shop.example.com":       "",
	} {
		if got := c.allowed(origin); got != want {
			t.Errorf("Origin %s: allowed %q, want %q", origin, got, want)
		}
	}
}

// TestCORSHeadersSurviveTheNextHandler: a handler that replaces the CORS
// headers (an upstream's own Access-Control-Allow-Origin, the gate's
// Expose-Headers, a Vary without Origin) gets them set again when it
// writes, by Write, WriteHeader or io.Copy.
func TestCORSHeadersSurviveTheNextHandler(t *testing.T) {
	c := &CORS{Origins: []string{corsOrigin}}
	if err := c.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	for name, write := range map[string]func(http.ResponseWriter){
		"Write":       func(w http.ResponseWriter) { w.Write([]byte("x")) },
		"WriteHeader": func(w http.ResponseWriter) { w.WriteHeader(http.StatusTeapot) },
		"ReadFrom":    func(w http.ResponseWriter) { io.Copy(w, io.LimitReader(strings.NewReader("x"), 1)) },
	} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("Origin", corsOrigin)
		err := c.ServeHTTP(rec, req, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			h := w.Header()
			h.Set("Access-Control-Allow-Origin", "*")
			h.Set("Access-Control-Expose-Headers", "X-Own")
			h.Set("Vary", "Accept-Encoding")
			write(w)
			return nil
		}))
		if err != nil {
			t.Fatal(err)
		}
		h := rec.Result().Header
		exp := h.Get("Access-Control-Expose-Headers")
		if h.Get("Access-Control-Allow-Origin") != corsOrigin || !strings.Contains(exp, "X-Own") || !strings.Contains(exp, x402.HeaderPaymentRequired) || !headerHasToken(h, "Vary", "Origin") {
			t.Errorf("%s: headers %v", name, h)
		}
	}
}
