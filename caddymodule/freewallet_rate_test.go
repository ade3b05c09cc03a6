package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/walletauth"
)

// TestFreeCallsPerWalletAreBoundedPerClient: with free_allowance { key
// wallet }, the allowance is per wallet, and a wallet is a key anyone
// mints for free. Each free call served counts against the client's
// rate_limit (its IP), so one client with a fresh wallet per call gets at
// most rate_limit's events of free upstream work per window, then 429.
func TestFreeCallsPerWalletAreBoundedPerClient(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		x402 {
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			validate verify_request
			rate_limit 5 1h
			free_allowance {
				key wallet
				per_day 1
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	url := base + "/verify/schema"
	free, limited := 0, 0
	for range 20 {
		key, err := crypto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		st, _, body := walletCall(t, "POST", url, validRequest, map[string]string{walletauth.HeaderName: walletProof(t, key, "POST", url, nil)})
		switch {
		case st == 200 && body["payment"] == "free":
			free++
		case st == http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("a fresh wallet's call: %d %v", st, body)
		}
	}
	if free != 5 || limited != 15 {
		t.Errorf("one client, 20 fresh wallets, rate_limit 5 1h: %d free calls, %d answered 429; want 5 and 15", free, limited)
	}
}
