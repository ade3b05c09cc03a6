package caddymodule

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// forgedPayments are payments for pr's first offer that anyone makes
// without funds or a key of any worth, by the reason their 402 gives: one
// whose accepted amount ("1") matches no offer, so it never reaches the
// facilitator, and one that matches the offer but authorizes 1 unit of
// it, which the facilitator refuses.
func forgedPayments(t *testing.T, pr x402.PaymentRequired) map[string]x402.PaymentPayload {
	t.Helper()
	cheap := pr.Accepts[0]
	cheap.Amount = "1"
	unmatched, err := x402.SignExactEVM(evmfacilitator.DevKey(9), cheap, &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	refused := unmatched
	refused.Accepted = pr.Accepts[0]
	return map[string]x402.PaymentPayload{"no_matching_requirements": unmatched, x402.ReasonSpecValueMismatch: refused}
}

// A request carrying a payment is checked as a paid call's work (no
// unpaid compile slot, no turn of its client) only once the facilitator
// verified its payment. One that matches no offer or that the facilitator
// refuses costs its maker nothing, so the 402 answering it is bounded as
// an unpaid request's: with every gateway compile slot busy it is the
// offer unchecked, with its client's turn taken the 503 after
// precheckWait. (Before: the request was compiled at once whenever its
// PAYMENT-SIGNATURE decoded, past every bound, here answering 422 with
// every slot busy; one address's 24 such compile-heavy requests were all
// compiled at once, +381 MiB of heap against +129 MiB unpaid, and under
// settle before even a payment that matched no offer was compiled before
// the facilitator was asked.)
func TestAForgedPaymentsRequestCheckIsBoundedAsUnpaid(t *testing.T) {
	_, fac := sharedDevnet(t)
	for _, settle := range []string{"settle after", "settle before"} {
		t.Run(settle, func(t *testing.T) {
			up := newUpstream(t)
			base := startCaddy(t, gateSite(up.URL, fac, 0, settle))
			url := base + "/verify/schema"
			for kind, forged := range forgedPayments(t, paymentRequired(t, post(t, url, "", nil))) {
				header, err := x402.EncodeHeader(forged)
				if err != nil {
					t.Fatal(err)
				}
				t.Run(kind+", every compile slot busy", func(t *testing.T) {
					holdCompileSlots(t)
					t0 := time.Now()
					resp := post(t, url, invalidRequest, map[string]string{x402.HeaderPaymentSignature: header})
					took := time.Since(t0)
					body := readAll(t, resp)
					if resp.StatusCode != http.StatusPaymentRequired || took < precheckSlotWait {
						t.Fatalf("%d after %v: %.200s; want the unchecked 402 after precheckSlotWait (%v)", resp.StatusCode, took, body, precheckSlotWait)
					}
					var demand paymentRequiredBody
					if err := json.Unmarshal(body, &demand); err != nil || demand.Reason != kind || !strings.Contains(demand.Error, uncheckedNote) {
						t.Errorf("402 %.300s; want reason %s, its message saying the request was not checked", body, kind)
					}
				})
				t.Run(kind+", its client's turn taken", func(t *testing.T) {
					shortenPrecheckWait(t, 300*time.Millisecond)
					holdTurn(t, "127.0.0.1")
					t0 := time.Now()
					resp := post(t, url, invalidRequest, map[string]string{x402.HeaderPaymentSignature: header})
					took := time.Since(t0)
					body := readAll(t, resp)
					if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"verification_timeout"`) || took < precheckWait {
						t.Errorf("%d after %v: %.200s; want 503 verification_timeout after precheckWait (%v)", resp.StatusCode, took, body, precheckWait)
					}
				})
			}
			if n := up.calls.Load(); n != 0 {
				t.Errorf("the upstream ran %d times", n)
			}
		})
	}
}

// The same over MCP: a verify_schema call whose _meta carries a forged
// payment is checked as an unpaid call is, with every gateway compile slot
// busy answered by the offer, unchecked. (Before: it was compiled at once,
// and answered invalid_request.)
func TestAForgedMCPPaymentsRequestCheckIsBoundedAsUnpaid(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 0))
	s := mcpSession(t, base+"/mcp")
	invalid := map[string]any{"task_id": "t-mcp", "expected_schema": map[string]any{"type": "object"}}
	for kind, forged := range forgedPayments(t, demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil))) {
		t.Run(kind, func(t *testing.T) {
			b, _ := json.Marshal(forged)
			var payment map[string]any
			if err := json.Unmarshal(b, &payment); err != nil {
				t.Fatal(err)
			}
			holdCompileSlots(t)
			res := callTool(t, s, "verify_schema", invalid, mcp.Meta{mcpMetaPayment: payment})
			got, _ := json.Marshal(res.StructuredContent)
			var pr x402.PaymentRequired
			if err := json.Unmarshal(got, &pr); err != nil || len(pr.Accepts) == 0 || !strings.Contains(pr.Error, uncheckedNote) {
				t.Errorf("an invalid call with a forged payment, every compile slot busy: %.300s; want the offer, saying the call was not checked", got)
			}
		})
	}
}
