package svmfacilitator

import (
	"context"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// In a multi with a remote member the embedded member reads every payment
// it did not send in this process as a peer's, so after a restart it
// reads its own earlier send, whose record in the shared store is still
// unanswered, by the chain alone: landed after the attempt began, settled,
// and the gate serves the buyer. The peer read marks that record answered
// as it answers settled, so a later Settle of the same payment (a replay,
// on this instance or another sharing the store) finds it answered and is
// refused duplicate_settlement, however often asked. (Before: the record
// was left unanswered, and the later Settle adopted it and answered
// success, the payment served twice.)
func TestPeerReadMarksTheUnansweredRecordItAnswersSettled(t *testing.T) {
	c := newCrashTest(t)
	e := c.e
	ctx := context.Background()
	began := time.Now()
	_, sig := c.sentUnanswered(t, func(ctx context.Context, hash [32]byte) error {
		_, err := e.f.remember(ctx, hash, &settlement{})
		return err
	})
	e.f.Close()
	c.db.Close()
	c.db = openStore(t, c.dir)
	f := restartedOn(t, c, e.chain.URL, sentOf(c.db), nil)
	for i := range 2 {
		if st, err := f.PeerSettlementStatus(ctx, c.pp, e.req, began); err != nil || st.State != x402.SettlementDone || st.Transaction != sig {
			t.Fatalf("peer read %d after the restart: %+v %v; want settled naming %s", i+1, st, err, sig)
		}
	}
	other := restartedOn(t, c, e.chain.URL, sentOf(c.db), nil)
	for name, s := range map[string]*Facilitator{"this instance": f, "another instance": other} {
		if r, err := s.Settle(ctx, c.pp, e.req); err != nil || r.Success || r.ErrorReason != ReasonDuplicateSettlement {
			t.Errorf("a later Settle of the payment on %s: %+v %v; want duplicate_settlement", name, r, err)
		}
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}
