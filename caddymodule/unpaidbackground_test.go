package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/store"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// failingReports is an upstream that never takes a report: it refuses
// each with 503, or, stalled, holds it until the attempt's deadline.
type failingReports struct {
	stalled  bool
	attempts atomic.Int64
}

func (f *failingReports) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	f.attempts.Add(1)
	if f.stalled {
		<-r.Context().Done()
		return caddyhttp.Error(http.StatusBadGateway, r.Context().Err())
	}
	w.WriteHeader(http.StatusServiceUnavailable)
	return nil
}

// provisionedForReports is a gate with what Provision gives its unpaid
// reports, logging to an observer.
func provisionedForReports() (*Gate, *observer.ObservedLogs) {
	core, logs := observer.New(zapcore.WarnLevel)
	return &Gate{logger: zap.New(core), stopped: new(atomic.Bool), background: &backgroundReports{stop: make(chan struct{})}}, logs
}

// An unpaid report waiting for its retries still counts against
// maxReportsInBackground, so a stalled upstream under a flood of failing
// calls holds no more goroutines than that. (Before: the retries went to a
// goroutine of their own, uncounted, about 35 s each while the upstream
// stalled.)
func TestUnpaidRetriesCountUnderTheCap(t *testing.T) {
	oldTimeout, oldRetries := reportTimeout, reportRetries
	reportTimeout, reportRetries = 200*time.Millisecond, []time.Duration{time.Hour}
	defer func() { reportTimeout, reportRetries = oldTimeout, oldRetries }()
	g, _ := provisionedForReports()
	up := &failingReports{}
	before := reportsInBackground.Load()
	g.reportUnpaid(httptest.NewRequest(http.MethodPost, "/verify/schema", nil), up, "/v1/gateway/settlement", "v-retried")
	waitFor(t, "the first attempt", func() bool { return up.attempts.Load() == 1 })
	time.Sleep(100 * time.Millisecond) // the attempt refused: its retry waits
	if n := reportsInBackground.Load() - before; n != 1 {
		t.Fatalf("unpaid reports counted while one waits for its retry: %d, want 1", n)
	}
	if err := g.Cleanup(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the given-up report to leave the count", func() bool { return reportsInBackground.Load() == before })
}

// Cleanup (a stop, or a reload's unload) waits for the first attempt of
// the unpaid reports in the background, at most reportTimeout while the
// upstream stalls, then gives up their retries and logs how many. The
// timeout and retries are seconds long, so a Cleanup that also waited for a
// retry (6 s) or for the reports one by one (4 s) is told from one that
// waits one timeout (2 s) with a second of slack for a loaded machine.
func TestCleanupWaitsForUnpaidReportsThenGivesUpRetries(t *testing.T) {
	oldTimeout, oldRetries := reportTimeout, reportRetries
	reportTimeout, reportRetries = 2*time.Second, []time.Duration{2 * time.Second, 2 * time.Second}
	defer func() { reportTimeout, reportRetries = oldTimeout, oldRetries }()
	g, logs := provisionedForReports()
	up := &failingReports{stalled: true}
	r := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
	g.reportUnpaid(r, up, "/v1/gateway/settlement", "v-a")
	g.reportUnpaid(r, up, "/v1/gateway/settlement", "v-b")
	waitFor(t, "the first attempt", func() bool { return up.attempts.Load() >= 1 })
	start := time.Now()
	if err := g.Cleanup(); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took < reportTimeout/2 {
		t.Fatalf("Cleanup returned after %v with the first attempt in flight; want it to wait for it", took)
	}
	if bound := reportTimeout + time.Second; took > bound {
		t.Fatalf("Cleanup took %v while the upstream stalls; want at most reportTimeout (%v)", took, reportTimeout)
	}
	given := logs.FilterMessageSnippet("given up").All()
	if len(given) != 1 || given[0].ContextMap()["reports"] != int64(2) {
		t.Fatalf("give-up log lines: %+v; want one naming 2 reports", given)
	}
	attempts := up.attempts.Load()
	time.Sleep(2*reportTimeout + 2*reportRetries[0])
	if n := up.attempts.Load(); n != attempts {
		t.Fatalf("%d attempts after Cleanup; want none (the retries given up)", n-attempts)
	}
	waitFor(t, "the reports to leave", func() bool { return g.background.n.Load() == 0 })
}

// A paid report the upstream did not take before the answer is retried in
// the background as an unpaid one is: counted under
// maxReportsInBackground, and given up by the gate's Cleanup, which logs
// it. (Before: its retries ran in a goroutine counted nowhere, which no
// Cleanup stopped.)
func TestPaidReportRetriesCountUnderTheCapAndEndAtCleanup(t *testing.T) {
	oldTimeout, oldRetries := reportTimeout, reportRetries
	reportTimeout, reportRetries = 200*time.Millisecond, []time.Duration{300 * time.Millisecond}
	defer func() { reportTimeout, reportRetries = oldTimeout, oldRetries }()
	g, logs := provisionedForReports()
	up := &failingReports{}
	before := reportsInBackground.Load()
	g.report(httptest.NewRequest(http.MethodPost, "/verify/schema", nil), up, "/v1/gateway/settlement", "v-paid", store.PaymentPaid)
	if n := up.attempts.Load(); n != 1 {
		t.Fatalf("attempts before report returned: %d; want 1", n)
	}
	if n := reportsInBackground.Load() - before; n != 1 {
		t.Fatalf("reports counted while a paid one waits for its retry: %d, want 1", n)
	}
	if err := g.Cleanup(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * reportRetries[0])
	if n := up.attempts.Load(); n != 1 {
		t.Fatalf("%d attempts after Cleanup; want none (the retry given up)", n-1)
	}
	if given := logs.FilterMessageSnippet("given up").All(); len(given) != 1 || given[0].ContextMap()["reports"] != int64(1) {
		t.Fatalf("give-up log lines: %+v; want one naming 1 report", given)
	}
	waitFor(t, "the given-up report to leave the count", func() bool { return reportsInBackground.Load() == before })
}
