package svmfacilitator

import (
	"context"
	"testing"

	"github.com/aovhq/aov/x402"
)

// Two instances with one fee payer remember their sends in one store. A
// settles the payment and marks its record answered; its reply is lost
// (the gateway's caller charged, told settlement_pending). B, asked as the
// peer reader, finds A's record marked by another and reads the chain for
// the transaction: settled, naming it, however often it is asked. Its own
// reading, SettlementStatus, still answers that record "settled by another
// settlement", and the record stays A's. (Before: the peer read answered
// the marked record settled by another settlement, and the gateway refused
// the charged buyer duplicate_settlement.)
func TestPeerReadOfASendRecordedInASharedStore(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{Sent: sentOf(db)})
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle on A: %+v %v", s, err)
	}
	cfg := e.f.cfg
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		st, err := b.PeerSettlementStatus(ctx, pp, e.req)
		if err != nil || st.State != x402.SettlementDone || st.Transaction != s.Transaction || st.Reason != "" {
			t.Fatalf("peer read %d on B: %+v %v; want settled naming %s", i+1, st, err, s.Transaction)
		}
	}
	if st, err := b.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementNever || st.Reason != ReasonDuplicateSettlement {
		t.Errorf("B's own status read of A's marked record: %+v %v; want settled by another settlement", st, err)
	}
	if a, p := e.balances(t); a != 1_000_000-20000 || p != 20000 {
		t.Errorf("balances payer %d payee %d", a, p)
	}
}
