package caddymodule

import (
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// TestDevnetRPCReadableFromABrowser: a page on a loopback origin other than
// the devnet's RPC reads the chain id and a buyer's test USDC balance from
// the RPC with fetch(), as the official EVM paywall page does. Nothing is
// intercepted: Chromium sends the preflight and checks the devnet's own
// CORS answers, so the test fails if the RPC sends none.
func TestDevnetRPCReadableFromABrowser(t *testing.T) {
	chromium := chromiumPath(t)
	interop.Dir(t, "playwright-core")
	d, _ := sharedDevnet(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, "<!doctype html><title>dapp</title><p>a dapp in development</p>")
	}))
	t.Cleanup(page.Close)
	buyer := evmfacilitator.DevAccounts()[3].Address
	balanceOf := "0x70a08231" + common.Bytes2Hex(common.LeftPadBytes(buyer.Bytes(), 32))

	var res struct {
		Results []struct {
			Result any    `json:"result"`
			Error  string `json:"error"`
		} `json:"results"`
	}
	interop.Run(t, "devnet-rpc-browser.mjs", nil, map[string]any{
		"page": page.URL + "/", "rpc": d.RPCURL(), "chromium": chromium,
		"calls": []map[string]any{
			{"method": "eth_chainId", "params": []any{}},
			{"method": "eth_call", "params": []any{map[string]string{"to": d.Token().Hex(), "data": balanceOf}, "latest"}},
		},
	}, &res)
	if len(res.Results) != 2 {
		t.Fatalf("results: %+v", res.Results)
	}
	for i, r := range res.Results {
		if r.Error != "" {
			t.Errorf("call %d: %s", i, r.Error)
		}
	}
	if res.Results[0].Result != "0x539" {
		t.Errorf("eth_chainId read by the page: %v, want 0x539 (1337)", res.Results[0].Result)
	}
	hex, _ := res.Results[1].Result.(string)
	got, ok := new(big.Int).SetString(common.Bytes2Hex(common.FromHex(hex)), 16)
	if want := balance(t, d, buyer); !ok || got.Cmp(want) != 0 {
		t.Errorf("balanceOf read by the page: %v (%q), want %v", got, hex, want)
	}
}
