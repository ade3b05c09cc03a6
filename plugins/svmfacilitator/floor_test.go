package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// fakeFutureSlotPool is a FAKE FOR A FAULT the dev chain cannot make: a
// load-balanced pool behind one URL one of whose members (a node of
// another cluster, a lying provider) answers the first getSlot at
// commitment level with a slot far past the chain's tip. Every other call,
// and every later getSlot, is the dev chain's own answer. told counts the
// getSlot calls at that level.
func fakeFutureSlotPool(t *testing.T, upstream, level string) (url string, told *atomic.Int64) {
	told = &atomic.Int64{}
	url = proxy(t, upstream, func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool {
		if method != "getSlot" || !asksCommitment(params, level) || told.Add(1) > 1 {
			return false
		}
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + strconv.FormatUint(1<<40, 10) + `}`))
		return true
	}, nil)
	return url, told
}

// asksCommitment reports whether a call's first param is a config asking
// commitment level.
func asksCommitment(params []json.RawMessage, level string) bool {
	var cfg struct {
		Commitment string `json:"commitment"`
	}
	return len(params) > 0 && json.Unmarshal(params[0], &cfg) == nil && cfg.Commitment == level
}

// One getSlot answer from a future slot leaves undecided the read it was
// taken for, and no more: once no bank read reaches that slot for
// floorHold while the endpoint answers from older banks, the floor lapses,
// and the payment that landed for the attempt that sent it is read
// settled, by the gate's read of the named signature and by a peer's.
// (Before: the floor only ever rose, every later read asked for the Clock
// of a bank no honest node reaches for years, and the charged buyer's
// payment stayed settlement_pending until its claim lapsed.)
func TestOneFutureSlotAnswerLapsesForChainReads(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)
	began := time.Now()
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	pool, told := fakeFutureSlotPool(t, e.chain.URL, "confirmed")
	r, err := NewStatusReader(&RPC{URL: pool}, x402.NetworkSolanaDevnet)
	if err != nil {
		t.Fatal(err)
	}
	peerPool, peerTold := fakeFutureSlotPool(t, e.chain.URL, "confirmed")
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: peerPool}, nil
	peer, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	reads := map[string]func() (x402.SettlementStatus, error){
		"named": func() (x402.SettlementStatus, error) {
			return r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: s.Transaction, After: began})
		},
		"peer": func() (x402.SettlementStatus, error) {
			return peer.PeerSettlementStatus(ctx, pp, e.req, began)
		},
	}
	for name, read := range reads {
		if st, err := read(); err == nil {
			t.Errorf("%s, the read the future slot was taken for: %+v; want undecided with an error", name, st)
		}
	}
	if told.Load() != 1 || peerTold.Load() != 1 {
		t.Fatalf("the bad members answered %d and %d reads; want one each", told.Load(), peerTold.Load())
	}
	// Every answer from here is the chain's own. It moves on, and more
	// than floorHold passes on both clocks alike (the attempt's age and
	// the transaction's), so the transaction stays the attempt's own.
	e.settleNoise(t, 3)
	e.chain.AdvanceClock(2 * floorHold)
	now = func() time.Time { return time.Now().Add(2 * floorHold) }
	defer func() { now = time.Now }()
	for name, read := range reads {
		if st, err := read(); err != nil || st.State != x402.SettlementDone || st.Transaction != s.Transaction {
			t.Errorf("%s, a later read: %+v %v; want settled naming %s", name, st, err, s.Transaction)
		}
	}
}

// The processed floor of a judgement of expiry lapses alike: a payment
// never sent whose blockhash expired is judged "never" once no bank read
// reaches the future slot one getSlot answer named for floorHold.
// (Before: every later isBlockhashValid asked for a bank at that slot, and
// the payment stayed settlement_pending, its claim held, until it lapsed.)
func TestOneFutureSlotAnswerLapsesForExpiry(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req) // never sent
	began := time.Now()
	pool, told := fakeFutureSlotPool(t, e.chain.URL, "processed")
	r, err := NewStatusReader(&RPC{URL: pool}, x402.NetworkSolanaDevnet)
	if err != nil {
		t.Fatal(err)
	}
	e.chain.ExpireBlockhash()
	read := func() (x402.SettlementStatus, error) {
		return r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{After: began})
	}
	if st, err := read(); err == nil && st.State != x402.SettlementUndecided {
		t.Errorf("the read the future slot was taken for: %+v; want undecided", st)
	}
	if told.Load() != 1 {
		t.Fatalf("the bad member answered %d reads; want one", told.Load())
	}
	e.settleNoise(t, 3)
	e.chain.AdvanceClock(2 * floorHold)
	now = func() time.Time { return time.Now().Add(2 * floorHold) }
	defer func() { now = time.Now }()
	if st, err := read(); err != nil || st.State != x402.SettlementNever {
		t.Errorf("a later read: %+v %v; want never", st, err)
	}
}

