package svmfacilitator

import (
	"context"
	"testing"
	"time"
)

// The chain's own clock (the Clock sysvar of the confirmed bank) is read
// as a cluster keeps it, near the wall clock, and the development chain
// keeps it so: litesvm's own clock stays at 0 unless the chain sets it.
// AdvanceClock moves it on, and a landed transaction's block time with it.
// A node whose bank is older than the slot asked for is refused. (Before:
// the development chain's Clock sysvar said 1970 whatever the hour.)
func TestChainTimeIsTheChainsClock(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	unix, slot, err := e.f.rpc.ChainTime(ctx, 0)
	if err != nil || slot == 0 {
		t.Fatalf("ChainTime: %d at slot %d, %v", unix, slot, err)
	}
	if d := time.Since(time.Unix(unix, 0)); d < -2*time.Second || d > 2*time.Second {
		t.Errorf("the chain's clock says %s, %s from the wall clock", time.Unix(unix, 0), d)
	}
	e.chain.AdvanceClock(30 * time.Second)
	moved, _, err := e.f.rpc.ChainTime(ctx, 0)
	if err != nil || moved-unix < 30 || moved-unix > 32 {
		t.Errorf("after AdvanceClock(30s): %d, %d s on, %v", moved, moved-unix, err)
	}
	s, err := e.f.Settle(ctx, Payload(e.payment(t).Transaction(), e.req), e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	lt, err := e.f.rpc.Transaction(ctx, s.Transaction)
	if err != nil || lt == nil || lt.BlockTime == nil || *lt.BlockTime < moved {
		t.Errorf("the landed transaction's block time: %+v %v; want at least %d", lt, err, moved)
	}
	if _, _, err := e.f.rpc.ChainTime(ctx, slot+1000); err == nil {
		t.Error("a bank older than the slot asked for was taken")
	}
}
