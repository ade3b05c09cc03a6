package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// settle before with verify_response: upstream_timeout bounds the whole
// answer and its check (README, settle), so a verifierd slower than it
// (30 s, within verifier_timeout 45s) leaves the charged buyer the gate's
// 503 upstream_unavailable at about upstream_timeout (1 s), and verifierd
// is told that deadline (X-Aov-Answer-By), the earlier of it and
// verifier_timeout's. (Before: the check ran on a context without the
// gate's deadline, and the 503 came when verifierd answered.) The answer
// is bounded at 10 s: a loaded machine adds seconds to the 1 s, and the
// defect's 30 s stays far past them.
func TestSettleBeforeCheckBoundedByUpstreamTimeout(t *testing.T) {
	_, fac := sharedDevnet(t)
	buildBinaries(t)
	told := make(chan string, 1)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		told <- r.Header.Get(HeaderUpstreamAnswerBy)
		select {
		case <-time.After(30 * time.Second):
		case <-r.Context().Done(): // the gate gave up on the check
			return
		}
		http.Error(w, `{"code":"busy"}`, http.StatusServiceUnavailable)
	}))
	t.Cleanup(slow.Close)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"invoice_id":"x"}`))
	}))
	t.Cleanup(up.Close)
	site := fmt.Sprintf(`:{port} {
	handle /invoices/* {
		x402 {
			accept devnet $0.05 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
			settle before
			upstream_timeout 1s
		}
		verify_response {
			schema %[5]s
			agent_id seller-7
			verifier_url %[4]s
			verifier_token gate-secret
			verifier_timeout 45s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), slow.URL, binaries.schemaPath)
	base := startCaddy(t, site)
	resp, _ := getBody(t, base+"/invoices/INV-1", nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unpaid: %d", resp.StatusCode)
	}
	sig := signFor(t, paymentRequired(t, resp), 8)
	start := time.Now()
	resp, body := getBody(t, base+"/invoices/INV-1", map[string]string{x402.HeaderPaymentSignature: sig})
	took := time.Since(start)
	if took > 10*time.Second {
		t.Errorf("the charged buyer's answer came after %v; upstream_timeout is 1s (the settlement itself is quick on the devnet), verifierd answers after 30s", took)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"upstream_unavailable"`) ||
		!strings.Contains(string(body), `"charged":true`) || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Errorf("paid call past upstream_timeout: %d %.300s; want 503 upstream_unavailable, charged, with PAYMENT-RESPONSE", resp.StatusCode, body)
	}
	ms, err := strconv.ParseInt(<-told, 10, 64)
	if by := time.UnixMilli(ms); err != nil || by.Before(start) || by.After(start.Add(5*time.Second)) {
		t.Errorf("verifierd was told %v (%v after the call began), want the gate's deadline, about 1s after it (verifier_timeout's is 45s)", by, by.Sub(start))
	}
}

// settle after, upstream_timeout 1s: the agent answers at once, verifierd
// takes 30 s (within verifier_timeout 45s, far past what a loaded machine
// adds to the 1 s). upstream_timeout bounds the whole answer and its
// check: the call fails with 504 at the deadline and nothing is charged. (Before: the
// check's context dropped the gate's deadline, and the answer was settled
// and delivered after it.)
func TestCheckPastUpstreamTimeoutIsNotCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	slow := delayedVerifier(t, vf, 30*time.Second)
	site := fmt.Sprintf(`:{port} {
	handle /invoices/* {
		x402 {
			accept devnet $0.05 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
			upstream_timeout 1s
		}
		verify_response {
			schema %[5]s
			rules %[6]s
			enforce_rules
			agent_id seller-7
			verifier_url %[4]s
			verifier_timeout 45s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(agent, "http://"), fac, payTo.Hex(), slow.URL, binaries.schemaPath, binaries.rules)
	base := startCaddy(t, site)
	payerIdx := 8
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	resp, _ := getBody(t, base+"/invoices/INV-7731", nil)
	sig := signFor(t, paymentRequired(t, resp), payerIdx)
	before := balance(t, d, payer)
	start := time.Now()
	resp, body := getBody(t, base+"/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
	took := time.Since(start)
	got := charged(t, d, payer, before)
	t.Logf("after %v: %d charged %v receipt %t %.120s", took, resp.StatusCode, got, resp.Header.Get(HeaderVerificationReceipt) != "", body)
	if got.Sign() != 0 || resp.StatusCode != http.StatusGatewayTimeout || took > 10*time.Second {
		t.Errorf("upstream_timeout 1s, the agent answered at once and its check took 30s: answered %d after %v, charged %v; README (upstream_timeout, settle): the timeout bounds the whole answer and its check, past it 504 and nothing charged", resp.StatusCode, took, got)
	}
}

// delayedVerifier is vf behind a front that holds each request for delay
// before passing it on: a verifierd slow to check (a fake for a load the
// real one cannot be made to show on demand). A request its caller gives up
// on while held is dropped, and one still held when the test ends is passed
// on then, so a long delay costs a test that cuts the check short nothing
// at its end.
func delayedVerifier(t *testing.T, vf *verifierFixture, delay time.Duration) *httptest.Server {
	target, _ := neturl.Parse(vf.srv.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	ended := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(delay):
		case <-ended:
		case <-r.Context().Done():
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { close(ended) }) // before Close, which waits for the handlers
	return slow
}
