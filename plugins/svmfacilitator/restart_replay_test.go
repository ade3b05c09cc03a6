package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// behindNode is a FAKE of one member of a load-balanced RPC pool a few
// slots behind the one where a transaction landed (or of a node answering
// right after the facilitator restarted), in front of the real simulated
// chain at upstream (proxy): it does not know the signature yet
// (getSignatureStatuses answers null the first lag times), simulates
// against its older bank (where the transfer has not happened, so the
// simulation succeeds), and, as Agave does for sendTransaction with
// skipPreflight, returns the transaction's signature without checking the
// status cache (the leader drops the duplicate; nothing is forwarded).
// Every other call, and every later status, is the real chain's. sends
// counts the sendTransaction calls it answered.
type behindNode struct {
	URL   string
	mu    sync.Mutex
	sends int
}

func newBehindNode(t *testing.T, upstream string, lag int) *behindNode {
	return newBehindNodeSimulating(t, upstream, lag, replySimulated)
}

// newBehindNodeSimulating is newBehindNode answering each simulation with
// simulate (a failing node, a caller going away mid-simulation) instead.
func newBehindNodeSimulating(t *testing.T, upstream string, lag int, simulate func(w http.ResponseWriter, id json.RawMessage)) *behindNode {
	n := &behindNode{}
	statuses := 0
	n.URL = proxy(t, upstream, func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		switch method {
		case "getSignatureStatuses":
			statuses++
			if statuses > lag {
				return false
			}
			replyNoStatus(w, id)
		case "simulateTransaction":
			simulate(w, id)
		case "sendTransaction":
			n.sends++
			var s string
			json.Unmarshal(params[0], &s)
			raw, _ := base64.StdEncoding.DecodeString(s)
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":"` + base58.Encode(raw[1:65]) + `"}`))
		default:
			return false
		}
		return true
	}, nil)
	return n
}

func (n *behindNode) sent() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.sends
}

// sentOf is db's claims as the facilitator's store of sends.
func sentOf(db *store.DB) SentStore { return db.Claims().(SentStore) }

// openStore opens a Badger store in dir, closed at the test's end unless
// the test closed it first.
func openStore(t *testing.T, dir string) *store.DB {
	t.Helper()
	db, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// reopenBehind is the process started again after a crash: the store of
// sends in dir opened anew (the caller closed the old one) and a
// facilitator of e's settings on it, whose node lags the chain by a slot
// and counts what it is sent.
func (e *env) reopenBehind(t *testing.T, dir string) (*Facilitator, *store.DB, *behindNode) {
	t.Helper()
	db := openStore(t, dir)
	cfg := e.f.cfg
	node := newBehindNode(t, e.chain.URL, 1)
	cfg.RPC, cfg.Sent = &RPC{URL: node.URL}, sentOf(db)
	restarted, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return restarted, db, node
}

// crashTest is a facilitator whose store of sends is in a folder of its
// own, closed by a crash and opened again by the restart, and a payment
// for it to settle.
type crashTest struct {
	e   *env
	dir string
	db  *store.DB
	pp  x402.PaymentPayload
}

func newCrashTest(t *testing.T) *crashTest {
	dir := t.TempDir()
	db := openStore(t, dir)
	e := newEnv(t, Config{Sent: sentOf(db)})
	return &crashTest{e: e, dir: dir, db: db, pp: Payload(e.payment(t).Transaction(), e.req)}
}

// sentUnanswered is what a process that crashed mid-send did before it
// stopped: the payment's send recorded by record (as the version under
// test writes the record of a message hash), then sent, and no answer. It
// returns the transaction's message hash and the signature sent.
func (c *crashTest) sentUnanswered(t *testing.T, record func(ctx context.Context, hash [32]byte) error) (hash [32]byte, sig string) {
	t.Helper()
	ctx := context.Background()
	ch := c.e.f.checkStatic(c.pp, c.e.req, false)
	c.e.f.cosign(ch)
	if err := record(ctx, ch.tx.MessageHash()); err != nil {
		t.Fatal(err)
	}
	sig, err := c.e.f.rpc.Send(ctx, ch.signed)
	if err != nil {
		t.Fatal(err)
	}
	return ch.tx.MessageHash(), sig
}

// restart is the process stopping and started again: the store closed
// and opened anew under a facilitator of the same settings whose node
// lags the chain (reopenBehind).
func (c *crashTest) restart(t *testing.T) (*Facilitator, *behindNode) {
	t.Helper()
	c.db.Close()
	f, db, node := c.e.reopenBehind(t, c.dir)
	c.db = db
	return f, node
}

// sentNothingPaidOnce checks what every replay after the restart must
// leave: nothing sent again, the payer charged once.
func (c *crashTest) sentNothingPaidOnce(t *testing.T, node *behindNode) {
	t.Helper()
	if node.sent() != 0 {
		t.Errorf("the replay was sent %d times; a send recorded before the restart is not sent again", node.sent())
	}
	if a, b := c.e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d (paid once)", a, b)
	}
}

