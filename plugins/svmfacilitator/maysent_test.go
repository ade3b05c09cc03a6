package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/x402"
)

// A payment whose transaction this fee payer sent and which landed (the
// payer is charged), whose Settle never answered (the process stopped
// mid-settle), is settled again after the restart while the store of sends
// cannot be read: the chain has the transaction, so the payer was charged,
// and the answer is settlement_pending naming it, through the facilitator
// API and the client a remote gate uses, never "nothing sent". Once the
// store is back, the same replay is answered success naming it (the record
// is adopted). (Before: a plain error, which the facilitator API answers
// success false, facilitator_unavailable, and a remote gate takes for
// "nothing was charged, pay again".)
func TestSettleReplayOfLandedSendStoreDownIsPending(t *testing.T) {
	c, sig := landedBeforeRestart(t, false)
	e, pp := c.e, c.pp
	// The restart, with the store of sends down.
	restarted := restartedOn(t, c, e.chain.URL, sentOf(c.db), nil)
	srv := httptest.NewServer(x402.NewFacilitatorHandler(restarted))
	defer srv.Close()
	body, _ := json.Marshal(map[string]any{"x402Version": 2, "paymentPayload": pp, "paymentRequirements": e.req})
	resp, err := http.Post(srv.URL+"/settle", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var sr x402.SettleResponse
	json.NewDecoder(resp.Body).Decode(&sr)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || sr.ErrorReason != x402.ReasonSettlementPending || sr.Transaction != sig {
		t.Errorf("replay of a landed send with the store down: %d %+v; want 200 settlement_pending naming %s", resp.StatusCode, sr, sig)
	}
	cl := x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: srv.URL})
	got, err := cl.Settle(context.Background(), pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.Transaction != sig {
		t.Errorf("the remote gate's client read the replay as %+v, %v; want an unknown outcome naming %s", got, err, sig)
	}
	// The store back: the record is read, adopted, and answered success.
	c.db = openStore(t, c.dir)
	back := restartedOn(t, c, e.chain.URL, sentOf(c.db), nil)
	if r, err := back.Settle(context.Background(), pp, e.req); err != nil || !r.Success || r.Transaction != sig {
		t.Errorf("replay with the store back: %+v %v; want success naming %s", r, err, sig)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Errorf("balances payer %d payee %d; want the payment once", a, b)
	}
}

