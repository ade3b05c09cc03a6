package caddymodule

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/x402"
)

// A Solana gate whose fee payer has no SOL (never funded, or drained)
// answers a good payment 503 upstream_unavailable, nothing charged, and
// the same payment is served once the operator funds the fee payer.
// (Before: 402 invalid_exact_svm_transaction_simulation_failed, asking the
// buyer to sign a new payment, which failed the same way.)
func TestSolanaGateWithAnEmptyFeePayerAnswers503(t *testing.T) {
	e := newSolanaEnv(t)
	seed := sha256.Sum256([]byte("caddymodule svm fee payer never funded"))
	key := ed25519.NewKeyFromSeed(seed[:])
	fee := base58.Encode(key.Public().(ed25519.PublicKey))
	keyFile := filepath.Join(t.TempDir(), "empty-fee-payer.key")
	if err := os.WriteFile(keyFile, []byte(base58.Encode(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept solana-devnet $0.02 %s
			facilitator svm {
				network solana-devnet
				rpc_url %s
				fee_payer_key_file %s
			}
			store badger {data}/gate
		}
		reverse_proxy %s
	}
}
`, e.payee.Address, e.chain.URL, keyFile, strings.TrimPrefix(newUpstream(t).URL, "http://")))
	pr := paymentRequired(t, post(t, base+"/verify/schema", validRequest, nil))
	var signed struct {
		Header string `json:"header"`
	}
	interop.Run(t, "x402-client-sign.mjs", nil, map[string]any{"solana": e.clientInput(), "paymentRequired": pr}, &signed)
	before := e.usdc(t, e.payer.Address)
	pay := map[string]string{x402.HeaderPaymentSignature: signed.Header}
	r := post(t, base+"/verify/schema", validRequest, pay)
	if body := readJSON(t, r); r.StatusCode != 503 || body["code"] != "upstream_unavailable" || r.Header.Get("Retry-After") == "" {
		t.Fatalf("payment with the fee payer out of SOL: status %d %v; want 503 upstream_unavailable", r.StatusCode, body)
	}
	if got := e.usdc(t, e.payer.Address); got != before {
		t.Fatalf("payer charged %d while the fee payer was empty", before-got)
	}
	e.chain.Airdrop(fee, 1_000_000_000)
	if r := post(t, base+"/verify/schema", validRequest, pay); r.StatusCode != 200 {
		t.Fatalf("the same payment once the fee payer is funded: status %d %v", r.StatusCode, readJSON(t, r))
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("payer charged %d, want one payment", got)
	}
}