// After a restart (a new Facilitator, and the store closed and opened
// again), a replay of a payment that landed and was answered success is
// duplicate_settlement naming the transaction, never a second success,
// even when the node answering the look-up and the simulation lags the one
// the transaction landed on: the record of the send, kept in the store
// from before it, says so. (Before: with nothing remembered across the
// restart, the lagging node's null status, passing simulation and echoed
// signature had the replay answered success a second time.)
func TestSettleReplayAfterRestartOnLaggingNodeIsDuplicate(t *testing.T) {
	c := newCrashTest(t)
	e, pp, ctx := c.e, c.pp, context.Background()
	first, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !first.Success {
		t.Fatalf("first settle: %+v %v", first, err)
	}
	// Marked answered, naming the transaction, before the answer.
	dec, _ := DecodePayload(pp.Payload)
	if st, err := c.db.Claims().Lookup(ctx, e.f.sentKey(dec.MessageHash())); err != nil || !st.Settled || markedSig(st.Note) != first.Transaction {
		t.Fatalf("record after success: %+v %v; want it answered, naming %s", st, err, first.Transaction)
	}

	restarted, node := c.restart(t)
	again, err := restarted.Settle(ctx, pp, e.req)
	if err != nil || again.Success || again.ErrorReason != ReasonDuplicateSettlement || again.Transaction != first.Transaction {
		t.Fatalf("replay after restart: success=%v reason=%q tx=%s err=%v; want duplicate_settlement naming %s",
			again.Success, again.ErrorReason, again.Transaction, err, first.Transaction)
	}
	c.sentNothingPaidOnce(t, node)
	// Answered from memory from then on, as any duplicate.
	if third, err := restarted.Settle(ctx, pp, e.req); err != nil || third.ErrorReason != ReasonDuplicateSettlement || third.Transaction != first.Transaction {
		t.Fatalf("second replay: %+v %v", third, err)
	}
}

// A transaction sent, whose Settle never answered (the process stopped
// mid-send, or while waiting), is recorded from before the send: after a
// restart, a replay on a lagging node sends nothing, polls it and answers
// success once it landed (nobody was answered for it yet), marking the
// record answered, and a further replay is duplicate_settlement naming it.
func TestSettleReplayOfUnansweredSendAfterRestartAnswersOnce(t *testing.T) {
	c := newCrashTest(t)
	e, pp, ctx := c.e, c.pp, context.Background()
	hash, sig := c.sentUnanswered(t, func(ctx context.Context, hash [32]byte) error {
		_, err := e.f.remember(ctx, hash, &settlement{})
		return err
	})

	restarted, node := c.restart(t)
	again, err := restarted.Settle(ctx, pp, e.req)
	if err != nil || !again.Success || again.Transaction != sig {
		t.Fatalf("replay after restart: success=%v reason=%q tx=%s err=%v; want success naming %s", again.Success, again.ErrorReason, again.Transaction, err, sig)
	}
	if st, err := c.db.Claims().Lookup(ctx, e.f.sentKey(hash)); err != nil || !st.Settled || markedSig(st.Note) != sig {
		t.Fatalf("record: %+v %v; want it answered, naming %s", st, err, sig)
	}
	if third, err := restarted.Settle(ctx, pp, e.req); err != nil || third.ErrorReason != ReasonDuplicateSettlement || third.Transaction != sig {
		t.Fatalf("second replay: %+v %v; want duplicate_settlement naming %s", third, err, sig)
	}
	c.sentNothingPaidOnce(t, node)
}

