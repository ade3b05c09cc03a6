package svmfacilitator

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/x402"
)

// proxy is a FAKE node in front of upstream: answer may answer a call
// itself (true) from its method and params; every other call is forwarded
// and its reply passed through rewrite (when set).
func proxy(t *testing.T, upstream string, answer func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool, rewrite func(method string, reply []byte) []byte) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			ID     json.RawMessage   `json:"id"`
			Method string            `json:"method"`
			Params []json.RawMessage `json:"params"`
		}
		json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "application/json")
		if answer != nil && answer(w, req.ID, req.Method, req.Params) {
			return
		}
		resp, err := http.Post(upstream, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		if rewrite != nil {
			out = rewrite(req.Method, out)
		}
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// replyNoStatus answers getSignatureStatuses as a node at slot 1 that has
// not seen the transaction.
func replyNoStatus(w http.ResponseWriter, id json.RawMessage) {
	w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":{"context":{"slot":1},"value":[null]}}`))
}

// replySimulated answers simulateTransaction as a node at slot 1 whose
// simulation passed.
func replySimulated(w http.ResponseWriter, id json.RawMessage) {
	w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":{"context":{"slot":1},"value":{"err":null,"logs":[]}}}`))
}

// replyUnavailable answers as a proxy whose node is down: 503 and a
// JSON-RPC internal error.
func replyUnavailable(w http.ResponseWriter, id json.RawMessage) {
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32603,"message":"upstream unavailable"}}`))
}

// loseReply breaks the connection: the caller gets no answer.
func loseReply(w http.ResponseWriter) {
	if hj, ok := w.(http.Hijacker); ok {
		if c, _, err := hj.Hijack(); err == nil {
			c.Close()
		}
	}
}

// laggingNode is a FAKE of a load-balanced pool one of whose members, a few
// slots behind the one that accepted the transaction, answers
// isBlockhashValid: at slot 0 (the local chain starts at 1) it has not seen
// the buyer's blockhash, so it answers false, exactly as for an expired one. With honour it refuses a
// minContextSlot above its slot as Agave does (-32016); without, it ignores
// it (an older node, a caching proxy). The send reaches the pool, its reply
// is lost, and the transaction is still on its way to the leader (not
// forwarded here: the test lands it later).
func laggingNode(t *testing.T, upstream string, honour bool) string {
	return proxy(t, upstream, func(w http.ResponseWriter, id json.RawMessage, method string, params []json.RawMessage) bool {
		switch method {
		case "sendTransaction":
			loseReply(w)
			return true
		case "isBlockhashValid":
			var cfg struct {
				MinContextSlot uint64 `json:"minContextSlot"`
			}
			if len(params) == 2 {
				json.Unmarshal(params[1], &cfg)
			}
			if honour && cfg.MinContextSlot > 0 {
				w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32016,"message":"Minimum context slot has not been reached"}}`))
				return true
			}
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"result":{"context":{"slot":0},"value":false}}`))
			return true
		}
		return false
	}, nil)
}

// A node that has not seen a blockhash yet answers isBlockhashValid false,
// as for an expired one. Its answer must never make a seconds-old
// transaction "never landed": not in Settle's poll, not in
// SettlementStatus (with a record, or after a restart without one), not in
// the StatusReader's poll or search. Each stays undecided (pending, or an
// error), and once the copy in flight lands it is settled, charged once.
func TestALaggingNodeCannotExpireAFreshBlockhash(t *testing.T) {
	for _, honour := range []bool{true, false} {
		name := "ignores minContextSlot"
		if honour {
			name = "honours minContextSlot"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, Config{})
			lagging := laggingNode(t, e.chain.URL, honour)
			cfg := e.f.cfg
			cfg.RPC, cfg.ConfirmTimeout, cfg.PollInterval = &RPC{URL: lagging}, 300*time.Millisecond, 20*time.Millisecond
			f, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			p := e.payment(t)
			raw := p.Build(p.Instructions())
			pp := Payload(raw, e.req)
			ctx := context.Background()
			s, err := f.Settle(ctx, pp, e.req)
			var unknown *x402.UnknownOutcomeError
			tx, _ := DecodeTransaction(raw)
			sig := base58.Encode(ed25519.Sign(e.fee, tx.Message))
			if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending || unknown.Reply.Transaction != sig {
				t.Errorf("settle through a lagging node: %+v %v; want settlement_pending naming %s", s, err, sig)
			}
			notNever := func(what string, st x402.SettlementStatus, err error) {
				t.Helper()
				if err == nil && st.State == x402.SettlementNever {
					t.Errorf("%s: never, for a transaction still in flight", what)
				}
			}
			st, err := f.SettlementStatus(ctx, pp, e.req)
			notNever("status with a record", st, err)
			restarted, _ := New(cfg)
			st, err = restarted.SettlementStatus(ctx, pp, e.req)
			notNever("status after a restart", st, err)
			r, err := NewStatusReader(&RPC{URL: lagging}, x402.NetworkSolanaDevnet)
			if err != nil {
				t.Fatal(err)
			}
			st, err = r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{Transaction: sig})
			notNever("reader by the signature", st, err)
			r, _ = NewStatusReader(&RPC{URL: lagging}, x402.NetworkSolanaDevnet)
			st, err = r.SentSettlementStatus(ctx, pp, e.req, x402.SentSettlement{After: time.Now().Add(-time.Minute)})
			notNever("reader by search", st, err)

			// The copy in flight reaches the leader.
			if landed := e.sendSigned(t, raw); landed != sig {
				t.Fatalf("landed %s, settle named %s", landed, sig)
			}
			if st, err := f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementDone || st.Transaction != sig {
				t.Fatalf("status once it landed: %+v %v", st, err)
			}
			if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
				t.Fatalf("balances payer %d payee %d", a, b)
			}
		})
	}
}

// unconfirmedNode is a FAKE of a chain where every known transaction is
// processed and not yet confirmed (the local chain answers "finalized" at
// once).
func unconfirmedNode(t *testing.T, upstream string) string {
	return proxy(t, upstream, nil, func(method string, reply []byte) []byte {
		if method == "getSignatureStatuses" {
			return bytes.ReplaceAll(reply, []byte(`"finalized"`), []byte(`"processed"`))
		}
		return reply
	})
}

// Two instances with one fee payer. A sends, cannot confirm in time and
// answers settlement_pending; the caller retries on B. While the
// transaction is unconfirmed B answers pending too, naming it (never
// duplicate_settlement: that would be a definitive failure for a transfer
// that may still land); once it is confirmed, the caller's retry on B is
// duplicate_settlement naming it, as B's first Settle would have been had
// it found the transaction confirmed: A sent it and answers for it, and the
// retry on A, whose pending answer promised the outcome, is the one
// success.
func TestPendingOnOneInstanceIsSettledOnAnother(t *testing.T) {
	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 200 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.target, f.dropSend, f.forwardOK, f.hideStatus = e.chain.URL, true, true, true })
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	ctx := context.Background()
	_, err := e.f.Settle(ctx, pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil {
		t.Fatalf("settle on A: want an unknown outcome, got %v", err)
	}
	cfg := e.f.cfg
	cfg.RPC = &RPC{URL: unconfirmedNode(t, e.chain.URL)}
	b, _ := New(cfg)
	s, err := b.Settle(ctx, pp, e.req)
	var again *x402.UnknownOutcomeError
	if !errors.As(err, &again) || again.Reply == nil || again.Reply.ErrorReason != ReasonSettlementPending || again.Reply.Transaction != unknown.Reply.Transaction {
		t.Fatalf("settle on B while unconfirmed: %+v %v; want settlement_pending naming %s", s, err, unknown.Reply.Transaction)
	}
	b.rpc = &RPC{URL: e.chain.URL}
	for _, what := range []string{"settle on B once confirmed", "settle on B again"} {
		if s, err := b.Settle(ctx, pp, e.req); err != nil || s.Success || s.ErrorReason != ReasonDuplicateSettlement || s.Transaction != unknown.Reply.Transaction {
			t.Fatalf("%s: %+v %v; want %s naming %s", what, s, err, ReasonDuplicateSettlement, unknown.Reply.Transaction)
		}
	}
	fr.set(func(f *faultyRPC) { f.dropSend, f.hideStatus = false, false })
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || !s.Success || s.Transaction != unknown.Reply.Transaction {
		t.Fatalf("retry on A, which sent it: %+v %v; want success naming %s", s, err, unknown.Reply.Transaction)
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}

// A pending record lives DuplicateWindow from when its Settle gave up
// waiting, not from its claim: a confirmation that took most of the window
// (a long confirm_timeout) must not leave a record already expired, whose
// retry would no longer poll the caller's own transaction. Past the window
// (and a sweep) it is dropped all the same.
func TestPendingRecordLivesAWindowFromItsPendingAnswer(t *testing.T) {
	var mu sync.Mutex
	base := time.Now()
	clock := base
	now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	defer func() { now = time.Now }()
	set := func(t time.Time) { mu.Lock(); clock = t; mu.Unlock() }

	fr := &faultyRPC{}
	srv := fr.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srv}, ConfirmTimeout: 200 * time.Millisecond, PollInterval: 20 * time.Millisecond})
	fr.set(func(f *faultyRPC) {
		f.target, f.dropSend, f.forwardOK, f.hideStatus = e.chain.URL, true, true, true
		// The wait for confirmation took 100 s.
		f.beforeSend = func() { set(base.Add(100 * time.Second)) }
	})
	p := e.payment(t)
	raw := p.Build(p.Instructions())
	pp := Payload(raw, e.req)
	ctx := context.Background()
	_, err := e.f.Settle(ctx, pp, e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil {
		t.Fatalf("want an unknown outcome, got %v", err)
	}
	tx, _ := DecodeTransaction(raw)
	key := tx.MessageHash()

	set(base.Add(DuplicateWindow + 10*time.Second)) // past the claim's window, inside the pending answer's
	s, how := e.f.claim(key)
	if how != claimRetry {
		t.Fatalf("the pending record is gone %s after its pending answer (claim: %v)", DuplicateWindow+10*time.Second-100*time.Second, how)
	}
	e.f.unclaim(s)
	fr.set(func(f *faultyRPC) { f.dropSend, f.hideStatus, f.beforeSend = false, false, nil })
	sends := fr.count("sendTransaction")
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || !s.Success || s.Transaction != unknown.Reply.Transaction || fr.count("sendTransaction") != sends {
		t.Fatalf("the caller's retry: %+v %v; want success naming %s, nothing sent", s, err, unknown.Reply.Transaction)
	}

	// Memory stays bounded: past the window and a sweep, no record.
	set(base.Add(100*time.Second + 2*DuplicateWindow + sweepEvery))
	if _, how := e.f.claim([32]byte{1}); how != claimNew {
		t.Fatal("claim of another message refused")
	}
	e.f.mu.Lock()
	_, kept := e.f.settled[key]
	e.f.mu.Unlock()
	if kept {
		t.Fatal("the record outlived its window and a sweep")
	}
}

// A node without transaction history answers -32011 to the look-up every
// Settle makes before sending: the error says so and names the fix (the
// gateway logs it), instead of an opaque RPC error on every payment.
func TestANodeWithoutHistoryNamesTheFix(t *testing.T) {
	e := newEnv(t, Config{})
	cfg := e.f.cfg
	cfg.RPC = &RPC{URL: proxy(t, e.chain.URL, func(w http.ResponseWriter, id json.RawMessage, method string, _ []json.RawMessage) bool {
		if method != "getSignatureStatuses" {
			return false
		}
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32011,"message":"Transaction history is not available from this node"}}`))
		return true
	}, nil)}
	f, _ := New(cfg)
	p := e.payment(t)
	s, err := f.Settle(context.Background(), Payload(p.Build(p.Instructions()), e.req), e.req)
	if err == nil || !strings.Contains(err.Error(), "--enable-rpc-transaction-history") {
		t.Fatalf("settle through a node without history: %+v %v; want an error naming the fix", s, err)
	}
	if a, b := e.balances(t); a != 1_000_000 || b != 0 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}
