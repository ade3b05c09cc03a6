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
	c := newCrashTest(t)
	e, pp := c.e, c.pp
	_, sig := c.sentUnanswered(t, func(ctx context.Context, hash [32]byte) error {
		_, err := e.f.remember(ctx, hash, &settlement{})
		return err
	})
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d; want the first send landed", a, b)
	}
	// The restart, with the store of sends down.
	c.db.Close()
	cfg := e.f.cfg
	cfg.RPC, cfg.Sent = &RPC{URL: e.chain.URL}, sentOf(c.db)
	restarted, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer restarted.Close()
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
	cfg.Sent = sentOf(c.db)
	back, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
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
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(id) + `,"error":{"code":-32603,"message":"upstream unavailable"}}`))
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