// A record of a send that names no claim token (written by a version
// that kept none) cannot be marked answered by another: a replay after a
// restart answers duplicate_settlement once it landed, never success, and
// sends nothing.
func TestSettleReplayOfUnansweredSendWithoutTokenIsDuplicate(t *testing.T) {
	c := newCrashTest(t)
	e, pp, ctx := c.e, c.pp, context.Background()
	// The record as that version wrote it: a claim, naming no token.
	_, sig := c.sentUnanswered(t, func(ctx context.Context, hash [32]byte) error {
		_, err := c.db.Claims().Claim(ctx, []string{e.f.sentKey(hash)}, time.Now().Add(SentRecordHold))
		return err
	})

	restarted, node := c.restart(t)
	again, err := restarted.Settle(ctx, pp, e.req)
	if err != nil || again.Success || again.ErrorReason != ReasonDuplicateSettlement || again.Transaction != sig {
		t.Fatalf("replay after restart: success=%v reason=%q tx=%s err=%v; want duplicate_settlement naming %s", again.Success, again.ErrorReason, again.Transaction, err, sig)
	}
	c.sentNothingPaidOnce(t, node)
}

// A store that cannot record the send fails the settlement closed: nothing
// is sent, and the caller gets an unknown outcome naming the transaction
// (a facilitator API answers settlement_pending), since the record it could
// not write may be that of a send before a restart, which landed; the
// Settle keeps no claim, so once the store is back the same payment
// settles. (Before: a plain error, which a facilitator API answers
// success false, facilitator_unavailable: nothing charged.)
func TestSettleStoreDownSendsNothing(t *testing.T) {
	dir := t.TempDir()
	db := openStore(t, dir)
	db.Close() // the store fails every write
	e := newEnv(t, Config{})
	node := newBehindNode(t, e.chain.URL, 0)
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: node.URL}, sentOf(db)
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pp := Payload(e.payment(t).Transaction(), e.req)
	body, _ := json.Marshal(map[string]any{"x402Version": 2, "paymentPayload": pp, "paymentRequirements": e.req})
	w, r := httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/settle", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	x402.NewFacilitatorHandler(f).ServeHTTP(w, r)
	var sr x402.SettleResponse
	if json.Unmarshal(w.Body.Bytes(), &sr) != nil || w.Code != http.StatusOK || sr.Success || sr.ErrorReason != x402.ReasonSettlementPending || sr.Transaction == "" {
		t.Fatalf("settle with the store down: %d %s; want 200, settlement_pending naming the transaction", w.Code, w.Body)
	}
	_, err = f.Settle(context.Background(), pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.Transaction != sr.Transaction || !strings.Contains(err.Error(), "recording") {
		t.Fatalf("settle with the store down: %v; want an unknown outcome naming %s, caused by the record", err, sr.Transaction)
	}
	if node.sent() != 0 {
		t.Fatalf("sent %d times with the store down; want none", node.sent())
	}
	if a, b := e.balances(t); a != 1_000_000 || b != 0 {
		t.Fatalf("balances payer %d payee %d; want nothing moved", a, b)
	}

	db = openStore(t, dir)
	cfg.RPC, cfg.Sent = &RPC{URL: e.chain.URL}, sentOf(db)
	f, err = New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := f.Settle(context.Background(), pp, e.req); err != nil || !s.Success {
		t.Fatalf("settle once the store is back: %+v %v", s, err)
	}
}

