package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// newBlindStatusRPC is a FAKE node in front of the real chain that
// forwards everything (the send lands) but answers every
// getSignatureStatuses "unknown" with the chain's own slot: an RPC node
// that stalls on statuses. calls counts the requests it served.
func newBlindStatusRPC(t *testing.T, chain string) (url string, calls *atomic.Int64) {
	calls = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(body, &req)
		resp, err := http.Post(chain, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		w.Header().Set("Content-Type", "application/json")
		if req.Method == "getSignatureStatuses" {
			var r struct {
				Result struct {
					Context json.RawMessage `json:"context"`
				} `json:"result"`
			}
			json.Unmarshal(out, &r)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"context":%s,"value":[null]}}`, req.ID, r.Result.Context)
			return
		}
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, calls
}

// provisionSVMWith is provisionSVM with extra JSON fields (",..." or "")
// in the module's config.
func provisionSVMWith(t *testing.T, e *solanaEnv, rpc, storeJSON, extra string) (m *SVMFacilitator, stop func()) {
	t.Helper()
	m = new(SVMFacilitator)
	cfg := fmt.Sprintf(`{"network":"solana-devnet","rpc_url":%q,"fee_payer_key_file":%q,"store":%s%s}`, rpc, e.keyFile, storeJSON, extra)
	if err := json.Unmarshal([]byte(cfg), m); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	if err := m.Provision(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	return m, func() { m.Cleanup(); cancel() }
}

// A /settle answered settlement_pending promises its caller the outcome
// (README, Payments on Solana). The operator's RPC node stalls on
// statuses, so the first /settle is answered pending while the transfer
// did land; the operator points rpc_url at a healthy node and reloads
// (same fee payer, same store). The reload gets a new facilitator (rpc_url
// is in the pool key) with no memory of the pending answer; the record of
// the send in the store has the retry answered success, once, and a
// further retry duplicate_settlement naming the transaction. (Before: the
// retry was answered duplicate_settlement, "already settled, by another
// settlement", never success, so a seller verifying, serving and settling
// refused to deliver a payment that moved.)
func TestSVMPendingSettlementAnsweredAfterReloadChangingRPC(t *testing.T) {
	e := newSolanaEnv(t)
	storeJSON := fmt.Sprintf(`{"type":"badger","path":%q}`, t.TempDir())
	blind, _ := newBlindStatusRPC(t, e.chain.URL)
	old, stopOld := provisionSVMWith(t, e, blind, storeJSON, `,"confirm_timeout":"1s"`)
	pp, req := svmPayment(t, e)
	before := e.usdc(t, e.payer.Address)
	_, err := old.Settle(t.Context(), pp, req)
	var uo *x402.UnknownOutcomeError
	if !errors.As(err, &uo) || uo.Reply == nil || uo.Reply.ErrorReason != svmfacilitator.ReasonSettlementPending {
		t.Fatalf("first settle: %v; want settlement_pending", err)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("charged %d; want the payment landed", got)
	}
	// Reload: the new config is provisioned before the old one is unloaded.
	m, stop := provisionSVMWith(t, e, e.chain.URL, storeJSON, `,"confirm_timeout":"1s"`)
	defer stop()
	stopOld()
	again, err := m.Settle(t.Context(), pp, req)
	if err != nil || !again.Success || again.Transaction != uo.Reply.Transaction {
		t.Fatalf("retry of a pending settlement after a reload changing rpc_url: success=%v reason=%q msg=%q tx=%s err=%v; want success naming %s",
			again.Success, again.ErrorReason, again.ErrorMessage, again.Transaction, err, uo.Reply.Transaction)
	}
	third, err := m.Settle(t.Context(), pp, req)
	if err != nil || third.Success || third.ErrorReason != svmfacilitator.ReasonDuplicateSettlement || third.Transaction != again.Transaction {
		t.Fatalf("second retry: %+v %v; want duplicate_settlement naming %s", third, err, again.Transaction)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("charged %d; want one payment", got)
	}
}

// A config unloaded while a send it answered settlement_pending is still
// undecided stops the background polling of that send: the facilitator
// polls its old rpc_url (every 400ms) no more, and writes nothing through
// the store handle the config closes. (Before: it went on polling that node
// for its whole failure window, an hour by default.)
func TestSVMUnloadedFacilitatorStopsPolling(t *testing.T) {
	e := newSolanaEnv(t)
	blind, calls := newBlindStatusRPC(t, e.chain.URL)
	old, stop := provisionSVMWith(t, e, blind, fmt.Sprintf(`{"type":"badger","path":%q}`, t.TempDir()), `,"confirm_timeout":"1s"`)
	pp, req := svmPayment(t, e)
	var uo *x402.UnknownOutcomeError
	if _, err := old.Settle(t.Context(), pp, req); !errors.As(err, &uo) {
		t.Fatalf("settle: %v; want settlement_pending", err)
	}
	n := calls.Load()
	waitFor(t, "polling while the config is loaded (else the test proves nothing)", func() bool { return calls.Load() > n })
	stop()
	// A poll under way ends: the old node is asked nothing for longer than
	// the 400ms between polls (a facilitator still polling never is).
	last, quietFrom := calls.Load(), time.Now()
	waitFor(t, "the old node to go unasked for 600ms after the unload", func() bool {
		if c := calls.Load(); c != last {
			last, quietFrom = c, time.Now()
		}
		return time.Since(quietFrom) >= 600*time.Millisecond
	})
	n = calls.Load()
	time.Sleep(1200 * time.Millisecond)
	if later := calls.Load(); later != n {
		t.Fatalf("the unloaded facilitator asked its old node %d more times; want none", later-n)
	}
}

// Two svm blocks (two gateways, or a reload changing the settings)
// sharing one store of sends: the first answered settlement_pending (its
// node stalls on statuses) for a send that landed, and a /settle through
// the second adopted its record and answered success. A status read
// through a third, with no memory of the send (a reload of the first
// pointing at a healthy node), is the payment settled by another
// settlement (never, duplicate_settlement), which the gate does not serve
// as its own. (Before: it answered settled, and the gate served a payment
// the other /settle's caller was told succeeded.)
func TestSVMStatusReadAfterASettleElsewhereIsNotSettledHere(t *testing.T) {
	e := newSolanaEnv(t)
	storeJSON := fmt.Sprintf(`{"type":"badger","path":%q}`, t.TempDir())
	blind, _ := newBlindStatusRPC(t, e.chain.URL)
	first, stopFirst := provisionSVMWith(t, e, blind, storeJSON, `,"confirm_timeout":"1s"`)
	defer stopFirst()
	pp, req := svmPayment(t, e)
	_, err := first.Settle(t.Context(), pp, req)
	var uo *x402.UnknownOutcomeError
	if !errors.As(err, &uo) || uo.Reply == nil || uo.Reply.ErrorReason != svmfacilitator.ReasonSettlementPending {
		t.Fatalf("first settle: %v; want settlement_pending", err)
	}
	second, stopSecond := provisionSVMWith(t, e, e.chain.URL, storeJSON, `,"confirm_timeout":"1s"`)
	defer stopSecond()
	if s, err := second.Settle(t.Context(), pp, req); err != nil || !s.Success || s.Transaction != uo.Reply.Transaction {
		t.Fatalf("settle through the second block: %+v %v; want success naming %s", s, err, uo.Reply.Transaction)
	}
	third, stopThird := provisionSVMWith(t, e, e.chain.URL, storeJSON, `,"confirm_timeout":"2s"`)
	defer stopThird()
	st, err := third.SettlementStatus(t.Context(), pp, req)
	if err != nil || st.State != x402.SettlementNever || st.Reason != svmfacilitator.ReasonDuplicateSettlement {
		t.Fatalf("status read through a block with no memory of the send: %+v %v; want never, duplicate_settlement", st, err)
	}
}

// newSlowRefusingSolanaRPC is a FAKE node in front of the real chain that
// forwards everything but sendTransaction, which it holds for delay and
// then refuses (-32600): a node that refuses a send only after a while.
// sends counts the sends it took.
func newSlowRefusingSolanaRPC(t *testing.T, chain string, delay time.Duration) (url string, sends *atomic.Int64) {
	sends = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "application/json")
		if req.Method == "sendTransaction" {
			sends.Add(1)
			time.Sleep(delay)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32600,"message":"refused by the node"}}`, req.ID)
			return
		}
		resp, err := http.Post(chain, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, sends
}

