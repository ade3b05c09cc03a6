package svmfacilitator

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// answeredElsewhere reports whether st is the status read's answer for a
// payment another settlement answered: decided, never served as the
// caller's own (not SettlementDone), and naming duplicate_settlement.
func answeredElsewhere(st x402.SettlementStatus) bool {
	return st.State == x402.SettlementNever && st.Reason == ReasonDuplicateSettlement
}

// A status read (from memory) that learns a pending send landed while the
// store cannot mark its record answered tells its caller nothing decided
// (undecided): the record stays unanswered, so a Settle through another
// facilitator on the same store adopts it and answers success, the one
// success of the payment. (Before: the status read answered settled, the
// gate served its buyer, and the other Settle answered success too.)
func TestStatusReadThatCannotMarkTheRecordIsUndecided(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &swapFails{SentStore: sentOf(db)}
	e, fr, pp, _ := settlePending(t, sent, time.Minute)
	ctx := context.Background()
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	sent.fail.Store(true) // the store cannot mark the record for a moment
	st, err := e.f.SettlementStatus(ctx, pp, e.req)
	sent.fail.Store(false)
	if err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("status read with the mark failing: %+v %v; want undecided", st, err)
	}
	other := e.elsewhere(t)
	s, err := other.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle elsewhere: %+v %v; want success (it adopts the unanswered record)", s, err)
	}
	// The sender's next status read, the store back, finds the record
	// marked by the other Settle: settled elsewhere, twice alike.
	for i := 0; i < 2; i++ {
		if st, err = e.f.SettlementStatus(ctx, pp, e.req); err != nil || !answeredElsewhere(st) {
			t.Fatalf("status read %d after the settle elsewhere: %+v %v; want never, duplicate_settlement", i, st, err)
		}
	}
}

// The same through a facilitator with no memory of the send (a reload
// changing its settings, or a restart): unrecorded's mark failing is
// undecided too, never settled.
func TestUnrecordedStatusReadThatCannotMarkTheRecordIsUndecided(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &swapFails{SentStore: sentOf(db)}
	e, _, pp, unknown := settlePending(t, sent, time.Minute)
	ctx := context.Background()
	reader := e.elsewhere(t)
	sent.fail.Store(true)
	st, err := reader.SettlementStatus(ctx, pp, e.req)
	sent.fail.Store(false)
	if err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("status read with the mark failing: %+v %v; want undecided", st, err)
	}
	// Its retry, the store back, marks the record and answers settled;
	// a Settle elsewhere then answers duplicate_settlement.
	if st, err = reader.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementDone || st.Transaction != unknown.Reply.Transaction {
		t.Fatalf("status read with the store back: %+v %v; want settled naming %s", st, err, unknown.Reply.Transaction)
	}
	other := e.elsewhere(t)
	if s, err := other.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement {
		t.Fatalf("settle elsewhere after the status read marked it: %+v %v; want duplicate_settlement", s, err)
	}
}

// A pending send adopted and answered success by a Settle through another
// facilitator on the same store: the sender's own status read (the
// gateway's retry of its settlement_pending) answers that another
// settlement settled it, never settled as its caller's own. (Before:
// store.ErrNoteChanged from the mark was ignored, and the status read
// answered settled: the gateway served its buyer, for a payment the other
// Settle's caller was told succeeded.)
func TestStatusReadAfterAnotherSettleAnsweredSuccessIsDuplicate(t *testing.T) {
	db := openStore(t, t.TempDir())
	e, fr, pp, _ := settlePending(t, sentOf(db), time.Minute)
	ctx := context.Background()
	other := e.elsewhere(t)
	s, err := other.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle elsewhere: %+v %v; want success (adopted)", s, err)
	}
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	for i := 0; i < 2; i++ { // the second from memory
		st, err := e.f.SettlementStatus(ctx, pp, e.req)
		if err != nil || !answeredElsewhere(st) {
			t.Fatalf("sender's status read %d: %+v %v; want never, duplicate_settlement", i, st, err)
		}
	}
	// A status read with no memory of the send answers the same.
	reader := e.elsewhere(t)
	if st, err := reader.SettlementStatus(ctx, pp, e.req); err != nil || !answeredElsewhere(st) {
		t.Fatalf("status read with no memory: %+v %v; want never, duplicate_settlement", st, err)
	}
}

