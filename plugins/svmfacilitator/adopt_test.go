package svmfacilitator

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// A send answered settlement_pending (its node hid the statuses while the
// transfer landed) is settled again through two other facilitators on the
// same store (a reload changing the settings, or two instances), at the
// same moment: the record of the send has exactly one of them answer
// success and the other duplicate_settlement naming the transaction, and
// the facilitator that sent it, asked again once its node answers,
// answers duplicate_settlement too. Nothing is sent twice. (Before: the
// other facilitators answered duplicate_settlement alone, never success,
// so the payment's pending answer was never followed by its success.)
func TestPendingSendAnsweredSuccessOnceAcrossFacilitatorsOnOneStore(t *testing.T) {
	db := openStore(t, t.TempDir())
	e, fr, pp, unknown := settlePending(t, sentOf(db), 20*time.Millisecond)
	ctx := context.Background()
	if unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("first settle: %v; want settlement_pending", unknown)
	}
	sig := unknown.Reply.Transaction
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d; want the transfer landed", a, b)
	}

	others := []*Facilitator{e.elsewhere(t), e.elsewhere(t)}
	answers := make([]x402.SettleResponse, len(others))
	errs := make([]error, len(others))
	var wg sync.WaitGroup
	for i, f := range others {
		wg.Go(func() { answers[i], errs[i] = f.Settle(ctx, pp, e.req) })
	}
	wg.Wait()
	successes := 0
	for i, a := range answers {
		switch {
		case errs[i] != nil || a.Transaction != sig:
			t.Fatalf("settle %d: %+v %v; want an answer naming %s", i, a, errs[i], sig)
		case a.Success:
			successes++
		case a.ErrorReason != ReasonDuplicateSettlement:
			t.Fatalf("settle %d: %+v; want success or duplicate_settlement", i, a)
		}
	}
	if successes != 1 {
		t.Fatalf("%d successes (%+v); want exactly one", successes, answers)
	}
	if st, err := db.Claims().Lookup(ctx, e.f.sentKey(mustDecode(t, pp).MessageHash())); err != nil || !st.Settled || markedSig(st.Note) != sig {
		t.Fatalf("record: %+v %v; want it answered, naming %s", st, err, sig)
	}

	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != sig {
		t.Fatalf("retry at the sender: %+v %v; want duplicate_settlement naming %s", s, err, sig)
	}
	if n := fr.count("sendTransaction"); n != 1 {
		t.Errorf("sent %d times; want once", n)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d (paid once)", a, b)
	}
}

// A pending send the gateway's own status read (SettlementStatus) learned
// landed is answered settled there, and its record says so: a /settle of
// it through another facilitator on the same store is
// duplicate_settlement naming it, never a success for a payment its
// caller was already told settled.
func TestPendingSendSettledByStatusReadIsDuplicateElsewhere(t *testing.T) {
	db := openStore(t, t.TempDir())
	e, fr, pp, unknown := settlePending(t, sentOf(db), time.Minute)
	ctx := context.Background()
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementDone {
		t.Fatalf("status: %+v %v; want settled", st, err)
	}
	other := e.elsewhere(t)
	if s, err := other.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != unknown.Reply.Transaction {
		t.Fatalf("settle elsewhere: %+v %v; want duplicate_settlement naming %s", s, err, unknown.Reply.Transaction)
	}
}

// So is one whose status a facilitator with no memory of it (after a
// reload that changed the settings, or a restart) reads as settled.
func TestPendingSendSettledByStatusReadElsewhereIsDuplicate(t *testing.T) {
	db := openStore(t, t.TempDir())
	e, _, pp, unknown := settlePending(t, sentOf(db), time.Minute)
	ctx := context.Background()
	reader := e.elsewhere(t)
	if st, err := reader.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementDone {
		t.Fatalf("status: %+v %v; want settled", st, err)
	}
	other := e.elsewhere(t)
	if s, err := other.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != unknown.Reply.Transaction {
		t.Fatalf("settle elsewhere: %+v %v; want duplicate_settlement naming %s", s, err, unknown.Reply.Transaction)
	}
}

// swapFails is the Badger store of sends with its marks failing while
// fail is set: a store down at the moment a landed send would be answered.
type swapFails struct {
	SentStore
	fail atomic.Bool
}

