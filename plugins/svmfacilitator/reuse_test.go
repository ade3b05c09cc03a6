package svmfacilitator

import (
	"context"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// countingEnv is an env whose facilitator reaches the chain through a
// faultyRPC that only counts.
func countingEnv(t *testing.T) (*env, *faultyRPC) {
	t.Helper()
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target = e.chain.URL })
	return e, fr
}

// TestSettleReusesTheVerifiedSimulation: a Settle right after the Verify
// of the same transaction sends what Verify simulated without simulating
// it again, and still pays exactly once.
func TestSettleReusesTheVerifiedSimulation(t *testing.T) {
	e, fr := countingEnv(t)
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	ctx := context.Background()
	if v, err := e.f.Verify(ctx, pp, e.req); err != nil || !v.IsValid {
		t.Fatalf("verify: %+v %v", v, err)
	}
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success || s.Payer != pub(e.payer).String() {
		t.Fatalf("settle: %+v %v", s, err)
	}
	if n := fr.count("simulateTransaction"); n != 1 {
		t.Fatalf("%d simulations for one verify and its settle, want 1", n)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
	// The reuse was single: a replay is a duplicate naming the
	// transaction, from the record, with nothing simulated or sent again.
	if r, err := e.f.Settle(ctx, pp, e.req); err != nil || r.Success || r.ErrorReason != ReasonDuplicateSettlement || r.Transaction != s.Transaction || fr.count("simulateTransaction") != 1 || fr.count("sendTransaction") != 1 {
		t.Fatalf("replay: %+v %v", r, err)
	}
}

// TestSettleSimulatesWhatVerifyDidNot: past SimulationReuse, for other
// bytes of the same message, and without a Verify, Settle simulates
// itself; and a kept simulation never stands in for the requirement
// checks.
func TestSettleSimulatesWhatVerifyDidNot(t *testing.T) {
	e, fr := countingEnv(t)
	ctx := context.Background()
	p := e.payment(t)
	fresh := func(memo string) x402.PaymentPayload {
		ixs := p.Instructions()
		ixs[3] = MemoIx(memo)
		return Payload(p.Build(ixs), e.req)
	}
	settle := func(name string, pp x402.PaymentPayload, wantSims int) {
		t.Helper()
		before := fr.count("simulateTransaction")
		if s, err := e.f.Settle(ctx, pp, e.req); err != nil || !s.Success {
			t.Fatalf("%s: settle %+v %v", name, s, err)
		}
		if n := fr.count("simulateTransaction") - before; n != wantSims {
			t.Fatalf("%s: settle simulated %d times, want %d", name, n, wantSims)
		}
	}
	settle("no verify", fresh("a"), 1)

	late := fresh("b")
	if v, err := e.f.Verify(ctx, late, e.req); err != nil || !v.IsValid {
		t.Fatalf("verify: %+v %v", v, err)
	}
	now = func() time.Time { return time.Now().Add(SimulationReuse + time.Second) }
	settle("past the reuse window", late, 1)
	now = time.Now

	// The same message with other bytes in the fee payer's slot is
	// another transaction on the wire: no reuse.
	other := fresh("c")
	if v, err := e.f.Verify(ctx, other, e.req); err != nil || !v.IsValid {
		t.Fatalf("verify: %+v %v", v, err)
	}
	tx, err := DecodePayload(other.Payload)
	if err != nil {
		t.Fatal(err)
	}
	raw := append([]byte(nil), tx.Raw...)
	raw[1] ^= 1
	settle("other wire bytes", Payload(raw, e.req), 1)

	// Verified against one offer, settled against another: refused.
	third := fresh("d")
	if v, err := e.f.Verify(ctx, third, e.req); err != nil || !v.IsValid {
		t.Fatalf("verify: %+v %v", v, err)
	}
	dearer := e.req
	dearer.Amount = "30000"
	if s, err := e.f.Settle(ctx, third, dearer); err != nil || s.Success || s.ErrorReason != ReasonAmountMismatch {
		t.Fatalf("settle against another offer: %+v %v", s, err)
	}
	if a, b := e.balances(t); a != 1_000_000-3*20000 || b != 3*20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}

// TestExpiredRecordsAreSweptInBatches: a settled message past
// DuplicateWindow no longer blocks a Settle even before the sweep drops
// it, and the sweep walks the records once per sweepEvery, not on every
// Settle.
func TestExpiredRecordsAreSweptInBatches(t *testing.T) {
	f, err := New(Config{RPC: &RPC{URL: "http://127.0.0.1:1"}, Network: x402.NetworkSolanaDevnet, FeePayer: testKey("fee payer")})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now()
	now = func() time.Time { return base }
	defer func() { now = time.Now }()
	key := func(i int) [32]byte { return [32]byte{byte(i), byte(i >> 8), 1} }
	if _, how := f.claim(key(0)); how != claimNew {
		t.Fatal("first claim refused")
	}
	f.finish(key(0), "")
	for i := 1; i <= 1000; i++ {
		f.settled[key(i)] = &settlement{at: base.Add(-DuplicateWindow - time.Second)}
	}
	if _, how := f.claim(key(0)); how != claimSettled {
		t.Fatal("a settled message was claimed again inside its window")
	}
	if _, how := f.claim(key(1)); how != claimNew {
		t.Fatal("a message past its window is still refused")
	}
	if len(f.settled) < 1000 {
		t.Fatalf("%d records: the expired ones were walked before sweepEvery passed", len(f.settled))
	}
	now = func() time.Time { return base.Add(sweepEvery) }
	if _, how := f.claim(key(2000)); how != claimNew {
		t.Fatal("claim refused")
	}
	if n := len(f.settled); n != 3 {
		t.Fatalf("%d records after the sweep, want 3 (two claimed, one settled in its window)", n)
	}
}
