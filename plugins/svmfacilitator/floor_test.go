package svmfacilitator

import (
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

// A floor a later bank read reached is kept for good: when the slot named
// after it lapses (no bank read reaches it for floorHold while a lagging
// node answers from older banks), the floor falls back to the reached
// slot, never below, so the lagging node is still refused. A slot not yet
// reached is the floor at once, and lapses only after floorHold of older
// answers, never while the endpoint is merely quiet.
func TestSlotFloorLapsesToTheSlotABankReadReached(t *testing.T) {
	var f slotFloor
	t0 := time.Now()
	f.saw(100, true, t0)
	f.saw(102, true, t0) // reaches 100, names 102
	f.saw(90, false, t0) // a lagging node's tip
	if floor, lapsed := f.at(t0.Add(floorHold)); floor != 102 || lapsed != 0 {
		t.Errorf("within floorHold: floor %d, lapsed %d; want 102, none", floor, lapsed)
	}
	if floor, lapsed := f.at(t0.Add(floorHold + time.Second)); floor != 100 || lapsed != 102 {
		t.Errorf("after floorHold of older answers: floor %d, lapsed %d; want 100 (reached), 102", floor, lapsed)
	}
	var quiet slotFloor
	quiet.saw(100, true, t0)
	if floor, _ := quiet.at(t0.Add(10 * floorHold)); floor != 100 {
		t.Errorf("a floor no older answer contradicts: %d after a quiet while; want 100", floor)
	}
	var reached slotFloor
	reached.saw(100, false, t0)
	reached.saw(100, true, t0)
	reached.saw(90, true, t0)
	if floor, _ := reached.at(t0.Add(10 * floorHold)); floor != 100 {
		t.Errorf("a floor a bank read reached: %d; want 100 for good", floor)
	}
}
