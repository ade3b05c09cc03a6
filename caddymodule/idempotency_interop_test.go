package caddymodule

import (
	"math/big"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// paymentIDResult is what interop/payment-identifier.mjs reports.
type paymentIDResult struct {
	Declared            map[string]any `json:"declared"`
	DeclaredIsReference bool           `json:"declaredIsReference"`
	Validation          struct {
		Valid  bool     `json:"valid"`
		Errors []string `json:"errors"`
	} `json:"validation"`
	Required  bool            `json:"required"`
	Extracted string          `json:"extracted"`
	First     fetchResult     `json:"first"`
	Replay    fetchResult     `json:"replay"`
	Second    fetchResult     `json:"second"`
	IDChecks  map[string]bool `json:"idChecks"`
}

// The official @x402/extensions helpers read our declaration as theirs and
// attach an id the gate honours: through the official @x402/fetch wrapper,
// one payment settles; the same payment sent again gets the saved answer
// and the same settlement, with no second charge; a newly signed payment
// under the id is 409; and the official isValidPaymentId agrees with the
// gate's rule on every edge case.
func TestOfficialPaymentIdentifierHelpersRetryIdempotently(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "payment_identifier required"))
	payer := evmfacilitator.DevAccounts()[1]
	before := balance(t, d, payer.Address)
	const id = "pay_official_helper_0000000001"
	ids := []string{id, strings.Repeat("a", 15), strings.Repeat("a", 16), strings.Repeat("Z", 128), strings.Repeat("Z", 129),
		"pay_with.dot_000000", "pay_with space_00000", "pay-dash_and_under_", "pay_ünicode_0000000", "pay_newline_00000\n", "________________"}

	var res paymentIDResult
	interop.Run(t, "payment-identifier.mjs", nil, map[string]any{
		"privateKey": payer.PrivateKeyHex,
		"url":        base + "/verify/schema",
		"body":       validRequest,
		"id":         id,
		"ids":        ids,
	}, &res)

	if !res.DeclaredIsReference || !res.Required {
		t.Errorf("declaration %v is not declarePaymentIdentifierExtension(true)", res.Declared)
	}
	if !res.Validation.Valid || res.Extracted != id {
		t.Errorf("the official helpers read the payment's extension as %+v, id %q", res.Validation, res.Extracted)
	}
	if res.First.Status != 200 || res.First.PaymentResponse == nil || !res.First.PaymentResponse.Success {
		t.Fatalf("first payment: %d %s", res.First.Status, res.First.Body)
	}
	if res.Replay.Status != 200 || res.Replay.Body != res.First.Body || res.Replay.PaymentResponse == nil ||
		res.Replay.PaymentResponse.Transaction != res.First.PaymentResponse.Transaction {
		t.Fatalf("the same payment again: %d %s %+v", res.Replay.Status, res.Replay.Body, res.Replay.PaymentResponse)
	}
	if res.Second.Status != 409 || !strings.Contains(res.Second.Body, codePaymentIDConflict) {
		t.Fatalf("a new payment under the id: %d %s", res.Second.Status, res.Second.Body)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
		t.Fatalf("payer charged %v, upstream ran %d times; want one payment and one run", got, up.calls.Load())
	}
	for _, s := range ids {
		if official, ok := res.IDChecks[s]; !ok || official != x402.ValidPaymentID(s) {
			t.Errorf("id %q: official isValidPaymentId %v (reported %v), ours %v", s, official, ok, x402.ValidPaymentID(s))
		}
	}
}