// refusingNode is e's chain behind a node that refuses every
// sendTransaction (a signature verification failure, -32003), after
// delay, while refuse holds (nil: always); every other call is the
// chain's.
func refusingNode(t *testing.T, e *env, refuse *atomic.Bool, delay time.Duration) *RPC {
	return &RPC{URL: proxy(t, e.chain.URL, func(w http.ResponseWriter, id json.RawMessage, method string, _ []json.RawMessage) bool {
		if method != "sendTransaction" || refuse != nil && !refuse.Load() {
			return false
		}
		time.Sleep(delay)
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32003,"message":"Transaction signature verification failure"}}`))
		return true
	}, nil)}
}

// A send the node refused leaves no record behind: nothing is in flight,
// so the same payment settles later, also after a restart. (A record left
// in place would have the retry taken for a transaction sent before,
// polled, and never answered success.)
func TestSettleRefusedSendDropsItsRecord(t *testing.T) {
	dir := t.TempDir()
	db := openStore(t, dir)
	e := newEnv(t, Config{})
	cfg := e.f.cfg
	cfg.Sent, cfg.ConfirmTimeout = sentOf(db), 2*time.Second
	cfg.RPC = refusingNode(t, e, nil, 0)
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pp := Payload(e.payment(t).Transaction(), e.req)
	if s, err := f.Settle(context.Background(), pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonTransactionFailed {
		t.Fatalf("refused send: %+v %v", s, err)
	}
	db.Close()

	db = openStore(t, dir)
	cfg.Sent, cfg.RPC = sentOf(db), &RPC{URL: e.chain.URL}
	restarted, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := restarted.Settle(context.Background(), pp, e.req); err != nil || !s.Success {
		t.Fatalf("settle after the refusal and a restart: success=%v reason=%q err=%v; want success", s.Success, s.ErrorReason, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d (paid once)", a, b)
	}
}

// A sent transaction that can no longer land (its blockhash expired, the
// chain never saw it) has its record dropped with the answer that says so:
// nothing of it can settle any more.
func TestSettleExpiredSendDropsItsRecord(t *testing.T) {
	db := openStore(t, t.TempDir())
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, Sent: sentOf(db), ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
	tx := e.payment(t).Transaction()
	pp := Payload(tx, e.req)
	dec, err := DecodeTransaction(tx)
	if err != nil {
		t.Fatal(err)
	}
	key := e.f.sentKey(dec.MessageHash())
	if _, err := e.f.Settle(context.Background(), pp, e.req); err == nil {
		t.Fatal("want an unknown outcome")
	}
	if st, err := db.Claims().Lookup(context.Background(), key); err != nil || st.Settled {
		t.Fatalf("record while pending: %+v %v; want one, not answered", st, err)
	}
	e.chain.ExpireBlockhash()
	if s, err := e.f.Settle(context.Background(), pp, e.req); err != nil || s.ErrorReason != ReasonTransactionFailed {
		t.Fatalf("retry once expired: %+v %v", s, err)
	}
	if st, err := db.Claims().Lookup(context.Background(), key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record once expired: %+v %v; want none", st, err)
	}
}

// UseSent swaps the store of the sends while the facilitator runs: a
// settlement after the swap is recorded in the new store only, and one in
// the old store no longer counts.
func TestUseSentSwapsTheStore(t *testing.T) {
	old, cur := openStore(t, t.TempDir()), openStore(t, t.TempDir())
	e := newEnv(t, Config{Sent: sentOf(old)})
	e.f.UseSent(sentOf(cur))
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	dec, _ := DecodePayload(pp.Payload)
	key := e.f.sentKey(dec.MessageHash())
	if st, err := cur.Claims().Lookup(ctx, key); err != nil || !st.Settled {
		t.Fatalf("record in the store in use: %+v %v; want it answered", st, err)
	}
	if st, err := old.Claims().Lookup(ctx, key); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record in the store replaced: %+v %v; want none", st, err)
	}
}

// A send answered pending whose caller never asks again has its outcome
// learned by the background resolver: once that is its blockhash's expiry,
// the record is dropped there too, as a retry would have dropped it.
// (Before: the resolver left it in place for the whole SentRecordHold.)
func TestPendingSendExpiredInBackgroundDropsItsRecord(t *testing.T) {
	db := openStore(t, t.TempDir())
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, Sent: sentOf(db), ConfirmTimeout: 300 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend = e.chain.URL, true })
	tx := e.payment(t).Transaction()
	dec, err := DecodeTransaction(tx)
	if err != nil {
		t.Fatal(err)
	}
	key := e.f.sentKey(dec.MessageHash())
	if _, err := e.f.Settle(context.Background(), Payload(tx, e.req), e.req); err == nil {
		t.Fatal("want an unknown outcome")
	}
	e.chain.ExpireBlockhash()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := db.Claims().Lookup(context.Background(), key)
		if errors.Is(err, store.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			e.f.mu.Lock()
			n := len(e.f.unlearned)
			e.f.mu.Unlock()
			t.Fatalf("record once the resolver could learn the blockhash expired (%d unlearned): %v; want none", n, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A settlement the in-flight budget refuses at the last moment (another of
// its payer's was sent while it was being simulated) sends nothing, and its
// record is dropped: the payment may be settled once the other is done.
func TestSettleRefusedAtHoldDropsItsRecord(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	bBlocked, aSent := make(chan struct{}), make(chan struct{})
	var mu sync.Mutex
	simulations := 0
	var sentOnce sync.Once
	cfg := e.f.cfg
	cfg.Sent, cfg.MaxInFlightPerPayer, cfg.ConfirmTimeout, cfg.PollInterval = sentOf(db), 1, 300*time.Millisecond, 20*time.Millisecond
	// B's simulation waits until A was sent; A's send never reaches the
	// chain (its reply is lost), so A stays in flight.
	cfg.RPC = &RPC{URL: proxy(t, e.chain.URL, func(w http.ResponseWriter, _ json.RawMessage, method string, _ []json.RawMessage) bool {
		switch method {
		case "simulateTransaction":
			mu.Lock()
			simulations++
			first := simulations == 1
			mu.Unlock()
			if first {
				close(bBlocked)
				select {
				case <-aSent:
				case <-time.After(20 * time.Second):
				}
			}
		case "sendTransaction":
			sentOnce.Do(func() { close(aSent) })
			loseReply(w)
			return true
		}
		return false
	}, nil)}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pa, pb := e.payment(t), e.payment(t)
	pb.Memo = "a second payment of the same payer"
	txb := pb.Transaction()
	ppa, ppb := Payload(pa.Transaction(), e.req), Payload(txb, e.req)
	type result struct {
		r   x402.SettleResponse
		err error
	}
	resB := make(chan result, 1)
	go func() {
		r, err := f.Settle(context.Background(), ppb, e.req)
		resB <- result{r, err}
	}()
	<-bBlocked
	if _, err := f.Settle(context.Background(), ppa, e.req); err == nil {
		t.Fatal("A: want an unknown outcome (its reply was lost)")
	}
	b := <-resB
	if b.err != nil || b.r.ErrorReason != ReasonPayerFailureBudget {
		t.Fatalf("B: %+v %v; want %s", b.r, b.err, ReasonPayerFailureBudget)
	}
	dec, _ := DecodeTransaction(txb)
	if st, err := db.Claims().Lookup(context.Background(), f.sentKey(dec.MessageHash())); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("B's record: %+v %v; want none (nothing was sent)", st, err)
	}
}

// The window README states: a Settle marks its record and answers success,
// and the gateway stops before recording that success (a crash, or its
// write fails and a reload changing the block's settings follows). The
// restarted facilitator, with no memory of the payment, reads the record
// marked and cannot tell whose mark it was: its status read answers
// settled by another settlement (duplicate_settlement), so the gate
// releases its claim and serves nothing for tokens that moved.
func TestStatusReadAfterRestartOfItsOwnMarkedSettleIsDuplicate(t *testing.T) {
	c := newCrashTest(t)
	e, pp, ctx := c.e, c.pp, context.Background()
	first, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !first.Success {
		t.Fatalf("settle: %+v %v", first, err)
	}
	// The gateway stops before recording the success.
	c.db.Close()
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: e.chain.URL}, sentOf(openStore(t, c.dir))
	restarted, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := restarted.SettlementStatus(ctx, pp, e.req)
	if err != nil || !answeredElsewhere(st) || st.Transaction != first.Transaction {
		t.Errorf("status read after restart of a payment whose own success went unrecorded: %+v %v; want never, duplicate_settlement naming %s (the documented window)", st, err, first.Transaction)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d (charged once)", a, b)
	}
}

// dropped waits until key's record in st is gone, or fails t: a drop
// whose caller's deadline passed goes on in the background.
func dropped(t *testing.T, st SentStore, key string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second) // drops run in the background, late on a loaded machine
	for {
		rec, err := st.Lookup(context.Background(), key)
		if errors.Is(err, store.ErrNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("record of a send that never happened: %+v %v; want dropped", rec, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A send whose refusal the node answers after its caller's deadline (the
// send itself runs to ConfirmTimeout) still drops its record: the caller
// is answered transaction_failed, and the retry of the same payment sends
// it and answers success. (Before: the drop ran on the caller's expired
// context, the record stayed, and the retry adopted it as a send in
// flight, polling a signature the chain never got: settlement_pending
// until its blockhash expired, a valid payment that could not settle.)
func TestSettleRefusedAfterItsCallersDeadlineDropsItsRecord(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	var refuse atomic.Bool
	refuse.Store(true)
	cfg := e.f.cfg
	cfg.Sent, cfg.ConfirmTimeout = sentOf(db), 2*time.Second
	cfg.RPC = refusingNode(t, e, &refuse, 500*time.Millisecond) // a slow node: its refusal comes after the caller's deadline
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pp := Payload(e.payment(t).Transaction(), e.req)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	s, err := f.Settle(ctx, pp, e.req)
	cancel()
	if err != nil || s.Success || s.ErrorReason != ReasonTransactionFailed {
		t.Fatalf("refused send: %+v %v; want transaction_failed", s, err)
	}
	dropped(t, sentOf(db), f.sentKey(mustDecode(t, pp).MessageHash()))
	refuse.Store(false)
	s, err = f.Settle(context.Background(), pp, e.req)
	if err != nil || !s.Success {
		t.Errorf("retry of the refused payment: %+v %v; want success", s, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Errorf("balances payer %d payee %d; want the payment settled once", a, b)
	}
}

// slowRelease is the store of sends whose drop (Release) takes delay: a
// store that stalls for a while, then answers.
type slowRelease struct {
	SentStore
	delay time.Duration
}

func (s *slowRelease) Release(ctx context.Context, c store.Claim) error {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	return s.SentStore.Release(ctx, c)
}

// A refused send whose drop stalls answers its caller near the caller's
// deadline, transaction_failed, and the drop lands once the store answers
// (within ConfirmTimeout): a store that stalls holds no caller past its
// deadline, and loses no drop for it. The drop stalls 4 s, so a caller
// held by it is told from one answered at its 300ms deadline with room
// for a loaded machine.
func TestSettleRefusedWithAStalledDropAnswersAtItsCallersDeadline(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	cfg := e.f.cfg
	cfg.Sent, cfg.ConfirmTimeout = &slowRelease{SentStore: sentOf(db), delay: 4 * time.Second}, 8*time.Second
	cfg.RPC = refusingNode(t, e, nil, 0)
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pp := Payload(e.payment(t).Transaction(), e.req)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	s, err := f.Settle(ctx, pp, e.req)
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("refused send with a stalled drop took %v; want an answer near its caller's deadline (300ms)", d.Round(time.Millisecond))
	}
	if err != nil || s.Success || s.ErrorReason != ReasonTransactionFailed {
		t.Fatalf("refused send: %+v %v; want transaction_failed", s, err)
	}
	dropped(t, sentOf(db), f.sentKey(mustDecode(t, pp).MessageHash()))
}

// A refused send whose drop stalls keeps its payment a settlement in
// progress until the drop ends: the caller's immediate retry (the node's
// refusal gone) is answered as a second Settle of a payment in progress
// is, duplicate_settlement, and sends and polls nothing; Close waits for
// the drop, so the store a reload closes after it holds no record of the
// refused send; and the retry after the drop, through the next
// configuration (the closed facilitator sends nothing new), sends afresh
// and answers success. (Before: the payment was forgotten at once, and the retry
// adopted the record its own drop had not removed yet and polled the
// refused signature, which the chain never got, until its deadline; and
// Close returned at once, the drop still running on the store.)
func TestRetryDuringARefusedSendsDropIsInProgressAndCloseWaitsForTheDrop(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{})
	var refuse atomic.Bool
	refuse.Store(true)
	cfg := e.f.cfg
	cfg.Sent, cfg.ConfirmTimeout, cfg.PollInterval = &slowRelease{SentStore: sentOf(db), delay: 1500 * time.Millisecond}, 2*time.Second, 50*time.Millisecond
	cfg.RPC = refusingNode(t, e, &refuse, 0)
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	pp := Payload(e.payment(t).Transaction(), e.req)
	key := f.sentKey(mustDecode(t, pp).MessageHash())
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	s, err := f.Settle(ctx, pp, e.req)
	cancel()
	if err != nil || s.Success || s.ErrorReason != ReasonTransactionFailed {
		t.Fatalf("refused send: %+v %v; want transaction_failed", s, err)
	}
	refuse.Store(false)
	rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
	defer rcancel()
	if s, err = f.Settle(rctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != "" {
		t.Errorf("retry while the refused send's drop runs: %+v %v; want duplicate_settlement (a settlement in progress), naming nothing", s, err)
	}
	f.Close()
	if rec, err := sentOf(db).Lookup(context.Background(), key); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("record once Close returned: %+v %v; want dropped (Close waits for the drop)", rec, err)
	}
	// The closed facilitator sends nothing new; the next configuration's
	// does.
	if s, err = f.Settle(context.Background(), pp, e.req); !errors.Is(err, ErrClosed) {
		t.Errorf("retry through the closed facilitator: %+v %v; want ErrClosed (nothing sent)", s, err)
	}
	cfg.Sent = sentOf(db)
	next, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if s, err = next.Settle(context.Background(), pp, e.req); err != nil || !s.Success {
		t.Errorf("retry once the drop ended: %+v %v; want success (a fresh send)", s, err)
	}
	if _, b := e.balances(t); b != 20000 {
		t.Errorf("payee holds %d; want the payment once", b)
	}
}
