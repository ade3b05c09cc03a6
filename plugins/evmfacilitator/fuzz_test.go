package evmfacilitator

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/aovhq/aov/x402"
)

// FuzzVerifyPayload feeds arbitrary exact-EVM payloads to Verify against a
// devnet: whatever the bytes, Verify answers (valid only for a genuine
// payment) and never panics. Settle, asked for ten times the amount the
// genuine payment authorizes, refuses every one with a reason, the
// genuine one included: a payment is held against the caller's own
// requirements before anything else.
func FuzzVerifyPayload(f *testing.F) {
	e := newEnv(f)
	req := e.requirements(payee, amount)
	more := req
	more.Amount = amount + "0"
	good := mustSignExact(f, payer, req)
	f.Add([]byte(good.Payload))
	f.Add([]byte(`{"signature":"0x","authorization":{}}`))
	f.Add([]byte(`{"signature":"0x00","authorization":{"from":"0x0000000000000000000000000000000000000000","to":"0x0","value":"1","validAfter":"0","validBefore":"99999999999","nonce":"0x00"}}`))
	f.Add([]byte(`{"permit2Authorization":{}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // PaymentPayload.Payload is a json.RawMessage: the HTTP layer only passes valid JSON
		}
		p := x402.PaymentPayload{X402Version: 2, Accepted: req, Payload: raw}
		r, err := e.f.Verify(context.Background(), p, req)
		if err != nil {
			t.Fatalf("verify error on a live devnet: %v", err)
		}
		if r.IsValid && string(raw) != string(good.Payload) {
			// Another valid payment would need the payer's signature.
			var pl x402.ExactEVMPayload
			if json.Unmarshal(raw, &pl) != nil || pl.Signature == "" {
				t.Fatalf("fuzzed payload verified as valid: %s", raw)
			}
		}
		if !r.IsValid && r.InvalidReason == "" {
			t.Fatalf("refusal without a reason: %+v", r)
		}
		s, err := e.f.Settle(context.Background(), p, more)
		if err != nil || s.Success || s.ErrorReason == "" || s.Transaction != "" {
			t.Fatalf("settle for ten times the amount = %+v, %v; want a refusal with a reason", s, err)
		}
	})
}
