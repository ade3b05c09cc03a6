package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// paywallSite prices /score/* with the given paywall option.
func paywallSite(up, fac, option string) string {
	return fmt.Sprintf(`:{port} {
	route /score/* {
		x402 {
			accept devnet $0.01 %[3]s
			description "An agent's trust score"
			route "GET /score/{agent_id}"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			%[4]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex(), option)
}

func getHTML(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	resp, b := getEncoded(t, url, "")
	return resp, string(b)
}

var windowX402 = regexp.MustCompile(`<script>window\.x402 = (\{.*?\});</script>\n</head>`)

// officialConfigOf extracts window.x402 from an official page.
func officialConfigOf(t *testing.T, page string) officialConfig {
	t.Helper()
	m := windowX402.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no window.x402 before </head> in the page (%d bytes): %.300s", len(page), page)
	}
	var cfg officialConfig
	if err := json.Unmarshal([]byte(m[1]), &cfg); err != nil {
		t.Fatalf("window.x402 is not JSON: %v", err)
	}
	return cfg
}

// TestPaywallModesThroughCaddy: official serves the vendored page with the
// live demand, app name and logo in window.x402; static (the default) the
// built-in page; off the JSON 402. Every answer carries PAYMENT-REQUIRED.
func TestPaywallModesThroughCaddy(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, paywallSite(up.URL, fac, "paywall official {\n\t\t\t\tapp_name \"Agent Verifier\"\n\t\t\t\tapp_logo https://example.com/logo.png\n\t\t\t}"))

	resp, page := getHTML(t, base+"/score/agent-1?x=1")
	if resp.StatusCode != http.StatusPaymentRequired || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("official: status %d, %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	pr := paymentRequired(t, resp)
	cfg := officialConfigOf(t, page)
	if cfg.AppName != "Agent Verifier" || cfg.AppLogo != "https://example.com/logo.png" || !cfg.Testnet || cfg.Amount != "0.01" {
		t.Errorf("window.x402 %+v", cfg)
	}
	if cfg.CurrentURL != base+"/score/agent-1?x=1" {
		t.Errorf("currentUrl %q, want the requested URL", cfg.CurrentURL)
	}
	got, _ := json.Marshal(cfg.PaymentRequired)
	want, _ := json.Marshal(pr)
	if !bytes.Equal(got, want) {
		t.Errorf("window.x402.paymentRequired\n%s\nis not PAYMENT-REQUIRED\n%s", got, want)
	}
	if !strings.Contains(page, `<div id="root"></div>`) || len(page) < 1<<20 {
		t.Errorf("not the official page (%d bytes)", len(page))
	}
	// Go's client asks for gzip and decompresses what it gets.
	if !resp.Uncompressed {
		t.Error("the official page was not sent gzipped to a client that accepts gzip")
	}
	notFramable(t, "official", resp)

	// An API client still gets JSON.
	api := corsDo(t, http.MethodGet, base+"/score/agent-1", nil)
	if api.StatusCode != http.StatusPaymentRequired || api.Header.Get("Content-Type") != "application/json" {
		t.Errorf("API client: status %d, %s", api.StatusCode, api.Header.Get("Content-Type"))
	}

	loadCaddy(t, portOf(t, base), paywallSite(up.URL, fac, ""))
	resp, page = getHTML(t, base+"/score/agent-1")
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(page, "is paid per call with") || strings.Contains(page, "window.x402") {
		t.Errorf("default (static): status %d, page %.200s", resp.StatusCode, page)
	}
	paymentRequired(t, resp)
	notFramable(t, "static", resp)

	loadCaddy(t, portOf(t, base), paywallSite(up.URL, fac, "paywall off"))
	resp, page = getHTML(t, base+"/score/agent-1")
	if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get("Content-Type") != "application/json" || !strings.HasPrefix(page, "{") {
		t.Errorf("off: status %d, %s, %.100s", resp.StatusCode, resp.Header.Get("Content-Type"), page)
	}
	paymentRequired(t, resp)
	if n := up.calls.Load(); n != 0 {
		t.Errorf("the upstream was called %d times for unpaid requests", n)
	}
}

// getEncoded GETs url as a browser taking acceptEncoding, and returns the
// answer and its body as sent (Go's client decompresses nothing it did not
// ask for itself; with acceptEncoding "" it asks for gzip and decompresses
// it); a body cut short or longer than its Content-Length is an error.
func getEncoded(t *testing.T, url, acceptEncoding string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/html,application/xhtml+xml")
	req.Header.Set("User-Agent", "Mozilla/5.0")
	if acceptEncoding != "" {
		req.Header.Set("Accept-Encoding", acceptEncoding)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("Accept-Encoding %q: reading the answer (Content-Encoding %q, Content-Length %q, %d bytes read): %v",
			acceptEncoding, resp.Header.Get("Content-Encoding"), resp.Header.Get("Content-Length"), len(b), err)
	}
	return resp, b
}

// TestOfficialPaywallBehindCaddysEncode: with Caddy's encode handler in
// front of the gate, the official page goes out gzipped once, by the gate
// (encode leaves an answer that has its Content-Encoding), even when the
// client prefers another encoding encode would have used; it decompresses
// to the page an identity request gets. A client that takes only another
// encoding gets the page as it is: encode does not compress it for each
// unpaid request (no-transform). The site logs its requests, as
// Caddyfile.example's does (Caddy then records every answer, which must
// not read as a handler keeping the page).
func TestOfficialPaywallBehindCaddysEncode(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	site := paywallSite(up.URL, fac, "paywall official")
	base := startCaddy(t, strings.Replace(site, ":{port} {\n", ":{port} {\n\tlog {\n\t\toutput discard\n\t}\n\tencode zstd gzip\n", 1))
	u := base + "/score/agent-1"

	resp, plain := getEncoded(t, u, "identity")
	if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get("Content-Encoding") != "" {
		t.Fatalf("identity asked: status %d, Content-Encoding %q", resp.StatusCode, resp.Header.Get("Content-Encoding"))
	}
	officialConfigOf(t, string(plain))
	resp, gz := getEncoded(t, u, "zstd, gzip")
	if ce := resp.Header.Values("Content-Encoding"); len(ce) != 1 || ce[0] != "gzip" {
		t.Fatalf("Content-Encoding %q, want gzip once", ce)
	}
	if got := gunzip(t, gz); !bytes.Equal(got, plain) {
		t.Errorf("the gzipped page (%d bytes on the wire) decompresses to %d bytes, not the %d of the page", len(gz), len(got), len(plain))
	}
	if len(gz)*3 > len(plain) {
		t.Errorf("%d bytes on the wire for a page of %d", len(gz), len(plain))
	}
	resp, zs := getEncoded(t, u, "zstd")
	if ce := resp.Header.Get("Content-Encoding"); ce != "" || !bytes.Equal(zs, plain) {
		t.Errorf("zstd alone asked: Content-Encoding %q, %d bytes; want the page as it is (%d bytes)", ce, len(zs), len(plain))
	}
}

// TestOfficialPaywallUnderIntercept: Caddy's intercept in front of the gate
// keeps the page and answers with its handle_response under the gate's
// headers: what it sends must still be readable by a browser taking gzip
// (no Content-Encoding or Content-Length left over from a page it did not
// send), and a page it only gives another status stays readable; for the
// 402 and for the 400 of a malformed payment, which also gets the page.
// README's remedy where an encode sits between them, and another recorder
// that keeps the answer (log_append of the body), are checked too.
func TestOfficialPaywallUnderIntercept(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	site := paywallSite(up.URL, fac, "paywall official")
	base := startCaddy(t, site)
	for _, tc := range []struct {
		name, handle string
		status       int
		body         string // "" : the page
	}{
		{"a page of its own", "handle_response @pay {\n\t\t\t\trespond \"Please pay at /pricing\" 402\n\t\t\t}", 402, "Please pay at /pricing"},
		{"an error", "handle_response @pay {\n\t\t\t\terror \"no\" 403\n\t\t\t}", 403, ""},
		{"another status", "replace_status @pay 403", 403, "the page"},
	} {
		intercepted := strings.Replace(site, "\troute /score/* {\n", "\troute /score/* {\n\t\tintercept {\n\t\t\t@pay status 4xx\n\t\t\t"+tc.handle+"\n\t\t}\n", 1)
		loadCaddy(t, portOf(t, base), intercepted)
		for _, payment := range []string{"", "!!!not-base64!!!"} {
			for _, ae := range []string{"identity", "gzip, deflate, br"} {
				req, _ := http.NewRequest(http.MethodGet, base+"/score/agent-1", nil)
				req.Header.Set("Accept", "text/html")
				req.Header.Set("Accept-Encoding", ae)
				if payment != "" {
					req.Header.Set(x402.HeaderPaymentSignature, payment)
				}
				resp, err := testClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				readable := err == nil && resp.Header.Get("Content-Encoding") == ""
				if readable && tc.body == "the page" {
					readable = windowX402.Match(body)
				} else if readable {
					readable = string(body) == tc.body
				}
				if resp.StatusCode != tc.status || !readable {
					t.Errorf("intercept with %s, payment %q, Accept-Encoding %q: status %d, Content-Encoding %q, Content-Length %q, body %.60q (%d bytes, %v); want %d and %.60q",
						tc.name, payment, ae, resp.StatusCode, resp.Header.Get("Content-Encoding"), resp.Header.Get("Content-Length"), body, len(body), err, tc.status, tc.body)
				}
			}
		}
	}

	// A route that puts encode between intercept and the gate: the
	// handle_response README shows removes the page's headers itself.
	outside := strings.Replace(site, "\troute /score/* {\n", "\troute /score/* {\n\t\tintercept {\n\t\t\t@pay status 4xx\n\t\t\thandle_response @pay {\n"+
		"\t\t\t\theader -Content-Encoding\n\t\t\t\theader -Content-Length\n\t\t\t\trespond \"Please pay at /pricing\" 402\n\t\t\t}\n\t\t}\n\t\tencode gzip\n", 1)
	loadCaddy(t, portOf(t, base), outside)
	if resp, body := getEncoded(t, base+"/score/agent-1", "gzip"); resp.StatusCode != 402 || resp.Header.Get("Content-Encoding") != "" || string(body) != "Please pay at /pricing" {
		t.Errorf("intercept outside encode, its page's headers removed: status %d, Content-Encoding %q, body %.60q", resp.StatusCode, resp.Header.Get("Content-Encoding"), body)
	}
	// log_append of the response body records and keeps every answer: it
	// gets the page uncompressed, and sends it so.
	logged := strings.Replace(site, ":{port} {\n", ":{port} {\n\tlog {\n\t\toutput discard\n\t}\n\tlog_append resp_body {http.response.body}\n", 1)
	loadCaddy(t, portOf(t, base), logged)
	if resp, body := getEncoded(t, base+"/score/agent-1", "gzip"); resp.StatusCode != 402 || resp.Header.Get("Content-Encoding") != "" || !windowX402.Match(body) {
		t.Errorf("log_append of the response body in front: status %d, Content-Encoding %q, %d bytes; want the page uncompressed", resp.StatusCode, resp.Header.Get("Content-Encoding"), len(body))
	}
}

// notFramable checks that a paywall page may not be framed by any site
// (clickjacking a "Pay now" button), in the CSP and the legacy header.
func notFramable(t *testing.T, mode string, resp *http.Response) {
	t.Helper()
	if csp := resp.Header.Get("Content-Security-Policy"); csp != "frame-ancestors 'none'" || resp.Header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("%s paywall: Content-Security-Policy %q, X-Frame-Options %q; want frame-ancestors 'none' and DENY", mode, csp, resp.Header.Get("X-Frame-Options"))
	}
}

func portOf(t *testing.T, base string) int {
	t.Helper()
	var port int
	if _, err := fmt.Sscanf(base[strings.LastIndex(base, ":")+1:], "%d", &port); err != nil {
		t.Fatal(err)
	}
	return port
}

// TestOfficialPaywallConfigCannotCloseTheScript: the demand's resource URL
// (from the request) and the app name cannot end the configuration script.
func TestOfficialPaywallConfigCannotCloseTheScript(t *testing.T) {
	p := &Paywall{Mode: PaywallOfficial, AppName: `</script><script>alert(1)</script>`}
	pr := x402.PaymentRequired{X402Version: 2, Resource: x402.Resource{URL: "http://h/</script><b>"},
		Accepts: []x402.PaymentRequirements{{Scheme: "exact", Network: x402.NetworkDevnet, Amount: "10000", Asset: "0x1", PayTo: "0x2"}}}
	rec := httptest.NewRecorder()
	if err := p.serve(rec, httptest.NewRequest(http.MethodGet, "/", nil), pr, 6, nil, "http://h/\u2028</script>"); err != nil {
		t.Fatal(err)
	}
	page := rec.Body.String()
	cfg := officialConfigOf(t, page)
	if cfg.AppName != p.AppName || cfg.PaymentRequired.Resource.URL != pr.Resource.URL {
		t.Errorf("the values did not survive: %+v", cfg)
	}
	if head := page[:strings.Index(page, "</head>")]; strings.Count(head, "</script>") != 1 || strings.Contains(head, "\u2028") {
		t.Error("the configuration script can be closed or broken by the values it carries")
	}
}

// TestOfficialPaywallPicksThePageOfTheFirstOffer: EVM and Solana get their
// official page; any other network the static page.
func TestOfficialPaywallPicksThePageOfTheFirstOffer(t *testing.T) {
	p := &Paywall{Mode: PaywallOfficial}
	for _, tc := range []struct{ network, want string }{
		{x402.NetworkBase, string(evmPage.rest)},
		{x402.NetworkSolanaDevnet, string(svmPage.rest)},
		{"algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=", "is paid per call with"},
	} {
		rec := httptest.NewRecorder()
		pr := x402.PaymentRequired{X402Version: 2, Accepts: []x402.PaymentRequirements{{Network: tc.network, Amount: "10000"}}}
		if err := p.serve(rec, httptest.NewRequest(http.MethodGet, "/", nil), pr, 6, nil, "http://h/x"); err != nil {
			t.Fatal(err)
		}
		if rec.Code != http.StatusPaymentRequired || !strings.Contains(rec.Body.String(), tc.want[:min(len(tc.want), 4000)]) {
			t.Errorf("%s: status %d, not the expected page", tc.network, rec.Code)
		}
	}
	if bytes.Equal(evmPage.rest, svmPage.rest) {
		t.Fatal("the EVM and Solana pages are the same")
	}
}

func TestPaywallOption(t *testing.T) {
	for _, tc := range []struct{ cfg, want string }{
		{"paywall official", ""},
		{"paywall static", ""},
		{"paywall off", ""},
		{"paywall official {\n\tapp_name \"My shop\"\n\tapp_logo /logo.png\n}", ""},
		{"paywall", "wrong argument count"},
		{"paywall sometimes", "not off, static or official"},
		{"paywall official extra", "wrong argument count"},
		{"paywall official {\n\tapp_logo javascript:alert(1)\n}", "not an http(s) URL"},
		{"paywall official {\n\tcolour red\n}", "unknown option"},
	} {
		d := caddyfile.NewTestDispenser(tc.cfg)
		d.Next()
		_, err := parsePaywall(d)
		wantErr(t, err, tc.want)
	}
	// Through the x402 directive.
	wantErr(t, adaptSiteError("x402 {\n\taccept devnet $0.01 "+payTo.Hex()+"\n\tpaywall official {\n\t\tapp_name Shop\n\t}\n}"), "")
	wantErr(t, adaptSiteError("x402 {\n\taccept devnet $0.01 "+payTo.Hex()+"\n\tpaywall maybe\n}"), "not off, static or official")
}

// TestOfficialPaywallIsVendored: the pages, their version and licence are
// in the binary.
func TestOfficialPaywallIsVendored(t *testing.T) {
	v, _ := officialPages.ReadFile("paywall/VERSION")
	if !regexp.MustCompile(`^@x402/paywall \d+\.\d+\.\d+\nintegrity sha512-[A-Za-z0-9+/=]+\n$`).Match(v) {
		t.Errorf("VERSION %q", v)
	}
	lic, _ := officialPages.ReadFile("paywall/LICENSE")
	notice, _ := officialPages.ReadFile("paywall/NOTICE")
	if !bytes.Contains(lic, []byte("Apache License")) || !bytes.Contains(notice, []byte("@x402/paywall")) {
		t.Error("LICENSE or NOTICE missing")
	}
	for _, p := range []officialPage{evmPage, svmPage} {
		if !bytes.Contains(p.rest, []byte(`id="root"`)) || !bytes.Contains(p.rest, []byte("Bundled license information")) {
			t.Error("a vendored page is not the package's page")
		}
	}
}

type paywallBrowserResult struct {
	Status          int      `json:"status"`
	Encoding        string   `json:"encoding"`
	Text            string   `json:"text"`
	Paid            string   `json:"paid"`
	Balance         string   `json:"balance"`
	OffPageRequests []string `json:"offPageRequests"`
	Refused         []string `json:"refused"`
	Signed          int      `json:"signed"`
	Chains          []string `json:"chains"`
	ConsoleErrors   []string `json:"consoleErrors"`
}

// TestOfficialPaywallPaysInABrowser: headless Chromium opens a priced URL
// and gets the official page, which shows our demand (price, token,
// network). A devnet key behind an injected EIP-1193 provider stands in for
// a wallet extension: the person connects it and presses "Pay now"; the
// page signs once, fetches the URL again with PAYMENT-SIGNATURE and shows
// the paid content. The token moves once, the upstream runs once. The
// page's own calls to the chain go to the devnet's JSON-RPC as they would
// under make run, with the browser enforcing CORS on its answers.
func TestOfficialPaywallPaysInABrowser(t *testing.T) {
	chromium := chromiumPath(t)
	interop.Dir(t, "playwright-core")
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, paywallSite(up.URL, fac, "paywall official {\n\t\t\t\tapp_name \"Agent Verifier\"\n\t\t\t}"))

	key := evmfacilitator.DevKey(5)
	payer := evmfacilitator.DevAccounts()[5].Address
	before, payeeBefore := balance(t, d, payer), balance(t, d, payTo)

	var res paywallBrowserResult
	interop.Run(t, "paywall-browser.mjs", nil, map[string]any{
		"url": base + "/score/agent-1", "chromium": chromium, "rpc": d.RPCURL(),
		"rpcAt": "http://127.0.0.1:8545", "key": fmt.Sprintf("0x%x", crypto.FromECDSA(key)),
	}, &res)
	t.Logf("the page showed:\n%s\nthe balance %q; after paying:\n%s", res.Text, res.Balance, res.Paid)
	if res.Status != http.StatusPaymentRequired || res.Encoding != "gzip" {
		t.Errorf("the page came with status %d, Content-Encoding %q; want 402, gzip", res.Status, res.Encoding)
	}
	for _, want := range []string{"Payment Required", "An agent's trust score", "$0.01", "USD Coin"} {
		if !strings.Contains(res.Text, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	// The page read the payer's token balance on the devnet (viem's
	// formatUnits: no trailing zeros).
	whole := strings.TrimRight(strings.TrimRight(new(big.Rat).SetFrac(before, big.NewInt(1e6)).FloatString(6), "0"), ".")
	if want := "$" + whole + " USD Coin"; res.Balance != want {
		t.Errorf("the page shows the balance %q, want %q", res.Balance, want)
	}
	if res.Signed != 1 {
		t.Errorf("the wallet signed %d times, want once", res.Signed)
	}
	if !strings.Contains(res.Paid, `"paid_content":true`) || !strings.Contains(res.Paid, `"payment":"paid"`) {
		t.Fatalf("after paying the page shows %q", res.Paid)
	}
	amount := big.NewInt(10000)
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(amount) != 0 {
		t.Errorf("payer paid %v, want %v once", got, amount)
	}
	if got := new(big.Int).Sub(balance(t, d, payTo), payeeBefore); got.Cmp(amount) != 0 {
		t.Errorf("payee received %v, want %v", got, amount)
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("the upstream ran %d times, want once", n)
	}
	// The page reads the chain at viem's URL for chain 1337, which the
	// browser reaches on the devnet's real RPC (nothing intercepted, so the
	// devnet's own CORS answers let the page read it); it asks for nothing
	// else off its origin.
	if len(res.Refused) != 0 {
		t.Errorf("the page asked for more than JSON-RPC off its origin: %q", res.Refused)
	}
	for _, u := range res.OffPageRequests {
		if u != "http://127.0.0.1:8545/" {
			t.Errorf("the page called %s, not the chain's RPC", u)
		}
	}
}

// TestOfficialPaywallPaysOnSolanaInABrowser: a priced route whose first
// offer is Solana devnet gets the official Solana page, which shows our
// demand. A devnet keypair behind an injected wallet-standard wallet stands
// in for a wallet extension: the person selects and connects it and presses
// "Pay now"; the page reads the USDC mint and balance and a blockhash from
// the local chain, has the wallet sign the transfer once, fetches the URL
// again with PAYMENT-SIGNATURE and shows the content. The gate settles
// through our Solana facilitator: the buyer's USDC moved once by the price,
// the upstream ran once.
func TestOfficialPaywallPaysOnSolanaInABrowser(t *testing.T) {
	chromium := chromiumPath(t)
	interop.Dir(t, "playwright-core")
	e := newSolanaEnv(t)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /score/* {
		x402 {
			accept solana-devnet $0.01 %s
			description "An agent's trust score"
			route "GET /score/{agent_id}"
			facilitator %s
			store badger {data}/gate
			paywall official {
				app_name "Agent Verifier"
			}
		}
		reverse_proxy %s
	}
}
`, e.payee.Address, e.svmBlock(), strings.TrimPrefix(up.URL, "http://")))
	payerBefore, payeeBefore := e.usdc(t, e.payer.Address), e.usdc(t, e.payee.Address)
	feeBefore := e.chain.Lamports(e.feePay)

	var res paywallBrowserResult
	interop.Run(t, "paywall-browser.mjs", nil, map[string]any{
		"url": base + "/score/agent-1", "chromium": chromium, "rpc": e.chain.URL, "solanaKey": e.payer.SecretKey,
	}, &res)
	t.Logf("the page showed:\n%s\nafter paying:\n%s", res.Text, res.Paid)
	if res.Status != http.StatusPaymentRequired || res.Encoding != "gzip" {
		t.Errorf("the page came with status %d, Content-Encoding %q; want 402, gzip", res.Status, res.Encoding)
	}
	for _, want := range []string{"Payment Required", "An agent's trust score", "$0.01", "Solana Devnet"} {
		if !strings.Contains(res.Text, want) {
			t.Errorf("the page does not show %q", want)
		}
	}
	// The page read the buyer's USDC account on the local chain (1,000 USDC).
	if res.Balance != "$1000 USDC" {
		t.Errorf("the page shows the balance %q, want $1000 USDC", res.Balance)
	}
	if res.Signed != 1 || len(res.Chains) != 1 || res.Chains[0] != "solana:devnet" {
		t.Errorf("the wallet signed %d times on %q, want once on solana:devnet", res.Signed, res.Chains)
	}
	var paid map[string]any
	if err := json.Unmarshal([]byte(res.Paid), &paid); err != nil || paid["paid_content"] != true || paid["payment"] != "paid" ||
		paid["network"] != x402.NetworkSolanaDevnet || paid["payer"] != e.payer.Address {
		t.Fatalf("after paying the page shows %q", res.Paid)
	}
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 10000 {
		t.Errorf("the buyer paid %d, want 10000 once", got)
	}
	if got := e.usdc(t, e.payee.Address) - payeeBefore; got != 10000 {
		t.Errorf("the payee received %d, want 10000", got)
	}
	if e.chain.Lamports(e.feePay) >= feeBefore {
		t.Error("the facilitator's fee payer paid no fee: the payment was not settled by it")
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("the upstream ran %d times, want once", n)
	}
	if len(res.Refused) != 0 {
		t.Errorf("the page asked for more than JSON-RPC off its origin: %q", res.Refused)
	}
	for _, u := range res.OffPageRequests {
		if u != "https://api.devnet.solana.com/" {
			t.Errorf("the page called %s, not the devnet RPC", u)
		}
	}
}

