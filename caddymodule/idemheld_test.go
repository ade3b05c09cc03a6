package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), extra+"\n\t\t\tpayment_identifier"))
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

// An unknown settlement (the reply lost, the transfer made) whose buyer
// retries only after the authorization expired and its claim lapsed
// (validBefore plus a minute; max_timeout 30s here, which leaves room for
// the devnet's block time running up to 10 s ahead of the wall clock). With a payment
// identifier, within its window (1h), the retry gets the held answer with
// PAYMENT-RESPONSE: the record lives as long as the id's binding. Without
// one the answer is gone, but the retry is told the payment settled (402
// payment_already_used with PAYMENT-RESPONSE, found on chain), not that
// nothing was charged. Neither is charged twice or runs the upstream again.
func TestHeldAnswerAfterTheAuthorizationExpired(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	site := pendingSite(up.URL, "lose_reply", gateDir(t), "upstream_timeout 4s\n\t\t\tpayment_identifier")
	site = strings.Replace(site, "accept devnet $0.02 "+payTo.Hex(), "accept {\n\t\t\t\tnetwork devnet\n\t\t\t\tprice $0.02\n\t\t\t\tpay_to "+payTo.Hex()+"\n\t\t\t\tmax_timeout 30s\n\t\t\t}", 1)
	base := startCaddy(t, site)
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	withID, withoutID := evmfacilitator.DevAccounts()[6], evmfacilitator.DevAccounts()[5]
	beforeWith, beforeWithout := balance(t, d, withID.Address), balance(t, d, withoutID.Address)
	sigWith := signWithID(t, pr, withID.Key(), "pay_retried_after_expiry_01")
	sigWithout := signFor(t, pr, 5)
	for _, sig := range []string{sigWith, sigWithout} {
		if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("first call: %d %s", resp.StatusCode, readAll(t, resp))
		}
	}
	time.Sleep(95 * time.Second) // past validBefore (30 s) plus a minute

	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sigWith})
	if m := readJSON(t, resp); resp.StatusCode != http.StatusOK || m["paid_content"] != true {
		t.Errorf("the retry with the id: %d %v", resp.StatusCode, m)
	} else {
		settlementOf(t, resp)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sigWithout})
	if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != x402.ReasonPaymentAlreadyUsed {
		t.Fatalf("the retry without an id: %d %s", resp.StatusCode, reason)
	}
	settlementOf(t, resp)
	if a, b := charged(t, d, withID.Address, beforeWith), charged(t, d, withoutID.Address, beforeWithout); a.Int64() != 20000 || b.Int64() != 20000 || up.calls.Load() != 2 {
		t.Fatalf("charged %v and %v, upstream ran %d times", a, b, up.calls.Load())
	}
}

// respelled is payment sig with every signed byte unchanged and its JSON
// written anew (keys sorted, unlike the struct's order), as another client
// library would encode the same PaymentPayload.
func respelled(t *testing.T, sig string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := x402.DecodeHeader(sig, &m); err != nil {
		t.Fatal(err)
	}
	h, err := x402.EncodeHeader(m)
	if err != nil || h == sig {
		t.Fatalf("respelling: %v (same bytes: %v)", err, h == sig)
	}
	return h
}

// The retry of a settled, answered call with the same id, the same signed
// payment and the same request, its JSON encoded anew: the same call, so
// the saved answer with the first PAYMENT-RESPONSE, as over MCP, not a
// conflict telling a charged buyer to use a new identifier.
func TestPaymentIdentifierSamePaymentEncodedAnew(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "payment_identifier"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[6]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, pr, payer.Key(), "pay_same_payment_anew_001")
	first := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first call: %d", first.StatusCode)
	}
	tx := settlementOf(t, first).Transaction
	again := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: respelled(t, sig)})
	if m := readJSON(t, again); again.StatusCode != http.StatusOK || m["paid_content"] != true {
		t.Fatalf("the retry encoded anew: %d %v", again.StatusCode, m)
	}
	if got := settlementOf(t, again).Transaction; got != tx {
		t.Fatalf("PAYMENT-RESPONSE names %s, not the first call's %s", got, tx)
	}
	if got := charged(t, d, payer.Address, before); got.Int64() != 20000 || up.calls.Load() != 1 {
		t.Fatalf("charged %v, upstream ran %d times", got, up.calls.Load())
	}
}

// Settle before, the reply of the settlement lost: the buyer's retry with
// its id runs the upstream again, once, streamed; the next retry with the
// same id and payment is told the call was paid and answered, its answer
// not kept (409 payment_identifier_answer_not_kept with the run's
// PAYMENT-RESPONSE), as after any streamed answer, not payment_already_used.
// The upstream ran once: settled before, the first call never ran it.
func TestPaymentIdentifierAfterARunAgain(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "settle before\n\t\t\tpayment_identifier"))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[6]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, paymentRequired(t, post(t, url, "", nil)), payer.Key(), "pay_after_a_run_again_001")
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %d", resp.StatusCode)
	}
	run := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if run.StatusCode != http.StatusOK {
		t.Fatalf("the run again: %d", run.StatusCode)
	}
	tx := settlementOf(t, run).Transaction
	again := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if again.StatusCode != http.StatusConflict || idemCode(t, again) != codePaymentIDAnswerNotKept || settlementOf(t, again).Transaction != tx {
		t.Fatalf("the retry after the run: %d", again.StatusCode)
	}
	if got := charged(t, d, payer.Address, before); got.Int64() != 20000 || up.calls.Load() != 1 {
		t.Fatalf("charged %v, upstream ran %d times", got, up.calls.Load())
	}
}

// TestRetryWithItsIDWhileTheRunAgainRuns: settled before, the reply of the
// settlement lost, the buyer's retry with its payment identifier runs the
// upstream again (slowly). A second retry of the same call (same id,
// payment and request) meanwhile is told the call is still being served,
// 409 payment_identifier_in_progress with Retry-After: 1, as README's table
// says, never a 402 an x402 client answers with a new payment; the payment
// without the id gets payment_already_used. Nothing runs or is charged
// twice.
func TestRetryWithItsIDWhileTheRunAgainRuns(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "settle before\n\t\t\tpayment_identifier"))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[6]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, paymentRequired(t, post(t, url, "", nil)), payer.Key(), "pay_during_run_again_0001")
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %d", resp.StatusCode)
	}
	started := make(chan struct{})
	up.during = func() { close(started); time.Sleep(2 * time.Second) }
	run := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(x402.HeaderPaymentSignature, sig)
		resp, err := testClient.Do(req)
		if err != nil {
			run <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		run <- resp.StatusCode
	}()
	<-started
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusConflict || resp.Header.Get("Retry-After") != "1" || resp.Header.Get(x402.HeaderPaymentRequired) != "" || idemCode(t, resp) != codePaymentIDInProgress {
		t.Errorf("the same id and payment while the run again runs: %d, Retry-After %q; want 409 %s, Retry-After 1, no PAYMENT-REQUIRED",
			resp.StatusCode, resp.Header.Get("Retry-After"), codePaymentIDInProgress)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: copiedFromChain(t, sig, nil)})
	if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != x402.ReasonPaymentAlreadyUsed {
		t.Errorf("the payment without its id while the run again runs: %d %s", resp.StatusCode, reason)
	}
	if code := <-run; code != http.StatusOK {
		t.Fatalf("the run again: %d", code)
	}
	if got := charged(t, d, payer.Address, before); got.Int64() != 20000 || up.calls.Load() != 1 {
		t.Fatalf("charged %v, upstream ran %d times", got, up.calls.Load())
	}
}
