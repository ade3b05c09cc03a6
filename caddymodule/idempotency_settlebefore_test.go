package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// invalidRequest breaks validate verify_request (no submitted_output);
// invalidArgs are the same as MCP tool arguments.
const invalidRequest = `{"task_id":"t-1","expected_schema":{"type":"object"}}`

var invalidArgs = map[string]any{"task_id": "t-mcp", "expected_schema": map[string]any{"type": "object"}}

// With settle before, a paid call is charged before its upstream runs and
// its answer, streamed, is not kept (over MCP, which settles after the
// result, an answer over max_answer is not kept either). A retry under the
// same payment identifier with the same payment is about that spent
// payment, and the id's table (SPEC §7) answers it: the same request gets
// 409 payment_identifier_answer_not_kept with the first PAYMENT-RESPONSE,
// another request 409 payment_identifier_conflict. When the retried body
// was one the gate's validate refuses, its request check used to answer
// instead: 422 invalid_request, "Nothing was charged; fix the field(s) and
// send it again", carrying the first call's PAYMENT-RESPONSE (the same
// request, which the upstream had answered and the buyer paid for), or
// inviting the spent payment again for a fixed body that the id would then
// refuse (another request). REST and MCP answer alike; nothing is charged
// twice and the upstream runs once. (Over REST an invalid first call is no
// longer settled: settle before checks the request before it settles,
// TestSettleBeforeValidatesBeforeSettling; only MCP, settled after its
// tool's result, can spend a payment on it.)
func TestPaymentIdentifierSettleBeforeRetryOfAnInvalidRequest(t *testing.T) {
	d, fac := sharedDevnet(t)
	payerIdx := 5
	payer := evmfacilitator.DevAccounts()[payerIdx]
	cases := []struct {
		name          string
		first, retry  string         // REST bodies
		firstArgs     map[string]any // MCP arguments
		retryArgs     map[string]any
		code          string
		paymentAnswer bool // the retry carries the first PAYMENT-RESPONSE
		rest          bool // over REST the first call is settled (a valid request)
	}{
		{name: "the same invalid request", first: invalidRequest, retry: invalidRequest,
			firstArgs: invalidArgs, retryArgs: invalidArgs, code: codePaymentIDAnswerNotKept, paymentAnswer: true},
		{name: "another request, invalid", first: validRequest, retry: invalidRequest,
			firstArgs: verifyArgs, retryArgs: invalidArgs, code: codePaymentIDConflict, rest: true},
	}
	for i, tc := range cases {
		t.Run("REST/"+tc.name, func(t *testing.T) {
			up := newUpstream(t)
			base := startCaddy(t, gateSite(up.URL, fac, 0, "settle before\n\t\t\tpayment_identifier"))
			url := base + "/verify/schema"
			before := balance(t, d, payer.Address)
			sig := signWithID(t, paymentRequired(t, post(t, url, "", nil)), payer.Key(), fmt.Sprintf("pay_settle_before_retry_%d", i))
			if !tc.rest {
				// Never settled: the first call and its retry are
				// the request's own 422, and nothing is paid.
				for _, body := range []string{tc.first, tc.retry} {
					resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig, "X-Test-Status": "422"})
					if code := idemCode(t, resp); resp.StatusCode != http.StatusUnprocessableEntity || code != "invalid_request" || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
						t.Fatalf("status %d, %s; want 422 invalid_request without PAYMENT-RESPONSE", resp.StatusCode, code)
					}
				}
				if got := charged(t, d, payer.Address, before); got.Sign() != 0 || up.calls.Load() != 0 {
					t.Fatalf("charged %v, upstream ran %d times; want 0, never", got, up.calls.Load())
				}
				return
			}
			// The upstream refuses the call, after the payment settled:
			// the answer goes out, and is not kept.
			first := post(t, url, tc.first, map[string]string{x402.HeaderPaymentSignature: sig, "X-Test-Status": "422"})
			tx := settlementOf(t, first).Transaction
			again := post(t, url, tc.retry, map[string]string{x402.HeaderPaymentSignature: sig})
			m := readJSON(t, again)
			if again.StatusCode != http.StatusConflict || m["code"] != tc.code || m["charged"] != false {
				t.Fatalf("retry: status %d, %v; want 409 %s, charged false", again.StatusCode, m, tc.code)
			}
			if pr := again.Header.Get(x402.HeaderPaymentResponse); tc.paymentAnswer != (pr != "") || (pr != "" && settlementOf(t, again).Transaction != tx) {
				t.Fatalf("retry: PAYMENT-RESPONSE %q, want the first settlement's: %v", pr, tc.paymentAnswer)
			}
			if got := charged(t, d, payer.Address, before); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
				t.Fatalf("charged %v, upstream ran %d times; want 20000, once", got, up.calls.Load())
			}
		})
		t.Run("MCP/"+tc.name, func(t *testing.T) {
			up := newMCPUpstream(t)
			base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[2]s
			facilitator http %[1]s
			store badger {data}/gate
			validate verify_request
			payment_identifier {
				max_answer 16
			}
		}
		reverse_proxy %[3]s
	}
}
`, fac, payTo.Hex(), strings.TrimPrefix(up.URL, "http://")))
			s := mcpSession(t, base+"/mcp")
			pr := demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil))
			before := balance(t, d, payer.Address)
			p, err := x402.SignExactEVM(payer.Key(), pr.Accepts[0], &pr.Resource, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(withPaymentID(t, pr, p, fmt.Sprintf("pay_settle_before_mcp_%d", i)))
			var obj map[string]any
			json.Unmarshal(b, &obj)
			meta := mcp.Meta{mcpMetaPayment: obj}
			// The tool answers (it does not check what validate checks),
			// the call is charged, and its answer is too large to keep.
			if first := callTool(t, s, "verify_schema", tc.firstArgs, meta); first.IsError {
				t.Fatalf("first call: %+v", first)
			}
			res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: tc.retryArgs, Meta: meta})
			if err != nil {
				t.Fatalf("retry: not a tool result: %v", err)
			}
			if c := toolErrorOf(t, res); c["code"] != tc.code || c["charged"] != false || c["status"] != float64(http.StatusConflict) {
				t.Fatalf("retry: %v; want 409 %s, charged false (as over REST)", c, tc.code)
			}
			if got := charged(t, d, payer.Address, before); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
				t.Fatalf("charged %v, tool ran %d times; want 20000, once", got, up.calls.Load())
			}
		})
	}
}