// A Settle whose look-up of its transaction on chain fails cannot tell a
// first settlement from a replay of one sent before a restart, which may
// have landed: it sends nothing and answers an unknown outcome naming the
// transaction's signature, never "nothing sent". It keeps no claim, so
// once the node answers the same payment settles. (Before: a plain error,
// "nothing was sent", which a gate answers as nothing charged.)
func TestSettleLookUpFailingIsUnknownOutcome(t *testing.T) {
	e := newEnv(t, Config{})
	var failing atomic.Bool
	failing.Store(true)
	var sends atomic.Int32
	cfg := e.f.cfg
	cfg.RPC = &RPC{URL: proxy(t, e.chain.URL, func(w http.ResponseWriter, id json.RawMessage, method string, _ []json.RawMessage) bool {
		switch {
		case method == "sendTransaction":
			sends.Add(1)
		case method == "getSignatureStatuses" && failing.Load():
			replyUnavailable(w, id)
			return true
		}
		return false
	}, nil)}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pp := Payload(e.payment(t).Transaction(), e.req)
	want := e.f.checkStatic(pp, e.req, false)
	e.f.cosign(want)
	r, err := f.Settle(context.Background(), pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending ||
		unknown.Reply.Transaction == "" || unknown.Reply.Transaction != base58.Encode(want.signed[1:65]) {
		t.Fatalf("settle with the look-up failing: %+v, %v; want an unknown outcome naming the transaction", r, err)
	}
	if n := sends.Load(); n != 0 {
		t.Fatalf("%d sends with the look-up failing; want none", n)
	}
	failing.Store(false)
	if r, err := f.Settle(context.Background(), pp, e.req); err != nil || !r.Success {
		t.Fatalf("settle once the node answers: %+v %v; want success", r, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Errorf("balances payer %d payee %d; want the payment once", a, b)
	}
}

// landedBeforeRestart is a payment whose transaction this fee payer sent
// and which landed (the payer is charged) while its Settle never answered
// (the process stopped mid-settle), its record in the store of sends left
// unanswered; the store is closed, as by the crash, and, with storeBack,
// opened again, as a restart finds it. It returns the crash and the
// transaction's signature.
func landedBeforeRestart(t *testing.T, storeBack bool) (*crashTest, string) {
	t.Helper()
	c := newCrashTest(t)
	e := c.e
	_, sig := c.sentUnanswered(t, func(ctx context.Context, hash [32]byte) error {
		_, err := e.f.remember(ctx, hash, &settlement{})
		return err
	})
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d; want the first send landed", a, b)
	}
	c.db.Close()
	if storeBack {
		c.db = openStore(t, c.dir)
	}
	return c, sig
}

// restartedOn is c's facilitator started again with node as its RPC
// endpoint and sent as its store of sends.
func restartedOn(t *testing.T, c *crashTest, node string, sent SentStore, tune func(*Config)) *Facilitator {
	t.Helper()
	cfg := c.e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: node}, sent
	if tune != nil {
		tune(&cfg)
	}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// replayIsPending checks a Settle's answer (r, err) to the replay of c's
// payment, whose transaction sig landed before the restart: an unknown
// outcome naming sig, the payer charged once; and, as the facilitator API
// answers the same replay (settle), settlement_pending naming it, which a
// remote gate's client reads as an unknown outcome; and, after both, no
// send of it again to the node (sent counts them).
func replayIsPending(t *testing.T, c *crashTest, sig string, r x402.SettleResponse, err error, settle func() (x402.SettleResponse, error), sent func() int) {
	t.Helper()
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending || unknown.Reply.Transaction != sig {
		t.Errorf("replay of a landed send: %+v, %v; want an unknown outcome naming %s, never \"nothing sent\" (the payer was charged)", r, err, sig)
	}
	if a, b := c.e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d; want the payment once", a, b)
	}
	if settle != nil {
		got, err := settle()
		if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending || unknown.Reply.Transaction != sig {
			t.Errorf("the remote gate's client read the replay as %+v, %v; want an unknown outcome naming %s", got, err, sig)
		}
	}
	if n := sent(); n != 0 {
		t.Errorf("the landed transaction sent %d times again; want none (the payer was charged)", n)
	}
}

// throughAPI settles p as a remote gate does: through the facilitator API
// served by f, with the client a gate uses.
func throughAPI(t *testing.T, f *Facilitator, p x402.PaymentPayload, req x402.PaymentRequirements) func() (x402.SettleResponse, error) {
	return func() (x402.SettleResponse, error) {
		srv := httptest.NewServer(x402.NewFacilitatorHandler(f))
		defer srv.Close()
		return x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: srv.URL}).Settle(context.Background(), p, req)
	}
}

// A payment that landed before a restart is settled again after it, while
// the store of sends is down, through a node one slot behind the chain:
// the look-up finds nothing, and the write of the record before the send,
// which would have found the record of the landed send, fails. Nothing is
// sent, and the answer is settlement_pending naming the transaction: the
// payer was charged. (Before: a plain error, which the facilitator API
// answers success false, facilitator_unavailable, "nothing charged, send
// the same payment again", and a remote gate released the payment.)
func TestSettleReplayOfLandedSendLaggingNodeStoreDownIsPending(t *testing.T) {
	c, sig := landedBeforeRestart(t, false)
	node := newBehindNode(t, c.e.chain.URL, 2)
	f := restartedOn(t, c, node.URL, sentOf(c.db), nil)
	r, err := f.Settle(context.Background(), c.pp, c.e.req)
	replayIsPending(t, c, sig, r, err, throughAPI(t, f, c.pp, c.e.req), node.sent)
}

