package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/json"
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
