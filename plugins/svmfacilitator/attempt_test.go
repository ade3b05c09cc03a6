package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// The reads by the chain alone attribute a landed transaction to the
// asking attempt only when it landed after the attempt began: the
// gateway's StatusReader, by the signature named and by the search, and
// the peer read. 10 s after the transaction landed, an attempt begun then
// (a replay of a payment settled and answered earlier) is answered
// settled by another settlement naming it; the attempt whose settlement
// sent it, settled naming it; an attempt beginning within
// AttemptMargin of the landing is still the attempt's. (Before: each read
// answered settled whenever the transaction landed, and a gate serving
// the replay of a payment already served charged once for two answers.)
func TestChainReadsAttributeOnlyATransactionThatLandedAfterTheAttemptBegan(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
	honest := time.Now()
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	peer, err := New(e.f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	reads := map[string]func(began time.Time) (x402.SettlementStatus, error){
		"named": func(began time.Time) (x402.SettlementStatus, error) {
			return e.reader(t).SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: s.Transaction, After: began})
		},
		"searched": func(began time.Time) (x402.SettlementStatus, error) {
			return e.reader(t).SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{After: began})
		},
		"peer": func(began time.Time) (x402.SettlementStatus, error) {
			return peer.PeerSettlementStatus(ctx, pp, e.req, began)
		},
	}
	// 10 s pass, on both clocks.
	e.chain.AdvanceClock(10 * time.Second)
	now = func() time.Time { return time.Now().Add(10 * time.Second) }
	defer func() { now = time.Now }()
	replay := now()
	for name, read := range reads {
		if st, err := read(honest); err != nil || st.State != x402.SettlementDone || st.Transaction != s.Transaction {
			t.Errorf("%s, the attempt that sent it: %+v %v; want settled naming %s", name, st, err, s.Transaction)
		}
		if st, err := read(replay); err != nil || st.State != x402.SettlementNever || st.Reason != ReasonDuplicateSettlement || st.Transaction != s.Transaction {
			t.Errorf("%s, an attempt begun 10 s after it landed: %+v %v; want settled by another settlement naming %s", name, st, err, s.Transaction)
		}
		if st, err := read(replay.Add(-10*time.Second + AttemptMargin - 2*time.Second)); err != nil || st.State != x402.SettlementDone {
			t.Errorf("%s, an attempt begun within the margin of its landing: %+v %v; want settled", name, st, err)
		}
		// A record from before records kept their attempt's start is
		// judged as its gate judged it: by the landing alone. (Before:
		// undecided, and its charged buyer was never served.)
		if st, err := read(time.Time{}); err != nil || st.State != x402.SettlementDone {
			t.Errorf("%s, no attempt start known: %+v %v; want settled", name, st, err)
		}
	}
}

// The chain's clock is read from a confirmed bank no older than the tip:
// a node of the pool behind it (a FAKE node answering the Clock sysvar
// from its bank 4 s and a slot behind the chain, the only lag the dev
// chain cannot make) leaves the outcome undecided, never settled, when a
// replay is read 8 s after the original landed: for the gate's read by the
// signature named and for a peer's read, once another node names the tip
// (getSlot) and once the lagging node names its own slot but the pool has
// shown a newer bank before (a Verify's simulation). Through the chain
// itself the same read answers settled by another settlement. (Before: the
// Clock was asked of a bank no older than the landing, the lagging clock
// made the transaction 4 s old, within AttemptMargin of the replay's
// attempt, and the replay was answered settled and served again.)
func TestChainReadsTakeNoClockOfANodeBehindTheTip(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	e.chain.AdvanceClock(4 * time.Second)
	var stale json.RawMessage
	e.chain.Call("getAccountInfo", &stale, ClockSysvar, map[string]any{"encoding": "base64", "commitment": "confirmed"})
	var staleAt struct{ Context rpcContext }
	if err := json.Unmarshal(stale, &staleAt); err != nil {
		t.Fatal(err)
	}
	e.settleNoise(t, 1) // the chain moves on a slot
	e.chain.AdvanceClock(4 * time.Second)
	replay := time.Now()
	if st, err := e.reader(t).SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: s.Transaction, After: replay}); err != nil || st.Reason != ReasonDuplicateSettlement {
		t.Fatalf("through the chain itself: %+v %v; want settled by another settlement", st, err)
	}
	// lagging is the node; namesItsSlot: it answers getSlot too.
	lagging := func(namesItsSlot bool) *RPC {
		return &RPC{URL: proxy(t, e.chain.URL, func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool {
			var result []byte
			switch {
			case method == "getAccountInfo" && len(params) > 0 && bytes.Contains(params[0], []byte(ClockSysvar)):
				result = stale
			case method == "getSlot" && namesItsSlot:
				result = strconv.AppendUint(nil, staleAt.Context.Slot, 10)
			default:
				return false
			}
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":` + string(result) + `}`))
			return true
		}, nil)}
	}
	// member is a facilitator of this fee payer reading through rpc that
	// remembers nothing of the payment.
	member := func(rpc *RPC) *Facilitator {
		cfg := e.f.cfg
		cfg.RPC, cfg.Sent = rpc, nil
		m, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		return m
	}
	notSettled := func(what string, st x402.SettlementStatus, err error) {
		t.Helper()
		if err == nil || st.State != x402.SettlementUndecided {
			t.Errorf("%s: %+v %v; want undecided with an error", what, st, err)
		}
	}
	r, err := NewStatusReader(lagging(false), x402.NetworkSolanaDevnet)
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: s.Transaction, After: replay})
	notSettled("named, another node naming the tip", st, err)
	st, err = member(lagging(false)).PeerSettlementStatus(ctx, pp, e.req, replay)
	notSettled("peer, another node naming the tip", st, err)
	m := member(lagging(true))
	if v, err := m.Verify(ctx, Payload(e.payment(t).withMemo("another"), e.req), e.req); err != nil || !v.IsValid {
		t.Fatalf("verify of another payment: %+v %v", v, err)
	}
	st, err = m.PeerSettlementStatus(ctx, pp, e.req, replay)
	notSettled("peer, the node naming its own slot after a newer bank was shown", st, err)
}

// A node that does not tell the landed transaction's block time (a FAKE
// node answering getTransaction with blockTime null, as a node that lost
// it may) leaves the outcome undecided, never settled: whose settlement it
// is cannot be told.
func TestChainReadWithoutABlockTimeStaysUndecided(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	pp := Payload(e.payment(t).Build(e.payment(t).Instructions()), e.req)
	began := time.Now()
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle: %+v %v", s, err)
	}
	node := proxy(t, e.chain.URL, nil, func(method string, reply []byte) []byte {
		if method != "getTransaction" {
			return reply
		}
		var m map[string]any
		json.Unmarshal(reply, &m)
		if r, ok := m["result"].(map[string]any); ok {
			r["blockTime"] = nil
		}
		out, _ := json.Marshal(m)
		return bytes.TrimSpace(out)
	})
	r, err := NewStatusReader(&RPC{URL: node}, x402.NetworkSolanaDevnet)
	if err != nil {
		t.Fatal(err)
	}
	st, err := r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: s.Transaction, After: began})
	if err == nil || st.State != x402.SettlementUndecided {
		t.Errorf("no block time: %+v %v; want undecided with an error", st, err)
	}
}
