package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// wantInternalRefusal fails t unless resp is the 500 internal_error of a
// misordered route: the SPEC §6 shape, nothing charged, no settlement
// receipt and none of the upstream's content.
func wantInternalRefusal(t *testing.T, what string, resp *http.Response, body []byte, content string) {
	t.Helper()
	var e apierr.Error
	if resp.StatusCode != http.StatusInternalServerError || json.Unmarshal(body, &e) != nil || e.Code != "internal_error" || e.Charged {
		t.Fatalf("%s: status %d: %.200s", what, resp.StatusCode, body)
	}
	if resp.Header.Get(x402.HeaderPaymentResponse) != "" || strings.Contains(string(body), content) {
		t.Fatalf("%s: a settlement receipt or the paid content went out: %.200s", what, body)
	}
}

// wantLogged fails t unless Caddy's log file has an error line saying fix.
func wantLogged(t *testing.T, logFile, fix string) {
	t.Helper()
	caddy.Stop()
	raw, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if strings.Contains(line, `"level":"error"`) && strings.Contains(line, fix) {
			return
		}
	}
	t.Fatalf("no error logged saying %q:\n%s", fix, raw)
}

// Inside a `route` block directives run in the order written. Written
// before x402, verify_response wraps the gate, which then judged the answer
// before anything verified it: by default it settled and verify_response
// then withheld the output with 502 "charged": false (the buyer paid for
// nothing); with settle_on pass it released the payment and verify_response
// passed the output with a pass receipt (the buyer had the work free). The
// gate now refuses such a request before it claims a payment or spends a
// free unit: 500 internal_error, and an error log naming the fix. The same
// payment then buys the answer once on a correctly ordered route.
func TestVerifyResponseBeforeGateIsRefusedUncharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := strings.TrimPrefix(startAgent(t), "http://")
	vr := func(verifier, opts string) string {
		return fmt.Sprintf(`verify_response {
			schema %s
			rules %s
			enforce_rules
			agent_id seller-7
			verifier_url %s
			%s
		}`, binaries.schemaPath, binaries.rules, verifier, opts)
	}
	gate := func(opts string) string {
		return fmt.Sprintf(`x402 {
			accept devnet $0.05 %s
			facilitator http %s
			store badger {data}/gate
			%s
		}`, payTo.Hex(), fac, opts)
	}
	// INV-7732's invoice fails the rules, INV-7731's passes.
	for _, tc := range []struct {
		desc, verifier, vrOpts, gateOpts string
		payer                            int
	}{
		{"default settle_on, on_fail block", vf.srv.URL, "on_fail block", "", 7},
		{"default settle_on, on_error fail_closed, the verifier down", "http://127.0.0.1:1", "on_error fail_closed", "", 6},
		{"settle_on pass", vf.srv.URL, "", "settle_on pass", 5},
		{"a free allowance", vf.srv.URL, "", "free_allowance {\n\t\t\t\tper_day 5\n\t\t\t}", 3},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			base := startCaddyServers(t, "", logFile, fmt.Sprintf(`:{port} {
	route /invoices/* {
		%[1]s
		%[2]s
		reverse_proxy %[4]s
	}
	route /ok/* {
		uri strip_prefix /ok
		%[3]s
		%[5]s
		reverse_proxy %[4]s
	}
}`, vr(tc.verifier, tc.vrOpts), gate(tc.gateOpts), gate(""), agent, vr(vf.srv.URL, "")))
			payer := evmfacilitator.DevAccounts()[tc.payer].Address
			before := balance(t, d, payer)

			resp, _ := getBody(t, base+"/ok/invoices/INV-7731", nil)
			if resp.StatusCode != http.StatusPaymentRequired {
				t.Fatalf("unpaid, ordered route: status %d", resp.StatusCode)
			}
			sig := signFor(t, paymentRequired(t, resp), tc.payer)
			resp, body := getBody(t, base+"/invoices/INV-7732", map[string]string{x402.HeaderPaymentSignature: sig})
			if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Sign() != 0 {
				t.Fatalf("the misordered route charged %v (status %d: %.120s)", got, resp.StatusCode, body)
			}
			wantInternalRefusal(t, "paid", resp, body, "Acme")
			resp, body = getBody(t, base+"/invoices/INV-7732", nil)
			wantInternalRefusal(t, "unpaid", resp, body, "Acme")

			// Nothing was claimed: the same payment buys the verified
			// answer, once, where x402 comes first.
			resp, body = getBody(t, base+"/ok/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
			if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || resp.Header.Get(HeaderVerificationStatus) != "pass" {
				t.Fatalf("ordered route: status %d, status header %q: %.200s", resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
			}
			if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(50000)) != 0 {
				t.Fatalf("charged %v in all, want 50000", got)
			}
			wantLogged(t, logFile, "write x402 before verify_response")
		})
	}
}

