package svmfacilitator

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// closableSent is one configuration's handle on the store of sends: once
// the configuration is unloaded it closes the handle (as a Redis client's
// Close), and every later drop or mark fails as a closed client's does.
type closableSent struct {
	SentStore
	closed atomic.Bool
}

var errClientClosed = errors.New("redis: client is closed")

func (c *closableSent) Release(ctx context.Context, cl store.Claim) error {
	if c.closed.Load() {
		return errClientClosed
	}
	return c.SentStore.Release(ctx, cl)
}

func (c *closableSent) Swap(ctx context.Context, cl store.Claim, old, note string) error {
	if c.closed.Load() {
		return errClientClosed
	}
	return c.SentStore.Swap(ctx, cl, old, note)
}

func (c *closableSent) Settle(ctx context.Context, cl store.Claim, note string, keepUntil time.Time) error {
	if c.closed.Load() {
		return errClientClosed
	}
	return c.SentStore.Settle(ctx, cl, note, keepUntil)
}

// stuckRelease is a store of sends whose drop (Release) never answers and
// ignores its context, as a store wedged below its client's timeouts.
type stuckRelease struct {
	SentStore
	stuck chan struct{} // closed at the test's end
}

func (s *stuckRelease) Release(ctx context.Context, c store.Claim) error {
	<-s.stuck
	return errClientClosed
}

