package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
)

// TestCORSOnEveryKindOfAnswer: with x402_cors on the site, the answers the
// gateway's own handlers write, not only the 402 and the upstream's 200,
// let the page's origin read them: the gate's refusals (422 before any
// payment, 405, a payment it cannot read), wallet_auth's 401, the browser
// paywall page, and a seller's receipted answers (pass, and a blocked
// fail, whose receipt is in the body); a preflight is answered before wallet_auth required asks for a
// proof.
func TestCORSOnEveryKindOfAnswer(t *testing.T) {
	_, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	x402_cors %[4]s
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			route "POST /verify/schema"
			facilitator http %[2]s
			store badger {data}/gate
			validate verify_request
		}
		reverse_proxy %[1]s
	}
	route /score/* {
		x402 {
			accept devnet $0.01 %[3]s
			route "GET /score/{agent_id}"
			facilitator http %[2]s
			store badger {data}/gate
			paywall official
		}
		reverse_proxy %[1]s
	}
	route /api/* {
		wallet_auth required {
			store badger {data}/wallet
			domains 127.0.0.1:{port}
		}
		reverse_proxy %[1]s
	}
	%[5]s
	%[6]s
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), corsOrigin,
		sellerRoute("/plain", agent, vf, ""), sellerRoute("/block", agent, vf, "on_fail block")))

	pre := corsDo(t, http.MethodOptions, base+"/api/report", map[string]string{
		"Origin": corsOrigin, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "x-wallet-auth",
	})
	if pre.StatusCode != http.StatusNoContent || !strings.Contains(strings.ToLower(pre.Header.Get("Access-Control-Allow-Headers")), "x-wallet-auth") {
		t.Errorf("preflight before wallet_auth required: status %d, headers %v", pre.StatusCode, pre.Header)
	}
	wantCORS(t, "preflight before wallet_auth required", pre)

	origin := func(extra ...string) map[string]string {
		h := map[string]string{"Origin": corsOrigin}
		for i := 0; i+1 < len(extra); i += 2 {
			h[extra[i]] = extra[i+1]
		}
		return h
	}
	postJSON := func(url, body string, hdr map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
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
	for _, tc := range []struct {
		what   string
		resp   func() *http.Response
		status int
		expose []string
	}{
		{"the gate's 422 for an invalid request", func() *http.Response {
			return postJSON(base+"/verify/schema", `{"schema":{"type":"object"}}`, origin())
		}, http.StatusUnprocessableEntity, nil},
		{"the gate's 405 for a wrong method", func() *http.Response {
			return corsDo(t, http.MethodDelete, base+"/verify/schema", origin())
		}, http.StatusMethodNotAllowed, nil},
		{"the gate's answer to a payment it cannot read", func() *http.Response {
			return postJSON(base+"/verify/schema", validRequest, origin(x402.HeaderPaymentSignature, "not base64!"))
		}, 0, []string{x402.HeaderPaymentRequired}},
		{"wallet_auth's 401 for a missing proof", func() *http.Response {
			return corsDo(t, http.MethodGet, base+"/api/report", origin())
		}, http.StatusUnauthorized, nil},
		{"the paywall page a browser gets", func() *http.Response {
			return corsDo(t, http.MethodGet, base+"/score/agent-1", origin("Accept", "text/html"))
		}, http.StatusPaymentRequired, []string{x402.HeaderPaymentRequired}},
		{"a seller's answer with its pass receipt", func() *http.Response {
			return corsDo(t, http.MethodGet, base+"/plain/invoices/INV-7731", origin())
		}, http.StatusOK, []string{HeaderVerificationReceipt, HeaderVerificationStatus}},
		{"a seller's failing answer withheld (its receipt in the body)", func() *http.Response {
			return corsDo(t, http.MethodGet, base+"/block/invoices/INV-7732", origin())
		}, http.StatusBadGateway, nil},
	} {
		t.Run(tc.what, func(t *testing.T) {
			resp := tc.resp()
			if tc.status != 0 && resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if resp.StatusCode < 400 && tc.status == 0 {
				t.Fatalf("status %d for an unreadable payment", resp.StatusCode)
			}
			wantCORS(t, tc.what, resp, tc.expose...)
			for _, h := range tc.expose {
				if h != x402.HeaderPaymentRequired && resp.Header.Get(h) == "" {
					t.Errorf("the answer has no %s to read", h)
				}
			}
		})
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("refused and unpaid requests reached the upstream %d times", n)
	}
}
