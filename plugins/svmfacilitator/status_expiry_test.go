package svmfacilitator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// When the gateway's own status read (SettlementStatus, how it resolves
// its pending answers) is the first to learn that a pending send's
// blockhash expired, the record of the send (Config.Sent) is dropped, as
// when a /settle or the background resolver learns it (README, Payments
// on Solana). (Before: it was dropped from memory only, and stayed in the
// store, unanswered, for the whole SentRecordHold.)
func TestSettlementStatusLearningExpiryDropsSentRecord(t *testing.T) {
	db := openStore(t, t.TempDir())
	fr := &faultyRPC{}
	srv := fr.serve(t)
	// A long PollInterval keeps the background resolver from learning it
	// first: the gate's status read does.
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, Sent: sentOf(db), ConfirmTimeout: 300 * time.Millisecond, PollInterval: time.Minute})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
	tx := e.payment(t).Transaction()
	dec, err := DecodeTransaction(tx)
	if err != nil {
		t.Fatal(err)
	}
	key := e.f.sentKey(dec.MessageHash())
	pp := Payload(tx, e.req)
	ctx := context.Background()
	var unknown *x402.UnknownOutcomeError
	if _, err := e.f.Settle(ctx, pp, e.req); !errors.As(err, &unknown) {
		t.Fatalf("want an unknown outcome, got %v", err)
	}
	if _, err := db.Claims().Lookup(ctx, key); err != nil {
		t.Fatalf("record after the pending answer: %v", err)
	}
	e.chain.ExpireBlockhash()
	if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementNever {
		t.Fatalf("after the blockhash expired: %+v %v", st, err)
	}
	if st, err := db.Claims().Lookup(ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record once the status read learned the blockhash expired: %+v %v; README says it is dropped", st, err)
	}
}

// shortKeep scales keepMarked's extension as shortHold scales the hold.
type shortKeep struct {
	SentStore
	keep time.Duration
}

func (s *shortKeep) Settle(ctx context.Context, c store.Claim, note string, _ time.Time) error {
	return s.SentStore.Settle(ctx, c, note, c.Until.Add(s.keep))
}

// A sender's memory of a pending send, past its life (its record's hold
// plus SentRecordHold, by the facilitator's clock) and not yet swept, is
// not acted on by a status read: another facilitator adopted, marked and
// kept the record and answered success, and the read answers settled by
// another settlement, as a Settle at that moment does. Hold and keep are
// scaled to 2 s each and the clock moved by SentRecordHold. (Before: the
// status read used the expired memory, found the record gone, took it for
// lapsed unmarked and answered settled, which the gate serves.)
func TestStatusReadIgnoresAnExpiredMemory(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &shortHold{SentStore: sentOf(db), hold: 2 * time.Second}
	e, fr, pp, unknown := settlePending(t, sent, time.Minute)
	ctx := context.Background()
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: e.chain.URL}, &shortKeep{SentStore: sent, keep: 2 * time.Second}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := b.Settle(ctx, pp, e.req); err != nil || !s.Success {
		t.Fatalf("B: %+v %v; want success (adopted, marked, kept)", s, err)
	}
	time.Sleep(4500 * time.Millisecond) // hold and keep passed: B's marked record lapsed
	now = func() time.Time { return time.Now().Add(SentRecordHold) }
	defer func() { now = time.Now }()
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	st, err := e.f.SettlementStatus(ctx, pp, e.req)
	if err != nil || !answeredElsewhere(st) || st.Transaction != unknown.Reply.Transaction {
		t.Errorf("sender's status read on its expired memory after B answered success: %+v %v; want never, duplicate_settlement", st, err)
	}
}