// The same replay through a node that lags a slot at the look-up and then
// fails the simulation (an overloaded node, a proxy's 503), the store up:
// the Settle cannot reach the record that tells, and answers
// settlement_pending naming the transaction. (Before: the plain error
// "verifying before settlement", answered "nothing charged".)
func TestSettleReplayOfLandedSendLaggingNodeSimulationFailingIsPending(t *testing.T) {
	c, sig := landedBeforeRestart(t, true)
	var simulations atomic.Int32
	node := newBehindNodeSimulating(t, c.e.chain.URL, 2, func(w http.ResponseWriter, id json.RawMessage) {
		simulations.Add(1)
		replyUnavailable(w, id)
	})
	f := restartedOn(t, c, node.URL, sentOf(c.db), nil)
	r, err := f.Settle(context.Background(), c.pp, c.e.req)
	if simulations.Load() == 0 {
		t.Fatal("no simulation asked; the test needs the Settle to reach it")
	}
	replayIsPending(t, c, sig, r, err, throughAPI(t, f, c.pp, c.e.req), node.sent)
	// The node answering again, the record is found and followed.
	again := restartedOn(t, c, c.e.chain.URL, sentOf(c.db), nil)
	if r, err := again.Settle(context.Background(), c.pp, c.e.req); err != nil || !r.Success || r.Transaction != sig {
		t.Errorf("replay once the node answers: %+v %v; want success naming %s (the record adopted)", r, err, sig)
	}
}

// The same replay whose payer the budget refuses (its places in flight
// taken), the store down: the record the refusal reads, to tell a send
// recorded before, cannot be read, and the answer is settlement_pending
// naming the transaction, never a refusal or "nothing sent". (Before: the
// plain error "reading the record of the transaction".)
func TestSettleReplayOfLandedSendOverBudgetRecordUnreadableIsPending(t *testing.T) {
	c, sig := landedBeforeRestart(t, false)
	node := newBehindNode(t, c.e.chain.URL, 2)
	f := restartedOn(t, c, node.URL, sentOf(c.db), func(cfg *Config) { cfg.MaxInFlightPerPayer = 1 })
	if reason, _ := f.budget.reserve(f.checkStatic(c.pp, c.e.req, false).exposure); reason != "" {
		t.Fatal(reason)
	}
	r, err := f.Settle(context.Background(), c.pp, c.e.req)
	replayIsPending(t, c, sig, r, err, nil, node.sent)
}

// The same replay through a closed facilitator (its configuration
// unloaded by a reload), the store up: it sends nothing new, and, having
// not read the record, answers settlement_pending naming the transaction,
// its cause ErrClosed. (Before: ErrClosed alone, which said nothing was
// sent and to send the payment again, answered "nothing charged".)
func TestSettleReplayOfLandedSendLaggingNodeClosedIsPending(t *testing.T) {
	c, sig := landedBeforeRestart(t, true)
	node := newBehindNode(t, c.e.chain.URL, 2)
	f := restartedOn(t, c, node.URL, sentOf(c.db), nil)
	f.Close()
	r, err := f.Settle(context.Background(), c.pp, c.e.req)
	if !errors.Is(err, ErrClosed) {
		t.Errorf("replay through a closed facilitator: %+v %v; want ErrClosed its cause", r, err)
	}
	replayIsPending(t, c, sig, r, err, throughAPI(t, f, c.pp, c.e.req), node.sent)
}

// The same replay whose caller goes away while the node simulates it (the
// store up, the node a slot behind): nothing is sent for a caller who
// cannot be answered, and the answer is settlement_pending naming the
// transaction, never "nothing sent". (Before: a plain error, "before
// settlement: context canceled".)
func TestSettleReplayOfLandedSendCallerGoneIsPending(t *testing.T) {
	c, sig := landedBeforeRestart(t, true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	node := newBehindNodeSimulating(t, c.e.chain.URL, 1, func(w http.ResponseWriter, id json.RawMessage) {
		cancel() // the caller goes away while the node simulates
		replySimulated(w, id)
	})
	f := restartedOn(t, c, node.URL, sentOf(c.db), nil)
	r, err := f.Settle(ctx, c.pp, c.e.req)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("replay whose caller went away: %+v %v; want context.Canceled its cause", r, err)
	}
	replayIsPending(t, c, sig, r, err, nil, node.sent)
}