// README (Payments on Solana): an unload waits, before the block's store
// is closed, for every settlement in progress. The svm module is loaded as
// Caddy loads it, with a `store` of its own: Caddy cleans up the config's
// modules, the store among them, in no set order. A send the node refuses
// only after the unload drops its record, and the next config's
// facilitator (same store) settles the payment, which was never sent. Each
// order is tried: Caddy's own, a few times, and the svm module's Cleanup
// first. (Before: when the store was cleaned up first, its handle closed
// before the facilitator's Close waited for the send; the drop failed on
// the closed database, the record of a send that never happened stayed,
// and the next config adopted it and polled a signature the chain never
// got: the buyer's retry of a good payment was answered
// settlement_pending.)
func TestSVMUnloadClosesItsStoreAfterItsSends(t *testing.T) {
	for _, tc := range []struct {
		name     string
		svmFirst bool
	}{{"caddy's order", false}, {"svm cleaned up first", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSolanaEnv(t)
			storeJSON := fmt.Sprintf(`{"type":"badger","path":%q}`, t.TempDir())
			slow, sends := newSlowRefusingSolanaRPC(t, e.chain.URL, 700*time.Millisecond)
			for i := range 6 {
				pp, req := svmMemoPayment(t, e, fmt.Sprintf("unload-%d", i))
				cctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
				cfg := fmt.Sprintf(`{"network":"solana-devnet","rpc_url":%q,"fee_payer_key_file":%q,"store":%s,"confirm_timeout":"5s"}`, slow, e.keyFile, storeJSON)
				val, err := cctx.LoadModuleByID("x402.facilitators.svm", json.RawMessage(cfg))
				if err != nil {
					cancel()
					t.Fatal(err)
				}
				m := val.(*SVMFacilitator)
				n := sends.Load()
				done := make(chan error, 1)
				go func() {
					sctx, stop := context.WithTimeout(context.Background(), 20*time.Second)
					defer stop()
					_, err := m.Settle(sctx, pp, req)
					done <- err
				}()
				waitFor(t, "the send to reach the node", func() bool { return sends.Load() > n })
				if tc.svmFirst {
					m.Cleanup()
				}
				cancel() // the unload: Caddy cleans up the config's modules
				<-done

				next, stop := provisionSVMWith(t, e, e.chain.URL, storeJSON, `,"confirm_timeout":"1s"`)
				s, err := next.Settle(t.Context(), pp, req)
				stop()
				if err != nil || !s.Success {
					t.Fatalf("payment %d, refused unsent before the unload, settled after it: success %v %q %q, err %v; want success", i, s.Success, s.ErrorReason, s.ErrorMessage, err)
				}
			}
		})
	}
}