// The gateway's own order (/verify before /settle) at a second gateway
// whose claims are its own but whose svm block shares the store of sends:
// the first Settle's send is lost on its way (an unknown outcome) and
// lands a moment later; the second gateway's Verify ran before it landed
// (passes), and its Settle adopts the unanswered record and answers
// success. The first gateway's status read of its pending settlement
// answers that another settlement settled it: one payment, one gateway
// told it is theirs.
func TestVerifyThenSettleElsewhereLeavesTheSenderStatusDuplicate(t *testing.T) {
	db := openStore(t, t.TempDir())
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, Sent: sentOf(db), ConfirmTimeout: 300 * time.Millisecond, PollInterval: time.Minute})
	p := e.payment(t)
	raw := p.Build(p.Instructions())
	pp := Payload(raw, e.req)
	fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
	ctx := context.Background()
	_, err := e.f.Settle(ctx, pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) {
		t.Fatalf("first settle: %v; want an unknown outcome", err)
	}
	fr.set(func(f *faultyRPC) { f.dropSend = false })
	other := e.elsewhere(t)
	vr, err := other.Verify(ctx, pp, e.req)
	if err != nil || !vr.IsValid {
		t.Fatalf("verify elsewhere before it landed: %+v %v", vr, err)
	}
	sig := e.sendSigned(t, raw) // the first send, delayed, lands
	s, err := other.Settle(ctx, pp, e.req)
	if err != nil || !s.Success || s.Transaction != sig {
		t.Fatalf("settle elsewhere: %+v %v; want success naming %s", s, err, sig)
	}
	st, err := e.f.SettlementStatus(ctx, pp, e.req)
	if err != nil || !answeredElsewhere(st) {
		t.Fatalf("sender's status read of %s: %+v %v; want never, duplicate_settlement", sig, st, err)
	}
}

// shortHold is the store of sends with SentRecordHold shortened to hold:
// what ten minutes of no Verify/Settle traffic on this facilitator do to
// a pending send's record, in a second.
type shortHold struct {
	SentStore
	hold time.Duration
}

func (s *shortHold) ClaimHeld(ctx context.Context, keys []string, _ time.Time, span time.Duration, note func(store.Claim) (string, error)) (store.Claim, error) {
	return s.SentStore.ClaimHeld(ctx, keys, time.Now().Add(s.hold), span, note)
}

// A send answered settlement_pending whose record lapsed (SentRecordHold)
// before its transfer could be read is read settled by its sender's status
// read from memory, naming its transaction: no record is left for anyone
// to mark. A facilitator with no memory of the send cannot tell it sent it
// and reads it settled by another settlement. (Before: every read from
// memory tried to mark a record that no longer existed,
// store.ErrClaimLost, and answered undecided for ever; and a read with no
// memory answered settled, beside the sender's success.)
func TestStatusReadAfterTheRecordLapsedIsSettled(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &shortHold{SentStore: sentOf(db), hold: time.Second}
	e, fr, pp, unknown := settlePending(t, sent, time.Minute)
	sig := unknown.Reply.Transaction
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d; want the transfer landed", a, b)
	}
	time.Sleep(1500 * time.Millisecond) // the record lapses
	ctx := context.Background()
	if _, err := db.Claims().Lookup(ctx, e.f.sentKey(mustDecode(t, pp).MessageHash())); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record: %v; want lapsed", err)
	}
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	rs, err := e.elsewhere(t).SettlementStatus(ctx, pp, e.req)
	if err != nil || !answeredElsewhere(rs) || rs.Transaction != sig {
		t.Fatalf("status read with no memory: %+v %v; want never, duplicate_settlement naming %s", rs, err, sig)
	}
	for i := 0; i < 3; i++ {
		st, err := e.f.SettlementStatus(ctx, pp, e.req)
		if err != nil || st.State != x402.SettlementDone || st.Transaction != sig {
			t.Errorf("sender's status read %d after its record lapsed: %+v %v; want settled naming %s", i, st, err, sig)
		}
	}
}

