package caddymodule

import (
	"context"
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
// answer, so the 504 waited reportTimeout, 5 s, past upstream_timeout.)
func TestUnsettledAnswerDoesNotWaitForItsUnpaidReport(t *testing.T) {
	_, fac := sharedDevnet(t)
	vf := startVerifier(t)
	const passing = "`{\"type\":\"object\",\"required\":[\"verification_id\"]}`"
	slowCheck := delayedVerifier(t, vf, 3*time.Second)
	// verifierd as the gate's upstream: it answers verifications at once,
	// but stalls on the settlement report (as a stalled history store
	// would) until recovered.
	target, _ := neturl.Parse(vf.srv.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	var stalled atomic.Bool
	stalled.Store(true)
	stop := make(chan struct{})
	var once sync.Once
	heal := func() { stalled.Store(false); once.Do(func() { close(stop) }) }
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/gateway/") && stalled.Load() {
			select {
			case <-stop:
			case <-r.Context().Done():
			case <-time.After(20 * time.Second):
			}
			http.Error(w, "stalled", http.StatusServiceUnavailable)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { heal(); up.Close() })
	site := strings.Replace(sellerOverVerifierdSite(vf, "http "+fac, "upstream_timeout 1s", passing, slowCheck.URL, ""),
		strings.TrimPrefix(vf.srv.URL, "http://"), strings.TrimPrefix(up.URL, "http://"), 1)
	base := startCaddy(t, site)
	url := base + "/verify/schema"
	const agent = "buyer-stalled-report"
	body := `{"task_id":"t-1","agent_id":"` + agent + `","expected_schema":{"type":"object"},"submitted_output":{"ok":true}}`
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 4)
	start := time.Now()
	resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
	answer := readAll(t, resp)
	took := time.Since(start)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("paid call: %d %.300s; want 504", resp.StatusCode, answer)
	}
	if took > 2500*time.Millisecond {
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
