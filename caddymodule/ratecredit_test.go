package caddymodule

import (
	"net/http"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// TestPayingClientsAreNotCappedByTheirProbes: with a budget of 2 refusals,
// a client that asks the price (402) and pays, three times over, is never
// limited (each settled payment gives its 402 back), while replays and
// unpaid probes count as before: the credit is capped at the budget and
// earned only by a settlement.
func TestPayingClientsAreNotCappedByTheirProbes(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 1, "rate_limit 2 1m"))
	url := base + "/verify/schema"
	t0 := time.Now()
	now = func() time.Time { return t0 } // no refill during the test
	t.Cleanup(func() { now = time.Now })

	if resp := post(t, url, validRequest, nil); resp.StatusCode != 200 {
		t.Fatalf("the free call: %d", resp.StatusCode)
	}
	var pr x402.PaymentRequired
	var sig string
	for i := range 3 {
		resp := post(t, url, validRequest, nil)
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("probe %d: %d, want 402", i+1, resp.StatusCode)
		}
		pr = paymentRequired(t, resp)
		sig = signFor(t, pr, 1)
		if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
			t.Fatalf("paid call %d: %d", i+1, resp.StatusCode)
		}
	}
	// A payment made without a probe finds the budget full: nothing saved.
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 1)}); resp.StatusCode != 200 {
		t.Fatalf("paid call without a probe: %d", resp.StatusCode)
	}
	// A replayed payment settles nothing and counts; so does a probe.
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("replay: %d, want 402", resp.StatusCode)
	}
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("last probe: %d, want 402", resp.StatusCode)
	}
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after a replay and a probe with a budget of 2: %d, want 429", resp.StatusCode)
	}
	if got := up.calls.Load(); got != 5 {
		t.Fatalf("upstream calls %d, want the free call and the four paid ones", got)
	}
}
