package caddymodule

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// copiedFromChain is what a chain observer builds from a settled EVM
// payment sig: the signed payload (payer, nonce, validity and signature,
// the calldata of transferWithAuthorization) in the public
// PAYMENT-REQUIRED's offer and resource, with extensions ext instead of the
// buyer's unsigned ones (nil: none, so no payment identifier).
func copiedFromChain(t *testing.T, sig string, ext map[string]any) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := x402.DecodeHeader(sig, &m); err != nil {
		t.Fatal(err)
	}
	delete(m, "extensions")
	if ext != nil {
		b, err := json.Marshal(ext)
		if err != nil {
			t.Fatal(err)
		}
		m["extensions"] = b
	}
	h, err := x402.EncodeHeader(m)
	if err != nil || h == sig {
		t.Fatalf("copying: %v", err)
	}
	return h
}

// otherPaymentID is the extensions of a payment carrying id.
func otherPaymentID(id string) map[string]any {
	return map[string]any{x402.PaymentIdentifierExtension: map[string]any{"info": map[string]any{"required": false, "id": id}}}
}

// heldForID runs a call with a payment identifier whose settlement reply
// is lost (the transfer made) on a route with extra options, then has its
// payment, copied from the chain without the buyer's id and with another
// id, retried with the buyer's (guessable) request: each copy is refused
// payment_already_used and neither runs the upstream nor is charged; the
// buyer's own retry, with its id, gets the answer the payment bought.
func heldForID(t *testing.T, extra, id string) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", filepath.Join(t.TempDir(), "gate"), extra+"\n\t\t\tpayment_identifier"))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[6]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, paymentRequired(t, post(t, url, "", nil)), payer.Key(), id)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %d", resp.StatusCode)
	}
	calls := up.calls.Load()
	for name, copied := range map[string]string{
		"without an id":   copiedFromChain(t, sig, nil),
		"with another id": copiedFromChain(t, sig, otherPaymentID("pay_a_guess_of_another_id")),
	} {
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: copied})
		if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != x402.ReasonPaymentAlreadyUsed {
			t.Fatalf("the payment copied %s: %d %s", name, resp.StatusCode, reason)
		}
	}
	if n := up.calls.Load(); n != calls {
		t.Fatalf("the copies ran the upstream %d times", n-calls)
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if m := readJSON(t, resp); resp.StatusCode != http.StatusOK || m["paid_content"] != true {
		t.Fatalf("the buyer's retry with its id: %d %v", resp.StatusCode, m)
	}
	settlementOf(t, resp)
	if got := charged(t, d, payer.Address, before); got.Int64() != 20000 {
		t.Fatalf("charged %v", got)
	}
}

// The answer held for an unknown settlement of a call that carried a
// payment identifier is the buyer's: a chain observer who copies the
// payment and guesses the request does not get it.
func TestHeldAnswerOnlyUnderItsPaymentIdentifier(t *testing.T) {
	heldForID(t, "", "pay_held_answer_owner_0001")
}

// The same in settle before mode, where the upstream runs again, once,
// for the retry: the copy does not take that run.
func TestRunAgainOnlyUnderItsPaymentIdentifier(t *testing.T) {
	heldForID(t, "settle before", "pay_run_again_owner_00001")
}
