package svmfacilitator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// Compare with x402's BenchmarkCheckExactEVM and evmfacilitator's
// BenchmarkVerifyOnDevnet in the same run:
//
//	go test -run '^$' -bench 'CheckExactEVM|VerifyOnDevnet|SVM' ./x402 ./plugins/evmfacilitator ./plugins/svmfacilitator

// BenchmarkSVMCheckStatic is every off-chain check of one payment: payload
// and transaction decode, the authority's ed25519 signature (with the
// small-order check), the instruction layout, and the destination's
// associated token account derivation.
func BenchmarkSVMCheckStatic(b *testing.B) {
	fee := testKey("fee payer")
	f, err := New(Config{RPC: &RPC{URL: "http://127.0.0.1:1"}, Network: x402.NetworkSolanaDevnet, FeePayer: fee})
	if err != nil {
		b.Fatal(err)
	}
	p := Payment{FeePayer: pub(fee), Authority: testKey("payer"), Mint: mustKey("4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU"),
		Program: TokenProgram, PayTo: pub(testKey("payee")), Amount: 20000, Decimals: 6}
	req := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet, Amount: "20000", Asset: p.Mint.String(),
		PayTo: p.PayTo.String(), MaxTimeoutSeconds: 60, Extra: map[string]any{"feePayer": pub(fee).String()}}
	pp := Payload(p.Build(p.Instructions()), req)
	b.ReportAllocs()
	for b.Loop() {
		c := f.checkStatic(pp, req, false)
		if c.resp.InvalidReason != "" {
			b.Fatal(c.resp)
		}
	}
}

// BenchmarkSVMVerifyOnChain is one full Verify: the checks above, the fee
// payer's co-signature and a simulateTransaction on the local litesvm chain
// over loopback JSON-RPC.
func BenchmarkSVMVerifyOnChain(b *testing.B) {
	e := newEnv(b, Config{})
	p := e.payment(b)
	pp := Payload(p.Build(p.Instructions()), e.req)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		v, err := e.f.Verify(ctx, pp, e.req)
		if err != nil || !v.IsValid {
			b.Fatalf("%+v %v", v, err)
		}
	}
}

// BenchmarkSVMSettle is one full Settle on the local chain: verify,
// co-sign, send, and poll until confirmed; each payment has its own memo.
func BenchmarkSVMSettle(b *testing.B) {
	e := newEnv(b, Config{PollInterval: time.Millisecond})
	e.chain.SetTokenBalance(pub(e.payer).String(), "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU", 1<<62, "")
	p := e.payment(b)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		i++
		ixs := p.Instructions()
		ixs[3] = MemoIx(fmt.Sprintf("bench-%d", i))
		s, err := e.f.Settle(ctx, Payload(p.Build(ixs), e.req), e.req)
		if err != nil || !s.Success {
			b.Fatalf("%+v %v", s, err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "settles/s")
}