// shownAmount is what the official page writes for "please pay
// $<amount>": the page renders window.x402.amount as a React child, that
// is with JavaScript's String(), run here in node on the page's own
// window.x402.
func shownAmount(t *testing.T, page string) string {
	t.Helper()
	m := windowX402.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no window.x402 before </head> in the page (%d bytes)", len(page))
	}
	out, err := exec.Command("node", "-e", "process.stdout.write(String(JSON.parse(process.argv[1]).amount))", m[1]).Output()
	if err != nil {
		t.Fatalf("node (needed to render window.x402.amount as the page does): %v", err)
	}
	return string(out)
}

// officialPaywallSite is a site whose one route pays a custom token
// (not the network's USDC) priced by the accept lines pricing, behind
// paywall official.
func officialPaywallSite(pricing string) string {
	return fmt.Sprintf(`:{port} {
	route /score/* {
		x402 {
			accept {
				network devnet
				%s
				asset 0x6B175474E89094C44Da98b954EedeAC495271d0F
				asset_name "Dai Stablecoin"
				asset_version 1
				pay_to %s
			}
			route "GET /score/{agent_id}"
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger {data}/gate
			paywall official
		}
		respond "paid"
	}
}
`, pricing, payTo.Hex())
}

// TestOfficialPaywallShowsTheSignedAmount: the official page shows
// "please pay $<window.x402.amount> <token>", and the wallet signs the
// first offer's atomic amount. What the page shows is exactly that amount
// in whole tokens of the offer's decimals, digit for digit: below a
// millionth of a token (no exponent form), with more digits than a
// float64 holds, and priced with amount.
func TestOfficialPaywallShowsTheSignedAmount(t *testing.T) {
	for _, tc := range []struct {
		pricing  string
		decimals int
		want     string
	}{
		{"price $0.02\n\t\t\t\tasset_decimals 18", 18, "0.02"},
		{"price $0.02\n\t\t\t\tasset_decimals 6", 6, "0.02"},
		{"price $0.02\n\t\t\t\tasset_decimals 2", 2, "0.02"},
		{"price $0.0000001\n\t\t\t\tasset_decimals 18", 18, "0.0000001"},
		{"price $0.123456789012345678\n\t\t\t\tasset_decimals 18", 18, "0.123456789012345678"},
		{"price $90071992547.409931\n\t\t\t\tasset_decimals 6", 6, "90071992547.409931"},
		{"amount 20000000000000000\n\t\t\t\tasset_decimals 18", 18, "0.02"},
	} {
		base := startCaddy(t, officialPaywallSite(tc.pricing))
		resp, page := getHTML(t, base+"/score/agent-1")
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("%q: status %d", tc.pricing, resp.StatusCode)
		}
		offer := officialConfigOf(t, page).PaymentRequired.Accepts[0]
		shown := shownAmount(t, page)
		if signed := x402.FormatAmount(offer.Amount, tc.decimals); shown != tc.want || shown != signed {
			t.Errorf("%q: the page shows \"please pay $%s\" for a signed amount of %s atomic units (%s tokens)", tc.pricing, shown, offer.Amount, signed)
		}
	}
}

// TestOfficialPaywallRefusesUnknownDecimals: an offer priced with amount
// on a token whose decimals the config does not give has no price in whole
// tokens the page could show honestly, so `paywall official` with it first
// is refused when the config loads, naming the fix; `paywall static`
// (which states the atomic amount) takes it.
func TestOfficialPaywallRefusesUnknownDecimals(t *testing.T) {
	site := officialPaywallSite("amount 5")
	wantErr(t, tryLoadCaddy(t, freePort(t), site), "paywall official: the first offer is priced with amount and its asset's decimals are unknown")
	base := startCaddy(t, strings.Replace(site, "paywall official", "paywall static", 1))
	if resp, _ := getHTML(t, base+"/score/agent-1"); resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("paywall static: status %d", resp.StatusCode)
	}
}
