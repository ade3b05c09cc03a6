package evmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// One check makes at most maxLogBlocks/logChunkBlocks eth_getLogs, however
// the blocks left to search are split by the runs remembered for the
// nonce: each run's last, partial chunk is a call of its own. Scaled
// constants: 5 blocks a call, 50 in all: 10 calls. Four one-block windows
// 12 blocks apart leave 5 runs of one window over them (11 + 11 + 11 + 11
// + 6 = 50 blocks, 15 calls searched whole); the search is cut to 10 calls,
// an unknown outcome, not an answer from a part of the window.
func TestValidityWindowSearchCallsAreBoundedWithManyRuns(t *testing.T) {
	oldChunk, oldMax := logChunkBlocks, maxLogBlocks
	logChunkBlocks, maxLogBlocks = 5, 50
	t.Cleanup(func() { logChunkBlocks, maxLogBlocks = oldChunk, oldMax })

	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Hour})
	ctx := context.Background()
	for range 5 {
		d.backend.Commit()
	}
	spy := &logSpy{Chain: d.Client()}
	reader, err := NewStatusReader(spy, DevnetNetwork)
	if err != nil {
		t.Fatal(err)
	}
	f, err := d.NewFacilitator()
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{d: d, f: f}
	req := e.requirements(payee, amount)
	a := auth(payer, req)
	p := sign(t, payer, a, req, req)
	r, err := f.Settle(ctx, p, req)
	if err != nil || !r.Success {
		t.Fatalf("settle = %+v, %v", r, err)
	}
	settled, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 90 {
		d.backend.Commit()
	}
	S := settled.Number.Uint64()
	timeOf := func(n uint64) uint64 {
		h, err := d.Client().HeaderByNumber(ctx, new(big.Int).SetUint64(n))
		if err != nil {
			t.Fatal(err)
		}
		return h.Time
	}
	ask := func(validAfter, validBefore uint64) (x402.SettlementStatus, error, int) {
		o := a
		o.ValidAfter, o.ValidBefore = fmt.Sprint(validAfter), fmt.Sprint(validBefore)
		spy.reset()
		st, err := reader.SettlementStatus(ctx, sign(t, payer, o, req, req), req)
		_, ranges := spy.reset()
		return st, err, len(ranges)
	}
	// Four one-block windows after the settlement: four runs remembered.
	b1 := S + 15
	for i := uint64(0); i < 4; i++ {
		b := b1 + 12*i
		if st, err, _ := ask(timeOf(b)-1, timeOf(b)+1); err != nil || st.State != x402.SettlementNever {
			t.Fatalf("one-block window at block %d: %+v, %v; want never", b, st, err)
		}
	}
	st, err, calls := ask(timeOf(b1-11)-1, timeOf(b1+36+7))
	if bound := int(maxLogBlocks / logChunkBlocks); calls > bound {
		t.Errorf("one check made %d eth_getLogs; at most %d (maxLogBlocks/logChunkBlocks)", calls, bound)
	}
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) || st.State != x402.SettlementUndecided {
		t.Errorf("a window whose runs need more calls than the bound: %+v, %v; want an unknown outcome (cut short)", st, err)
	}
}