func (s *swapFails) Swap(ctx context.Context, c store.Claim, old, note string) error {
	if s.fail.Load() {
		return errors.New("store down")
	}
	return s.SentStore.Swap(ctx, c, old, note)
}

// A send that landed while its record cannot be marked answered is
// answered settlement_pending, not success: unmarked, the record would
// have a Settle elsewhere answer success a second time. The retry, with
// the store back, answers success and marks it. (Before: the mark's
// failure was only logged, and the answer was success.)
func TestLandedSendUnmarkedIsPendingUntilMarked(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &swapFails{SentStore: sentOf(db)}
	sent.fail.Store(true)
	e := newEnv(t, Config{Sent: sent, PollInterval: 20 * time.Millisecond})
	pp := Payload(e.payment(t).Transaction(), e.req)
	ctx := context.Background()
	_, err := e.f.Settle(ctx, pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("settle with the mark failing: %v; want settlement_pending", err)
	}
	key := e.f.sentKey(mustDecode(t, pp).MessageHash())
	if st, err := db.Claims().Lookup(ctx, key); err != nil || st.Settled {
		t.Fatalf("record: %+v %v; want it not answered", st, err)
	}
	sent.fail.Store(false)
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success || s.Transaction != unknown.Reply.Transaction {
		t.Fatalf("retry with the store back: %+v %v; want success naming %s", s, err, unknown.Reply.Transaction)
	}
	if st, err := db.Claims().Lookup(ctx, key); err != nil || !st.Settled || markedSig(st.Note) != s.Transaction {
		t.Fatalf("record: %+v %v; want it answered", st, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d (paid once)", a, b)
	}
}

// settlePending settles a payment of a new env through a node that hides
// its statuses while the transfer lands, so the Settle answers an unknown
// outcome: the pending send on sent that the tests of adoption and of the
// status read start from. fr still hides the statuses when it returns.
func settlePending(t *testing.T, sent SentStore, poll time.Duration) (*env, *faultyRPC, x402.PaymentPayload, *x402.UnknownOutcomeError) {
	t.Helper()
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, Sent: sent, ConfirmTimeout: 300 * time.Millisecond, PollInterval: poll})
	fr.set(func(f *faultyRPC) { f.target, f.hideStatus = e.chain.URL, true })
	pp := Payload(e.payment(t).Transaction(), e.req)
	_, err := e.f.Settle(context.Background(), pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil {
		t.Fatalf("first settle: %v; want settlement_pending", err)
	}
	return e, fr, pp, unknown
}

// elsewhere is another facilitator on e's settings and store of sends,
// with no memory of e's sends and a node that hides nothing: a second
// instance, or e after a reload that changed its settings.
func (e *env) elsewhere(t *testing.T) *Facilitator {
	t.Helper()
	cfg := e.f.cfg
	cfg.RPC = &RPC{URL: e.chain.URL}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func mustDecode(t *testing.T, pp x402.PaymentPayload) *Transaction {
	t.Helper()
	tx, err := DecodePayload(pp.Payload)
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

// Close stops the background resolver of pending sends: a closed
// facilitator asks its node nothing more on its own, and a pending send
// it holds is answered by a retry as before. (Before: no Close, and the
// resolver polled a facilitator's node until the outcome was learned or
// its failure window passed, whoever still used it.)
func TestCloseStopsTheResolver(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.hideStatus = e.chain.URL, true })
	pp := Payload(e.payment(t).Transaction(), e.req)
	ctx := context.Background()
	if _, err := e.f.Settle(ctx, pp, e.req); err == nil {
		t.Fatal("want an unknown outcome")
	}
	n := fr.count("getSignatureStatuses")
	time.Sleep(200 * time.Millisecond)
	if fr.count("getSignatureStatuses") == n {
		t.Fatal("the resolver polled nothing before Close; the test proves nothing")
	}
	e.f.Close()
	time.Sleep(100 * time.Millisecond) // a poll under way ends
	n = fr.count("getSignatureStatuses")
	time.Sleep(300 * time.Millisecond)
	if later := fr.count("getSignatureStatuses"); later != n {
		t.Fatalf("%d polls after Close; want none", later-n)
	}
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || !s.Success {
		t.Fatalf("retry after Close: %+v %v; want success", s, err)
	}
}

