package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// A graceful stop (SIGTERM, admin /stop) waits for the unpaid reports in
// the background: the process exits right after caddy.Stop, so a report
// still on its way to a healthy (just not instant) verifierd would be lost
// and the verification would stay "pending" for ever. (Before: caddy.Stop
// returned while the report's goroutine was still sending.)
func TestUnpaidReportDeliveredAtGracefulStop(t *testing.T) {
	// verifierd is healthy; its settlement endpoint answers in 800 ms
	// (a busy history store), well within reportTimeout (5 s).
	const agent = "buyer-report-at-stop"
	vf, url, body, sig := unpaidReportGate(t, agent, func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasPrefix(r.URL.Path, "/v1/gateway/") {
			time.Sleep(800 * time.Millisecond)
		}
		return false
	})
	resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
	answer := readAll(t, resp)
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("paid call: %d %.300s; want 504", resp.StatusCode, answer)
	}
	// The operator stops the gateway (graceful: in-flight requests drain).
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	// The process would exit here. What did verifierd record by then?
	recs, _, err := vf.db.Verifications(context.Background(), agent, "", 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("records %+v %v", recs, err)
	}
	if recs[0].Payment != store.PaymentUnpaid {
		t.Errorf("after a graceful stop, verifierd's record says %q; want %q (the stop did not wait for the unpaid report: lost at exit)", recs[0].Payment, store.PaymentUnpaid)
	}
	// In this process the goroutine lives on: does the report still get
	// through the cleaned-up config's handler chain?
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		recs, _, _ = vf.db.Verifications(context.Background(), agent, "", 10)
		if recs[0].Payment == store.PaymentUnpaid {
			t.Logf("in process, the report arrived after Stop (the old chain still works)")
			return
		}
	}
	t.Logf("in process, the report never arrived after Stop: %q", recs[0].Payment)
}

// unpaidReportGate starts a gate over a verifierd whose check answers in
// 3 s, past the gate's upstream_timeout 1s, so a paid call is a 504 that
// settles nothing and is reported unpaid. The gate reaches verifierd
// through front, which answers a request itself (true) or leaves it to
// verifierd (false): the way a test makes the report slow or stalled. It
// returns verifierd, the paid route's URL, and the body and payment of a
// paid call by agent.
func unpaidReportGate(t *testing.T, agent string, front func(http.ResponseWriter, *http.Request) bool) (vf *verifierFixture, url, body, sig string) {
	t.Helper()
	_, fac := sharedDevnet(t)
	vf = startVerifier(t)
	const passing = "`{\"type\":\"object\",\"required\":[\"verification_id\"]}`"
	slowCheck := delayedVerifier(t, vf, 3*time.Second)
	target, _ := neturl.Parse(vf.srv.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !front(w, r) {
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(up.Close)
	site := strings.Replace(sellerOverVerifierdSite(vf, "http "+fac, "upstream_timeout 1s", passing, slowCheck.URL, ""),
		strings.TrimPrefix(vf.srv.URL, "http://"), strings.TrimPrefix(up.URL, "http://"), 1)
	url = startCaddy(t, site) + "/verify/schema"
	body = `{"task_id":"t-1","agent_id":"` + agent + `","expected_schema":{"type":"object"},"submitted_output":{"ok":true}}`
	sig = signFor(t, paymentRequired(t, post(t, url, "", nil)), 4)
	return vf, url, body, sig
}

// Past maxReportsInBackground an unpaid report is sent before its answer
// (back-pressure); when the upstream does not take it, its retries need a
// place in the background as any report's do: with none left they are
// given up (the record stays pending, counting for nothing), and no
// goroutine is left uncounted, or outlives the gate's Cleanup to report
// through an unloaded config. (Before: its retries went to a goroutine
// counted nowhere and never stopped, about 35 s each while verifierd
// failed, that still reported after caddy.Stop returned.)
func TestOverCapUnpaidReportLeavesNoUncountedRetry(t *testing.T) {
	var hits, afterStop atomic.Int64
	var stopped atomic.Bool
	const agent = "buyer-overcap-report"
	_, url, body, sig := unpaidReportGate(t, agent, func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/v1/gateway/") {
			return false
		}
		hits.Add(1)
		if stopped.Load() {
			afterStop.Add(1)
		}
		http.Error(w, "history store busy", http.StatusServiceUnavailable)
		return true
	})
	// The bound is reached by other gates' reports in the background.
	reportsInBackground.Add(maxReportsInBackground)
	t.Cleanup(func() { reportsInBackground.Add(-maxReportsInBackground) })

	resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
	if answer := readAll(t, resp); resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("paid call: %d %.300s; want 504", resp.StatusCode, answer)
	}
	if hits.Load() != 1 {
		t.Fatalf("report attempts before the answer: %d; want the one over the bound, sent first", hits.Load())
	}
	if n := reportsInBackground.Load(); n != maxReportsInBackground {
		t.Errorf("reports in the background: %d; want %d (the bound: a retry past it is given up, not run uncounted)", n, maxReportsInBackground)
	}
	time.Sleep(2 * reportRetries[0]) // when a retry would have been sent
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	stopped.Store(true)
	time.Sleep(2 * reportRetries[0])
	if n := hits.Load(); n != 1 {
		t.Errorf("%d report attempts; want 1 (no retry past the bound)", n)
	}
	if n := afterStop.Load(); n > 0 {
		t.Errorf("%d report attempt(s) after caddy.Stop returned; want none", n)
	}
}

