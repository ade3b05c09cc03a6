package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// laggingPoolNode is a FAKE Solana RPC node in front of the simulated
// chain: while lag is set it is a pool member a slot behind,
// simulateTransaction answered "passed" from its older bank (as
// svmfacilitator's behindNode does), and with lookUpFails an overloaded
// one, getSignatureStatuses answered 503; otherwise every call is the real
// chain's.
func laggingPoolNode(t *testing.T, upstream string, lag *atomic.Bool, lookUpFails bool) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if lag.Load() {
			var req struct {
				Method string `json:"method"`
			}
			_ = json.Unmarshal(body, &req)
			id := jsonID(body)
			switch {
			case req.Method == "getSignatureStatuses" && lookUpFails:
				w.WriteHeader(http.StatusServiceUnavailable)
				w.Write([]byte(`{"jsonrpc":"2.0","id":` + id + `,"error":{"code":-32603,"message":"upstream unavailable"}}`))
				return
			case req.Method == "simulateTransaction":
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

// twoRoutesOf starts a Caddy with two routes selling /verify/schema to
// the upstream at up for the same Solana offer (payee), through fac, each
// with a store of its own (so claims of its own; route B's is storeB, a
// Badger store when ""), and returns their URLs: a payment served at
// route A can be replayed at route B.
func twoRoutesOf(t *testing.T, up, fac, payee, storeB string) (urlA, urlB string) {
	if storeB == "" {
		storeB = "badger " + filepath.Join(t.TempDir(), "b")
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
			store %[5]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, payee, filepath.Join(t.TempDir(), "a"), storeB)
	base := startCaddy(t, site)
	return base + "/verify/schema", base + "/other/schema"
}

// replayRefused sends sig to url, as the buyer's replay, once with
// fault set and then, fault cleared, again every half second while it is
// 503 settlement_pending, and wants the last answer 402
// duplicate_settlement; ran is how often the upstream ran before the
// replay.
func replayRefused(t *testing.T, url, sig string, fault *atomic.Bool, up *reportingUpstream, ran int64) {
	t.Helper()
	fault.Store(true)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b := readAll(t, resp)
	fault.Store(false)
	if resp.StatusCode == http.StatusOK {
		t.Fatalf("replay served at once: %s", b)
	}
	for i := 0; i < 6 && resp.StatusCode == http.StatusServiceUnavailable; i++ {
		time.Sleep(500 * time.Millisecond)
		resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		b = readAll(t, resp)
	}
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), x402.ReasonDuplicateSettlement) {
		t.Errorf("the replay at route B of a payment already served at route A: %d %s (upstream ran %d times, %d before the replay); want 402 duplicate_settlement", resp.StatusCode, b, up.n.Load(), ran)
	}
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
	var lag atomic.Bool
	node := laggingPoolNode(t, e.chain.URL, &lag, true)
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
	urlA, urlB := twoRoutesOf(t, up.URL, facOf(remote.URL, e), e.payee.Address, "")
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
	replayRefused(t, urlB, sig, &lag, up, ranOnce)
	if charged := payerBefore - e.usdc(t, e.payer.Address); charged != 20000 {
		t.Errorf("payer charged %d in all; want 20000, once", charged)
	}
}

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
	e, lag, proxy, fac := replayWithReplyLost(t, multi)
	up := newReportingUpstream(t)
	urlA, urlB := twoRoutesOf(t, up.URL, fac, e.payee.Address, "")
	sig, txid := signSolana(t, e, urlA)
	wantPaidWith(t, e, post(t, urlA, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), txid)

	ranOnce := up.n.Load()
	e.chain.AdvanceClock(10 * time.Second) // the replay comes 10 s later
	proxy.pass.Store(false)
	replayRefused(t, urlB, sig, lag, up, ranOnce)
}

// replayWithReplyLost is the Solana chain, a remote svm facilitator on
// it whose node lags while lag is set (laggingPoolNode, statuses real),
// the lossy proxy in front of it (passing until proxy.pass is cleared),
// and the gate's facilitator block for it: a multi with an embedded svm
// member, or `http` alone with `rpc`.
func replayWithReplyLost(t *testing.T, multi bool) (*solanaEnv, *atomic.Bool, *lossyProxy, string) {
	e := newSolanaEnv(t)
	var lag atomic.Bool
	node := laggingPoolNode(t, e.chain.URL, &lag, false)
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: node}, Network: x402.NetworkSolanaDevnet, FeePayer: svmFeeKey()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	remoteURL := httptest.NewServer(x402.NewFacilitatorHandler(f))
	t.Cleanup(remoteURL.Close)
	proxy := newLossyProxy(t, remoteURL.URL, "lose_reply")
	proxy.pass.Store(true)

	fac := fmt.Sprintf("multi {\n\t\t\t\thttp %s {\n\t\t\t\t\ttimeout 5s\n\t\t\t\t}\n\t\t\t\t%s\n\t\t\t}", proxy.URL, e.svmBlock())
	if !multi {
		fac = fmt.Sprintf("http %s {\n\t\t\t\ttimeout 5s\n\t\t\t\trpc solana-devnet %s\n\t\t\t}", proxy.URL, e.chain.URL)
	}
	return e, &lag, proxy, fac
}

// The same replay at route B, on the multi, while route B's store (Redis)
// loses the replay's claim as the upstream runs (FLUSHALL, what a restart
// without its data leaves): the settlement's outcome is unknown and its
// claim gone, so the gate reports the verification as the chain tells,
// reading it from when the replay's claim was made. The transaction
// landed 10 s before that: another settlement's, and the verification is
// reported unpaid. (Before: the read went back the whole settle wait, 30
// s, took the original's landing for this attempt's, and verifierd
// recorded the replay paid, final: one payment counted twice.)
func TestSolanaReplayWithClaimLostIsNotReportedPaid(t *testing.T) {
	e, lag, proxy, fac := replayWithReplyLost(t, true)
	srv := servers.StartRedis(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	up := newReportingUpstream(t)
	var wipe atomic.Bool
	target, _ := neturl.Parse(up.URL)
	toUp := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wipe.CompareAndSwap(true, false) {
			if err := rdb.FlushAll(r.Context()).Err(); err != nil {
				t.Errorf("FLUSHALL: %v", err)
			}
		}
		toUp.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	urlA, urlB := twoRoutesOf(t, front.URL, fac, e.payee.Address, "redis "+srv.Addr)
	sig, txid := signSolana(t, e, urlA)
	wantPaidWith(t, e, post(t, urlA, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), txid)

	e.chain.AdvanceClock(10 * time.Second) // the replay comes 10 s later
	proxy.pass.Store(false)
	lag.Store(true)
	wipe.Store(true)
	resp := post(t, urlB, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if b := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("the replay at route B: %d %s; want 503 settlement_pending", resp.StatusCode, b)
	}
	lag.Store(false)
	if wipe.Load() {
		t.Fatal("the store was never wiped under the replay")
	}
	// Reported by a background chain read: wait for it (bounded).
	var got []string
	for i := 0; i < 200 && len(got) < 2; i++ {
		time.Sleep(100 * time.Millisecond)
		got = up.got()
	}
	if want := []string{"v-1=paid", "v-2=unpaid"}; !slices.Equal(got, want) {
		t.Errorf("reports %q; want %q (the replay's transaction landed before its claim)", got, want)
	}
}
