package caddymodule

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// The claim keys name an authorization by its exact header and by payer and
// nonce: a re-encoded copy of the same authorization gets another header
// key but the same authorization key, and the claim lasts until the
// authorization can no longer settle.
func TestClaimKeysNameTheAuthorization(t *testing.T) {
	usdc, _ := x402.USDC(x402.NetworkBase)
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkBase, Amount: "20000", Asset: usdc.Address, PayTo: "0x1111111111111111111111111111111111111111", MaxTimeoutSeconds: 60, Extra: usdc.Extra()}
	signed := time.Now()
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(1), offer, &x402.Resource{URL: "http://example.com/verify/schema"}, signed)
	if err != nil {
		t.Fatal(err)
	}
	var ev x402.ExactEVMPayload
	if err := json.Unmarshal(p.Payload, &ev); err != nil {
		t.Fatal(err)
	}
	header, _ := x402.EncodeHeader(p)
	keys, until := claimKeys(header, p, offer)
	auth := strings.ToLower("x402/auth/" + offer.Network + "/" + offer.Asset + "/" + ev.Authorization.From + "/" + ev.Authorization.Nonce)
	if len(keys) != 2 || !strings.HasPrefix(keys[0], claimPayloadPrefix) || len(keys[0]) != len(claimPayloadPrefix)+64 || keys[1] != auth {
		t.Fatalf("keys %q, want the header's hash and %q", keys, auth)
	}
	if vb := time.Unix(mustInt(t, ev.Authorization.ValidBefore), 0); until.Before(vb) {
		t.Errorf("the claim lapses at %v, before the authorization expires at %v", until, vb)
	}

	// The same authorization with its members in another order and
	// another member added: another header, the same authorization key.
	var m map[string]json.RawMessage
	json.Unmarshal(p.Payload, &m)
	m["note"] = json.RawMessage(`"re-encoded"`)
	p2 := p
	p2.Payload, _ = json.Marshal(m)
	header2, _ := x402.EncodeHeader(p2)
	keys2, _ := claimKeys(header2, p2, offer)
	if len(keys2) != 2 || keys2[0] == keys[0] || keys2[1] != auth {
		t.Fatalf("re-encoded: keys %q, want a new header key and %q", keys2, auth)
	}

	// A signature of the wrong type does not hide payer and nonce.
	m["signature"] = json.RawMessage(`5`)
	p3 := p
	p3.Payload, _ = json.Marshal(m)
	if keys3, _ := claimKeys("other", p3, offer); len(keys3) != 2 || keys3[1] != auth {
		t.Fatalf("malformed signature: keys %q, want %q among them", keys3, auth)
	}

	// No authorization: the header alone names the payment.
	p4 := p
	p4.Payload = json.RawMessage(`{"transaction":"AQID"}`)
	if keys4, until4 := claimKeys("other", p4, offer); len(keys4) != 1 || until4.After(now().Add(time.Duration(offer.MaxTimeoutSeconds)*time.Second+2*time.Minute)) {
		t.Fatalf("no authorization: keys %q until %v", keys4, until4)
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	if err := json.Unmarshal([]byte(s), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A Solana payment's claim outlives its transaction's blockhash and the
// passes that judge it "never" after that: it lasts svmClaimHold at the
// least, although its offer's maxTimeoutSeconds alone would end it sooner.
// The transaction is the smallest legacy one that decodes: one signer, no
// instruction (the claim keys read the message, not what it does).
func TestSolanaClaimOutlivesItsBlockhash(t *testing.T) {
	raw := []byte{1}
	raw = append(raw, make([]byte, 64)...) // the fee payer's signature slot
	raw = append(raw, 1, 0, 0, 1)          // header; one account key
	raw = append(raw, make([]byte, 32)...) // the key
	raw = append(raw, make([]byte, 32)...) // recent blockhash
	raw = append(raw, 0)                   // no instruction
	payload, _ := json.Marshal(map[string]string{"transaction": base64.StdEncoding.EncodeToString(raw)})
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet, Amount: "10000", MaxTimeoutSeconds: 60}
	p := x402.PaymentPayload{X402Version: 2, Accepted: offer, Payload: payload}
	start := now()
	keys, until := claimKeys("header", p, offer)
	if len(keys) != 2 || !strings.HasPrefix(keys[1], "x402/svm/"+offer.Network+"/") {
		t.Fatalf("keys %q, want the header's and the message's", keys)
	}
	if until.Before(start.Add(svmClaimHold)) {
		t.Errorf("the claim lapses %v after it is made, before svmClaimHold (%v)", until.Sub(start), svmClaimHold)
	}
	if until.After(now().Add(svmClaimHold + time.Second)) {
		t.Errorf("the claim lasts %v, longer than svmClaimHold", until.Sub(start))
	}
}
