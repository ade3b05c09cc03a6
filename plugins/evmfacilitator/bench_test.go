package evmfacilitator

import (
	"context"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// benchEnv is a devnet that lets block time run far ahead of the wall
// clock, so that a benchmark's burst of blocks is not throttled to one per
// second, and requirements whose authorizations outlive that lead.
func benchEnv(b *testing.B) (*testEnv, x402.PaymentRequirements) {
	d := startDevnet(b, DevnetConfig{MaxClockLead: 24 * time.Hour})
	f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 2 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	e := &testEnv{d: d, f: f}
	req := e.requirements(payee, amount)
	req.MaxTimeoutSeconds = 48 * 3600
	return e, req
}

// BenchmarkVerifyOnDevnet: one full Verify (off-chain checks, payer code,
// token domain (cached), nonce, balance, eth_call simulation) against the
// in-process devnet.
func BenchmarkVerifyOnDevnet(b *testing.B) {
	e, req := benchEnv(b)
	p := mustSignExact(b, payer, req)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r, err := e.f.Verify(ctx, p, req)
		if err != nil || !r.IsValid {
			b.Fatalf("verify = %+v, %v", r, err)
		}
	}
}

// BenchmarkDecodeAndRecover: the part of verification that needs no chain:
// decode the PAYMENT-SIGNATURE header, check the payment, compute the
// EIP-712 digest and ecrecover the signer.
func BenchmarkDecodeAndRecover(b *testing.B) {
	req := x402.PaymentRequirements{Scheme: x402.SchemeExact, Network: DevnetNetwork, Amount: amount,
		Asset: "0x5FbDB2315678afecb367f032d93F642f64180aa3", PayTo: payee.Hex(), MaxTimeoutSeconds: 3600,
		Extra: map[string]any{"name": "USD Coin", "version": "2"}}
	p := mustSignExact(b, payer, req)
	h, err := x402.EncodeHeader(p)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		got, err := x402.DecodePaymentSignature(h)
		if err != nil {
			b.Fatal(err)
		}
		c, err := x402.CheckExactEVM(got, req, now)
		if err != nil || !c.Recovered {
			b.Fatalf("check = %+v, %v", c, err)
		}
	}
}

// BenchmarkSettleSequential: sign, verify, submit and wait for the receipt,
// one payment at a time (each settlement waits for its own block).
func BenchmarkSettleSequential(b *testing.B) {
	e, req := benchEnv(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		r, err := e.f.Settle(ctx, mustSignExact(b, payer, req), req)
		if err != nil || !r.Success {
			b.Fatalf("settle = %+v, %v", r, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "settles/s")
}

// BenchmarkSettleConcurrent: many payers settling at once through one
// relayer; blocks carry many settlements each.
func BenchmarkSettleConcurrent(b *testing.B) {
	e, req := benchEnv(b)
	ctx := context.Background()
	b.SetParallelism(8)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := e.f.Settle(ctx, mustSignExact(b, payer, req), req)
			if err != nil || !r.Success {
				b.Errorf("settle = %+v, %v", r, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "settles/s")
}
