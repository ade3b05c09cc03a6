package caddymodule

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// An outage on the operator's side where certd's card or verifierd cannot
// be connected to at all withholds paid answers with a retryable 503, and
// none of them counts against the buyer's rate_limit: nothing worked for
// the call there (workRan), and a buyer retrying one payment as told is
// served once the outage ends, not locked out by 429s. A verifier that
// answers, even with an error, worked for the call: that counts, so a
// buyer whose answers it fails on (a verifier_timeout the answer causes,
// say) is bounded. (Content the buyer can cause to be unverifiable counts
// too: TestUnsettledPaidAnswersCountAgainstRateLimit.)
func TestVerificationOutageDoesNotCountAgainstRateLimit(t *testing.T) {
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

	sig := pay("/card/invoices/INV-7731")
	var statuses []int
	for range 3 {
		resp, _ := getBody(t, base+"/card/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
		statuses = append(statuses, resp.StatusCode)
		time.Sleep(cardRefetchEvery + 100*time.Millisecond) // a fresh read of the card each time
	}
	ln, err := net.Listen("tcp", cardAddr)
	if err != nil {
		t.Fatal(err)
	}
	card := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := testClient.Get(vf.cardURL)
		if err != nil {
			http.Error(w, "unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		io.Copy(w, resp.Body)
	}))
	card.Listener.Close()
	card.Listener = ln
	card.Start()
	t.Cleanup(card.Close)
	resp, body := getBody(t, base+"/card/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
	statuses = append(statuses, resp.StatusCode)
	if fmt.Sprint(statuses) != "[503 503 503 200]" {
		t.Errorf("one payment, certd's card unreachable then back: statuses %v, want [503 503 503 200]; last body %.160s", statuses, body)
	}

	sig = pay("/verifier/invoices/INV-7731")
	statuses = nil
	for range 5 {
		resp, _ := getBody(t, base+"/verifier/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
		statuses = append(statuses, resp.StatusCode)
	}
	if fmt.Sprint(statuses) != "[503 503 503 503 503]" {
		t.Errorf("one payment, verifierd unreachable: statuses %v, want five 503s and no 429", statuses)
	}

	// The probe and two calls the verifier answered 503 are the budget.
	sig = pay("/failing/invoices/INV-7731")
	statuses = nil
	for range 4 {
		resp, _ := getBody(t, base+"/failing/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
		statuses = append(statuses, resp.StatusCode)
	}
	if fmt.Sprint(statuses) != "[503 503 429 429]" {
		t.Errorf("one payment, verifierd answering 503: statuses %v, want [503 503 429 429]", statuses)
	}
}
