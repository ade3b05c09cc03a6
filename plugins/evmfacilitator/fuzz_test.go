package evmfacilitator

import (
	"context"
	"encoding/json"
	"fmt"
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

// nodeError is an rpc.Error with data, as the RPC client returns a node's
// JSON-RPC error object: FuzzClassify's input.
type nodeError struct {
	code int
	msg  string
	data any
}

func (e nodeError) Error() string  { return e.msg }
func (e nodeError) ErrorCode() int { return e.code }
func (e nodeError) ErrorData() any { return e.data }

// FuzzClassify feeds arbitrary JSON-RPC error objects to classify, the one
// reading of a node's errors: it never panics, and it takes an answer for
// a revert or a failure to execute only in the forms nodes use for them
// (code 3, "execution reverted", Nethermind's -32015, geth's core/vm
// errors); anything else stays the node's trouble.
func FuzzClassify(f *testing.F) {
	f.Add(3, "execution reverted: no", "0x08c379a0")
	f.Add(-32000, "Execution reverted", "")
	f.Add(-32015, "VM execution error.", "Reverted 0x")
	f.Add(-32015, "VM execution error.", "revert: x")
	f.Add(-32000, "invalid opcode: INVALID", "")
	f.Add(-32005, "limit exceeded", "")
	f.Add(-32603, "internal error", "0x08c379a0000000")
	f.Fuzz(func(t *testing.T, code int, msg, data string) {
		kind, _ := classify(fmt.Errorf("calling: %w", nodeError{code, msg, data}))
		executed := code == 3 || code == -32015 || hasPrefixFold(msg, "execution reverted")
		for _, v := range vmFailures {
			executed = executed || hasPrefixFold(msg, v)
		}
		if (kind == answerReverted || kind == answerFailed) && !executed {
			t.Fatalf("classify(%d, %q, %q) = %d: a node's trouble taken for the code's answer", code, msg, data, kind)
		}
		if kind == answerNone {
			t.Fatalf("classify(%d, %q, %q) = no answer, for a JSON-RPC error", code, msg, data)
		}
	})
}
