package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/redisstore"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// skipPreflightNode is a FAKE RPC node in front of the real simulated
// chain at upstream that sends as Agave does with skipPreflight: it
// forwards the transaction and answers its signature whatever the chain
// made of it (a transaction it already processed included: the leader
// drops the duplicate). Every other call is forwarded. hook runs first on
// every call, with its method, and may block it.
func skipPreflightNode(t *testing.T, upstream string, hook func(method string)) string {
	return proxy(t, upstream, func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool {
		hook(method)
		if method != "sendTransaction" {
			return false
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
		if resp, err := http.Post(upstream, "application/json", bytes.NewReader(body)); err == nil {
			resp.Body.Close()
		}
		var s string
		json.Unmarshal(params[0], &s)
		raw, _ := base64.StdEncoding.DecodeString(s)
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":"` + base58.Encode(raw[1:65]) + `"}`))
		return true
	}, nil)
}

// Two instances with one fee payer sharing a Redis store settle one payment
// at the same moment: the second finds nothing on chain and its
// simulation passes (the first's send has not landed), but the first's
// record, claimed in the store before its send, has it send nothing and
// poll the first's transaction. Exactly one success (the first to mark the
// record answered), the other duplicate_settlement naming the
// transaction. (Before: both sent, and both answered success.)
func TestSettleSharedStoreTwoInstancesOneSuccess(t *testing.T) {
	srv := servers.StartRedis(t)
	shared := func() SentStore { return redisSent(t, srv.Addr, "", redis.Options{}) }
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)

	sending, release := make(chan struct{}), make(chan struct{})
	var sendingOnce, releaseOnce sync.Once
	var mu sync.Mutex
	sendsA, sendsB, statusesB := 0, 0, 0
	// A's send waits until B has gone as far as it goes (B sends, or polls
	// after its look-up).
	cfgA := e.f.cfg
	cfgA.Sent = shared()
	cfgA.RPC = &RPC{URL: skipPreflightNode(t, e.chain.URL, func(method string) {
		if method == "sendTransaction" {
			mu.Lock()
			sendsA++
			mu.Unlock()
			sendingOnce.Do(func() { close(sending) })
			select {
			case <-release:
			case <-time.After(20 * time.Second):
			}
		}
	})}
	cfgB := e.f.cfg
	cfgB.Sent = shared()
	cfgB.RPC = &RPC{URL: skipPreflightNode(t, e.chain.URL, func(method string) {
		mu.Lock()
		defer mu.Unlock()
		switch method {
		case "sendTransaction":
			sendsB++
		case "getSignatureStatuses":
			if statusesB++; statusesB < 2 {
				return
			}
		default:
			return
		}
		releaseOnce.Do(func() { close(release) })
	})}
	a, err := New(cfgA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(cfgB)
	if err != nil {
		t.Fatal(err)
	}

	type result struct {
		r   x402.SettleResponse
		err error
	}
	resA := make(chan result, 1)
	go func() {
		r, err := a.Settle(ctx, pp, e.req)
		resA <- result{r, err}
	}()
	select {
	case <-sending:
	case <-time.After(20 * time.Second):
		t.Fatal("instance A never sent")
	}
	rb, errB := b.Settle(ctx, pp, e.req)
	ra := <-resA
	if ra.err != nil || errB != nil {
		t.Fatalf("settles: A %v, B %v", ra.err, errB)
	}
	won, lost := ra.r, rb
	if rb.Success {
		won, lost = rb, ra.r
	}
	if !won.Success || lost.Success || lost.ErrorReason != ReasonDuplicateSettlement || lost.Transaction != won.Transaction {
		t.Fatalf("A success=%v reason=%q tx=%s; B success=%v reason=%q tx=%s; want one success and the other duplicate_settlement naming its transaction",
			ra.r.Success, ra.r.ErrorReason, ra.r.Transaction, rb.Success, rb.ErrorReason, rb.Transaction)
	}
	mu.Lock()
	defer mu.Unlock()
	if sendsA != 1 || sendsB != 0 {
		t.Errorf("sends: A %d, B %d; want A 1, B none", sendsA, sendsB)
	}
	if p, q := e.balances(t); p != 1_000_000-20000 || q != 20000 {
		t.Fatalf("balances payer %d payee %d (paid once)", p, q)
	}
}

// redisSent is the store of sends on the Redis server at addr, under
// prefix, with a client of options o (its Addr set here) closed when the
// test ends: what the Caddy module's redis store gives a facilitator.
func redisSent(t *testing.T, addr, prefix string, o redis.Options) SentStore {
	t.Helper()
	o.Addr = addr
	rdb := redis.NewClient(&o)
	t.Cleanup(func() { rdb.Close() })
	rs, err := redisstore.New(context.Background(), rdb, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	return rs.Claims().(SentStore)
}

// lostReplySent is the store of sends on a Redis server of its own,
// reached through a servers.ReplyDrop, with go-redis resending a command
// whose answer was lost retries times (-1: never). Its scripts are loaded
// first, so that an armed drop loses a mark's answer and not the loading
// of a script.
func lostReplySent(t *testing.T, retries int) (SentStore, *servers.ReplyDrop) {
	t.Helper()
	p := servers.StartReplyDrop(t, servers.StartRedis(t).Addr)
	sent := redisSent(t, p.Addr, "lostreply", redis.Options{MaxRetries: retries, ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true})
	ctx := context.Background()
	w, err := sent.ClaimHeld(ctx, []string{"warm"}, time.Now().Add(time.Hour), time.Minute, func(c store.Claim) (string, error) { return c.Token, nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := sent.Swap(ctx, w, w.Token, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := sent.Lookup(ctx, "warm"); err != nil {
		t.Fatal(err)
	}
	return sent, p
}

// A landed send whose mark (the Swap of its record's note to the marked
// note) runs on Redis but whose answer is lost (a timeout, a dropped
// connection) is still answered success once, by the Settle that marked
// it: the client as the Caddy module makes it (MaxRetries 2) resends the
// script, which finds the record already carrying this Settle's own mark;
// with no resend, the Settle answers settlement_pending and its retry
// finds the same. Every other answer (a Settle elsewhere, a status read
// with no memory) is duplicate_settlement. (Before: the resend, or the
// retry, found the note changed and took it for another Settle's mark:
// duplicate_settlement for ever, the buyer charged and never served.)
func TestRedisMarkWhoseReplyIsLostIsStillItsSuccess(t *testing.T) {
	for _, retries := range []int{2, -1} {
		t.Run(map[int]string{2: "module-client", -1: "no-resend"}[retries], func(t *testing.T) {
			sent, p := lostReplySent(t, retries)
			ctx := context.Background()
			fr := &faultyRPC{}
			e := newEnv(t, Config{RPC: &RPC{URL: fr.serve(t)}, Sent: sent, PollInterval: 20 * time.Millisecond, ConfirmTimeout: 2 * time.Second})
			fr.set(func(f *faultyRPC) {
				f.target = e.chain.URL
				f.beforeSend = func() { p.Armed.Store(true) } // the record is written; the next reply is the mark's
			})
			pp := Payload(e.payment(t).Transaction(), e.req)
			s, err := e.f.Settle(ctx, pp, e.req)
			t.Logf("first settle: success=%v reason=%q tx=%s err=%v (replies dropped %d)", s.Success, s.ErrorReason, s.Transaction, err, p.Drops.Load())
			if p.Drops.Load() != 1 {
				t.Fatalf("%d replies dropped; the test proves nothing", p.Drops.Load())
			}
			if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
				t.Fatalf("balances payer %d payee %d; want the transfer landed", a, b)
			}
			successes := 0
			if err == nil && s.Success {
				successes++
			}
			var uo *x402.UnknownOutcomeError
			if errors.As(err, &uo) {
				r, err := e.f.Settle(ctx, pp, e.req)
				t.Logf("retry: success=%v reason=%q err=%v", r.Success, r.ErrorReason, err)
				if err == nil && r.Success {
					successes++
				}
			}
			other := e.elsewhere(t)
			o, err := other.Settle(ctx, pp, e.req)
			t.Logf("settle elsewhere: success=%v reason=%q err=%v", o.Success, o.ErrorReason, err)
			if err == nil && o.Success {
				successes++
			}
			st, err := e.elsewhere(t).SettlementStatus(ctx, pp, e.req) // a facilitator with no memory (the gate after a reload)
			t.Logf("status read with no memory: %+v %v", st, err)
			if err == nil && st.State == x402.SettlementDone {
				successes++
			}
			if successes != 1 {
				t.Errorf("%d answers of success/settled for one landed payment; want exactly one", successes)
			}
		})
	}
}

// swapArms is the store of sends whose marks (Swap) arm p first, so that
// the mark's answer, and only it, is lost.
type swapArms struct {
	SentStore
	p *servers.ReplyDrop
}

func (s *swapArms) Swap(ctx context.Context, c store.Claim, old, note string) error {
	s.p.Armed.Store(true)
	return s.SentStore.Swap(ctx, c, old, note)
}

// A status read with no memory of a pending send (a reload that changed
// the settings, or a restart) adopts its record on Redis and marks it, and
// the mark's answer is lost with no resend: undecided. The next status
// read finds the record carrying that read's own mark and answers settled,
// naming the transaction; a Settle elsewhere answers duplicate_settlement.
// (Before: the next read drew a mark of its own, took the first for
// another's and answered settled by another settlement, which the gate
// releases: the buyer charged and never served.)
func TestRedisStatusReadMarkWhoseReplyIsLostIsStillItsOwn(t *testing.T) {
	sent, p := lostReplySent(t, -1)
	ctx := context.Background()
	e, _, pp, unknown := settlePending(t, sent, time.Minute)
	sig := unknown.Reply.Transaction
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: e.chain.URL}, &swapArms{SentStore: sent, p: p}
	reader, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := reader.SettlementStatus(ctx, pp, e.req)
	if err != nil || st.State != x402.SettlementUndecided || p.Drops.Load() != 1 {
		t.Fatalf("status read whose mark's answer was lost: %+v %v (%d replies dropped); want undecided", st, err, p.Drops.Load())
	}
	reader.UseSent(sent) // the store answers again
	if st, err := reader.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementDone || st.Transaction != sig {
		t.Errorf("next status read: %+v %v; want settled naming %s", st, err, sig)
	}
	if s, err := e.elsewhere(t).Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement {
		t.Errorf("settle elsewhere: %+v %v; want duplicate_settlement", s, err)
	}
}

// A send answered settlement_pending is adopted and marked by another
// facilitator on the same store (B answers success), and its sender asks
// again once the record's hold (SentRecordHold, shortened here) passed:
// B's mark keeps the record past the hold, longer than the sender's memory
// of the send lasts, so the sender's retry finds B's mark and answers
// duplicate_settlement. (Before: the marked record lapsed at its hold
// while the sender still remembered its pending send; the retry found no
// record, read it as lapsed unmarked and answered success a second time.)
func TestSenderRetryAfterAnotherMarkedPastTheHoldIsDuplicate(t *testing.T) {
	db := openStore(t, t.TempDir())
	markedPastTheHold(t, sentOf(db))
}

// The same on Redis, where the record lapses by the server's TTL.
func TestRedisSenderRetryAfterAnotherMarkedPastTheHoldIsDuplicate(t *testing.T) {
	markedPastTheHold(t, redisSent(t, servers.StartRedis(t).Addr, "markedhold", redis.Options{}))
}

// markedPastTheHold is the sender's retry after another facilitator
// marked its send's record, past the record's hold, on under.
func markedPastTheHold(t *testing.T, under SentStore) {
	sent := &shortHold{SentStore: under, hold: 2 * time.Second}
	e, fr, pp, unknown := settlePending(t, sent, time.Minute)
	sig := unknown.Reply.Transaction
	ctx := context.Background()
	b := e.elsewhere(t)
	s, err := b.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle on B: %+v %v; want success (adopted)", s, err)
	}
	key := e.f.sentKey(mustDecode(t, pp).MessageHash())
	if st, err := under.Lookup(ctx, key); err != nil || !st.Settled {
		t.Fatalf("record after B: %+v %v; want marked by B", st, err)
	}
	time.Sleep(2500 * time.Millisecond) // past the record's hold
	if st, err := under.Lookup(ctx, key); err != nil || !st.Settled {
		t.Fatalf("record past its hold: %+v %v; want kept, marked by B", st, err)
	}
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	a, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || a.Success || a.ErrorReason != ReasonDuplicateSettlement {
		t.Errorf("A's retry after B answered success, past the record's hold: %+v %v; want duplicate_settlement naming %s (B already answered success)", a, err, sig)
	}
}

// The sender's status read (from memory) of a send another facilitator
// marked, past the record's hold, answers settled by another settlement.
// (Before: the record lapsed at its hold and the read answered settled,
// so the gate served a payment whose one success was B's.)
func TestSenderStatusReadAfterAnotherMarkedPastTheHoldIsDuplicate(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &shortHold{SentStore: sentOf(db), hold: 2 * time.Second}
	e, fr, pp, _ := settlePending(t, sent, time.Minute)
	ctx := context.Background()
	b := e.elsewhere(t)
	if s, err := b.Settle(ctx, pp, e.req); err != nil || !s.Success {
		t.Fatalf("settle on B: %+v %v; want success (adopted)", s, err)
	}
	time.Sleep(2500 * time.Millisecond) // past the record's hold
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	st, err := e.f.SettlementStatus(ctx, pp, e.req)
	if err != nil || !answeredElsewhere(st) {
		t.Errorf("A's status read after B answered success, past the record's hold: %+v %v; want never, duplicate_settlement", st, err)
	}
}

// A send answered settlement_pending is adopted by another facilitator
// whose mark lands but whose keep of the record fails (B answers
// settlement_pending); the record then lapses at its hold while both
// memories of the send live. Only the sender answers it as its own: A's
// retry answers success, B's duplicate_settlement. (Before: each read the
// record gone as lapsed unmarked and both answered success.)
func TestAdopterWhoseMarkWasNotKeptAnswersDuplicateAfterTheLapse(t *testing.T) {
	db := openStore(t, t.TempDir())
	adoptedMarkNotKept(t, sentOf(db))
}

// The same on Redis, where the record lapses by the server's TTL.
func TestRedisAdopterWhoseMarkWasNotKeptAnswersDuplicateAfterTheLapse(t *testing.T) {
	adoptedMarkNotKept(t, redisSent(t, servers.StartRedis(t).Addr, "keepfails", redis.Options{}))
}

// adoptedMarkNotKept is the two retries, after the lapse, of a send whose
// adopter marked its record on under and could not keep it.
func adoptedMarkNotKept(t *testing.T, under SentStore) {
	sent := &shortHold{SentStore: under, hold: 2 * time.Second}
	e, fr, pp, unknown := settlePending(t, sent, time.Minute)
	sig := unknown.Reply.Transaction
	ctx := context.Background()
	key := e.f.sentKey(mustDecode(t, pp).MessageHash())
	kf := &keepFails{SentStore: sent}
	kf.fail.Store(true)
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: e.chain.URL}, kf
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Settle(ctx, pp, e.req)
	var bu *x402.UnknownOutcomeError
	if !errors.As(err, &bu) || bu.Reply == nil || bu.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("B's settle (mark lands, keep fails): %v; want settlement_pending", err)
	}
	if st, err := under.Lookup(ctx, key); err != nil || !st.Settled {
		t.Fatalf("record after B's mark: %+v %v; want marked by B", st, err)
	}
	kf.fail.Store(false)
	time.Sleep(2500 * time.Millisecond) // the marked record lapses at its hold (never kept)
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	if a, err := e.f.Settle(ctx, pp, e.req); err != nil || !a.Success || a.Transaction != sig {
		t.Errorf("sender's retry after the lapse: %+v %v; want success naming %s", a, err, sig)
	}
	if s, err := b.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != sig {
		t.Errorf("adopter's retry after the lapse: %+v %v; want duplicate_settlement naming %s", s, err, sig)
	}
}

