package svmfacilitator

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/x402"
)

// sendSigned lands the payment raw, co-signed by the fee payer, on the
// chain directly: another process with the same fee payer settling it.
func (e *env) sendSigned(t *testing.T, raw []byte) string {
	t.Helper()
	tx, err := DecodeTransaction(raw)
	if err != nil {
		t.Fatal(err)
	}
	signed := bytes.Clone(raw)
	copy(signed[1:65], ed25519.Sign(e.fee, tx.Message))
	var sig string
	e.chain.Call("sendTransaction", &sig, base64.StdEncoding.EncodeToString(signed), map[string]any{"encoding": "base64", "skipPreflight": true})
	return sig
}

// A facilitator with no record of a payment that already landed (it
// restarted, or another instance with the same fee payer settled it)
// looks it up by its transaction's id before simulating or sending: the
// answer is duplicate_settlement naming that transaction, never "failed,
// not charged" (the payer's tokens moved) and never a second success (its
// sender answered for it; a second would buy a second service). Verify
// refuses it as duplicate_settlement too.
func TestSettleWithoutARecordOfALandedPayment(t *testing.T) {
	e := newEnv(t, Config{})
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	ctx := context.Background()
	first, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !first.Success {
		t.Fatalf("first settle: %+v %v", first, err)
	}

	fr := &faultyRPC{target: e.chain.URL}
	cfg := e.f.cfg
	cfg.RPC = &RPC{URL: fr.serve(t)}
	fresh, err := New(cfg) // the same fee payer, a fresh process
	if err != nil {
		t.Fatal(err)
	}
	if v, err := fresh.Verify(ctx, pp, e.req); err != nil || v.IsValid || v.InvalidReason != ReasonDuplicateSettlement {
		t.Fatalf("verify of a landed payment: %+v %v, want %s", v, err, ReasonDuplicateSettlement)
	}
	sims := fr.count("simulateTransaction")
	for i := range 2 { // the second from the record the first left
		s, err := fresh.Settle(ctx, pp, e.req)
		if err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != first.Transaction {
			t.Fatalf("settle %d without a record: %+v %v, want %s naming %s", i, s, err, ReasonDuplicateSettlement, first.Transaction)
		}
	}
	if n := fr.count("sendTransaction"); n != 0 || fr.count("simulateTransaction") != sims {
		t.Fatalf("sent %d, simulated %d times for a payment that landed", n, fr.count("simulateTransaction")-sims)
	}
	// The facilitator that settled it, its record aged out.
	now = func() time.Time { return time.Now().Add(DuplicateWindow + sweepEvery + time.Second) }
	defer func() { now = time.Now }()
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != first.Transaction {
		t.Fatalf("settle after the record aged out: %+v %v", s, err)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}

// realNodeSend is a FAKE of one answer the local chain gives otherwise: a
// real node, with skipPreflight, answers a send of a transaction the chain
// already processed with its signature, as for a first send (the leader
// drops the copy), where the local chain answers -32002 AlreadyProcessed.
func realNodeSend(t *testing.T, upstream string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		resp, err := http.Post(upstream, "application/json", bytes.NewReader(body))
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		var req struct {
			ID     json.RawMessage   `json:"id"`
			Method string            `json:"method"`
			Params []json.RawMessage `json:"params"`
		}
		json.Unmarshal(body, &req)
		if req.Method == "sendTransaction" && bytes.Contains(out, []byte("AlreadyProcessed")) {
			var enc string
			json.Unmarshal(req.Params[0], &enc)
			raw, _ := base64.StdEncoding.DecodeString(enc)
			out, _ = json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "result": base58.Encode(raw[1:65])})
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// Two instances with one fee payer: the buyer's /verify lands on B (which
// keeps its simulation for the Settle that follows), /settle on A, which
// settles, then /settle of the same payment on B. B, reusing its
// simulation, must still look the transaction up: it sends nothing, and
// answers duplicate_settlement naming A's transaction, never a second
// success.
func TestSecondInstanceReportsNoSecondSuccess(t *testing.T) {
	e := newEnv(t, Config{})
	cfg := e.f.cfg
	cfg.RPC = &RPC{URL: realNodeSend(t, e.chain.URL)}
	a, _ := New(cfg)
	b, _ := New(cfg)
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	ctx := context.Background()
	if v, err := b.Verify(ctx, pp, e.req); err != nil || !v.IsValid {
		t.Fatalf("verify on B: %+v %v", v, err)
	}
	sa, err := a.Settle(ctx, pp, e.req)
	if err != nil || !sa.Success {
		t.Fatalf("settle on A: %+v %v", sa, err)
	}
	sb, err := b.Settle(ctx, pp, e.req)
	if err != nil || sb.Success || sb.ErrorReason != ReasonDuplicateSettlement || sb.Transaction != sa.Transaction {
		t.Fatalf("settle on B: %+v %v; want %s naming A's transaction", sb, err, ReasonDuplicateSettlement)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}

// The payment lands (sent by another process) after this Settle looked it
// up, before its simulation or before its send: the chain's
// AlreadyProcessed is looked up, never taken for a refusal, and the status
// read then answers as the Settle did: settled by another settlement.
// (Before: the status read answered settled, its caller's own.)
func TestAlreadyProcessedIsLookedUp(t *testing.T) {
	for _, at := range []string{"simulate", "send"} {
		t.Run(at, func(t *testing.T) {
			fr := &faultyRPC{}
			e := newEnv(t, Config{RPC: &RPC{URL: fr.serve(t)}, PollInterval: 20 * time.Millisecond})
			p := e.payment(t)
			raw := p.Build(p.Instructions())
			var elsewhere string
			land := func() {
				if elsewhere == "" {
					elsewhere = e.sendSigned(t, raw)
				}
			}
			fr.set(func(f *faultyRPC) {
				f.target = e.chain.URL
				if at == "send" {
					f.beforeSend = land
				} else {
					f.beforeSimulate = land
				}
			})
			s, err := e.f.Settle(context.Background(), Payload(raw, e.req), e.req)
			if elsewhere == "" {
				t.Fatal("the test did not land the payment")
			}
			if err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != elsewhere {
				t.Fatalf("settle: %+v %v; want %s naming %s", s, err, ReasonDuplicateSettlement, elsewhere)
			}
			if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
				t.Fatalf("balances payer %d payee %d", a, b)
			}
			if st, err := e.f.SettlementStatus(context.Background(), Payload(raw, e.req), e.req); err != nil || !answeredElsewhere(st) || st.Transaction != elsewhere {
				t.Fatalf("status: %+v %v; want never, %s naming %s, as the Settle answered", st, err, ReasonDuplicateSettlement, elsewhere)
			}
		})
	}
}

// processedOnlyRPC is a FAKE of a real node's timing, which the local chain
// does not have: it confirms a transaction at once, where a real node
// reports it "processed" (seen, not yet confirmed) for a second or more,
// longer under load. While hold is set, every signature status it forwards
// says "processed". land, when set, runs once, after the first status
// look-up is answered by the chain and before its answer is returned:
// another process landing the payment just after this one looked for it.
type processedOnlyRPC struct {
	upstream string
	hold     atomic.Bool
	land     func()
	once     sync.Once
}

var confirmedStatus = regexp.MustCompile(`"confirmationStatus"\s*:\s*"(confirmed|finalized)"`)

func (p *processedOnlyRPC) serve(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		resp, err := http.Post(p.upstream, "application/json", bytes.NewReader(body))
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if bytes.Contains(body, []byte("getSignatureStatuses")) {
			if p.land != nil {
				p.once.Do(p.land)
			}
			if p.hold.Load() {
				out = confirmedStatus.ReplaceAll(out, []byte(`"confirmationStatus":"processed"`))
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A Settle that finds the payment on chain before sending it (another
// instance with the same fee payer sent it, or this one before a restart:
// found by the look-up, or answered AlreadyProcessed at simulation) and
// gives up waiting for its confirmation answers settlement_pending. The
// retry its caller makes polls that transaction, and must still answer as
// the first Settle would have: settlement_pending while it is undecided,
// then duplicate_settlement naming it, never success: its sender answers
// for it, and a second success would have one payment served twice. Its
// status read then answers the same from memory: settled by another
// settlement. (Before: the status read answered settled, its caller's
// own.)
func TestElsewherePendingRetryIsNoSecondSuccess(t *testing.T) {
	for _, found := range []string{"lookup", "simulate"} {
		t.Run(found, func(t *testing.T) {
			e := newEnv(t, Config{})
			p := e.payment(t)
			raw := p.Build(p.Instructions())
			pp := Payload(raw, e.req)
			ctx := context.Background()
			fake := &processedOnlyRPC{upstream: e.chain.URL}
			fake.hold.Store(true)
			var sent string
			if found == "lookup" {
				first, err := e.f.Settle(ctx, pp, e.req)
				if err != nil || !first.Success {
					t.Fatalf("settle on A: %+v %v", first, err)
				}
				sent = first.Transaction
			} else {
				fake.land = func() { sent = e.sendSigned(t, raw) }
			}
			cfg := e.f.cfg
			cfg.RPC = &RPC{URL: fake.serve(t)}
			cfg.ConfirmTimeout, cfg.PollInterval = 300*time.Millisecond, 20*time.Millisecond
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			pending := func(what string) {
				t.Helper()
				s, err := b.Settle(ctx, pp, e.req)
				var uo *x402.UnknownOutcomeError
				if !errors.As(err, &uo) || uo.Reply == nil || uo.Reply.ErrorReason != ReasonSettlementPending || uo.Reply.Transaction != sent {
					t.Fatalf("%s: %+v %v; want %s naming %s", what, s, err, ReasonSettlementPending, sent)
				}
			}
			pending("settle on B, unconfirmed at its deadline")
			if sent == "" {
				t.Fatal("the test did not land the payment")
			}
			pending("retry on B while still unconfirmed")
			fake.hold.Store(false)
			for _, what := range []string{"retry on B once confirmed", "settle on B after that"} {
				s, err := b.Settle(ctx, pp, e.req)
				if err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != sent {
					t.Fatalf("%s: %+v %v; want %s naming %s, never a second success", what, s, err, ReasonDuplicateSettlement, sent)
				}
			}
			if st, err := b.SettlementStatus(ctx, pp, e.req); err != nil || !answeredElsewhere(st) || st.Transaction != sent {
				t.Fatalf("status on B: %+v %v; want never, %s naming %s, as its Settle answers", st, err, ReasonDuplicateSettlement, sent)
			}
			if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
				t.Fatalf("balances payer %d payee %d", a, b)
			}
		})
	}
}

// One payment, two facilitators with one fee payer and a store each: A
// settles it (success). B's Settle finds it on chain before sending and,
// unconfirmed at its deadline, answers settlement_pending; B's status read
// of it, once landed, answers settled by another settlement, as B's
// Settle retry answers duplicate_settlement: only a send B made may be
// its caller's own. (Before: the status read answered settled, and the
// gate behind B served the buyer a second time for one transfer.)
func TestElsewherePendingStatusReadIsDuplicate(t *testing.T) {
	e := newEnv(t, Config{Sent: sentOf(openStore(t, t.TempDir()))})
	p := e.payment(t)
	raw := p.Build(p.Instructions())
	pp := Payload(raw, e.req)
	ctx := context.Background()
	first, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !first.Success {
		t.Fatalf("settle on A: %+v %v", first, err)
	}
	fake := &processedOnlyRPC{upstream: e.chain.URL}
	fake.hold.Store(true)
	cfg := e.f.cfg
	cfg.RPC = &RPC{URL: fake.serve(t)}
	cfg.Sent = sentOf(openStore(t, t.TempDir())) // B's own store
	cfg.ConfirmTimeout, cfg.PollInterval = 300*time.Millisecond, 20*time.Millisecond
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Settle(ctx, pp, e.req)
	var uo *x402.UnknownOutcomeError
	if !errors.As(err, &uo) || uo.Reply == nil || uo.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("settle on B: %v; want settlement_pending", err)
	}
	fake.hold.Store(false)
	if st, err := b.SettlementStatus(ctx, pp, e.req); err != nil || !answeredElsewhere(st) || st.Transaction != first.Transaction {
		t.Errorf("B's status read of a payment A answered success: %+v %v; want never, duplicate_settlement naming %s", st, err, first.Transaction)
	}
	if s, err := b.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement {
		t.Errorf("B's Settle retry: %+v %v; want duplicate_settlement", s, err)
	}
}
