package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/walletauth"
)

// refusingChainRPC is a fake chain_rpc for a fault a real chain cannot be
// made to show on demand: a provider that refuses the eth_call (its quota
// spent, an internal error). It answers eth_chainId (8453) and eth_getCode
// (some code: a contract wallet), and every other call with the JSON-RPC
// error code and message given.
func refusingChainRPC(t *testing.T, code int, message string) *httptest.Server {
	t.Helper()
	return refusingChainRPCWith(t, code, message, nil)
}

// refusingChainRPCWith is refusingChainRPC calling check (when not nil)
// before it refuses each signature check: to count them, or to make them
// slow.
func refusingChainRPCWith(t *testing.T, code int, message string, check func()) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		switch req.Method {
		case "eth_chainId":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"0x2105"}`, req.ID)
		case "eth_getCode":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"0x6001"}`, req.ID)
		default:
			if check != nil {
				check()
			}
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":%d,"message":%q}}`, req.ID, code, message)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// A contract wallet's proof that chain_rpc could not check (the provider
// refused the eth_call: rate limited, internal error) is an outage, 503
// upstream_unavailable, retryable, never a 401 "not a signature": the
// wallet may well have signed it. (A real revert is a 401:
// TestContractWalletThroughChainRPC.)
func TestWalletAuthChainRefusalIsA503(t *testing.T) {
	for _, c := range []struct {
		code    int
		message string
	}{
		{-32005, "daily request count exceeded, request rate limited"},
		{-32603, "internal error"},
		{-32000, "header not found"},
	} {
		t.Run(c.message, func(t *testing.T) {
			rpc := refusingChainRPC(t, c.code, c.message)
			up := walletUpstream(t)
			base := startCaddy(t, walletSite(up.URL, "required", "chain_rpc "+rpc.URL))
			url := base + "/api/items"
			// Signed by wallet 1, presented as wallet 2's (a contract
			// wallet, by its code).
			e, err := walletauth.Parse(walletProof(t, walletKey(1), "POST", url, nil))
			if err != nil {
				t.Fatal(err)
			}
			e.Address = crypto.PubkeyToAddress(walletKey(2).PublicKey).Hex()
			h, _ := e.Encode()
			status, hdr, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: h})
			if status != http.StatusServiceUnavailable || body["code"] != "upstream_unavailable" || body["retryable"] != true || body["charged"] != false || hdr.Get("Retry-After") == "" {
				t.Fatalf("status %d %v, want 503 upstream_unavailable, retryable, with Retry-After", status, body)
			}
			if msg, _ := body["message"].(string); body["wallet"] != nil || strings.Contains(msg, c.message) || strings.Contains(msg, e.Address) {
				t.Errorf("the answer reached the upstream or echoes the chain or the proof: %v", body)
			}
		})
	}
}
