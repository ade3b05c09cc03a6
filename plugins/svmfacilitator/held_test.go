package svmfacilitator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// heldNode is a FAKE node in front of the local chain for the two faults a
// held payment starts from, which the chain never produces by itself: with
// drop set, the next sendTransaction is answered with a signature as an
// accepting node would, and never reaches the chain (the node dropped it);
// with failLookUp set, getSignatureStatuses fails as a proxy whose node is
// down. It counts the sends that reached it, dropped or not.
type heldNode struct {
	drop, failLookUp atomic.Bool
	sends            atomic.Int32
}

// heldEnv is a chain, its fake node (heldNode) and a facilitator reading
// the chain through it, which gives up waiting for a confirmation after
// 300 ms, as a caller's deadline would.
func heldEnv(t *testing.T) (*env, *heldNode, x402.PaymentPayload) {
	t.Helper()
	return heldEnvOn(t, nil)
}

// heldEnvOn is heldEnv with sent as the store of sends (Config.Sent).
func heldEnvOn(t *testing.T, sent SentStore) (*env, *heldNode, x402.PaymentPayload) {
	t.Helper()
	e := newEnv(t, Config{})
	n := &heldNode{}
	cfg := e.f.cfg
	cfg.Sent = sent
	cfg.ConfirmTimeout, cfg.PollInterval = 300*time.Millisecond, 20*time.Millisecond
	cfg.RPC = &RPC{URL: proxy(t, e.chain.URL, func(w http.ResponseWriter, id json.RawMessage, method string, _ []json.RawMessage) bool {
		switch {
		case method == "sendTransaction":
			n.sends.Add(1)
			if n.drop.CompareAndSwap(true, false) {
				w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":"1111111111111111111111111111111111111111111111111111111111111111"}`))
				return true
			}
		case method == "getSignatureStatuses" && n.failLookUp.Load():
			replyUnavailable(w, id)
			return true
		}
		return false
	}, nil)}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	e.f = f
	return e, n, Payload(e.payment(t).Transaction(), e.req)
}

// heldPending settles pp on e, whose node drops the send (dropped) or
// fails the look-up before it (nothing sent), and requires the answer
// settlement_pending naming the transaction, nothing moved. The node is
// healthy again when it returns.
func heldPending(t *testing.T, e *env, n *heldNode, pp x402.PaymentPayload, dropped bool) string {
	t.Helper()
	n.drop.Store(dropped)
	n.failLookUp.Store(!dropped)
	_, err := e.f.Settle(context.Background(), pp, e.req)
	n.failLookUp.Store(false)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending || unknown.Reply.Transaction == "" {
		t.Fatalf("settle: %v; want settlement_pending naming the transaction", err)
	}
	if a, b := e.balances(t); a != 1_000_000 || b != 0 {
		t.Fatalf("balances payer %d payee %d; want nothing moved yet", a, b)
	}
	return unknown.Reply.Transaction
}

// statusUntilDone reads pp's status through e's facilitator every 50 ms
// until it is settled, for at most wait, and returns the last status.
func statusUntilDone(t *testing.T, e *env, pp x402.PaymentPayload, wait time.Duration) x402.SettlementStatus {
	t.Helper()
	var st x402.SettlementStatus
	for end := time.Now().Add(wait); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		var err error
		if st, err = e.f.SettlementStatus(context.Background(), pp, e.req); err != nil {
			t.Fatalf("status: %v", err)
		}
		if st.State != x402.SettlementUndecided {
			break
		}
	}
	return st
}

// chargedOnce requires pp settled once on e's chain, naming sig, and a
// Settle of it now a replay.
func chargedOnce(t *testing.T, e *env, pp x402.PaymentPayload, sig string) {
	t.Helper()
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d; want the payment once", a, b)
	}
	if r, err := e.f.Settle(context.Background(), pp, e.req); err != nil || r.Success || r.ErrorReason != ReasonDuplicateSettlement || r.Transaction != sig {
		t.Fatalf("settle after it landed: %+v %v; want %s naming %s", r, err, ReasonDuplicateSettlement, sig)
	}
}