// A floor lapses only once the endpoint has answered from older banks
// alone for floorHold, counted from the first of those answers: never
// while it is merely quiet, and not while any answer at or past the floor
// shows it real again. It lapses to the newest older bank, and a floor
// that lapsed can lapse again.
// (Before: the hold was counted from when the floor was raised, so after a
// quiet minute the first answer of a lagging node lapsed it at once; and
// a second future-slot read "reached" the first and pinned it for good.)
func TestSlotFloorLapsesAfterFloorHoldOfOlderAnswers(t *testing.T) {
	t0 := time.Now()
	var f slotFloor
	f.saw(100, t0)
	quiet := t0.Add(10 * floorHold)
	f.saw(90, quiet) // the first answer after a quiet while: a lagging node's
	if floor, lapsed := f.at(quiet.Add(floorHold)); floor != 100 || lapsed != 0 {
		t.Errorf("floorHold after the first older answer: floor %d, lapsed %d; want 100, none", floor, lapsed)
	}
	f.saw(95, quiet.Add(30*time.Second))
	if floor, lapsed := f.at(quiet.Add(floorHold + time.Second)); floor != 95 || lapsed != 100 {
		t.Errorf("past floorHold of older answers: floor %d, lapsed %d; want 95 (the newest of them), 100", floor, lapsed)
	}

	var shown slotFloor
	shown.saw(100, t0)
	shown.saw(90, t0)
	shown.saw(100, t0.Add(30*time.Second)) // a node at the floor answers again
	shown.saw(91, t0.Add(40*time.Second))
	if floor, _ := shown.at(t0.Add(floorHold + time.Second)); floor != 100 {
		t.Errorf("older answers since an answer at the floor, for less than floorHold: floor %d; want 100", floor)
	}

	var future slotFloor
	future.saw(1<<40, t0)
	future.saw(1<<40+1, t0) // a second future answer
	future.saw(5, t0.Add(time.Second))
	if floor, _ := future.at(t0.Add(floorHold + 2*time.Second)); floor != 5 {
		t.Errorf("two future answers, then a minute of honest ones: floor %d; want 5", floor)
	}
	future.saw(6, t0.Add(floorHold+3*time.Second))
	if floor, _ := future.at(t0.Add(floorHold + 3*time.Second)); floor != 6 {
		t.Errorf("after the lapse the floor rises with the chain: %d; want 6", floor)
	}
}