// Two facilitators on one store of sends: A settles the payment (success,
// record marked), B's /settle of it answers duplicate_settlement, and B's
// status read of it then answers from memory what a fresh read answers:
// settled by another settlement. (Before: B's memory of that duplicate
// read as settled, its caller's own.)
func TestStatusReadAfterDuplicateSettleIsDuplicate(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{Sent: sentOf(db)})
	pp := Payload(e.payment(t).Transaction(), e.req)
	ctx := context.Background()
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || !s.Success {
		t.Fatalf("settle on A: %+v %v", s, err)
	}
	fresh, err := e.elsewhere(t).SettlementStatus(ctx, pp, e.req)
	if err != nil || !answeredElsewhere(fresh) {
		t.Fatalf("fresh status read: %+v %v; want never, duplicate_settlement", fresh, err)
	}
	b := e.elsewhere(t)
	if s, err := b.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement {
		t.Fatalf("settle on B: %+v %v; want duplicate_settlement", s, err)
	}
	if st, err := b.SettlementStatus(ctx, pp, e.req); err != nil || !answeredElsewhere(st) {
		t.Errorf("B's status read after its Settle answered duplicate_settlement: %+v %v; want never, duplicate_settlement (as a fresh read: %+v)", st, err, fresh)
	}
}

// slowSwap is the store of sends whose mark stalls (a Redis that accepts
// and does not answer, a Badger disk stall) until its own deadline.
type slowSwap struct{ SentStore }

func (s *slowSwap) Swap(ctx context.Context, c store.Claim, old, note string) error {
	<-ctx.Done()
	return ctx.Err()
}

// A status read whose mark stalls ends near its caller's deadline,
// undecided, not after ConfirmTimeout (5 s here). (Before: the mark ran
// on context.Background() bounded by ConfirmTimeout alone, so a store that
// stalled held every status read past its caller's deadline.)
func TestStatusReadWithAStalledMarkEndsAtItsCallersDeadline(t *testing.T) {
	db := openStore(t, t.TempDir())
	e, fr, pp, _ := settlePending(t, sentOf(db), time.Minute)
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent, cfg.ConfirmTimeout = &RPC{URL: e.chain.URL}, &slowSwap{SentStore: sentOf(db)}, 5*time.Second
	reader, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	st, err := reader.SettlementStatus(ctx, pp, e.req)
	if d := time.Since(start); d > 2*time.Second { // a mark held to ConfirmTimeout takes 5 s
		t.Errorf("status read with a 300ms deadline took %v (%+v %v); want it to end near its caller's deadline", d.Round(time.Millisecond), st, err)
	}
	if err == nil && st.State != x402.SettlementUndecided {
		t.Errorf("status read whose mark could not finish: %+v; want undecided", st)
	}
}

// lostAnswer is the Badger store of sends whose mark (Swap) lands while
// its answer is lost (as a Redis reply dropped after the script ran: see
// TestRedisStatusReadMarkWhoseReplyIsLostIsStillItsOwn), while lose is set.
type lostAnswer struct {
	SentStore
	lose atomic.Bool
}

func (s *lostAnswer) Swap(ctx context.Context, c store.Claim, old, note string) error {
	err := s.SentStore.Swap(ctx, c, old, note)
	if s.lose.Load() && err == nil {
		return errors.New("i/o timeout (the mark landed, its answer was lost)")
	}
	return err
}

// A status read with no memory of a send adopts its record and marks it;
// the mark lands, its answer is lost (undecided, the adopted send kept in
// memory with its mark). Minutes later, after a sweep, the next read finds
// the mark its own and answers settled, and a Settle elsewhere does not
// answer success. (Before: the memory was a pending entry swept
// DuplicateWindow after the adoption, and the read took its own mark for
// another's: settled by another settlement, the gate released its claim
// and the buyer, charged, was never served.)
func TestStatusReadOfItsOwnLostMarkMinutesLaterIsSettled(t *testing.T) {
	db := openStore(t, t.TempDir())
	e, _, pp, unknown := settlePending(t, sentOf(db), time.Minute)
	sig := unknown.Reply.Transaction
	ctx := context.Background()
	sent := &lostAnswer{SentStore: sentOf(db)}
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: e.chain.URL}, sent
	reader, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sent.lose.Store(true)
	st, err := reader.SettlementStatus(ctx, pp, e.req)
	sent.lose.Store(false)
	if err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("status read whose mark's answer was lost: %+v %v; want undecided", st, err)
	}
	// 2 minutes and a bit later, any Settle on this facilitator sweeps.
	now = func() time.Time { return time.Now().Add(DuplicateWindow + time.Minute) }
	defer func() { now = time.Now }()
	op := e.payment(t)
	op.Memo = "another-payment-another-payment!"
	other := Payload(op.Transaction(), e.req)
	if mustDecode(t, other).MessageHash() == mustDecode(t, pp).MessageHash() {
		t.Fatal("the other payment is the same transaction; the test proves nothing")
	}
	reader.mu.Lock()
	_, before := reader.settled[mustDecode(t, pp).MessageHash()]
	reader.mu.Unlock()
	_, _ = reader.Settle(ctx, other, e.req)
	now = time.Now
	reader.mu.Lock()
	_, after := reader.settled[mustDecode(t, pp).MessageHash()]
	reader.mu.Unlock()
	if !before || !after {
		t.Fatalf("memory of the adopted send: before the sweep %v, after %v; want kept", before, after)
	}
	st, err = reader.SettlementStatus(ctx, pp, e.req)
	if err != nil || st.State != x402.SettlementDone || st.Transaction != sig {
		t.Errorf("next status read (the record carries this facilitator's own mark, nobody else was told success): %+v %v; want settled naming %s", st, err, sig)
	}
	if s, err := e.elsewhere(t).Settle(ctx, pp, e.req); err != nil || s.Success {
		t.Errorf("settle elsewhere: %+v %v; want no success", s, err)
	}
}

