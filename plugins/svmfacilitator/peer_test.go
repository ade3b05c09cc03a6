package svmfacilitator

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// Two instances with one fee payer remember their sends in one store. A
// settles the payment and marks its record answered; its reply is lost
// (the gateway's caller charged, told settlement_pending). B, asked as the
// peer reader, finds A's record marked by another and reads the chain for
// the transaction: settled, naming it, however often it is asked. Its own
// reading, SettlementStatus, still answers that record "settled by another
// settlement", and the record stays A's. (Before: the peer read answered
// the marked record settled by another settlement, and the gateway refused
// the charged buyer duplicate_settlement.)
func TestPeerReadOfASendRecordedInASharedStore(t *testing.T) {
	db := openStore(t, t.TempDir())
	e := newEnv(t, Config{Sent: sentOf(db)})
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)
	began := time.Now()
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !s.Success {
		t.Fatalf("settle on A: %+v %v", s, err)
	}
	cfg := e.f.cfg
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		st, err := b.PeerSettlementStatus(ctx, pp, e.req, began)
		if err != nil || st.State != x402.SettlementDone || st.Transaction != s.Transaction || st.Reason != "" {
			t.Fatalf("peer read %d on B: %+v %v; want settled naming %s", i+1, st, err, s.Transaction)
		}
	}
	if st, err := b.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementNever || st.Reason != ReasonDuplicateSettlement {
		t.Errorf("B's own status read of A's marked record: %+v %v; want settled by another settlement", st, err)
	}
	if a, p := e.balances(t); a != 1_000_000-20000 || p != 20000 {
		t.Errorf("balances payer %d payee %d", a, p)
	}
}

// slowPoolNode is a FAKE of a node (or pool) consistently a few slots
// behind the one that accepted a peer's send, in front of the real chain
// at upstream: while behind, it answers every signature unknown and every
// blockhash invalid at slot 1 (it has not seen the buyer's blockhash yet,
// and answers as for an expired one), and refuses a minContextSlot above 1
// as Agave does (-32016). Once caught up it forwards everything.
func slowPoolNode(t *testing.T, upstream string, behind *atomic.Bool) string {
	return proxy(t, upstream, func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool {
		if !behind.Load() {
			return false
		}
		switch method {
		case "getSignatureStatuses":
			replyNoStatus(w, id)
		case "isBlockhashValid":
			var cfg struct {
				MinContextSlot uint64 `json:"minContextSlot"`
			}
			if len(params) == 2 {
				json.Unmarshal(params[1], &cfg)
			}
			if cfg.MinContextSlot > 1 {
				w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32016,"message":"Minimum context slot has not been reached"}}`))
				return true
			}
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":{"context":{"slot":1},"value":false}}`))
		default:
			return false
		}
		return true
	}, nil)
}

// A peer read's node is not the one that accepted the peer's send, and
// may lag it: answering a fresh blockhash invalid, with a slot as new as
// any this process has seen, it must not make the send "never landed".
// The read stays undecided until the node has shown the blockhash valid;
// from then a bank no older that holds it invalid is past it (never), and
// a transaction that landed is settled, naming it. (Before: the first read
// through the lagging node answered never, and the gateway released the
// claim of a payment about to be charged.)
func TestPeerReadOnALaggingNodeCannotExpireAFreshBlockhash(t *testing.T) {
	e := newEnv(t, Config{})
	var behind atomic.Bool
	behind.Store(true)
	cfg := e.f.cfg
	cfg.RPC = &RPC{URL: slowPoolNode(t, e.chain.URL, &behind)}
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pp := Payload(e.payment(t).Transaction(), e.req)
	began := time.Now()
	if st, err := b.PeerSettlementStatus(ctx, pp, e.req, began); err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("peer read through the lagging node: %+v %v; want undecided", st, err)
	}

	// Caught up: the blockhash is valid, the send still on its way.
	behind.Store(false)
	if st, err := b.PeerSettlementStatus(ctx, pp, e.req, began); err != nil || st.State != x402.SettlementUndecided {
		t.Fatalf("peer read once caught up: %+v %v; want undecided", st, err)
	}
	l := e.payment(t)
	l.Memo = "sent by the peer"
	landed := l.Build(l.Instructions())
	sig := e.sendSigned(t, landed)
	if st, err := b.PeerSettlementStatus(ctx, Payload(landed, e.req), e.req, began); err != nil || st.State != x402.SettlementDone || st.Transaction != sig {
		t.Errorf("peer read of a send that landed: %+v %v; want settled naming %s", st, err, sig)
	}
	e.chain.ExpireBlockhash()
	if st, err := b.PeerSettlementStatus(ctx, pp, e.req, began); err != nil || st.State != x402.SettlementNever || st.Reason != "" {
		t.Errorf("peer read after the blockhash it saw valid expired: %+v %v; want never", st, err)
	}
}

// Both status reads, of a payment this facilitator sent and of one a peer
// with its fee payer sent, refuse alike a payment on another network and
// one whose payload is not a transaction, naming which.
func TestStatusReadsRefuseAnotherNetworkAndANonTransaction(t *testing.T) {
	e := newEnv(t, Config{})
	pp := Payload(e.payment(t).Transaction(), e.req)
	other := e.req
	other.Network = x402.NetworkSolana
	garbled := pp
	garbled.Payload = json.RawMessage(`{"transaction":"not a transaction"}`)
	ctx := context.Background()
	for name, read := range map[string]func(x402.PaymentPayload, x402.PaymentRequirements) (x402.SettlementStatus, error){
		"SettlementStatus": func(p x402.PaymentPayload, r x402.PaymentRequirements) (x402.SettlementStatus, error) {
			return e.f.SettlementStatus(ctx, p, r)
		},
		"PeerSettlementStatus": func(p x402.PaymentPayload, r x402.PaymentRequirements) (x402.SettlementStatus, error) {
			return e.f.PeerSettlementStatus(ctx, p, r, time.Now())
		},
	} {
		if st, err := read(pp, other); err == nil || !strings.Contains(err.Error(), "this facilitator settles on "+e.req.Network+", not "+other.Network) {
			t.Errorf("%s of a payment on %s: %+v, %v; want refused naming both networks", name, other.Network, st, err)
		}
		if st, err := read(garbled, e.req); err == nil || !strings.HasPrefix(err.Error(), "payment payload: ") {
			t.Errorf("%s of a payload that is not a transaction: %+v, %v; want refused naming the payment payload", name, st, err)
		}
	}
}
