package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/walletauth"
)

// stalledChainRPC is a fake chain_rpc for the one fault a real chain cannot
// be made to show on demand: it answers eth_chainId (8453) but takes every
// eth_call and never answers it. It counts the eth_calls whose client hung
// up.
func stalledChainRPC(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var abandoned atomic.Int32
	stop := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		if req.Method != "eth_chainId" {
			select {
			case <-r.Context().Done():
				abandoned.Add(1)
			case <-stop:
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"result":"0x2105"}`))
	}))
	t.Cleanup(func() {
		close(stop)
		s.Close()
	})
	return s, &abandoned
}

// A proof that does not recover (anyone can send one) makes the gateway
// ask chain_rpc's contract; when chain_rpc stalls, the gateway gives up
// after chain_timeout and answers 503 upstream_unavailable (retryable, the
// chain's fault, nothing reaches the upstream) instead of holding the
// request for as long as the client waits.
func TestWalletAuthStalledChainIsA503(t *testing.T) {
	rpc, abandoned := stalledChainRPC(t)
	up := walletUpstream(t)
	base := startCaddy(t, walletSite(up.URL, "required", "chain_rpc "+rpc.URL+"\n\t\t\tchain_timeout 1s"))
	url := base + "/api/items"
	// Signed by wallet 1, presented as wallet 2's.
	h := walletProof(t, walletKey(1), "POST", url, nil)
	e, err := walletauth.Parse(h)
	if err != nil {
		t.Fatal(err)
	}
	e.Address = crypto.PubkeyToAddress(walletKey(2).PublicKey).Hex()
	h, _ = e.Encode()

	status, hdr, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: h})
	if status != http.StatusServiceUnavailable || body["code"] != "upstream_unavailable" || body["retryable"] != true || body["charged"] != false || hdr.Get("Retry-After") == "" {
		t.Fatalf("status %d %v, want 503 upstream_unavailable, retryable, with Retry-After", status, body)
	}
	if body["wallet"] != nil || strings.Contains(body["message"].(string), e.Address) {
		t.Errorf("the answer reached the upstream or echoes the proof: %v", body)
	}
	// The server sees the hang-up a moment after the gateway answers.
	for i := 0; abandoned.Load() == 0; i++ {
		if i == 3000 {
			t.Fatal("the gateway answered but never hung up on the stalled eth_call")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWalletAuthChainTimeoutCaddyfile(t *testing.T) {
	wantErr(t, adaptSiteError("wallet_auth {\n\tchain_timeout soon\n}"), "bad duration")
	if err := (&WalletAuth{Mode: "required", ChainTimeout: -1}).Validate(); err == nil {
		t.Error("a negative chain_timeout was accepted")
	}
}
