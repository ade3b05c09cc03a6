package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// An outage of verification on the operator's side (certd's card or
// verifierd not listening, verifierd answering 503) withholds paid answers
// with a retryable 503, and each counts against the buyer's rate_limit:
// verify_response asks verifierd only once the agent answered, so the
// agent worked for every such call (workRan), and one payment retried
// through the outage is bounded, past the limit by 429 with Retry-After.
// (Content the buyer can cause to be unverifiable counts too:
// TestUnsettledPaidAnswersCountAgainstRateLimit.)
func TestVerificationOutageCountsAgainstRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	// certd's card at an address nothing listens on while it restarts.
	cardAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "verifierd overloaded", http.StatusServiceUnavailable)
	}))
	t.Cleanup(failing.Close)
	route := func(prefix, verifier, cardURL string) string {
		return fmt.Sprintf(`
	handle %[1]s/* {
		uri strip_prefix %[1]s
		x402 {
			accept devnet $0.05 %[3]s
			facilitator http %[2]s
			store badger {data}%[1]s
			settle_on pass
			rate_limit {
				events 3
				window 1m
				zone %[1]s
			}
		}
		verify_response {
			schema %[4]s
			rules %[5]s
			enforce_rules
			verifier_url %[6]s
			verifier_token %[8]s
			card_url %[9]s
		}
		reverse_proxy %[7]s
	}`, prefix, fac, payTo.Hex(), binaries.schemaPath, binaries.rules, verifier, strings.TrimPrefix(agent, "http://"), verifierToken, cardURL)
	}
	base := startCaddy(t, ":{port} {"+route("/card", vf.srv.URL, "http://"+cardAddr+"/.well-known/agent-card.json")+
		route("/verifier", "http://127.0.0.1:1", vf.cardURL)+route("/failing", failing.URL, vf.cardURL)+"\n}\n")
	pay := func(path string) string {
		resp, _ := getBody(t, base+path, nil)
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("%s unpaid: %d", path, resp.StatusCode)
		}
		return signFor(t, paymentRequired(t, resp), 6)
	}

	// The probe and two withheld calls are each route's budget, three more
	// its debt (a payment passes while its refusal keeps the debt within
	// events: rateZone.arrival).
	for _, path := range []string{"/card", "/verifier", "/failing"} {
		sig := pay(path + "/invoices/INV-7731")
		var statuses []int
		for range 7 {
			resp, _ := getBody(t, base+path+"/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
			statuses = append(statuses, resp.StatusCode)
			if path == "/card" {
				time.Sleep(cardRefetchEvery + 100*time.Millisecond) // a fresh read of the card each time
			}
		}
		if fmt.Sprint(statuses) != "[503 503 503 503 503 429 429]" {
			t.Errorf("one payment, %s outage: statuses %v, want [503 503 503 503 503 429 429]", path, statuses)
		}
	}
}