// A payment another sender landed (without a record, or after its record
// lapsed) between this Settle's record and its send is answered
// AlreadyProcessed at send: its record goes, since no Settle of it
// answers for that transaction, and a /settle through another
// facilitator on the same store is duplicate_settlement naming it, never
// a success for a payment its sender answered.
func TestAlreadyProcessedAtSendDropsTheRecord(t *testing.T) {
	db := openStore(t, t.TempDir())
	fr := &faultyRPC{}
	e := newEnv(t, Config{RPC: &RPC{URL: fr.serve(t)}, Sent: sentOf(db), PollInterval: 20 * time.Millisecond})
	p := e.payment(t)
	raw := p.Build(p.Instructions())
	var elsewhere string
	fr.set(func(f *faultyRPC) {
		f.target = e.chain.URL
		f.beforeSend = func() {
			if elsewhere == "" {
				elsewhere = e.sendSigned(t, raw)
			}
		}
	})
	pp := Payload(raw, e.req)
	ctx := context.Background()
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != elsewhere {
		t.Fatalf("settle: %+v %v; want duplicate_settlement naming %s", s, err, elsewhere)
	}
	if st, err := db.Claims().Lookup(ctx, e.f.sentKey(mustDecode(t, pp).MessageHash())); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record: %+v %v; want none", st, err)
	}
	other := e.elsewhere(t)
	if s, err := other.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != elsewhere {
		t.Fatalf("settle elsewhere: %+v %v; want duplicate_settlement naming %s", s, err, elsewhere)
	}
}

// The same with the node's AlreadyProcessed answer arriving after the
// caller's deadline: the record still goes, and a /settle through another
// facilitator is duplicate_settlement naming the other sender's
// transaction. (Before: the drop ran on the caller's expired context, the
// record of a send that never happened stayed unanswered, and the other
// facilitator adopted it and answered success for a transaction another
// sender landed.)
func TestAlreadyProcessedAfterTheCallersDeadlineDropsTheRecord(t *testing.T) {
	db := openStore(t, t.TempDir())
	fr := &faultyRPC{}
	e := newEnv(t, Config{RPC: &RPC{URL: fr.serve(t)}, Sent: sentOf(db), PollInterval: 20 * time.Millisecond})
	p := e.payment(t)
	raw := p.Build(p.Instructions())
	var elsewhere string
	fr.set(func(f *faultyRPC) {
		f.target = e.chain.URL
		f.beforeSend = func() {
			if elsewhere == "" {
				elsewhere = e.sendSigned(t, raw)
				time.Sleep(500 * time.Millisecond) // the node answers after the caller's deadline
			}
		}
	})
	pp := Payload(raw, e.req)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	s, err := e.f.Settle(ctx, pp, e.req)
	cancel()
	if err == nil && s.Success {
		t.Fatalf("settle: %+v; want no success", s)
	}
	dropped(t, sentOf(db), e.f.sentKey(mustDecode(t, pp).MessageHash()))
	other := e.elsewhere(t)
	if s, err := other.Settle(context.Background(), pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != elsewhere {
		t.Errorf("settle elsewhere: %+v %v; want duplicate_settlement naming %s", s, err, elsewhere)
	}
}

// A landed send whose mark fails (the store down) is answered
// settlement_pending; the outage outlasts the record's hold
// (SentRecordHold, 1 s here); with the store back, the caller's retry
// answers success naming the transaction, once: no record is left for
// anyone else to mark. (Before: every retry tried to mark a record that
// no longer existed, store.ErrClaimLost, and answered settlement_pending
// for as long as the caller kept asking.)
func TestSettleRetryAfterAMarkOutageOutlastingTheRecordSucceeds(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &swapFails{SentStore: &shortHold{SentStore: sentOf(db), hold: time.Second}}
	sent.fail.Store(true)
	e := newEnv(t, Config{Sent: sent, PollInterval: 20 * time.Millisecond, ConfirmTimeout: 300 * time.Millisecond})
	pp := Payload(e.payment(t).Transaction(), e.req)
	ctx := context.Background()
	_, err := e.f.Settle(ctx, pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("settle with the mark failing: %v; want settlement_pending", err)
	}
	time.Sleep(1500 * time.Millisecond) // the outage outlasts the hold
	sent.fail.Store(false)
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success || s.Transaction != unknown.Reply.Transaction {
		t.Errorf("retry with the store back: %+v %v; want success naming %s", s, err, unknown.Reply.Transaction)
	}
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement {
		t.Errorf("second retry: %+v %v; want duplicate_settlement", s, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d (charged once)", a, b)
	}
}