// Two verify_response on one request: the outer one's outcome would
// overwrite the inner one's (a pass over a fail), and the gate settles on
// whichever was recorded last. The inner one refuses instead: 500, nothing
// charged, the payment released, an error log naming the fix.
func TestTwoVerifyResponsesOnOneRequestAreRefused(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	up := newUpstream(t)
	vr := fmt.Sprintf("verify_response {\n\t\t\tschema `{\"type\":\"object\"}`\n\t\t\tverifier_url %s\n\t\t}", vf.srv.URL)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	base := startCaddyServers(t, "", logFile, fmt.Sprintf(`:{port} {
	route /twice/* {
		x402 {
			accept devnet $0.05 %[1]s
			facilitator http %[2]s
			store badger {data}/gate
		}
		%[3]s
		%[3]s
		reverse_proxy %[4]s
	}
	route /once/* {
		x402 {
			accept devnet $0.05 %[1]s
			facilitator http %[2]s
			store badger {data}/gate
		}
		%[3]s
		reverse_proxy %[4]s
	}
}`, payTo.Hex(), fac, vr, strings.TrimPrefix(up.URL, "http://")))
	payer := evmfacilitator.DevAccounts()[8].Address
	before := balance(t, d, payer)
	resp, _ := getBody(t, base+"/once/thing", nil)
	sig := signFor(t, paymentRequired(t, resp), 8)
	resp, body := getBody(t, base+"/twice/thing", map[string]string{x402.HeaderPaymentSignature: sig})
	wantInternalRefusal(t, "two verify_response", resp, body, "paid_content")
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Sign() != 0 {
		t.Fatalf("charged %v", got)
	}
	resp, body = getBody(t, base+"/once/thing", map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderVerificationStatus) != "pass" || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("one verify_response: status %d: %.200s", resp.StatusCode, body)
	}
	wantLogged(t, logFile, "keep one verify_response per request")
}

// A gate that settles before its upstream runs has charged the buyer by
// the time verify_response judges the output. verify_response still
// withholds a failing output (on_fail block) or one it cannot verify
// (on_error fail_closed), but its answer said "nothing was charged" and
// "charged": false although the payment had moved. It now says the
// payment was made (charged: true, PAYMENT-RESPONSE names it) and logs an
// error naming the fix.
func TestVerifyResponseAfterSettleBeforeSaysCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := strings.TrimPrefix(startAgent(t), "http://")
	for _, tc := range []struct {
		desc, verifier, vrOpts, code string
		payer                        int
	}{
		{"on_fail block", vf.srv.URL, "on_fail block", codeOutputFailedVerification, 3},
		{"on_error fail_closed, the verifier down", "http://127.0.0.1:1", "on_error fail_closed", "upstream_unavailable", 2},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			base := startCaddyServers(t, "", logFile, fmt.Sprintf(`:{port} {
	route /invoices/* {
		x402 {
			accept devnet $0.05 %s
			facilitator http %s
			store badger {data}/gate
			settle before
		}
		verify_response {
			schema %s
			rules %s
			enforce_rules
			agent_id seller-7
			verifier_url %s
			%s
		}
		reverse_proxy %s
	}
}`, payTo.Hex(), fac, binaries.schemaPath, binaries.rules, tc.verifier, tc.vrOpts, agent))
			payer := evmfacilitator.DevAccounts()[tc.payer].Address
			before := balance(t, d, payer)
			resp, _ := getBody(t, base+"/invoices/INV-7732", nil)
			sig := signFor(t, paymentRequired(t, resp), tc.payer)
			resp, body := getBody(t, base+"/invoices/INV-7732", map[string]string{x402.HeaderPaymentSignature: sig})
			var e apierr.Error
			if json.Unmarshal(body, &e) != nil || e.Code != tc.code || !e.Charged || e.Retryable || resp.Header.Get("Retry-After") != "" ||
				strings.Contains(e.Message, "nothing was charged") || strings.Contains(e.Message, "retry") || !strings.Contains(e.Message, "not refunded") {
				t.Fatalf("status %d: %.300s", resp.StatusCode, body)
			}
			if resp.Header.Get(x402.HeaderPaymentResponse) == "" || strings.Contains(string(body), "Acme") {
				t.Fatalf("no PAYMENT-RESPONSE, or the withheld output went out: %.300s", body)
			}
			if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(50000)) != 0 {
				t.Fatalf("charged %v, want 50000", got)
			}
			wantLogged(t, logFile, "use settle after")
		})
	}
}

// Behind an mcp_tool gate the upstream's answer is a JSON-RPC message, not
// the agent's output: verify_response would check the envelope against
// the seller's schema, and by the default settle_on pass decide the
// charge on that. It refuses such a request instead (500, nothing
// charged, the upstream never reached) and logs what to do.
func TestVerifyResponseBehindAnMCPGateIsRefused(t *testing.T) {
	_, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	mup := newMCPUpstream(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	base := startCaddyServers(t, "", logFile, fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %s
			facilitator http %s
			store badger {data}/gate
			free_allowance {
				per_day 5
			}
		}
		verify_response {
			schema %s
			agent_id seller-7
			verifier_url %s
		}
		reverse_proxy %s
	}
}`, payTo.Hex(), fac, binaries.schemaPath, vf.srv.URL, strings.TrimPrefix(mup.URL, "http://")))
	hdr := map[string]string{"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
	for _, msg := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`,
	} {
		resp := post(t, base+"/mcp", msg, hdr)
		body, _ := io.ReadAll(resp.Body)
		wantInternalRefusal(t, msg[:40], resp, body, "result")
	}
	if n := mup.calls.Load(); n != 0 {
		t.Fatalf("the MCP upstream was reached %d time(s)", n)
	}
	wantLogged(t, logFile, "verify_response runs behind an mcp_tool gate")
}