// A send answered settlement_pending is adopted by another facilitator
// that cannot mark its record (B answers settlement_pending); the record
// lapses unmarked while both memories of the send live. The sender's
// retry answers success, and B's status read settled by another
// settlement, which the gate does not serve. (Before: each read the record
// gone as lapsed unmarked: a success and a settled read for one payment.)
func TestAdopterThatCouldNotMarkReadsALapsedRecordSettledElsewhere(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &shortHold{SentStore: sentOf(db), hold: 2 * time.Second}
	e, fr, pp, unknown := settlePending(t, sent, time.Minute)
	sig := unknown.Reply.Transaction
	ctx := context.Background()
	sf := &swapFails{SentStore: sent}
	sf.fail.Store(true)
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: e.chain.URL}, sf
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Settle(ctx, pp, e.req)
	var bu *x402.UnknownOutcomeError
	if !errors.As(err, &bu) || bu.Reply == nil || bu.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("B's settle (adopted, cannot mark): %v; want settlement_pending", err)
	}
	time.Sleep(2500 * time.Millisecond) // the record lapses unmarked
	sf.fail.Store(false)
	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	if a, err := e.f.Settle(ctx, pp, e.req); err != nil || !a.Success || a.Transaction != sig {
		t.Errorf("sender's retry after the lapse: %+v %v; want success naming %s", a, err, sig)
	}
	if st, err := b.SettlementStatus(ctx, pp, e.req); err != nil || !answeredElsewhere(st) {
		t.Errorf("adopter's status read after the lapse: %+v %v; want never, duplicate_settlement", st, err)
	}
}