// A paid call in flight across a reload (Caddy unloads the old config
// while its requests run) settles and is reported paid after the unload's
// wait for reports in the background; verifierd refuses that report once
// (a 503). Its retries still run, bounded by their schedule (1, 2, 4 and
// 8 s), and the record turns paid. (Before: its retry found the unloaded
// gate's stop closed and gave up at once, logging nothing: the paid
// verification stayed pending for ever.)
func TestPaidReportStartedAfterAReloadIsRetried(t *testing.T) { paidReportRefusedOnce(t, true) }

// The same without the reload: the retry after 1 s lands.
func TestPaidReportRefusedOnceIsRetried(t *testing.T) { paidReportRefusedOnce(t, false) }

// paidReportRefusedOnce makes a paid call whose report verifierd refuses
// once, across a reload of the config or not.
func paidReportRefusedOnce(t *testing.T, reload bool) {
	_, fac := sharedDevnet(t)
	fakeHistoryReset()
	fakeHistoryRefuse.Store(0)
	defer fakeHistoryRefuse.Store(0)
	site := fakeHistorySite("badger {data}/gate", "http "+fac)
	base := startCaddy(t, site)
	port := portOf(t, base)
	url := base + "/v1/verify"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 7)

	fakeHistorySlow.Store(int64(1500 * time.Millisecond))
	defer fakeHistorySlow.Store(0)
	done := make(chan *http.Response, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"x":2}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(x402.HeaderPaymentSignature, sig)
		resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
		if err != nil {
			t.Errorf("paid call: %v", err)
			done <- nil
			return
		}
		done <- resp
	}()
	time.Sleep(500 * time.Millisecond)
	fakeHistoryRefuse.Store(1) // verifierd blips once on the report
	if reload {
		loadCaddy(t, port, strings.Replace(site, "public_base_url https://gateway.test", "public_base_url https://gateway.test\n\t\t\tdescription \"reloaded\"", 1))
	}
	resp := <-done
	if resp == nil {
		return
	}
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("paid call across the reload: %d %.200s", resp.StatusCode, b)
	}
	var pays []string
	var reports []string
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		_, pays, reports = fakeHistoryRecords()
		if len(pays) == 1 && pays[0] == "paid" {
			return
		}
	}
	t.Errorf("record after a settled, delivered paid call whose report verifierd refused once: %v (reports taken %q); want paid (retried after 1 s as README says), got it given up silently", pays, reports)
}
