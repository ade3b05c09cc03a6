package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/walletauth"
)

// rateLimitedWalletSite is wallet_auth on /api/* (with chain_rpc rpc) on a
// server whose gate, on /paid/*, has rate_limit 3 1m: the budget
// wallet_auth answers within.
func rateLimitedWalletSite(up, fac, rpc string) string {
	return fmt.Sprintf(`:{port} {
	route /api/* {
		wallet_auth required {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			chain_rpc %[3]s
		}
		reverse_proxy %[1]s
	}
	route /paid/* {
		x402 {
			accept devnet $0.01 %[4]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			rate_limit 3 1m
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, rpc, payTo.Hex())
}

// A contract whose isValidSignature halts exceptionally (an invalid
// opcode; an endless loop that runs out of gas) has not accepted the
// signature, and never will: the node's answer is final, like a revert. The
// proof is a 401 that counts against the client's rate limit, so one
// client replaying it gets 429 after rate_limit's events, not an endless
// retryable 503 costing an eth_call each.
func TestWalletAuthContractHaltingIsARefusal(t *testing.T) {
	d, fac := sharedDevnet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct{ name, initcode string }{
		{"invalid opcode", "60fe60005360016000f3"},     // runtime: 0xfe
		{"endless loop", "635b6000566000526004601cf3"}, // runtime: JUMPDEST PUSH1 0 JUMP
	} {
		t.Run(c.name, func(t *testing.T) {
			r, err := d.SendTx(ctx, evmfacilitator.DevKey(0), nil, common.FromHex(c.initcode))
			if err != nil {
				t.Fatal(err)
			}
			up := walletUpstream(t)
			base := startCaddy(t, rateLimitedWalletSite(up.URL, fac, d.RPCURL()))
			u := base + "/api/x"
			e, err := walletauth.Parse(walletProof(t, walletKey(1), "GET", u, func(r *walletauth.Request) { r.ChainID = "eip155:1337" }))
			if err != nil {
				t.Fatal(err)
			}
			e.Address = r.ContractAddress.Hex()
			h, _ := e.Encode()
			var statuses []int
			for range 5 {
				st, _, _ := walletCall(t, "GET", u, "", map[string]string{walletauth.HeaderName: h})
				statuses = append(statuses, st)
			}
			want := []int{401, 401, 401, 429, 429}
			if fmt.Sprint(statuses) != fmt.Sprint(want) {
				t.Errorf("one proof for a contract whose isValidSignature halts, sent 5 times (rate_limit 3 1m): %v, want %v", statuses, want)
			}
		})
	}
}

// A contract-wallet check that fails at the chain (503, retryable) costs
// the operator's RPC calls for an address the client chose: it counts
// against the client's rate limit, so a client cannot make the gateway
// call its provider without bound.
func TestWalletAuthChainFailureCountsAgainstRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	rpc := refusingChainRPC(t, -32000, "header not found")
	up := walletUpstream(t)
	base := startCaddy(t, rateLimitedWalletSite(up.URL, fac, rpc.URL))
	u := base + "/api/x"
	e, err := walletauth.Parse(walletProof(t, walletKey(1), "GET", u, func(r *walletauth.Request) { r.ChainID = "eip155:8453" }))
	if err != nil {
		t.Fatal(err)
	}
	e.Address = walletAddr(2)
	h, _ := e.Encode()
	var statuses []int
	for range 5 {
		st, _, _ := walletCall(t, "GET", u, "", map[string]string{walletauth.HeaderName: h})
		statuses = append(statuses, st)
	}
	want := []int{http.StatusServiceUnavailable, 503, 503, 429, 429}
	if fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Errorf("one proof the chain cannot check, sent 5 times (rate_limit 3 1m): %v, want %v", statuses, want)
	}
}