// A send the node accepted and dropped is sent again, the same bytes,
// while its blockhash is valid, once its first send is 2 s old: it lands,
// the status read answers it settled, the payer is charged once.
// (Before: it was only polled, and the buyer waited for its blockhash to
// expire and signed again.)
func TestDroppedSendIsSentAgainAndLands(t *testing.T) {
	e, n, pp := heldEnv(t)
	sig := heldPending(t, e, n, pp, true)
	st := statusUntilDone(t, e, pp, 6*time.Second)
	if st.State != x402.SettlementDone || st.Transaction != sig {
		t.Fatalf("status: %+v; want settled naming %s", st, sig)
	}
	if got := n.sends.Load(); got != 2 {
		t.Fatalf("%d sends; want the dropped one and one more", got)
	}
	chargedOnce(t, e, pp, sig)
}

// A payment whose Settle ended without a verdict before anything was sent
// (its look-up on chain failed) is settled by the next status read while
// its blockhash is valid, through Settle's own path: sent once, landed,
// the read answers it settled, and the payment is served once (a Settle
// after it is a replay, and, with a store of sends, its record is marked
// answered, so another facilitator on the store answers it a replay too).
// (Before: the read only polled a signature the chain never got, until
// its blockhash expired.)
func TestStatusReadSettlesAPaymentWhoseSettleSentNothing(t *testing.T) {
	for _, withStore := range []bool{false, true} {
		t.Run(map[bool]string{false: "no store", true: "store of sends"}[withStore], func(t *testing.T) {
			var sent SentStore
			if withStore {
				sent = sentOf(openStore(t, t.TempDir()))
			}
			e, n, pp := heldEnvOn(t, sent)
			sig := heldPending(t, e, n, pp, false)
			if got := n.sends.Load(); got != 0 {
				t.Fatalf("%d sends with the look-up failing; want none", got)
			}
			st, err := e.f.SettlementStatus(context.Background(), pp, e.req)
			if err != nil || st.State != x402.SettlementDone || st.Transaction != sig || st.Payer != pub(e.payer).String() {
				t.Fatalf("status: %+v %v; want settled naming %s, paid by %s", st, err, sig, pub(e.payer))
			}
			if again, err := e.f.SettlementStatus(context.Background(), pp, e.req); err != nil || again != st {
				t.Fatalf("status read again: %+v %v; want %+v", again, err, st)
			}
			if got := n.sends.Load(); got != 1 {
				t.Fatalf("%d sends; want one", got)
			}
			chargedOnce(t, e, pp, sig)
			if !withStore {
				return
			}
			other, err := New(e.f.cfg) // no memory of the send, on the same store
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close()
			if r, err := other.Settle(context.Background(), pp, e.req); err != nil || r.Success || r.ErrorReason != ReasonDuplicateSettlement || r.Transaction != sig {
				t.Fatalf("settle elsewhere: %+v %v; want %s naming %s", r, err, ReasonDuplicateSettlement, sig)
			}
			if got := n.sends.Load(); got != 1 {
				t.Fatalf("%d sends; want one", got)
			}
		})
	}
}

