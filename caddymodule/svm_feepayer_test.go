package caddymodule

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// A Solana gate whose fee payer has no SOL (never funded, or drained)
// answers a good payment 503 upstream_unavailable, nothing charged, and
// the same payment is served once the operator funds the fee payer.
// (Before: 402 invalid_exact_svm_transaction_simulation_failed, asking the
// buyer to sign a new payment, which failed the same way.)
func TestSolanaGateWithAnEmptyFeePayerAnswers503(t *testing.T) {
	e := newSolanaEnv(t)
	fee, keyFile := feePayerKeyFile(t, "caddymodule svm fee payer never funded")
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

// A Solana gate whose fee payer holds enough SOL for every ordinary payment
// (rent exemption plus 0.0001 SOL) is sent a payment whose priority fee is
// the largest the facilitator's caps allow (50,000 units × 5 lamports).
// The buyer chose that fee: the gate refuses the payment (402), and
// rate_limit counts the refusals (429 once past the budget), while the same
// buyer's ordinary payment is served. (Before: 503 upstream_unavailable,
// the operator's outage, every time, counted by nothing.)
func TestSolanaBuyersPriorityFeeBeyondTheFeePayerIsRefusedAndCounted(t *testing.T) {
	e := newSolanaEnv(t)
	fee, keyFile := feePayerKeyFile(t, "caddymodule svm fee payer funded for ordinary payments")
	e.chain.Airdrop(fee, 890_880+100_000)
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
			rate_limit 2 1h
		}
		reverse_proxy %s
	}
}
`, e.payee.Address, e.chain.URL, keyFile, strings.TrimPrefix(newUpstream(t).URL, "http://")))
	pr := paymentRequired(t, post(t, base+"/verify/schema", validRequest, nil))
	offer := pr.Accepts[0]
	// The same buyer's ordinary payment (the official client's) is served
	// first: the fee payer is not out of funds.
	var signed struct {
		Header string `json:"header"`
	}
	interop.Run(t, "x402-client-sign.mjs", nil, map[string]any{"solana": e.clientInput(), "paymentRequired": pr}, &signed)
	if r := post(t, base+"/verify/schema", validRequest, map[string]string{x402.HeaderPaymentSignature: signed.Header}); r.StatusCode != 200 {
		t.Fatalf("ordinary payment: status %d %v; want 200", r.StatusCode, readJSON(t, r))
	}
	sk, err := base58.Decode(e.payer.SecretKey)
	if err != nil || len(sk) != 64 {
		t.Fatalf("payer key: %v", err)
	}
	feePub, _ := svmfacilitator.ParsePublicKey(fee)
	payTo, _ := svmfacilitator.ParsePublicKey(e.payee.Address)
	mint, _ := svmfacilitator.ParsePublicKey(offer.Asset)
	bh, _ := svmfacilitator.ParsePublicKey(e.chain.LatestBlockhash())
	p := svmfacilitator.Payment{FeePayer: feePub, Authority: ed25519.PrivateKey(sk), Mint: mint, Program: svmfacilitator.TokenProgram,
		PayTo: payTo, Amount: 20000, Decimals: 6, Blockhash: bh}
	ixs := p.Instructions()
	ixs[0] = svmfacilitator.ComputeLimitIx(svmfacilitator.DefaultMaxComputeUnits)
	ixs[1] = svmfacilitator.ComputePriceIx(svmfacilitator.DefaultMaxComputeUnitPrice)
	pp := svmfacilitator.Payload(p.Build(ixs), offer)
	pp.Resource = &pr.Resource
	hdr, err := x402.EncodeHeader(pp)
	if err != nil {
		t.Fatal(err)
	}
	var seen []int
	for range 8 {
		r := post(t, base+"/verify/schema", validRequest, map[string]string{x402.HeaderPaymentSignature: hdr})
		body := readJSON(t, r)
		seen = append(seen, r.StatusCode)
		if len(seen) == 1 {
			t.Logf("capped-fee payment: %d %v", r.StatusCode, body)
		}
	}
	if seen[0] != 402 || slices.Contains(seen, 503) || !slices.Contains(seen, 429) {
		t.Fatalf("statuses %v; want the payment refused (402), never the operator's 503, and counted (429 once past the budget)", seen)
	}
}

// feePayerKeyFile writes a fee payer key derived from seed to a key file
// and returns its address and the file.
func feePayerKeyFile(t *testing.T, seed string) (addr, file string) {
	t.Helper()
	sum := sha256.Sum256([]byte(seed))
	key := ed25519.NewKeyFromSeed(sum[:])
	file = filepath.Join(t.TempDir(), "fee-payer.key")
	if err := os.WriteFile(file, []byte(base58.Encode(key)), 0o600); err != nil {
		t.Fatal(err)
	}
	return base58.Encode(key.Public().(ed25519.PublicKey)), file
}
