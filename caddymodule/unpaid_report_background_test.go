package caddymodule

import (
	"context"
	"net/http"
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
		case <-time.After(20 * time.Second):
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
