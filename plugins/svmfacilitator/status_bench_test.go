package svmfacilitator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// BenchmarkSVMSettlementOutcome is what resolving one lost outcome costs on
// the local chain: by the signature the facilitator named (the baseline:
// one getSignatureStatuses), and by the search when nothing named it, with
// that many newer transfers of the same buyer to pass (each a
// getTransaction):
//
//	go test -run '^$' -bench SVMSettlementOutcome -benchtime 200x ./plugins/svmfacilitator
func BenchmarkSVMSettlementOutcome(b *testing.B) {
	e := newEnv(b, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(b).Build(e.payment(b).Instructions()), e.req)
	began := time.Now()
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		b.Fatalf("settle: %+v %v", s, err)
	}
	r, err := NewStatusReader(&RPC{URL: e.chain.URL}, x402.NetworkSolanaDevnet)
	if err != nil {
		b.Fatal(err)
	}
	run := func(b *testing.B, sent x402.SentSettlement) {
		b.ReportAllocs()
		for b.Loop() {
			if st, err := r.SentSettlementStatus(ctx, pp, e.req, sent); err != nil || st.State != x402.SettlementDone {
				b.Fatalf("%+v %v", st, err)
			}
		}
	}
	b.Run("named", func(b *testing.B) { run(b, x402.SentSettlement{Transaction: s.Transaction, After: began}) })
	noise := 0
	for _, n := range []int{0, 8, 32} {
		e.settleNoise(b, n-noise)
		noise = n
		b.Run(fmt.Sprintf("searched past %d", n), func(b *testing.B) { run(b, x402.SentSettlement{After: began}) })
	}
}