// slowRefusal is a FAKE node in front of the chain at upstream that,
// while refuse holds, answers sendTransaction after delay with a refusal
// (-32003), forwarding nothing; sending is signalled as the send arrives.
func slowRefusal(t *testing.T, upstream string, refuse *atomic.Bool, delay time.Duration, sending chan<- struct{}) string {
	return proxy(t, upstream, func(w http.ResponseWriter, id json.RawMessage, method string, _ []json.RawMessage) bool {
		if method != "sendTransaction" || !refuse.Load() {
			return false
		}
		select {
		case sending <- struct{}{}:
		default:
		}
		time.Sleep(delay)
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32003,"message":"Transaction signature verification failure"}}`))
		return true
	}, nil)
}

// settleAsync runs f.Settle of pp, for ctx, in the background.
func settleAsync(ctx context.Context, f *Facilitator, pp x402.PaymentPayload, req x402.PaymentRequirements) <-chan settleAnswer {
	out := make(chan settleAnswer, 1)
	go func() {
		r, err := f.Settle(ctx, pp, req)
		out <- settleAnswer{r, err}
	}()
	return out
}

type settleAnswer struct {
	r   x402.SettleResponse
	err error
}

// reload is a configuration unloaded while one of its Settles ran: its
// facilitator f settled the payment pp on the store of sends db through a
// handle the reload closed once f.Close returned.
type reload struct {
	e      *env
	db     *store.DB
	f      *Facilitator
	pp     x402.PaymentPayload
	key    string        // of pp's record of its send
	waited time.Duration // in f.Close
	answer settleAnswer  // the Settle's, which ran across the reload
}

// reloadMidSettle starts a facilitator on e's settings with the node at
// node, the bounds confirm and poll, and a handle on db's store of sends
// that closes as a Redis client's does; it settles pp through it and, once
// begun says the Settle reached the moment under test, unloads that
// configuration as a reload does: the facilitator is closed, then its
// store handle. It returns once the Settle has answered, so every test of
// a reload in flight builds, times and closes the same way.
func (e *env) reloadMidSettle(t *testing.T, db *store.DB, node string, confirm, poll time.Duration, pp x402.PaymentPayload, begun <-chan struct{}) *reload {
	t.Helper()
	handle := &closableSent{SentStore: sentOf(db)}
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent, cfg.ConfirmTimeout, cfg.PollInterval = &RPC{URL: node}, handle, confirm, poll
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &reload{e: e, db: db, f: f, pp: pp, key: f.sentKey(mustDecode(t, pp).MessageHash())}
	first := settleAsync(context.Background(), f, pp, e.req)
	<-begun
	start := time.Now()
	f.Close()
	r.waited = time.Since(start)
	handle.closed.Store(true)
	r.answer = <-first
	return r
}

// next is the next configuration's facilitator: r's settings on the
// chain's own node and a fresh handle on the same store of sends.
func (r *reload) next(t *testing.T) *Facilitator {
	t.Helper()
	cfg := r.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: r.e.chain.URL}, sentOf(r.db)
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// retrySettlesOnce checks that the retry of r's payment through the next
// configuration sends it afresh and answers success within 1.5s (a
// retry that adopted a record left behind would poll until its blockhash
// expired), and that the payee holds the payment once.
func (r *reload) retrySettlesOnce(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if s, err := r.next(t).Settle(ctx, r.pp, r.e.req); err != nil || !s.Success {
		t.Errorf("retry through the next configuration: %+v %v; want success (a fresh send)", s, err)
	}
	if _, b := r.e.balances(t); b != 20000 {
		t.Errorf("payee holds %d; want the payment once", b)
	}
}

// retryAnswersDuplicate checks that a settle of r's payment through the
// next configuration answers duplicate_settlement naming tx, the other
// sender's transaction, never success beside that sender.
func (r *reload) retryAnswersDuplicate(t *testing.T, tx string) {
	t.Helper()
	if s, err := r.next(t).Settle(context.Background(), r.pp, r.e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != tx {
		t.Errorf("settle through the next configuration: %+v %v; want duplicate_settlement naming %s", s, err, tx)
	}
}

// landedElsewhere is a node in front of e's chain at which another sender
// lands raw just before the facilitator's first send of it, signalling
// landed (when not nil) and answering that send (AlreadyProcessed) after
// delay; *elsewhere names the other sender's transaction once it is sent.
func (e *env) landedElsewhere(t *testing.T, raw []byte, delay time.Duration, landed chan<- struct{}) (fr *faultyRPC, elsewhere *string) {
	fr, elsewhere = &faultyRPC{}, new(string)
	fr.set(func(f *faultyRPC) {
		f.target = e.chain.URL
		f.beforeSend = func() {
			if *elsewhere == "" {
				*elsewhere = e.sendSigned(t, raw)
				if landed != nil {
					landed <- struct{}{}
				}
				time.Sleep(delay)
			}
		}
	})
	return fr, elsewhere
}

// noRecord checks, at once (no wait for a drop in the background), that
// st holds no record under key: dropped, or never written.
func noRecord(t *testing.T, st SentStore, key, when string) {
	t.Helper()
	if rec, err := st.Lookup(context.Background(), key); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("record %s: %+v %v; want none", when, rec, err)
	}
}

// A reload unloads a configuration while one of its Settles waits for the
// node's answer to its send: Close waits for that Settle, and for the drop
// of its record once the node refuses, before the configuration closes its
// store handle; so the retry of the refused payment through the next
// configuration's facilitator sends it afresh and answers success.
// (Before: Close waited only for the drops already running; the refusal
// came after it, the drop failed on the closed handle, and the retry
// adopted the record of the refused send and polled a signature the chain
// never got, answering settlement_pending until its blockhash expired.)
func TestCloseWaitsForASendInFlightAndItsDrop(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	var refuse atomic.Bool
	refuse.Store(true)
	sending := make(chan struct{}, 1)
	pp := Payload(e.payment(t).Transaction(), e.req)
	r := e.reloadMidSettle(t, db, slowRefusal(t, e.chain.URL, &refuse, 600*time.Millisecond, sending), 2*time.Second, 50*time.Millisecond, pp, sending)
	if r.waited < 400*time.Millisecond {
		t.Errorf("Close returned after %v; want it to wait for the send in flight (answered 600ms after it began)", r.waited.Round(time.Millisecond))
	}
	if a := r.answer; a.err != nil || a.r.Success || a.r.ErrorReason != ReasonTransactionFailed {
		t.Fatalf("refused send: %+v %v; want transaction_failed", a.r, a.err)
	}
	noRecord(t, sentOf(db), r.key, "of the refused send once Close returned")
	r.retrySettlesOnce(t)
}

// The same with the node answering AlreadyProcessed after Close began
// (another sender landed the payment meanwhile): Close waits for the drop
// of the record of this send, which never happened, so the next
// configuration's facilitator answers the payment duplicate_settlement
// naming the other sender's transaction, never success beside its sender.
// (Before: the drop failed on the closed handle, and the next facilitator
// adopted the record left unanswered, marked it and answered success for a
// transaction another sender answers for.)
func TestCloseWaitsForAnAlreadyProcessedSendsDrop(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	raw := e.payment(t).Transaction()
	sending := make(chan struct{}, 1)
	fr, elsewhere := e.landedElsewhere(t, raw, 600*time.Millisecond, sending) // the node answers after the reload began
	r := e.reloadMidSettle(t, db, fr.serve(t), 2*time.Second, 20*time.Millisecond, Payload(raw, e.req), sending)
	if a := r.answer; a.err != nil || a.r.Success || a.r.ErrorReason != ReasonDuplicateSettlement {
		t.Fatalf("send answered AlreadyProcessed: %+v %v; want duplicate_settlement", a.r, a.err)
	}
	noRecord(t, sentOf(db), r.key, "once Close returned")
	r.retryAnswersDuplicate(t, *elsewhere)
}

// Close's wait is bounded: with a send in flight whose refusal comes late
// and whose drop never ends (a store wedged below its timeouts), Close
// returns within twice ConfirmTimeout of being called (the send's bound,
// then the drop's), and so does a reload; the Settle itself answers its
// caller transaction_failed all the same.
func TestCloseReturnsWithinItsBoundWhenTheDropStalls(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	var refuse atomic.Bool
	refuse.Store(true)
	sending := make(chan struct{}, 1)
	stuck := &stuckRelease{SentStore: sentOf(db), stuck: make(chan struct{})}
	t.Cleanup(func() { close(stuck.stuck) })
	cfg := e.f.cfg
	cfg.Sent, cfg.ConfirmTimeout, cfg.PollInterval = stuck, 500*time.Millisecond, 50*time.Millisecond
	cfg.RPC = &RPC{URL: slowRefusal(t, e.chain.URL, &refuse, 300*time.Millisecond, sending)}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pp := Payload(e.payment(t).Transaction(), e.req)
	// The caller's deadline: its Settle waits no longer for the drop.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	first := settleAsync(ctx, f, pp, e.req)
	<-sending
	start := time.Now()
	f.Close()
	if d := time.Since(start); d < 800*time.Millisecond || d > 1500*time.Millisecond {
		t.Errorf("Close returned after %v; want about 1s (twice ConfirmTimeout: it waits, and no longer)", d.Round(time.Millisecond))
	}
	a := <-first
	if a.err != nil || a.r.Success || a.r.ErrorReason != ReasonTransactionFailed {
		t.Errorf("refused send: %+v %v; want transaction_failed", a.r, a.err)
	}
}

// With the node stalled (no send, no status answered), a Settle in flight
// at Close answers its caller settlement_pending within its own bounds,
// and Close returns by then, within its bound: the record of that send,
// which may have reached the chain, stays for a retry to follow.
func TestCloseReturnsWithinItsBoundWhenTheNodeStalls(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	var stall atomic.Bool
	sending := make(chan struct{}, 1)
	cfg := e.f.cfg
	cfg.Sent, cfg.ConfirmTimeout, cfg.PollInterval = sentOf(db), 500*time.Millisecond, 50*time.Millisecond
	cfg.RPC = &RPC{URL: proxy(t, e.chain.URL, func(w http.ResponseWriter, _ json.RawMessage, method string, _ []json.RawMessage) bool {
		if method == "sendTransaction" {
			stall.Store(true)
			select {
			case sending <- struct{}{}:
			default:
			}
		}
		if !stall.Load() || method != "sendTransaction" && method != "getSignatureStatuses" {
			return false
		}
		time.Sleep(3 * time.Second) // longer than any bound here
		return true
	}, nil)}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pp := Payload(e.payment(t).Transaction(), e.req)
	first := settleAsync(context.Background(), f, pp, e.req)
	<-sending
	start := time.Now()
	f.Close()
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("Close returned after %v; want within twice ConfirmTimeout (1s)", d.Round(time.Millisecond))
	}
	a := <-first
	var unknown *x402.UnknownOutcomeError
	if !errors.As(a.err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Errorf("send to a stalled node: %+v %v; want settlement_pending", a.r, a.err)
	}
	if _, err := sentOf(db).Lookup(context.Background(), f.sentKey(mustDecode(t, pp).MessageHash())); err != nil {
		t.Errorf("record of the send that may have reached the chain: %v; want it kept", err)
	}
}

// A status read in progress at Close, of a payment whose send landed, is
// waited for too: it marks the send's record before the configuration
// closes its store handle, and answers settled naming the transaction.
// (Before: Close returned at once, the mark failed on the closed handle,
// and the read answered undecided.)
func TestCloseWaitsForAStatusReadsMark(t *testing.T) {
	db := openStore(t, t.TempDir())
	fr := &faultyRPC{}
	e := newEnv(t, Config{RPC: &RPC{URL: fr.serve(t)}, Sent: sentOf(db), ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend, f.forwardOK, f.hideStatus = e.chain.URL, true, true, true })
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	_, err := e.f.Settle(context.Background(), pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("settle with its reply lost: %v; want settlement_pending", err)
	}
	e.f.Close()
	// The next configuration reads the payment's status through a node
	// that answers slowly, and is itself unloaded meanwhile.
	var slow atomic.Bool
	reading := make(chan struct{}, 1)
	handle := &closableSent{SentStore: sentOf(db)}
	cfg := e.f.cfg
	cfg.Sent = handle
	cfg.RPC = &RPC{URL: proxy(t, e.chain.URL, func(w http.ResponseWriter, _ json.RawMessage, method string, _ []json.RawMessage) bool {
		if method == "getSignatureStatuses" && slow.Load() {
			select {
			case reading <- struct{}{}:
			default:
			}
			time.Sleep(200 * time.Millisecond)
		}
		return false
	}, nil)}
	next, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	slow.Store(true)
	read := make(chan x402.SettlementStatus, 1)
	go func() {
		st, err := next.SettlementStatus(context.Background(), pp, e.req)
		if err != nil {
			t.Error(err)
		}
		read <- st
	}()
	<-reading
	next.Close()
	handle.closed.Store(true)
	if st := <-read; st.State != x402.SettlementDone || st.Transaction != unknown.Reply.Transaction {
		t.Errorf("status read across Close: %+v; want settled naming %s", st, unknown.Reply.Transaction)
	}
	if rec, err := sentOf(db).Lookup(context.Background(), next.sentKey(mustDecode(t, pp).MessageHash())); err != nil || !rec.Settled {
		t.Errorf("record once Close returned: %+v %v; want marked answered", rec, err)
	}
}

// A reload unloads a configuration while one of its Settles is still
// before its send (its look-up of the transaction slow, 1.5 times
// ConfirmTimeout): that Settle sends nothing once the facilitator is
// closed, writes no record, and answers an unknown outcome naming the
// transaction, caused by ErrClosed (it read no record that would tell a
// send before a restart: the gateway polls the signature), and keeps no
// claim, so the retry through the next configuration's facilitator sends
// it afresh and answers success.
// (Before: it never checked that the facilitator was closed, sent past
// Close's bound, the node's refusal came after Close returned, the drop
// failed on the closed handle, and the retry adopted the record of the
// refused send and polled a signature the chain never got, answering
// settlement_pending until its blockhash expired.)
func TestCloseCutsOffASendNotBegun(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	var lookups, sends atomic.Int32
	looking := make(chan struct{}, 1)
	node := proxy(t, e.chain.URL, func(w http.ResponseWriter, id json.RawMessage, method string, _ []json.RawMessage) bool {
		switch {
		case method == "getSignatureStatuses" && lookups.Add(1) == 1:
			looking <- struct{}{}
			time.Sleep(1500 * time.Millisecond) // a slow node before the send
		case method == "sendTransaction":
			sends.Add(1)
			time.Sleep(800 * time.Millisecond)
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32003,"message":"Transaction signature verification failure"}}`))
			return true
		}
		return false
	}, nil)
	r := e.reloadMidSettle(t, db, node, time.Second, 50*time.Millisecond, Payload(e.payment(t).Transaction(), e.req), looking)
	var unknown *x402.UnknownOutcomeError
	if a := r.answer; !errors.Is(a.err, ErrClosed) || !errors.As(a.err, &unknown) || unknown.Reply == nil ||
		unknown.Reply.ErrorReason != ReasonSettlementPending || unknown.Reply.Transaction == "" {
		t.Errorf("Settle still before its send at Close: %+v %v; want an unknown outcome naming the transaction, caused by ErrClosed", a.r, a.err)
	}
	if n := sends.Load(); n != 0 {
		t.Errorf("%d sends by the closed facilitator; want none", n)
	}
	noRecord(t, sentOf(db), r.key, "once the Settle answered")
	r.retrySettlesOnce(t)
}