// Two status reads and a Settle retry of one held payment at the same
// time, each asking again and again, send it at most once per 2 s: a
// dropped send is sent once more and lands once, and one never sent is
// sent once. Every answer is settled or pending, never a refusal.
func TestConcurrentStatusReadsAndSettleRetrySendOnce(t *testing.T) {
	for _, c := range []struct {
		name      string
		dropped   bool
		wantSends int32
	}{{"dropped send", true, 2}, {"nothing sent", false, 1}} {
		t.Run(c.name, func(t *testing.T) {
			e, n, pp := heldEnv(t)
			sig := heldPending(t, e, n, pp, c.dropped)
			var wg sync.WaitGroup
			errs := make(chan string, 64)
			end := time.Now().Add(6 * time.Second)
			for i := 0; i < 2; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ; time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
						st, err := e.f.SettlementStatus(context.Background(), pp, e.req)
						switch {
						case err != nil || (st.State == x402.SettlementDone && st.Transaction != sig) || st.State == x402.SettlementNever:
							errs <- fmt.Sprintf("status: %+v %v", st, err)
							return
						case st.State == x402.SettlementDone:
							return
						}
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ; time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					r, err := e.f.Settle(context.Background(), pp, e.req)
					var unknown *x402.UnknownOutcomeError
					switch {
					case errors.As(err, &unknown) && unknown.Reply != nil && unknown.Reply.ErrorReason == ReasonSettlementPending:
						continue
					case r.Success && r.Transaction == sig:
					case r.ErrorReason == ReasonDuplicateSettlement && (r.Transaction == sig || r.Transaction == ""):
						// Answered by a status read's settlement, or while it works.
						if r.Transaction == "" {
							continue
						}
					default:
						errs <- fmt.Sprintf("settle: %+v %v", r, err)
					}
					return
				}
			}()
			wg.Wait()
			close(errs)
			for msg := range errs {
				t.Error(msg)
			}
			if st := statusUntilDone(t, e, pp, time.Second); st.State != x402.SettlementDone || st.Transaction != sig {
				t.Fatalf("status after: %+v; want settled naming %s", st, sig)
			}
			if got := n.sends.Load(); got != c.wantSends {
				t.Fatalf("%d sends; want %d", got, c.wantSends)
			}
			if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
				t.Fatalf("balances payer %d payee %d; want the payment once", a, b)
			}
		})
	}
}

// A held payment whose blockhash expired is never sent again, nor settled
// by a status read: it can no longer land, the read answers never, and
// nothing is charged.
func TestHeldPaymentWhoseBlockhashExpiredIsNeverSent(t *testing.T) {
	for _, dropped := range []bool{true, false} {
		t.Run(map[bool]string{true: "dropped send", false: "nothing sent"}[dropped], func(t *testing.T) {
			e, n, pp := heldEnv(t)
			heldPending(t, e, n, pp, dropped)
			sends := n.sends.Load()
			e.chain.ExpireBlockhash()
			time.Sleep(2100 * time.Millisecond) // past the bound on sends again
			st, err := e.f.SettlementStatus(context.Background(), pp, e.req)
			if err != nil || st.State != x402.SettlementNever || st.Reason != "" {
				t.Fatalf("status: %+v %v; want never, for its expiry", st, err)
			}
			if got := n.sends.Load(); got != sends {
				t.Fatalf("%d sends after its expiry; want none", got-sends)
			}
			if a, b := e.balances(t); a != 1_000_000 || b != 0 {
				t.Fatalf("balances payer %d payee %d; want nothing charged", a, b)
			}
		})
	}
}

// A peer's read of a held payment (PeerSettlementStatus: the chain's word
// on a sibling's send) sends nothing through a facilitator with its fee
// payer that no Settle asked: the payment is not that read's to settle.
// Through the facilitator whose Settle was asked for it and sent nothing,
// the read settles it (the gateway asked that member, a multi with a
// remote member reads every payment as a peer's): once, and it lands once.
func TestPeerReadOfAHeldPaymentSendsNothing(t *testing.T) {
	e, n, pp := heldEnv(t)
	began := time.Now() // the gate's attempt
	sig := heldPending(t, e, n, pp, false)
	other, err := New(e.f.cfg) // its fee payer, through the same node
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for range 2 {
		st, err := other.PeerSettlementStatus(context.Background(), pp, e.req, began)
		if err != nil || st.State != x402.SettlementUndecided {
			t.Fatalf("peer read: %+v %v; want undecided", st, err)
		}
	}
	if got := n.sends.Load(); got != 0 {
		t.Fatalf("%d sends by a peer read; want none", got)
	}
	if a, b := e.balances(t); a != 1_000_000 || b != 0 {
		t.Fatalf("balances payer %d payee %d; want nothing moved", a, b)
	}
	st, err := e.f.PeerSettlementStatus(context.Background(), pp, e.req, began)
	if err != nil || st.State != x402.SettlementDone || st.Transaction != sig {
		t.Fatalf("read through the facilitator asked: %+v %v; want settled naming %s", st, err, sig)
	}
	if got := n.sends.Load(); got != 1 {
		t.Fatalf("%d sends; want one", got)
	}
	chargedOnce(t, e, pp, sig)
}

