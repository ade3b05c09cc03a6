package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aovhq/aov/x402"
)

// Every paid call the gate ran the agent for and did not settle counts
// against rate_limit, as a refusal does: an output that failed
// verification (handed over uncharged), one verify_response withheld (a
// 503 for prose labelled JSON, a 502 under on_fail block) and one
// withheld under settle_on pass as content nothing checked. Without it one
// signed, never-settled authorization would buy unbounded agent work.
// With rate_limit 3 the unpaid probe and two such calls use the budget,
// the third call (the bucket empty) is the last the agent runs.
func TestUnsettledPaidAnswersCountAgainstRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	var hits atomic.Int64
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch {
		case strings.HasSuffix(r.URL.Path, "/prose"):
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, "Here is your invoice: ...")
		case strings.HasSuffix(r.URL.Path, "/csv"):
			w.Header().Set("Content-Type", "text/csv")
			io.WriteString(w, "sku,qty\nA-100,2\n")
		default:
			// Fails sum_equals: 87 + 42.5 != 200.
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, strings.Replace(goodInvoice, `"total":129.5`, `"total":200`, 1))
		}
	}))
	t.Cleanup(agent.Close)
	route := func(prefix, vrOpts string) string {
		return fmt.Sprintf(`
	handle %[1]s/* {
		x402 {
			accept devnet $0.05 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
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
			%[7]s
		}
		reverse_proxy %[8]s
	}`, prefix, fac, payTo.Hex(), binaries.schemaPath, binaries.rules, vf.srv.URL, vrOpts, strings.TrimPrefix(agent.URL, "http://"))
	}
	base := startCaddy(t, ":{port} {"+route("/failing", "")+route("/blocked", "on_fail block")+
		route("/prose", "")+route("/csv", "")+"\n}\n")
	for _, c := range []struct {
		path   string
		status int // of a call the agent ran for
	}{
		{"/failing/INV-1", 200}, {"/blocked/INV-1", 502}, {"/prose/prose", 503}, {"/csv/csv", 503},
	} {
		hits.Store(0)
		resp, _ := getBody(t, base+c.path, nil)
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("%s unpaid: %d", c.path, resp.StatusCode)
		}
		sig := signFor(t, paymentRequired(t, resp), 3)
		statuses := map[int]int{}
		for range 10 {
			resp, _ := getBody(t, base+c.path, map[string]string{x402.HeaderPaymentSignature: sig})
			statuses[resp.StatusCode]++
			if resp.Header.Get(x402.HeaderPaymentResponse) != "" {
				t.Fatalf("%s: settled (status %d)", c.path, resp.StatusCode)
			}
		}
		// The probe and 2 calls spend the budget, 3 more its debt (a
		// payment passes while its refusal keeps the debt within events:
		// rateZone.arrival).
		if statuses[c.status] == 0 || statuses[http.StatusTooManyRequests] == 0 || hits.Load() > 5 {
			t.Errorf("%s: with rate_limit 3, 10 calls with one unsettled payment ran the agent %d times: statuses %v", c.path, hits.Load(), statuses)
		}
	}
}
