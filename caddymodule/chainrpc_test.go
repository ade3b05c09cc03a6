package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// hugeChainRPC (FAULT: a lying or broken chain RPC, which a real node never
// is) answers eth_chainId with Base's (8453) and every other call at once
// with a result of n hex digits.
func hugeChainRPC(t *testing.T, n int) *httptest.Server {
	t.Helper()
	chunk := []byte(strings.Repeat("00", 32<<10))
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		if req.Method == "eth_chainId" {
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":"0x2105"}`))
			return
		}
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":"0x`))
		for sent := 0; sent < n; sent += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
		w.Write([]byte(`"}`))
	}))
	t.Cleanup(s.Close)
	return s
}

// allocated is what f allocated, in bytes (the whole process's, so a
// bound checked with it must leave room for the rest of the process).
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestChainClientRefusesAnOversizeReply: every chain client the gateway
// dials (dialChain) reads a reply of at most maxChainReply bytes and
// fails past it, having read no more.
func TestChainClientRefusesAnOversizeReply(t *testing.T) {
	rpc := hugeChainRPC(t, 64<<20)
	c, err := dialChain(context.Background(), rpc.URL, time.Second, maxChainReply)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if id, err := c.ChainID(context.Background()); err != nil || id.Int64() != 8453 {
		t.Fatalf("a small reply: %v %v", id, err)
	}
	to := common.Address{1}
	var out []byte
	alloc := allocated(func() { out, err = c.CallContract(context.Background(), ethereum.CallMsg{To: &to}, nil) })
	t.Logf("a 64 MiB reply: err %v, %d KiB allocated", err, alloc>>10)
	if err == nil || !strings.Contains(err.Error(), "over") {
		t.Errorf("a 64 MiB reply: %d bytes, err %v; want it refused", len(out), err)
	}
	if alloc > 8<<20 {
		t.Errorf("reading a 64 MiB reply allocated %d MiB; want it bounded by the cap (%d KiB)", alloc>>20, maxChainReply>>10)
	}
}

// TestWalletAuthChainReplyIsBounded: a proof that does not recover, which
// anyone can send unauthenticated, makes wallet_auth ask chain_rpc
// (EIP-1271 eth_call). A chain RPC answering with 64 MiB costs the gateway
// a bounded read and the client a 503 upstream_unavailable (the proof
// could not be checked), not hundreds of MiB of memory.
func TestWalletAuthChainReplyIsBounded(t *testing.T) {
	rpc := hugeChainRPC(t, 64<<20)
	up := walletUpstream(t)
	base := startCaddy(t, walletSite(up.URL, "required", "chain_rpc "+rpc.URL+"\n\t\t\tchain_timeout 5s"))
	url := base + "/api/items"
	// Wallet 1's signature claimed for wallet 2: it recovers to another
	// address, so the gateway asks wallet 2's contract.
	notRecovering := func() string {
		e, err := walletauth.Parse(walletProof(t, walletKey(1), "POST", url, nil))
		if err != nil {
			t.Fatal(err)
		}
		e.Address = crypto.PubkeyToAddress(walletKey(2).PublicKey).Hex()
		h, err := e.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: notRecovering()}) // learns the chain id
	h := notRecovering()
	var (
		status int
		body   map[string]any
	)
	alloc := allocated(func() {
		status, _, body = walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: h})
	})
	t.Logf("status %d, %d KiB allocated for one unauthenticated request", status, alloc>>10)
	if status != http.StatusServiceUnavailable || body["code"] != apierr.CodeUpstreamUnavailable {
		t.Errorf("status %d %v, want 503 %s", status, body, apierr.CodeUpstreamUnavailable)
	}
	if alloc > 16<<20 {
		t.Errorf("one unauthenticated request made the gateway allocate %d MiB reading chain_rpc's 64 MiB reply; want a bounded read", alloc>>20)
	}
}

// TestChainRPCPathKeyNeverLeavesTheGate: a provider's API key is often
// the rpc URL's path (https://base-mainnet.g.alchemy.com/v2/<key>). The
// gate sends its chain reads to that path, and a chain read that fails at
// run time (here the settled-earlier check of a retried settled payment,
// the endpoint gone) names the endpoint by scheme and host alone: the key
// is in no log line and not in the answer.
func TestChainRPCPathKeyNeverLeavesTheGate(t *testing.T) {
	d, fac := sharedDevnet(t)
	const key = "SECRETPATHKEY0123456789"
	var wrongPath atomic.Int64
	// A provider in front of the devnet node that serves its key's path
	// only.
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v2/"+key {
			wrongPath.Add(1)
			http.NotFound(w, r)
			return
		}
		relayRPC(w, d.RPCURL(), r.Body)
	}))
	t.Cleanup(provider.Close)
	upA := newUpstream(t)
	urlA := startCaddy(t, gateSite(upA.URL, fac, 0, "")) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, urlA, "", nil)), 4)
	if resp := post(t, urlA, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK {
		t.Fatalf("the buyer's payment: %d %s", resp.StatusCode, readAll(t, resp))
	}
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	up := newUpstream(t)
	url := startCaddyServers(t, "", logFile, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator http %[2]s {
				timeout 3s
				rpc devnet %[4]s
			}
			store badger %[5]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), provider.URL+"/v2/"+key, gateDir(t))) + "/verify/schema"
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != x402.ReasonPaymentAlreadyUsed || wrongPath.Load() != 0 {
		t.Fatalf("the settled payment retried, the provider up: %d %s, %d calls to another path; want 402 %s read from the key's path",
			resp.StatusCode, reason, wrongPath.Load(), x402.ReasonPaymentAlreadyUsed)
	}
	provider.Close() // every chain read now fails at once
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body := string(readAll(t, resp))
	if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(body, key) {
		t.Errorf("the settled payment retried, the provider gone: %d %s; want 503 without the key", resp.StatusCode, body)
	}
	var logged []byte
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if logged, _ = os.ReadFile(logFile); bytes.Contains(logged, []byte(strings.TrimPrefix(provider.URL, "http://"))) {
			break // the failed read is logged, naming the endpoint
		}
	}
	if !bytes.Contains(logged, []byte(strings.TrimPrefix(provider.URL, "http://"))) {
		t.Errorf("no log line names the failed endpoint:\n%s", logged)
	}
	for _, line := range strings.Split(string(logged), "\n") {
		if strings.Contains(line, key) {
			t.Errorf("a log line carries the rpc URL's path key: %s", line)
		}
	}
}
