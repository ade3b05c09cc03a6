package caddymodule

import (
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// overStepBudget is a verification request whose schema compiles (the
// compile-only check passes it) but needs more than verifierd's default
// evaluation budget (MaxSchemaSteps, 2^20 steps) on its output: 30 levels
// of allOf over one shared subschema, 2^30 applications to the number 1.
// verifierd refuses it with 422 invalid_request while parsing it.
func overStepBudget() string {
	defs := []string{`"d0":{"type":"number"}`}
	for i := 1; i <= 30; i++ {
		defs = append(defs, fmt.Sprintf(`"d%d":{"allOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]}`, i, i-1, i-1))
	}
	return `{"task_id":"t","expected_schema":{"$defs":{` + strings.Join(defs, ",") + `},"$ref":"#/$defs/d30"},"submitted_output":1}`
}

// With settle before and validate verify_request, a paid request verifierd
// would refuse for its evaluation budget is refused by the gate, which
// evaluates it with verifierd's own code and default budgets once the
// payment verified and before it settles: 422 invalid_request, nothing
// charged, no PAYMENT-RESPONSE, verifierd not run, and the same payment
// then buys a valid request. (Before: the gate only compiled the schema,
// so the payment settled and the buyer paid for verifierd's 422, whose
// body said "charged": false.)
func TestSettleBeforeEvaluatesBeforeSettling(t *testing.T) {
	d, fac := sharedDevnet(t)
	vf := startVerifier(t)
	base := startCaddy(t, gateSite(vf.srv.URL, fac, 0, "settle before"))
	url := base + "/verify/schema"
	body := overStepBudget()
	pr := paymentRequired(t, post(t, url, body, nil)) // compile-only: offered
	payer := evmfacilitator.DevAccounts()[8].Address
	before := balance(t, d, payer)
	sig := signFor(t, pr, 8)
	calls := vf.calls.Load()

	resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	charged := new(big.Int).Sub(before, balance(t, d, payer))
	if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(string(b), `"code":"invalid_request"`) || !strings.Contains(string(b), `"charged":false`) ||
		charged.Sign() != 0 || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("HTTP %d, charged %v (PAYMENT-RESPONSE %t): %.300s\nwant 422 invalid_request with nothing charged, as for any other invalid request under settle before",
			resp.StatusCode, charged, resp.Header.Get(x402.HeaderPaymentResponse) != "", b)
	}
	if !strings.Contains(string(b), "expected_schema") {
		t.Errorf("the refusal does not name expected_schema: %.300s", b)
	}
	if n := vf.calls.Load() - calls; n != 0 {
		t.Errorf("verifierd ran %d times for the refused request", n)
	}
	// The payment was given back: it buys a valid request.
	ok := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if ok.StatusCode != http.StatusOK || ok.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("the payment sent again with a valid request: HTTP %d; want 200 settled", ok.StatusCode)
	}
}
