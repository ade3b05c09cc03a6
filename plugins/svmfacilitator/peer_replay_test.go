package svmfacilitator

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// A payment settled and answered success (the buyer served) is replayed
// after a restart (or at another gate) 10 s later. Its look-up through a
// node that fails once (a FAKE node answering getSignatureStatuses 503
// while failing is set; every other call the real simulated chain's) makes
// Settle answer settlement_pending naming the transaction, and the gate
// polls it. Read as a peer's send (a gate on multi { http; svm }), the
// transaction landed 10 s before the replay's attempt began: it is
// another settlement's, settled by another settlement as SettlementStatus
// answers it, never settled. (Before: the peer read judged by the chain
// alone answered settled naming the transaction, and the gate served the
// replay a second time for one payment.)
func TestPeerReadOfAReplayOfAnAnsweredPaymentIsAnotherSettlements(t *testing.T) {
	c := newCrashTest(t)
	e := c.e
	r, err := e.f.Settle(context.Background(), c.pp, e.req)
	if err != nil || !r.Success {
		t.Fatalf("first settle: %+v %v", r, err)
	}
	sig := r.Transaction
	e.f.Close()
	c.db.Close()
	c.db = openStore(t, c.dir)

	e.chain.AdvanceClock(10 * time.Second) // the replay comes 10 s later
	began := time.Now()
	var failing atomic.Bool
	failing.Store(true)
	node := proxy(t, e.chain.URL, func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool {
		if method == "getSignatureStatuses" && failing.Load() {
			replyUnavailable(w, id)
			return true
		}
		return false
	}, nil)
	f := restartedOn(t, c, node, sentOf(c.db), nil)
	r, err = f.Settle(context.Background(), c.pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) {
		t.Fatalf("replay with the look-up failing: %+v %v; the test needs the unknown outcome", r, err)
	}
	failing.Store(false)

	peer, err := f.PeerSettlementStatus(context.Background(), c.pp, e.req, began)
	own, oerr := f.SettlementStatus(context.Background(), c.pp, e.req)
	if err != nil || peer.State != x402.SettlementNever || peer.Reason != ReasonDuplicateSettlement || peer.Transaction != sig {
		t.Errorf("the peer read of a replay of payment %s, answered success 10 s before the replay began: %+v %v; want settled by another settlement naming it (as SettlementStatus: %+v %v)", sig, peer, err, own, oerr)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}
