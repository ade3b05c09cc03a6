package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// sellerOverVerifierdSite is a seller route whose upstream is verifierd
// itself (it records a paid call pending and asks for its outcome), with
// verify_response checking verifierd's answer against schema: the gate
// (settle after) with facilitator and its extra options, verify_response
// asking verifierURL with its extra options.
func sellerOverVerifierdSite(vf *verifierFixture, facilitator, gateExtra, schema, verifierURL, verifyExtra string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/* {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator %[4]s
			store badger {data}/gate
			%[5]s
		}
		verify_response {
			schema %[6]s
			verifier_url %[7]s
			%[8]s
		}
		reverse_proxy %[1]s {
			header_up X-Aov-Gateway-Token %[2]s
		}
	}
}
`, strings.TrimPrefix(vf.srv.URL, "http://"), verifierToken, payTo.Hex(), facilitator, gateExtra, schema, verifierURL, verifyExtra)
}

// recordedPayment waits up to 20 s (reports go in the background, late on
// a loaded machine) for the one verification verifierd recorded under
// agent to have payment want, and returns what it has. A record that
// should stay pending is read after a pause, so that a report made late
// would be seen.
func recordedPayment(t *testing.T, vf *verifierFixture, agent, want string) string {
	t.Helper()
	if want == store.PaymentPending {
		time.Sleep(500 * time.Millisecond)
	}
	var got string
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		recs, _, err := vf.db.Verifications(context.Background(), agent, "", 10)
		if err != nil || len(recs) != 1 {
			t.Fatalf("verifierd's records under %s: %+v, %v; want the one paid call's", agent, recs, err)
		}
		if got = recs[0].Payment; got == want || time.Now().After(end) {
			return got
		}
	}
}

// A paid call to verifierd through a seller route is recorded payment
// "pending", and verifierd asks the gate to report how it ended. Every way
// such a call ends without a settlement reports it unpaid, as a refused
// settlement and a client gone are reported: the output failed under
// settle_on pass (handed over uncharged, or withheld by on_fail block),
// the check could not be made (verifierd behind verify_response down), or
// it ran past upstream_timeout (504). A settled call is reported paid, an
// envelope's too, and one whose settlement outcome is unknown stays
// pending until it is resolved. The report's request never reaches the
// buyer, and the answer handed over keeps its verification status (the
// report passes verify_response unchecked). (Before: each unsettled way sent no report, so the record stayed
// pending for ever while the buyer's retry with the same payment recorded
// another; on_fail block, an outage and the 504 withheld the upstream's
// report request, and an envelope hid the answer's verification_id, so
// even a settled call's record stayed pending.)
func TestSellerCallThatSettlesNothingIsReportedUnpaid(t *testing.T) {
	_, fac := sharedDevnet(t)
	vf := startVerifier(t)
	const (
		passing = "`{\"type\":\"object\",\"required\":[\"verification_id\"]}`"
		failing = "`{\"type\":\"object\",\"required\":[\"never_in_the_answer\"]}`"
	)
	slow := delayedVerifier(t, vf, 2*time.Second)
	for _, c := range []struct {
		name, facilitator, gateExtra, schema, verifier, verifyExtra string
		status                                                      int
		payment                                                     string
	}{
		{"output failed under settle_on pass", "http " + fac, "settle_on pass", failing, vf.srv.URL, "", http.StatusOK, store.PaymentUnpaid},
		{"output failed, withheld by on_fail block", "http " + fac, "settle_on pass", failing, vf.srv.URL, "on_fail block", http.StatusBadGateway, store.PaymentUnpaid},
		{"the check's verifier is down", "http " + fac, "", passing, "http://127.0.0.1:1", "", http.StatusServiceUnavailable, store.PaymentUnpaid},
		{"the check ran past upstream_timeout", "http " + fac, "upstream_timeout 1s", passing, slow.URL, "", http.StatusGatewayTimeout, store.PaymentUnpaid},
		{"the facilitator refused the settlement", "faulty_devnet refuse", "", passing, vf.srv.URL, "", http.StatusPaymentRequired, store.PaymentUnpaid},
		{"settled", "http " + fac, "", passing, vf.srv.URL, "", http.StatusOK, store.PaymentPaid},
		{"settled, in an envelope", "http " + fac, "", passing, vf.srv.URL, "envelope", http.StatusOK, store.PaymentPaid},
		{"the settlement's outcome is unknown", "faulty_devnet lose_request", "", passing, vf.srv.URL, "", http.StatusServiceUnavailable, store.PaymentPending},
	} {
		t.Run(c.name, func(t *testing.T) {
			base := startCaddy(t, sellerOverVerifierdSite(vf, c.facilitator, c.gateExtra, c.schema, c.verifier, c.verifyExtra))
			url := base + "/verify/schema"
			agent := "buyer-" + strings.ReplaceAll(c.name, " ", "-")
			agent = strings.NewReplacer(",", "", "'", "", "_", "-").Replace(agent)
			body := `{"task_id":"t-1","agent_id":"` + agent + `","expected_schema":{"type":"object"},"submitted_output":{"ok":true}}`
			sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 4)
			resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
			answer := readAll(t, resp)
			if resp.StatusCode != c.status {
				t.Fatalf("paid call: %d %.300s; want %d", resp.StatusCode, answer, c.status)
			}
			if h := resp.Header.Get(headerSettlementReport); h != "" {
				t.Errorf("the buyer was shown the upstream's report request %s %q", headerSettlementReport, h)
			}
			if want := map[string]string{passing: "pass", failing: "fail"}[c.schema]; resp.StatusCode == http.StatusOK && resp.Header.Get(HeaderVerificationStatus) != want {
				t.Errorf("the answer handed over: %s %q; want %q", HeaderVerificationStatus, resp.Header.Get(HeaderVerificationStatus), want)
			}
			if got := recordedPayment(t, vf, agent, c.payment); got != c.payment {
				t.Errorf("verifierd recorded the call's payment %q; want %q", got, c.payment)
			}
		})
	}
}
