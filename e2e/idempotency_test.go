package e2e

import (
	"bytes"
	"net/http"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// Idempotent retries through the whole stack (Caddyfile.example turns
// payment_identifier on for every priced route): a buyer who sends its paid
// verification again with the same payment identifier gets the same signed
// receipt and the same settlement, and verifierd recorded one paid call; a
// newly signed payment under that id is 409 and records nothing.
func TestPaymentIdentifierThroughTheStack(t *testing.T) {
	s := newStack(t, "AOV_FREE_PER_DAY=0")
	const agent = "e2e-idempotent-agent"
	body := bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1)
	payer := evmfacilitator.DevAccounts()[2]

	r := post(t, s.url("/verify/schema"), body)
	mustStatus(t, r, http.StatusPaymentRequired)
	var pr x402.PaymentRequired
	if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentRequired), &pr); err != nil {
		t.Fatal(err)
	}
	decl, ok := pr.Extensions[x402.PaymentIdentifierExtension].(map[string]any)
	if !ok {
		t.Fatalf("PAYMENT-REQUIRED declares no payment-identifier: %v", pr.Extensions)
	}
	sign := func() string {
		p, err := x402.SignExactEVM(payer.Key(), pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		p.Extensions = map[string]any{x402.PaymentIdentifierExtension: map[string]any{
			"info":   map[string]any{"required": false, "id": "pay_e2e_idempotent_000001"},
			"schema": decl["schema"],
		}}
		h, err := x402.EncodeHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	sig := sign()
	first := do(t, http.MethodPost, s.url("/verify/schema"), body, map[string]string{x402.HeaderPaymentSignature: sig})
	mustStatus(t, first, http.StatusOK)
	again := do(t, http.MethodPost, s.url("/verify/schema"), body, map[string]string{x402.HeaderPaymentSignature: sig})
	mustStatus(t, again, http.StatusOK)
	if !bytes.Equal(first.body, again.body) {
		t.Fatalf("the retry got another answer:\n%s\n%s", first.body, again.body)
	}
	for _, h := range []string{x402.HeaderPaymentResponse, "Content-Type"} {
		if first.header.Get(h) == "" || first.header.Get(h) != again.header.Get(h) {
			t.Errorf("%s: %q then %q", h, first.header.Get(h), again.header.Get(h))
		}
	}
	conflict := do(t, http.MethodPost, s.url("/verify/schema"), body, map[string]string{x402.HeaderPaymentSignature: sign()})
	mustStatus(t, conflict, http.StatusConflict)
	if !bytes.Contains(conflict.body, []byte(`"payment_identifier_conflict"`)) {
		t.Fatalf("conflict body %s", conflict.body)
	}
	recs := s.history(t, agent)
	if len(recs) != 1 || recs[0].Payment != store.PaymentPaid {
		t.Fatalf("history %+v, want one paid verification", recs)
	}
}
