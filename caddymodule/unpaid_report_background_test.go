package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// A paid call that settles nothing is reported unpaid in the background:
// the buyer's error answer does not wait for the report. When the call
// failed because verifierd stalls (the check ran past upstream_timeout,
// the documented 504), the report goes to that same stalled verifierd; the
// 504 still comes at the deadline, and the report, retried, is recorded
// once verifierd recovers. (Before: the unpaid report was sent before the
// answer, so the 504 waited reportTimeout, 5 s, past upstream_timeout; a
// minute here, so a loaded machine's delays cannot hide it or pass for it.)
func TestUnsettledAnswerDoesNotWaitForItsUnpaidReport(t *testing.T) {
	defer func(d time.Duration) { reportTimeout = d }(reportTimeout)
	reportTimeout = 60 * time.Second
	// verifierd as the gate's upstream: it answers verifications at once,
	// but stalls on the settlement report (as a stalled history store
	// would) until recovered.
	var stalled atomic.Bool
	stalled.Store(true)
	stop := make(chan struct{})
	var once sync.Once
	heal := func() { stalled.Store(false); once.Do(func() { close(stop) }) }
	const agent = "buyer-stalled-report"
	vf, url, body, sig := unpaidReportGate(t, agent, func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/v1/gateway/") || !stalled.Load() {
			return false
		}
		select {
		case <-stop:
		case <-r.Context().Done():
		case <-time.After(90 * time.Second):
		}
		http.Error(w, "stalled", http.StatusServiceUnavailable)
		return true
	})
	t.Cleanup(heal)
	start := time.Now()
	resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
	answer := readAll(t, resp)
	took := time.Since(start)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("paid call: %d %.300s; want 504", resp.StatusCode, answer)
	}
	if took > 15*time.Second { // the deadline is 1 s; a report waited for would add a minute
		t.Errorf("the 504 for upstream_timeout 1s came after %v: the buyer's answer waited for an unpaid report to the stalled verifierd; want it at the deadline (~1 s)", took.Round(100*time.Millisecond))
	}
	// Nothing is lost: once verifierd recovers, the report's retry records
	// the call unpaid.
	heal()
	var got string
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		recs, _, err := vf.db.Verifications(context.Background(), agent, "", 10)
		if err != nil || len(recs) != 1 {
			t.Fatalf("verifierd's records under %s: %+v, %v; want the one paid call's", agent, recs, err)
		}
		if got = recs[0].Payment; got == store.PaymentUnpaid {
			return
		}
	}
	t.Errorf("verifierd recorded the call's payment %q after it recovered; want %q (the unpaid report retried)", got, store.PaymentUnpaid)
}

// A held payment that can never settle (its authorization expired
// unsettled) is answered 402 at once on the buyer's retry: its unpaid
// report goes in the background, as every unpaid report does, since the
// verifierd it goes to may be the one stalling. (Before: the retry's 402
// waited for the report to a stalled verifierd, its batch's wait and one
// attempt, 5 s; a minute here, far past a loaded machine's delays.)
func TestExpiredHeldPaymentRetryDoesNotWaitForItsUnpaidReport(t *testing.T) {
	defer func(d time.Duration) { reportTimeout = d }(reportTimeout)
	reportTimeout = 60 * time.Second
	d, _ := sharedDevnet(t)
	vf := startVerifier(t)
	var stalled atomic.Bool
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	target, _ := neturl.Parse(vf.srv.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/gateway/") && stalled.Load() {
			// Held until verifierd recovers, the gate gives up, or the test ends.
			for end := time.Now().Add(90 * time.Second); stalled.Load() && time.Now().Before(end); {
				select {
				case <-release:
					end = time.Now()
				case <-r.Context().Done():
					end = time.Now()
				case <-time.After(10 * time.Millisecond):
				}
			}
			http.Error(w, "stalled", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	const passing = "`{\"type\":\"object\",\"required\":[\"verification_id\"]}`"
	site := strings.Replace(sellerOverVerifierdSite(vf, "faulty_devnet lose_request", "", passing, vf.srv.URL, ""),
		"reverse_proxy "+strings.TrimPrefix(vf.srv.URL, "http://"), "reverse_proxy "+strings.TrimPrefix(up.URL, "http://"), 1)
	url := startCaddy(t, site) + "/verify/schema"
	const agent = "buyer-expired-held"
	body := `{"task_id":"t-1","agent_id":"` + agent + `","expected_schema":{"type":"object"},"submitted_output":{"ok":true}}`
	sig := signExpiring(t, d, paymentRequired(t, post(t, url, "", nil)), 5, 8)
	var pl x402.PaymentPayload
	if err := x402.DecodeHeader(sig, &pl); err != nil {
		t.Fatal(err)
	}
	var ev x402.ExactEVMPayload
	if err := json.Unmarshal(pl.Payload, &ev); err != nil {
		t.Fatal(err)
	}
	resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
	if a := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %d %.300s; want 503 settlement_pending", resp.StatusCode, a)
	}
	var vb int64
	fmt.Sscan(ev.Authorization.ValidBefore, &vb)
	for deadline := time.Now().Add(40 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		h, err := d.Client().HeaderByNumber(context.Background(), nil)
		if err == nil && int64(h.Time) >= vb {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the chain did not reach validBefore")
		}
	}
	stalled.Store(true) // verifierd's history store now stalls on writes
	start := time.Now()
	resp = post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
	a := readAll(t, resp)
	took := time.Since(start)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("retry after expiry: %d %.300s; want 402", resp.StatusCode, a)
	}
	if took > 15*time.Second { // a report waited for would add a minute
		t.Errorf("the 402 (nothing charged, sign a new payment) came after %v: it waited for the unpaid report to the stalled verifierd; want it at once", took.Round(100*time.Millisecond))
	}
	stalled.Store(false)
	// The report, retried in the background, is recorded once verifierd
	// recovers.
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		recs, _, err := vf.db.Verifications(context.Background(), agent, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		if len(recs) == 1 && recs[0].Payment == store.PaymentUnpaid {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("records %+v; want the one verification unpaid", recs)
		}
	}
}