// The same where another sender lands the payment while the Settle is
// still before its send at Close (a send then would be answered
// AlreadyProcessed after Close returned): the closed facilitator sends
// nothing and writes no record, so the next configuration's facilitator
// finds the transaction on chain and answers duplicate_settlement naming
// it, never success beside its sender. (Before: the send went out past
// Close's bound, the drop of its record failed on the closed handle, and
// the next facilitator adopted the record left unanswered and answered
// success for a transaction another sender answers for.)
func TestCloseCutsOffAnAlreadyProcessedSendNotBegun(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	raw := e.payment(t).Transaction()
	looking := make(chan struct{}, 1)
	var statuses atomic.Int32
	fr, elsewhere := e.landedElsewhere(t, raw, 800*time.Millisecond, nil)
	fr.set(func(f *faultyRPC) {
		f.beforeStatus = func() {
			if statuses.Add(1) == 1 {
				looking <- struct{}{}
				time.Sleep(1500 * time.Millisecond) // a slow node before the send
			}
		}
	})
	r := e.reloadMidSettle(t, db, fr.serve(t), time.Second, 20*time.Millisecond, Payload(raw, e.req), looking)
	if a := r.answer; !errors.Is(a.err, ErrClosed) {
		t.Errorf("Settle still before its send at Close: %+v %v; want ErrClosed", a.r, a.err)
	}
	if n := fr.count("sendTransaction"); n != 0 {
		t.Errorf("%d sends by the closed facilitator; want none", n)
	}
	noRecord(t, sentOf(db), r.key, "once the Settle answered")
	if *elsewhere == "" {
		*elsewhere = e.sendSigned(t, raw) // the other sender
	}
	r.retryAnswersDuplicate(t, *elsewhere)
}