// The same through the sender's own Settle: its mark lands, its answer is
// lost (settlement_pending), and its retry minutes later, after a sweep,
// finds its own mark and answers success. (Before: the memory was swept
// DuplicateWindow after the pending answer and the retry answered
// duplicate_settlement, nobody ever told success.)
func TestSettleRetryOfItsOwnLostMarkMinutesLaterIsSuccess(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &lostAnswer{SentStore: sentOf(db)}
	sent.lose.Store(true)
	e := newEnv(t, Config{Sent: sent, PollInterval: 20 * time.Millisecond, ConfirmTimeout: 300 * time.Millisecond})
	pp := Payload(e.payment(t).Transaction(), e.req)
	ctx := context.Background()
	_, err := e.f.Settle(ctx, pp, e.req)
	sent.lose.Store(false)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("settle whose mark's answer was lost: %v; want settlement_pending", err)
	}
	now = func() time.Time { return time.Now().Add(DuplicateWindow + time.Minute) }
	defer func() { now = time.Now }()
	op := e.payment(t)
	op.Memo = "another-payment-another-payment!"
	_, _ = e.f.Settle(ctx, Payload(op.Transaction(), e.req), e.req) // any Settle sweeps
	now = time.Now
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success || s.Transaction != unknown.Reply.Transaction {
		t.Errorf("retry (the record carries this Settle's own mark): %+v %v; want success naming %s", s, err, unknown.Reply.Transaction)
	}
}

// keepFails is the store of sends whose keeping of a marked record
// (Settle) fails while fail is set: the store went away between the mark
// and the write that keeps it.
type keepFails struct {
	SentStore
	fail atomic.Bool
}

func (s *keepFails) Settle(ctx context.Context, c store.Claim, note string, keepUntil time.Time) error {
	if s.fail.Load() {
		return errors.New("connection refused")
	}
	return s.SentStore.Settle(ctx, c, note, keepUntil)
}

// A Settle whose mark lands but cannot keep the record past its hold
// answers settlement_pending, not success, since another facilitator's
// memory of the send could outlive the record; its retry finds its own
// mark, keeps the record SentRecordHold past its hold, and answers
// success.
func TestSettleWhoseMarkIsNotKeptIsPendingUntilItIs(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &keepFails{SentStore: sentOf(db)}
	sent.fail.Store(true)
	e := newEnv(t, Config{Sent: sent, PollInterval: 20 * time.Millisecond, ConfirmTimeout: 300 * time.Millisecond})
	pp := Payload(e.payment(t).Transaction(), e.req)
	ctx := context.Background()
	key := e.f.sentKey(mustDecode(t, pp).MessageHash())
	_, err := e.f.Settle(ctx, pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("settle whose mark could not be kept: %v; want settlement_pending", err)
	}
	rec, err := db.Claims().Lookup(ctx, key)
	if err != nil || !rec.Settled || rec.Until.After(time.Now().Add(SentRecordHold)) {
		t.Fatalf("record: %+v %v; want marked, held no longer than SentRecordHold", rec, err)
	}
	sent.fail.Store(false)
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success || s.Transaction != unknown.Reply.Transaction {
		t.Fatalf("retry: %+v %v; want success naming %s", s, err, unknown.Reply.Transaction)
	}
	if kept, err := db.Claims().Lookup(ctx, key); err != nil || !kept.Until.Equal(rec.Until.Add(SentRecordHold)) {
		t.Errorf("record after the retry: %+v %v; want kept until %v", kept, err, rec.Until.Add(SentRecordHold))
	}
}