// A status read of a payment no Settle of this process was asked for
// sends nothing, its blockhash valid: a gateway that died before settling
// asks the same question of a payment whose settlement it may never have
// decided on (an upstream's error under settle after), and a process
// restarted since the Settle holds no word of it. Only a Settle's own
// unanswered send is brought to chain.
func TestStatusReadOfAPaymentNoSettleAskedSendsNothing(t *testing.T) {
	e, n, pp := heldEnv(t)
	heldPending(t, e, n, pp, false)
	fresh, err := New(e.f.cfg) // its fee payer, no Settle asked of it
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Close()
	st, err := fresh.SettlementStatus(context.Background(), pp, e.req)
	if err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("status: %+v %v; want undecided", st, err)
	}
	if got := n.sends.Load(); got != 0 {
		t.Fatalf("%d sends by a read no Settle asked for; want none", got)
	}
	if a, b := e.balances(t); a != 1_000_000 || b != 0 {
		t.Fatalf("balances payer %d payee %d; want nothing moved", a, b)
	}
}

// Settles whose caller went away before the send (a caller of the served
// /settle hanging up at once: the payments need only pass the static
// checks, no funds) are not noted for a status read to settle, so they
// cannot fill that memory (maxUnsent): a genuine payment whose look-up
// failed afterwards is still settled by its read. (Before: 4,096 hung-up
// settles filled it, and the genuine one waited for its blockhash to
// expire.)
func TestHungUpSettlesLeaveNothingForAReadToSettle(t *testing.T) {
	e, n, pp := heldEnv(t)
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 16 {
		p := e.payment(t)
		p.Memo = fmt.Sprintf("hung-up-%027d", i)
		if _, err := e.f.Settle(gone, Payload(p.Transaction(), e.req), e.req); !errors.As(err, new(*x402.UnknownOutcomeError)) {
			t.Fatalf("hung-up settle %d: %v; want an unknown outcome", i, err)
		}
	}
	e.f.mu.Lock()
	noted := len(e.f.unsent)
	e.f.mu.Unlock()
	if noted != 0 {
		t.Fatalf("%d hung-up settles noted for a read to settle; want none", noted)
	}
	sig := heldPending(t, e, n, pp, false)
	if st := statusUntilDone(t, e, pp, 3*time.Second); st.State != x402.SettlementDone || st.Transaction != sig {
		t.Fatalf("status of the genuine payment: %+v, %d sends; want settled naming %s", st, n.sends.Load(), sig)
	}
}

// A Settle cut off by Close (its configuration unloaded by a reload) sends
// nothing, and the facilitator that takes over was asked nothing: its
// reads judge the payment by the chain alone and send nothing, so the
// payment waits for its blockhash to expire (README states it).
func TestSettleCutOffByCloseIsLeftToItsBlockhash(t *testing.T) {
	e, n, pp := heldEnv(t)
	cfg := e.f.cfg
	e.f.Close()
	var unknown *x402.UnknownOutcomeError
	if _, err := e.f.Settle(context.Background(), pp, e.req); !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("settle on the closed facilitator: %v; want settlement_pending", err)
	}
	next, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	for range 3 {
		if st, err := next.SettlementStatus(context.Background(), pp, e.req); err != nil || st.State != x402.SettlementUndecided {
			t.Fatalf("status after the reload: %+v %v; want undecided", st, err)
		}
	}
	if got := n.sends.Load(); got != 0 {
		t.Fatalf("%d sends; want none", got)
	}
}