// The background resolver is waited for too: while it polls a pending
// send at Close and learns that its blockhash expired, it drops the send's
// record before the configuration closes its store handle, as a retry's
// Settle would. (Before: it was not counted among the work Close waits
// for; Close returned at once, and the drop failed on the closed handle,
// leaving the record of a send that can no longer land.)
func TestCloseWaitsForTheResolversDrop(t *testing.T) {
	db := openStore(t, t.TempDir())
	handle := &closableSent{SentStore: sentOf(db)}
	fr := &faultyRPC{}
	e := newEnv(t, Config{RPC: &RPC{URL: fr.serve(t)}, Sent: handle, ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	_, err := e.f.Settle(context.Background(), pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) {
		t.Fatalf("settle with its send lost: %v; want an unknown outcome", err)
	}
	polling, expired := make(chan struct{}, 1), make(chan struct{})
	var slowed atomic.Bool
	fr.set(func(f *faultyRPC) {
		f.beforeStatus = func() {
			if slowed.CompareAndSwap(false, true) {
				polling <- struct{}{}
				<-expired                          // this poll reads the expiry, however slow the chain's step
				time.Sleep(200 * time.Millisecond) // Close comes meanwhile
			}
		}
	})
	e.chain.ExpireBlockhash()
	close(expired)
	<-polling
	e.f.Close()
	handle.closed.Store(true)
	noRecord(t, sentOf(db), e.f.sentKey(mustDecode(t, pp).MessageHash()), "of the expired send once Close returned")
}
