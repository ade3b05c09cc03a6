package svmfacilitator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/x402"
)

// A settlement whose outcome Settle could not tell is resolved by
// SettlementStatus without sending anything: undecided while the chain
// does not show it, done (with its signature) once it does; the payment is
// then remembered as settled, so a second Settle is refused.
func TestSettlementStatusResolvesALostReply(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend, f.forwardOK, f.hideStatus = e.chain.URL, true, true, true })
	pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
	ctx := context.Background()

	if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("a payment never sent, its blockhash valid: %+v %v", st, err)
	}
	_, err := e.f.Settle(ctx, pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil {
		t.Fatalf("want an unknown outcome, got %v", err)
	}
	if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("while the chain hides it: %+v %v", st, err)
	}
	fr.set(func(f *faultyRPC) { f.dropSend, f.hideStatus = false, false })
	st, err := e.f.SettlementStatus(ctx, pp, e.req)
	if err != nil || st.State != x402.SettlementDone || st.Transaction != unknown.Reply.Transaction || st.Payer == "" {
		t.Fatalf("once the chain shows it: %+v %v", st, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
	sends := fr.count("sendTransaction")
	// The status answered the pending Settle's caller; a Settle of the
	// payment now is a replay.
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != unknown.Reply.Transaction || fr.count("sendTransaction") != sends {
		t.Fatalf("a second Settle after the resolution: %+v %v; want %s naming %s, nothing sent", s, err, ReasonDuplicateSettlement, unknown.Reply.Transaction)
	}
	other := e.req
	other.Network = x402.NetworkSolana
	if _, err := e.f.SettlementStatus(ctx, pp, other); err == nil {
		t.Fatal("judged a payment on another network")
	}
}

// A send whose request was lost is undecided while its blockhash is valid
// and can never land once it has expired: released, nothing moved.
func TestSettlementStatusReleasesAnExpiredLostSend(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
	pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
	ctx := context.Background()
	_, err := e.f.Settle(ctx, pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) {
		t.Fatalf("want an unknown outcome, got %v", err)
	}
	if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("with a valid blockhash: %+v %v", st, err)
	}
	e.chain.ExpireBlockhash()
	if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementNever {
		t.Fatalf("after the blockhash expired: %+v %v", st, err)
	}
	if a, b := e.balances(t); a != 1_000_000 || b != 0 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}

// "Never landed" needs the blockhash expired in the confirmed bank too,
// not at the processed tip alone: a transaction on a blockhash the
// confirmed bank still takes may yet be confirmed. Settle's poll and the
// search judge expiry by the one rule.
func TestExpiryNeedsTheConfirmedBankToo(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}})
	fr.set(func(f *faultyRPC) { f.target, f.confirmedValid = e.chain.URL, true })
	pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
	ctx := context.Background()
	e.chain.ExpireBlockhash()
	if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("expired at the processed tip, valid in the confirmed bank: %+v %v, want undecided", st, err)
	}
	fr.set(func(f *faultyRPC) { f.confirmedValid = false })
	if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementNever {
		t.Fatalf("expired in both: %+v %v, want never", st, err)
	}
}

// A gateway's StatusReader, on the chain alone, judges a payment by the
// signature its facilitator named: done once it landed, never once a lost
// send's blockhash expired; a signature that is not the fee payer's over
// the payment's message is not taken, whatever landed under it.
func TestStatusReaderJudgesByTheNamedSignature(t *testing.T) {
	ctx := context.Background()
	t.Run("landed", func(t *testing.T) {
		fr := &faultyRPC{}
		srv := fr.serve(t)
		e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
		fr.set(func(f *faultyRPC) { f.target, f.dropSend, f.forwardOK, f.hideStatus = e.chain.URL, true, true, true })
		pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
		began := time.Now()
		_, err := e.f.Settle(ctx, pp, e.req)
		var unknown *x402.UnknownOutcomeError
		if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.Transaction == "" {
			t.Fatalf("want an unknown outcome naming the signature, got %v", err)
		}
		r, err := NewStatusReader(&RPC{URL: e.chain.URL}, x402.NetworkSolanaDevnet)
		if err != nil {
			t.Fatal(err)
		}
		st, err := r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: unknown.Reply.Transaction, After: began})
		if err != nil || st.State != x402.SettlementDone || st.Transaction != unknown.Reply.Transaction {
			t.Fatalf("%+v %v", st, err)
		}
		tx, err := DecodePayload(pp.Payload)
		if err != nil {
			t.Fatal(err)
		}
		payerSig := base58.Encode(tx.Signatures[1])
		// A name that is not the fee payer's signature over the message is
		// not taken; the payment is searched for instead, and found under
		// its own id.
		for _, wrong := range []string{payerSig, "not base58!"} {
			if st, err := r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: wrong, After: began}); err != nil || st.State != x402.SettlementDone || st.Transaction != unknown.Reply.Transaction {
				t.Fatalf("named %q: %+v %v", wrong, st, err)
			}
		}
	})
	t.Run("lost send, blockhash expired", func(t *testing.T) {
		fr := &faultyRPC{}
		srv := fr.serve(t)
		e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
		fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
		pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
		_, err := e.f.Settle(ctx, pp, e.req)
		var unknown *x402.UnknownOutcomeError
		if !errors.As(err, &unknown) || unknown.Reply == nil {
			t.Fatalf("want an unknown outcome, got %v", err)
		}
		r, _ := NewStatusReader(&RPC{URL: e.chain.URL}, x402.NetworkSolanaDevnet)
		if st, err := r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: unknown.Reply.Transaction}); err != nil || st.State != x402.SettlementUndecided {
			t.Fatalf("valid blockhash: %+v %v", st, err)
		}
		e.chain.ExpireBlockhash()
		if st, err := r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: unknown.Reply.Transaction}); err != nil || st.State != x402.SettlementNever {
			t.Fatalf("expired blockhash: %+v %v", st, err)
		}
	})
	if _, err := NewStatusReader(&RPC{URL: "http://127.0.0.1:1"}, x402.NetworkDevnet); err == nil {
		t.Fatal("a Solana reader for an EVM network")
	}
}

// A pending record (sent, outcome unknown) whose caller never asks again is
// swept like a settled one, DuplicateWindow after its claim; the payment is
// then judged from the chain by its transaction's id, as after a restart.
func TestPendingRecordsAreSwept(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 100 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend, f.forwardOK, f.hideStatus = e.chain.URL, true, true, true })
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	ctx := context.Background()
	_, err := e.f.Settle(ctx, pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil {
		t.Fatalf("want an unknown outcome, got %v", err)
	}
	records := func() int {
		e.f.mu.Lock()
		defer e.f.mu.Unlock()
		return len(e.f.settled)
	}
	if n := records(); n != 1 {
		t.Fatalf("%d records after a pending settlement, want 1", n)
	}
	fr.set(func(f *faultyRPC) { f.dropSend, f.hideStatus = false, false })
	now = func() time.Time { return time.Now().Add(DuplicateWindow + sweepEvery + time.Second) }
	defer func() { now = time.Now }()
	// Any Verify sweeps.
	if v, err := e.f.Verify(ctx, Payload(p.withMemo("another"), e.req), e.req); err != nil || !v.IsValid {
		t.Fatalf("verify: %+v %v", v, err)
	}
	if n := records(); n != 0 {
		t.Fatalf("%d records past the window, want 0: pending records are never swept", n)
	}
	// What the record said, the chain says: the transfer landed.
	if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementDone || st.Transaction != unknown.Reply.Transaction {
		t.Fatalf("status after the sweep: %+v %v", st, err)
	}
}