// A pool member stuck behind the tip (a FAKE FOR A FAULT: a node
// answering getSlot and the Clock sysvar from a bank taken just after the
// original payment landed; the dev chain cannot lag) is refused after the
// endpoint was quiet for more than floorHold, as while the floor a
// Verify's simulation raised is fresh
// (TestChainReadsTakeNoClockOfANodeBehindTheTip): the peer read of a
// replay begun two minutes after the original landed never takes the
// replay for its own. (Before: after a quiet minute the stuck node's own
// getSlot lapsed the floor, its clock was taken, and the replay was read
// settled: one charge, two paid answers.)
func TestStuckNodeAfterAQuietMinuteServesNoReplay(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	e.chain.AdvanceClock(time.Second)
	var stale json.RawMessage
	e.chain.Call("getAccountInfo", &stale, ClockSysvar, map[string]any{"encoding": "base64", "commitment": "confirmed"})
	var staleAt struct{ Context rpcContext }
	if err := json.Unmarshal(stale, &staleAt); err != nil {
		t.Fatal(err)
	}
	stuck := &RPC{URL: proxy(t, e.chain.URL, func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool {
		var result []byte
		switch {
		case method == "getAccountInfo" && len(params) > 0 && bytes.Contains(params[0], []byte(ClockSysvar)):
			result = stale
		case method == "getSlot":
			result = strconv.AppendUint(nil, staleAt.Context.Slot, 10)
		default:
			return false
		}
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + string(result) + `}`))
		return true
	}, nil)}
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = stuck, nil
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e.settleNoise(t, 2) // the chain moves on
	// The pool shows the tip (a Verify's simulation, forwarded).
	if v, err := m.Verify(ctx, Payload(e.payment(t).withMemo("another"), e.req), e.req); err != nil || !v.IsValid {
		t.Fatalf("verify of another payment: %+v %v", v, err)
	}
	if fl := stuck.seen[confirmed].slot; fl <= staleAt.Context.Slot {
		t.Fatalf("the floor %d is not past the stuck node's slot %d", fl, staleAt.Context.Slot)
	}
	// Two quiet minutes pass on both clocks; then a replay is begun.
	e.chain.AdvanceClock(2 * floorHold)
	now = func() time.Time { return time.Now().Add(2 * floorHold) }
	defer func() { now = time.Now }()
	replay := now()
	if st, err := e.reader(t).SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: s.Transaction, After: replay}); err != nil || st.Reason != ReasonDuplicateSettlement {
		t.Fatalf("through the chain itself: %+v %v; want settled by another settlement", st, err)
	}
	st, err := m.PeerSettlementStatus(ctx, pp, e.req, replay)
	if st.State == x402.SettlementDone {
		t.Errorf("peer read of a replay begun 2 min after the original landed, through a stuck node after a quiet minute: %+v %v; want undecided or duplicate_settlement, never settled", st, err)
	}
}

// A member of another cluster (or a lying provider) that answers two bank
// reads in a row from its own, far newer bank (the Clock sysvar, twice: a
// FAKE FOR A FAULT, the dev chain has one cluster) leaves undecided the
// reads of the minute after, not every read: once the endpoint has
// answered from older banks alone for floorHold the floor lapses, and the
// landed payment is read settled. (Before: the second answer "reached"
// the first, the floor lapsed to it and never again: the buyer charged and
// never served until a restart.)
func TestTwoFutureBankReadsLeaveTheFloorToLapse(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)
	began := time.Now()
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	var lies atomic.Int64
	pool := proxy(t, e.chain.URL, nil, func(method string, reply []byte) []byte {
		if method != "getAccountInfo" || !bytes.Contains(reply, []byte(`"context"`)) {
			return reply
		}
		n := lies.Add(1)
		if n > 2 {
			return reply
		}
		var m map[string]any
		if json.Unmarshal(reply, &m) != nil {
			return reply
		}
		res, _ := m["result"].(map[string]any)
		c, _ := res["context"].(map[string]any)
		if c == nil {
			return reply
		}
		c["slot"] = uint64(1<<40) + uint64(n)
		out, _ := json.Marshal(m)
		return out
	})
	rpc := &RPC{URL: pool}
	r, err := NewStatusReader(rpc, x402.NetworkSolanaDevnet)
	if err != nil {
		t.Fatal(err)
	}
	read := func() (x402.SettlementStatus, error) {
		return r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: s.Transaction, After: began})
	}
	read()
	read()
	if lies.Load() < 2 {
		t.Fatalf("the bad member answered %d Clock reads; want two", lies.Load())
	}
	e.settleNoise(t, 3)
	for _, after := range []time.Duration{2 * floorHold, 5 * floorHold, 10 * floorHold} {
		e.chain.AdvanceClock(floorHold)
		now = func() time.Time { return time.Now().Add(after) }
		read() // honest answers, older than the floor
	}
	defer func() { now = time.Now }()
	now = func() time.Time { return time.Now().Add(20 * floorHold) }
	e.chain.AdvanceClock(10 * floorHold)
	if st, err := read(); err != nil || st.State != x402.SettlementDone || st.Transaction != s.Transaction {
		t.Errorf("20 min of honest answers after two future-slot bank reads: %+v %v (floor %d); want settled naming %s", st, err, rpc.seen[confirmed].slot, s.Transaction)
	}
}
