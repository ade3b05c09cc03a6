package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aovhq/aov/internal/solanachain"
)

// troubledNode is a FAKE for answers the local chain never gives: it
// forwards every call to target except simulateTransaction, which it
// answers with status and body (a rate limit, a node behind, a proxy's
// error, or a node's rejection of the transaction).
func troubledNode(t *testing.T, target string, status int, body string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req struct {
			Method string `json:"method"`
		}
		json.Unmarshal(b, &req)
		if req.Method == "simulateTransaction" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, body)
			return
		}
		resp, err := http.Post(target, "application/json", bytes.NewReader(b))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The node's own trouble while simulating (a rate limit, a node behind, a
// proxy's error) is an error, never the buyer's invalid payment: Verify
// does not tell the buyer to sign again, and Settle releases the payment
// unsent and uncharged, so it settles once the node is back. Only an
// answer (200, or 4xx but 429) rejecting the transaction itself is a
// refusal.
func TestNodeTroubleIsNoInvalidPayment(t *testing.T) {
	e := newEnv(t, Config{})
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		status  int
		body    string
		refusal bool
	}{
		{"429 rate limited", 429, `{"jsonrpc":"2.0","id":1,"error":{"code":429,"message":"Too many requests for a specific RPC call"}}`, false},
		{"node behind", 200, `{"jsonrpc":"2.0","id":1,"error":{"code":-32005,"message":"Node is behind by 120 slots"}}`, false},
		{"503 proxy", 503, `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"upstream unavailable"}}`, false},
		{"internal error", 200, `{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"Internal error"}}`, false},
		{"signature verification failed", 200, `{"jsonrpc":"2.0","id":1,"error":{"code":-32003,"message":"Transaction signature verification failure"}}`, true},
		{"transaction does not decode", 200, `{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"invalid transaction: Transaction failed to sanitize accounts offsets correctly"}}`, true},
		// Some providers carry a node's rejection in a 4xx: the transaction
		// is still at fault (not a permanent 503); a 429 never is.
		{"rejection in a 400", 400, `{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"invalid transaction: Transaction failed to sanitize accounts offsets correctly"}}`, true},
		{"429 carrying a rejection code", 429, `{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"too many requests"}}`, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := e.f.cfg
			cfg.RPC = &RPC{URL: troubledNode(t, e.chain.URL, c.status, c.body)}
			f, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			p := e.payment(t)
			pp := Payload(p.withMemo(c.name), e.req) // a transaction of its own
			v, err := f.Verify(ctx, pp, e.req)
			if c.refusal {
				if err != nil || v.IsValid || v.InvalidReason != ReasonSimulationFailed {
					t.Fatalf("verify: %+v %v, want %s", v, err, ReasonSimulationFailed)
				}
				return
			}
			if err == nil {
				t.Fatalf("verify: %+v, want an error (the node's trouble), not an answer", v)
			}
			var re *RPCError
			if !errors.As(err, &re) {
				t.Fatalf("verify: %v does not carry the node's error", err)
			}
			if s, err := f.Settle(ctx, pp, e.req); err == nil {
				t.Fatalf("settle: %+v, want an error", s)
			}
			if a, b := e.balances(t); a != 1_000_000 || b != 0 {
				t.Fatalf("balances moved: payer %d payee %d", a, b)
			}
			// Released, not held as a duplicate: the same payment settles
			// once the node answers again.
			f.rpc = &RPC{URL: e.chain.URL}
			if s, err := f.Settle(ctx, pp, e.req); err != nil || !s.Success {
				t.Fatalf("settle once the node is back: %+v %v", s, err)
			}
			if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
				t.Fatalf("balances payer %d payee %d", a, b)
			}
			e.chain.SetTokenBalance(pub(e.payer).String(), solanachain.USDC, 1_000_000, "")
			e.chain.SetTokenBalance(e.payTo.String(), solanachain.USDC, 0, "")
		})
	}
}
