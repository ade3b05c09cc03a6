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