// A retry of a held payment that is not the buyer's request (another body:
// 402 paid_for_another) is refused before anything is reported: the
// (public, once settled) payment in anyone's hands makes the gate send no
// report per request, and a stalled verifierd does not hold the 402. The
// request that finds the transfer reports it once, in the background, as
// it delivers nothing. (Before: every such request sent the paid report
// before it was refused, and waited reportTimeout, 5 s, on a stalled
// verifierd; a minute here, far past a loaded machine's delays.)
func TestRetryOfAHeldPaymentForAnotherRequestIsRefusedBeforeAnyReport(t *testing.T) {
	defer func(d time.Duration) { reportTimeout = d }(reportTimeout)
	reportTimeout = 60 * time.Second
	_, _ = sharedDevnet(t)
	fakeHistoryReset()
	base := startCaddy(t, fakeHistorySite("badger "+gateDir(t), "faulty_devnet lose_reply"))
	url := base + "/v1/verify"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 5)
	resp := post(t, url, `{"x":5}`, map[string]string{x402.HeaderPaymentSignature: sig})
	if b := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("paid call: %d %.200s; want 503 settlement_pending", resp.StatusCode, b)
	}
	fakeHistoryStall.Store(int64(90 * time.Second))
	defer fakeHistoryStall.Store(0)
	var took time.Duration
	var b []byte
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		start := time.Now()
		resp = post(t, url, `{"x":"not the buyer's"}`, map[string]string{x402.HeaderPaymentSignature: sig})
		b = readAll(t, resp)
		took = time.Since(start)
		if resp.StatusCode != http.StatusServiceUnavailable || time.Now().After(end) {
			break
		}
	}
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("a retry with another request: %d %.200s; want 402", resp.StatusCode, b)
	}
	if took > 15*time.Second { // a report waited for would add a minute
		t.Errorf("the 402 for a request the payment did not pay for took %v: held by a paid report to a stalled verifierd; want it at once", took.Round(100*time.Millisecond))
	}
	// The outcome this request found is reported once, in the background
	// (the stalled attempt is retried), and no later refused request
	// reports it again.
	fakeHistoryStall.Store(0)
	for range 3 {
		resp = post(t, url, `{"x":"not the buyer's either"}`, map[string]string{x402.HeaderPaymentSignature: sig})
		if b = readAll(t, resp); resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("another request, again: %d %.200s; want 402", resp.StatusCode, b)
		}
	}
	var pays, reports []string
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, pays, reports = fakeHistoryRecords(); len(pays) == 1 && pays[0] == "paid" {
			break
		}
	}
	time.Sleep(300 * time.Millisecond)
	if _, pays, reports = fakeHistoryRecords(); len(pays) != 1 || pays[0] != "paid" || len(reports) != 1 {
		t.Errorf("records %v, reports taken %q; want the one verification paid, by one report", pays, reports)
	}
}
