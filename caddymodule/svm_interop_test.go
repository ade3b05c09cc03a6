package caddymodule

import (
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/x402"
)

// payOnSolana has the official fetch client pay url from the env's payer
// and checks that exactly amount moved to the payee.
func payOnSolana(t *testing.T, e *solanaEnv, url string, amount int64) {
	t.Helper()
	payerBefore, payeeBefore := e.usdc(t, e.payer.Address), e.usdc(t, e.payee.Address)
	var res fetchResult
	interop.Run(t, "x402-fetch-pay.mjs", nil, map[string]any{"solana": e.clientInput(), "url": url, "method": "GET"}, &res)
	if res.Status != 200 || res.PaymentResponse == nil || !res.PaymentResponse.Success || res.PaymentResponse.Network != x402.NetworkSolanaDevnet {
		t.Fatalf("status %d, PAYMENT-RESPONSE %+v: %s", res.Status, res.PaymentResponse, res.Body)
	}
	if !strings.Contains(res.Body, "paid_content") {
		t.Fatalf("body %s", res.Body)
	}
	if got := payerBefore - e.usdc(t, e.payer.Address); got != amount {
		t.Fatalf("payer charged %d, want %d", got, amount)
	}
	if got := e.usdc(t, e.payee.Address) - payeeBefore; got != amount {
		t.Fatalf("payee received %d, want %d", got, amount)
	}
}

// TestOfficialSolanaFacilitatorSettlesForTheGate: the gate verifies and
// settles through the official @x402/svm facilitator over `facilitator
// http`, with that facilitator's own fee payer.
func TestOfficialSolanaFacilitatorSettlesForTheGate(t *testing.T) {
	e := newSolanaEnv(t)
	seed := sha256.Sum256([]byte("official facilitator fee payer"))
	key := ed25519.NewKeyFromSeed(seed[:])
	fee := base58.Encode(key.Public().(ed25519.PublicKey))
	e.chain.Airdrop(fee, 10_000_000_000)
	var ready struct {
		URL      string `json:"url"`
		FeePayer string `json:"feePayer"`
	}
	interop.Start(t, "svm-facilitator-server.mjs", []string{"RPC_URL=" + e.chain.URL, "SECRET_KEY=" + base58.Encode(key)}, &ready)
	if ready.FeePayer != fee {
		t.Fatalf("fee payer %s, want %s", ready.FeePayer, fee)
	}
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /paid {
		x402 {
			accept solana-devnet $0.02 %s
			facilitator http %s
			store badger {data}/gate
		}
		reverse_proxy %s
	}
}
`, e.payee.Address, ready.URL, strings.TrimPrefix(up.URL, "http://")))
	feeBefore := e.chain.Lamports(fee)
	payOnSolana(t, e, base+"/paid", 20000)
	if e.chain.Lamports(fee) >= feeBefore {
		t.Fatal("the official facilitator's fee payer paid nothing: it did not settle")
	}
}

// TestOfficialExpressServerUsesOurFacilitator: a seller on the official
// @x402/express middleware settles on Solana through our facilitator,
// served by x402_facilitator.
func TestOfficialExpressServerUsesOurFacilitator(t *testing.T) {
	e := newSolanaEnv(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	handle_path /facilitator/* {
		x402_facilitator {
			pay_to %s
			%s
		}
	}
}
`, e.payee.Address, e.svmBlock()))
	var ready struct {
		URL string `json:"url"`
	}
	interop.Start(t, "express-server.mjs", []string{"FACILITATOR_URL=" + base + "/facilitator", "PAY_TO=" + e.payee.Address}, &ready)
	feeBefore := e.chain.Lamports(e.feePay)
	payOnSolana(t, e, ready.URL+"/paid", 10000)
	if e.chain.Lamports(e.feePay) >= feeBefore {
		t.Fatal("our fee payer paid nothing: our facilitator did not settle")
	}
}
