package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// TestFreeCallsPerWalletAreBoundedPerClient: with free_allowance { key
// wallet }, the allowance is per wallet, and a wallet is a key anyone
// mints for free. Each free call served counts against the client's (its
// IP's) free budget, rate_limit's events per window, so one client with a
// fresh wallet per call gets that many free calls, then the demand for
// payment (402, counted against its refusals), then 429.
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
	free, demanded, limited := 0, 0, 0
	for range 20 {
		key, err := crypto.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		st, _, body := walletCall(t, "POST", url, validRequest, map[string]string{walletauth.HeaderName: walletProof(t, key, "POST", url, nil)})
		switch {
		case st == 200 && body["payment"] == "free":
			free++
		case st == http.StatusPaymentRequired && free == 5:
			demanded++
		case st == http.StatusTooManyRequests:
			limited++
		default:
			t.Fatalf("a fresh wallet's call: %d %v", st, body)
		}
	}
	if free != 5 || demanded != 5 || limited != 10 {
		t.Errorf("one client, 20 fresh wallets, rate_limit 5 1h: %d free calls, %d answered 402, %d answered 429; want 5, 5 and 10", free, demanded, limited)
	}
}

// TestFreeCallsDoNotCapPayingClients: free calls are bounded per client by
// their own budget, never the one a payment must pass: a client that used
// rate_limit's events of free calls is asked to pay for one more (402 with
// Retry-After), is served when it pays, and its refusals' budget is what
// its refusals alone left.
func TestFreeCallsDoNotCapPayingClients(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 1000, "rate_limit 5 1m"))
	url := base + "/verify/schema"
	t0 := time.Now()
	now = func() time.Time { return t0 } // no refill during the test
	t.Cleanup(func() { now = time.Now })
	big := `{"task_id":"t-1","expected_schema":{"type":"object"},"submitted_output":{"pad":"` + strings.Repeat("x", 3000) + `"}}`
	pr := paymentRequired(t, post(t, url, big, nil)) // over the free max_body: the price, one refusal
	for i := range 5 {
		if resp := post(t, url, validRequest, nil); resp.StatusCode != 200 {
			t.Fatalf("free call %d of rate_limit 5: %d", i+1, resp.StatusCode)
		}
	}
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("a sixth free call within the window: %d, want 402 with Retry-After", resp.StatusCode)
	}
	for i := range 2 {
		if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 4)}); resp.StatusCode != 200 {
			t.Fatalf("paid call %d after the free calls were used: %d, want 200 (paying clients are not capped)", i+1, resp.StatusCode)
		}
	}
	// The refusals' budget: 5 events, less the two 402s, given back by
	// the two settlements.
	for i := range 5 {
		if resp := post(t, url, big, nil); resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("402 %d of the refusals' budget: %d", i+1, resp.StatusCode)
		}
	}
	if resp := post(t, url, big, nil); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a refusal past the refusals' budget: %d, want 429", resp.StatusCode)
	}
}
