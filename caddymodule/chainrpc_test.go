package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/walletauth"
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
