package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// laggingPoolNode is a FAKE Solana RPC node in front of the simulated
// chain: while fail is set it is an overloaded pool member a slot behind
// (getSignatureStatuses answered 503, simulateTransaction answered
// "passed" from its older bank, as svmfacilitator's behindNode does);
// otherwise every call is the real chain's.
func laggingPoolNode(t *testing.T, upstream string, fail *atomic.Bool) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if fail.Load() {
			var req struct {
				ID     string `json:"-"`
				Method string `json:"method"`
			}
			_ = jsonUnmarshal(body, &req)
			id := jsonID(body)
			switch req.Method {
			case "getSignatureStatuses":
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(`{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32603,"message":"upstream unavailable"}}`))
				return
			case "simulateTransaction":
				w.Write([]byte(`{"jsonrpc":"2.0","id":` + id + `,"result":{"context":{"slot":1},"value":{"err":null,"logs":[]}}}`))
				return
			}
		}
		resp, err := http.Post(upstream, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		w.Write(out)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// multi { http <remote, fee payer F>; svm <F> }. A buyer pays route A;
// the remote settles it and the buyer is served (charged once). The
// remote restarts (its memory of the payment gone). 10 s later the buyer
// replays the very same PAYMENT-SIGNATURE at route B (its own store, so
// its own claims): the remote's node, a lagging pool member, passes the
// simulation and fails the look-up, and the remote answers
// settlement_pending naming the transaction. Route B holds it; on the
// retry the gate asks the embedded svm member, which reads a payment it
// did not send as a sibling's, by the chain alone: the transaction landed
// 10 s before route B's attempt began, so it is another settlement's, and
// route B answers 402 duplicate_settlement, serving nothing. (Before: the
// peer read answered landed = settled, and route B served the replay: one
// payment, two paid calls.)
func TestSolanaReplayAtAnotherStoreIsNotServedByTheMultisPeerRead(t *testing.T) {
	replayAtAnotherStore(t, func(remote string, e *solanaEnv) string {
		return fmt.Sprintf("multi {\n\t\t\t\thttp %s {\n\t\t\t\t\ttimeout 5s\n\t\t\t\t}\n\t\t\t\t%s\n\t\t\t}", remote, e.svmBlock())
	})
}

// The same replay on `facilitator http <remote> { rpc solana-devnet
// <chain> }` alone: the remote's settlement_pending names the
// transaction, and the gate's StatusReader polls that signature by the
// chain alone: landed before the attempt began, it is another
// settlement's, 402 duplicate_settlement. (Before: served, the named
// transaction's read not bounded by the attempt.)
func TestSolanaReplayAtAnotherStoreIsNotServedByTheNamedTransactionsRead(t *testing.T) {
	replayAtAnotherStore(t, func(remote string, e *solanaEnv) string {
		return fmt.Sprintf("http %s {\n\t\t\t\ttimeout 5s\n\t\t\t\trpc solana-devnet %s\n\t\t\t}", remote, e.chain.URL)
	})
}

func replayAtAnotherStore(t *testing.T, facOf func(remote string, e *solanaEnv) string) {
	e := newSolanaEnv(t)
	var fail atomic.Bool
	node := laggingPoolNode(t, e.chain.URL, &fail)
	newRemote := func() *svmfacilitator.Facilitator {
		f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: node}, Network: x402.NetworkSolanaDevnet, FeePayer: svmFeeKey()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	var current atomic.Pointer[http.Handler]
	h := http.Handler(x402.NewFacilitatorHandler(newRemote()))
	current.Store(&h)
	remote := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*current.Load()).ServeHTTP(w, r) }))
	t.Cleanup(remote.Close)

	up := newReportingUpstream(t)
	fac := facOf(remote.URL, e)
	site := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept solana-devnet $0.02 %[3]s
			facilitator %[2]s
			store badger %[4]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
	route /other/schema {
		rewrite * /verify/schema
		x402 {
			accept solana-devnet $0.02 %[3]s
			facilitator %[2]s
			store badger %[5]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, e.payee.Address, filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b"))
	base := startCaddy(t, site)
	urlA, urlB := base+"/verify/schema", base+"/other/schema"
	payerBefore := e.usdc(t, e.payer.Address)

	sig, txid := signSolana(t, e, urlA)
	wantPaidWith(t, e, post(t, urlA, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), txid)
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("charged %d after the first call, want 20000", got)
	}
	ranOnce := up.n.Load()

	// The remote restarts; its node lags and is overloaded; the replay
	// comes 10 s after the original landed.
	e.chain.AdvanceClock(10 * time.Second)
	h2 := http.Handler(x402.NewFacilitatorHandler(newRemote()))
	current.Store(&h2)
	fail.Store(true)
	resp := post(t, urlB, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("replay at route B: %d %s", resp.StatusCode, b)
	fail.Store(false)
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("replay served at once")
	}
	for i := 0; i < 6; i++ {
		time.Sleep(500 * time.Millisecond)
		resp = post(t, urlB, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("retry %d at route B: %d %s PAYMENT-RESPONSE=%q", i, resp.StatusCode, b, resp.Header.Get(x402.HeaderPaymentResponse))
		if resp.StatusCode != http.StatusServiceUnavailable {
			break
		}
	}
	charged := payerBefore - e.usdc(t, e.payer.Address)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), x402.ReasonDuplicateSettlement) || charged != 20000 {
		t.Errorf("the replay at route B of a payment already served at route A: %d %s (upstream ran %d times, %d before the replay; payer charged %d in all); want 402 duplicate_settlement, charged once", resp.StatusCode, b, up.n.Load(), ranOnce, charged)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func jsonID(b []byte) string {
	var req struct {
		ID json.RawMessage `json:"id"`
	}
	json.Unmarshal(b, &req)
	if len(req.ID) == 0 {
		return "null"
	}
	return string(req.ID)
}

// Without the look-up failing: the remote (not restarted) answers the
// replay's /settle duplicate_settlement at once, and that reply is lost
// (the connection drops). The gate holds the payment (unknown outcome, no
// transaction named) and the retry reads the chain alone: in the multi the
// embedded svm member's peer read, with `http` alone its `rpc` search from
// the payment. Only the replay's simulation must pass (a lagging pool
// member, FAKE as above, statuses real). The transaction landed 10 s
// before the replay's attempt began: 402 duplicate_settlement, nothing
// served. (Before: both read landed = settled, and served the replay.)
func TestSolanaReplayWhoseDuplicateReplyIsLostIsNotServedByTheMultisPeerRead(t *testing.T) {
	replayDuplicateReplyLost(t, true)
}

func TestSolanaReplayWhoseDuplicateReplyIsLostIsNotServedByTheSearch(t *testing.T) {
	replayDuplicateReplyLost(t, false)
}

func replayDuplicateReplyLost(t *testing.T, multi bool) {
	e := newSolanaEnv(t)
	var lag atomic.Bool
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if lag.Load() && bytes.Contains(body, []byte(`"simulateTransaction"`)) {
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + jsonID(body) + `,"result":{"context":{"slot":1},"value":{"err":null,"logs":[]}}}`))
			return
		}
		resp, err := http.Post(e.chain.URL, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		w.Write(out)
	}))
	t.Cleanup(node.Close)
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: node.URL}, Network: x402.NetworkSolanaDevnet, FeePayer: svmFeeKey()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	remoteURL := httptest.NewServer(x402.NewFacilitatorHandler(f))
	t.Cleanup(remoteURL.Close)
	proxy := newLossyProxy(t, remoteURL.URL, "lose_reply")
	proxy.pass.Store(true)

	up := newReportingUpstream(t)
	fac := fmt.Sprintf("multi {\n\t\t\t\thttp %s {\n\t\t\t\t\ttimeout 5s\n\t\t\t\t}\n\t\t\t\t%s\n\t\t\t}", proxy.URL, e.svmBlock())
	if !multi {
		fac = fmt.Sprintf("http %s {\n\t\t\t\ttimeout 5s\n\t\t\t\trpc solana-devnet %s\n\t\t\t}", proxy.URL, e.chain.URL)
	}
	site := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept solana-devnet $0.02 %[3]s
			facilitator %[2]s
			store badger %[4]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
	route /other/schema {
		rewrite * /verify/schema
		x402 {
			accept solana-devnet $0.02 %[3]s
			facilitator %[2]s
			store badger %[5]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, e.payee.Address, filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b"))
	base := startCaddy(t, site)
	urlA, urlB := base+"/verify/schema", base+"/other/schema"
	sig, txid := signSolana(t, e, urlA)
	wantPaidWith(t, e, post(t, urlA, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), txid)

	ranOnce := up.n.Load()
	e.chain.AdvanceClock(10 * time.Second) // the replay comes 10 s later
	lag.Store(true)
	proxy.pass.Store(false)
	resp := post(t, urlB, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("replay at route B: %d %s (remote /settle calls whose reply was lost: %d)", resp.StatusCode, b, proxy.settles.Load())
	lag.Store(false)
	for i := 0; i < 6 && resp.StatusCode == http.StatusServiceUnavailable; i++ {
		time.Sleep(500 * time.Millisecond)
		resp = post(t, urlB, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Logf("retry %d at route B: %d %s", i, resp.StatusCode, b)
	}
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), x402.ReasonDuplicateSettlement) {
		t.Errorf("the replay at route B of a payment already served at route A: %d %s (upstream ran %d times, %d before the replay); want 402 duplicate_settlement", resp.StatusCode, b, up.n.Load(), ranOnce)
	}
}
