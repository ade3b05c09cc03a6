package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verifierd/server"
)

// reportSink is the upstream's settlement endpoint as the gate's handler
// chain reaches it: it records each request's outcomes, can hold the next
// request until released, and can refuse batches.
type reportSink struct {
	mu            sync.Mutex
	requests      [][]outcomeReport
	hold          chan struct{} // non-nil: the next request waits on it
	arrived       chan struct{}
	refuseBatches bool
}

func (s *reportSink) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	b, _ := io.ReadAll(r.Body)
	var batch struct {
		outcomeReport
		Reports []outcomeReport `json:"reports"`
	}
	if err := json.Unmarshal(b, &batch); err != nil {
		w.WriteHeader(http.StatusUnprocessableEntity)
		return nil
	}
	reps := batch.Reports
	if reps == nil {
		reps = []outcomeReport{batch.outcomeReport}
	}
	s.mu.Lock()
	hold, refuse := s.hold, s.refuseBatches && batch.Reports != nil
	s.hold = nil
	if !refuse {
		s.requests = append(s.requests, reps)
	}
	s.mu.Unlock()
	if hold != nil {
		s.arrived <- struct{}{}
		<-hold
	}
	if refuse {
		w.WriteHeader(http.StatusServiceUnavailable)
		return nil
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *reportSink) got() [][]outcomeReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// queued is how many reports wait behind the one in flight.
func queued(g *Gate, path string) int {
	n := 0
	reportQueues.Range(func(k, v any) bool {
		if k := k.(reportQueueKey); k.g == g && k.path == path {
			q := v.(*reportQueue)
			q.mu.Lock()
			n += len(q.waiting)
			q.mu.Unlock()
		}
		return true
	})
	return n
}

// Reports that arrive while one is in flight wait for it and then go
// together in one request; each report call returns only once its outcome
// was taken.
func TestReportsWhileOneIsInFlightGoInOneBatch(t *testing.T) {
	g := &Gate{logger: zap.NewNop()}
	defer g.stopResolver()
	sink := &reportSink{hold: make(chan struct{}), arrived: make(chan struct{}, 1)}
	hold := sink.hold
	r := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
	const path = "/v1/gateway/settlement"
	var wg sync.WaitGroup
	returned := make(chan string, 8)
	send := func(id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.report(r, caddyhttp.Handler(sink), path, id, "paid")
			returned <- id
		}()
	}
	send("first")
	<-sink.arrived
	for _, id := range []string{"a", "b", "c", "d", "e"} {
		send(id)
	}
	for deadline := time.Now().Add(5 * time.Second); queued(g, path) < 5; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d reports queued, want 5", queued(g, path))
		}
	}
	select {
	case id := <-returned:
		t.Fatalf("report %s returned before its outcome was taken", id)
	default:
	}
	close(hold)
	wg.Wait()
	got := sink.got()
	if len(got) != 2 || len(got[0]) != 1 || got[0][0].VerificationID != "first" || len(got[1]) != 5 {
		t.Fatalf("requests %v, want the first alone and then one batch of the five", got)
	}
	ids := []string{}
	for _, rep := range got[1] {
		if rep.Payment != "paid" {
			t.Fatalf("report %+v", rep)
		}
		ids = append(ids, rep.VerificationID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"a", "b", "c", "d", "e"}) {
		t.Fatalf("batch ids %v", ids)
	}
	if n := queued(g, path); n != 0 {
		t.Fatalf("%d reports still queued", n)
	}
}

// A batch the upstream does not take is not lost: each of its reports is
// retried alone, as a single report would be.
func TestARefusedBatchIsRetriedReportByReport(t *testing.T) {
	old := reportRetries
	reportRetries = []time.Duration{10 * time.Millisecond, 10 * time.Millisecond}
	defer func() { reportRetries = old }()
	g := &Gate{logger: zap.NewNop()}
	defer g.stopResolver()
	sink := &reportSink{hold: make(chan struct{}), arrived: make(chan struct{}, 1), refuseBatches: true}
	hold := sink.hold
	r := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
	const path = "/v1/gateway/settlement"
	var wg sync.WaitGroup
	for _, id := range []string{"first", "x", "y"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g.report(r, caddyhttp.Handler(sink), path, id, "unpaid")
		}()
		if id == "first" {
			<-sink.arrived
		}
	}
	for deadline := time.Now().Add(5 * time.Second); queued(g, path) < 2; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d reports queued, want 2", queued(g, path))
		}
	}
	close(hold)
	wg.Wait()
	for deadline := time.Now().Add(5 * time.Second); len(sink.got()) < 3; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("requests %v: the refused batch was not retried", sink.got())
		}
	}
	ids := []string{}
	for _, reps := range sink.got() {
		if len(reps) != 1 {
			t.Fatalf("requests %v: a retry went as a batch", sink.got())
		}
		ids = append(ids, reps[0].VerificationID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"first", "x", "y"}) {
		t.Fatalf("reported %v", ids)
	}
}

// On a reload Caddy cleans up the old config's modules while its requests
// still run (caddyhttp.App.stop waits only when the process exits).
// Gate.Cleanup drops the gate's report queues (stopResolver); a paid call
// still in flight on the old gate then reports its outcome: the report
// must still reach the upstream, and must not leave a queue keyed by the
// cleaned-up gate, which nothing would drop (one old Gate, its verifier,
// offers and store handle, pinned per reload for the life of the process).
func TestReportAfterCleanupIsSentAndKeepsNoQueue(t *testing.T) {
	g := &Gate{Route: "POST /verify/schema", logger: zap.NewNop(), stopped: new(atomic.Bool)} // as Provision sets it
	g.stopResolver()                                                                          // what Cleanup does
	sink := &reportSink{}
	r := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
	const path = "/internal/report"
	if !g.reportBatched(r, caddyhttp.Handler(sink), path, outcomeReport{VerificationID: "v1", Payment: "paid"}) {
		t.Fatal("the report of a request that outlived its config was not taken")
	}
	if got := sink.got(); len(got) != 1 || len(got[0]) != 1 || got[0][0].VerificationID != "v1" {
		t.Fatalf("upstream got %v, want the one report", got)
	}
	if _, ok := reportQueues.LoadAndDelete(reportQueueKey{g, path, routeOf(r)}); ok {
		t.Fatal("a report queue keyed by a cleaned-up gate was created after its Cleanup; nothing drops it (it pins the old gate)")
	}
}

// verifierdUpstream is the gate's handler chain to a real verifierd (its
// history in a real Badger), as reverse_proxy with the gateway token
// reaches it. The first request it forwards waits until wait reports true.
type verifierdUpstream struct {
	url   string
	first atomic.Bool
	wait  func() bool
}

func (u *verifierdUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	if u.first.CompareAndSwap(false, true) {
		for deadline := time.Now().Add(5 * time.Second); !u.wait(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				return errors.New("the other reports never queued")
			}
		}
	}
	req, err := http.NewRequestWithContext(r.Context(), r.Method, u.url+r.URL.Path, r.Body)
	if err != nil {
		return err
	}
	req.Header = r.Header.Clone()
	req.Header.Set(server.HeaderGatewayToken, verifierToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	maps.Copy(w.Header(), resp.Header)
	w.WriteHeader(resp.StatusCode)
	_, err = io.Copy(w, resp.Body)
	return err
}

// A batch holding an id verifierd does not know (a row lost in a
// PostgreSQL failover) is answered per report: the others are recorded
// and counted as reported, and the unknown one is logged as not recorded
// and not sent again (no resend can record it). Before, verifierd
// answered the whole batch 404 and the gate sent every report in it
// again; with the per report answer, an unknown id was counted as
// reported.
func TestReportOfAnUnknownVerificationInABatch(t *testing.T) {
	vf := startVerifier(t)
	pending := func() string { return vf.pendingPaid(t) }
	first, known := pending(), pending()
	core, logs := observer.New(zap.WarnLevel)
	g := &Gate{logger: zap.New(core)}
	defer g.stopResolver()
	const path = "/v1/gateway/settlement"
	up := &verifierdUpstream{url: vf.srv.URL, wait: func() bool { return queued(g, path) == 2 }}
	paidBefore := reportedCount(t, "reported_paid")
	unpaidBefore := reportedCount(t, "reported_unpaid")
	r := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
	reports := []outcomeReport{{first, "paid"}, {"lost-in-a-failover", "paid"}, {known, "unpaid"}}
	taken := make([]bool, len(reports))
	var wg sync.WaitGroup
	for i, rep := range reports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			taken[i] = g.reportBatched(r, up, path, rep)
		}()
		if i == 0 {
			for !up.first.Load() {
				time.Sleep(time.Millisecond)
			}
		}
	}
	wg.Wait()
	for i, ok := range taken {
		if !ok {
			t.Errorf("report %+v is to be sent again", reports[i])
		}
	}
	for id, want := range map[string]string{first: store.PaymentPaid, known: store.PaymentUnpaid} {
		if rec, err := vf.db.Verification(context.Background(), id); err != nil || rec.Payment != want {
			t.Errorf("record %s: %+v, %v; want %s", id, rec, err, want)
		}
	}
	if d := reportedCount(t, "reported_paid") - paidBefore; d != 1 {
		t.Errorf("%v paid outcomes counted as reported, want 1 (the unknown one was not recorded)", d)
	}
	if d := reportedCount(t, "reported_unpaid") - unpaidBefore; d != 1 {
		t.Errorf("%v unpaid outcomes counted as reported, want 1", d)
	}
	lost := logs.FilterField(zap.String("verification_id", "lost-in-a-failover")).All()
	if len(lost) != 1 || lost[0].Level != zap.ErrorLevel || !strings.Contains(lost[0].Message, "no such verification") {
		t.Errorf("logged about the unknown id: %+v", lost)
	}
	if n := logs.Len() - len(lost); n != 0 {
		t.Errorf("%d other warnings: %+v", n, logs.All())
	}
}

// reportedCount reads the outcomes counter of one label.
func reportedCount(t *testing.T, label string) float64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.outcomes.WithLabelValues(label).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// pendingPaid records a paid verification whose settlement is pending,
// as a gateway's paid call leaves it, straight on vf's verifierd, and
// returns its id.
func (vf *verifierFixture) pendingPaid(t *testing.T) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, vf.srv.URL+"/verify/schema", strings.NewReader(
		`{"task_id":"t1","agent_id":"seller-9","expected_schema":{"type":"object"},"submitted_output":{}}`))
	req.Header = http.Header{"Content-Type": {"application/json"}, server.HeaderGatewayToken: {verifierToken},
		server.HeaderPayment: {"paid"}, server.HeaderSettlement: {"pending"}}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		ID string `json:"verification_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil || resp.StatusCode != http.StatusOK || doc.ID == "" {
		t.Fatalf("verify: %d, %v", resp.StatusCode, err)
	}
	return doc.ID
}

// stallingReports (FAULT: verifierd, or its history store, taking the
// settlement report and never answering, or answering slowly, which a live
// verifierd cannot be made to do on cue) is the report endpoint as
// reverse_proxy reaches it: while stalled, a request is held until its
// deadline and answered 502, as reverse_proxy answers then; otherwise each
// report is recorded, after slow.
type stallingReports struct {
	stalled atomic.Bool
	slow    time.Duration
	arrived chan struct{}
	mu      sync.Mutex
	got     map[string]bool
}

func (s *stallingReports) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	if s.stalled.Load() {
		select {
		case s.arrived <- struct{}{}:
		default:
		}
		<-r.Context().Done()
		return caddyhttp.Error(http.StatusBadGateway, r.Context().Err())
	}
	select {
	case s.arrived <- struct{}{}:
	default:
	}
	time.Sleep(s.slow)
	var batch struct {
		outcomeReport
		Reports []outcomeReport `json:"reports"`
	}
	if err := json.NewDecoder(r.Body).Decode(&batch); err != nil {
		w.WriteHeader(http.StatusUnprocessableEntity)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rep := range append(batch.Reports, batch.outcomeReport) {
		if rep.VerificationID != "" {
			s.got[rep.VerificationID] = true
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *stallingReports) recorded() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.got)
}

// With the report endpoint stalled and more reports queued than one batch
// takes, no paid call waits on its outcome report (and holds its rate
// slot) longer than the request in flight when it came plus its own
// attempt, whatever the queue's length; the reports that were not taken
// reach the upstream by the retries once it answers again. (Before: the
// batches went one after another, each taking the whole reportTimeout, so
// the last of 1 + 257 reports waited four of them.)
func TestAReportWaitsNoLongerThanTheRequestInFlightAndItsOwnWhenTheUpstreamStalls(t *testing.T) {
	sink := &stallingReports{arrived: make(chan struct{}, 1), got: map[string]bool{}}
	sink.stalled.Store(true)
	reportWaitBounded(t, sink)
}

// An upstream that takes every batch, each just within reportTimeout, is
// still slower than the reports come: those queued behind more than one
// batch leave the queue at reportTimeout and reach it by the retries.
// (Before: the last of 1 + 257 reports waited for the three batches ahead
// of it and then its own.)
func TestAReportWaitsNoLongerThanTheRequestInFlightAndItsOwnWhenTheUpstreamIsSlow(t *testing.T) {
	reportWaitBounded(t, &stallingReports{slow: 1800 * time.Millisecond, arrived: make(chan struct{}, 1), got: map[string]bool{}})
}

// reportWaitBounded sends 1 + 257 reports to sink, the rest while the
// first is in flight, checks that none waited longer than 2.5 ×
// reportTimeout (2 s here), and that every one is recorded once sink
// answers. The timeout is seconds long so that the slack between the two
// timeouts a report may wait and the bound is a second for a loaded
// machine, with the defect (four timeouts) 3 s past the bound.
func reportWaitBounded(t *testing.T, sink *stallingReports) {
	oldTimeout, oldRetries := reportTimeout, reportRetries
	reportTimeout = 2 * time.Second
	reportRetries = []time.Duration{100 * time.Millisecond, 100 * time.Millisecond, 100 * time.Millisecond, time.Second, time.Second}
	defer func() { reportTimeout, reportRetries = oldTimeout, oldRetries }()
	g := &Gate{logger: zap.NewNop()}
	defer g.stopResolver()
	r := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
	const path = "/v1/gateway/settlement"
	var wg sync.WaitGroup
	var mu sync.Mutex
	var worst time.Duration
	send := func(id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			g.report(r, caddyhttp.Handler(sink), path, id, "paid")
			mu.Lock()
			worst = max(worst, time.Since(start))
			mu.Unlock()
		}()
	}
	send("first")
	<-sink.arrived
	const more = 2*maxReportBatch + 1
	for i := range more {
		send(fmt.Sprintf("v%d", i))
	}
	for deadline := time.Now().Add(5 * time.Second); queued(g, path) < more; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d reports queued, want %d", queued(g, path), more)
		}
	}
	wg.Wait()
	if bound := 2*reportTimeout + reportTimeout/2; worst > bound {
		t.Fatalf("a report waited %v; want at most %v (the request in flight, then its own, each bounded by reportTimeout %v)", worst, bound, reportTimeout)
	}
	sink.stalled.Store(false)
	for deadline := time.Now().Add(30 * time.Second); sink.recorded() < 1+more; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d reports recorded once the upstream answered again: the retries lost some", sink.recorded(), 1+more)
		}
	}
}

// A report's batch does not end with its buyer's request: a buyer who
// hangs up while its lone report is in flight leaves the reports queued
// behind it to be sent, as verifierd is healthy. (Before: the report went
// on the leader's request context, failed when the buyer left, and the
// connected buyers' reports behind it were failed unsent.)
func TestALeaderWhoseBuyerLeftStillSendsTheBatch(t *testing.T) {
	old := reportRetries
	reportRetries = []time.Duration{time.Hour}
	defer func() { reportRetries = old }()
	vf := startVerifier(t)
	gone := vf.pendingPaid(t)
	others := []string{vf.pendingPaid(t), vf.pendingPaid(t), vf.pendingPaid(t)}
	g := &Gate{logger: zap.NewNop()}
	defer g.stopResolver()
	const path = "/v1/gateway/settlement"
	ctx, cancel := context.WithCancel(context.Background())
	up := &verifierdUpstream{url: vf.srv.URL, wait: func() bool {
		if queued(g, path) == len(others) {
			cancel() // the leader's buyer hangs up
			return true
		}
		return false
	}}
	left := httptest.NewRequest(http.MethodPost, "/verify/schema", nil).WithContext(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); g.reportBatched(left, up, path, outcomeReport{gone, "paid"}) }()
	for !up.first.Load() {
		time.Sleep(time.Millisecond)
	}
	reportConnected(t, g, vf, up, path, &wg, others)
}

// Nor does a batch end with the request of the waiter it is handed to:
// one whose buyer left while waiting sends the next batch, and the other
// buyers' reports in it are recorded. (Before: the batch went on the
// cancelled context and every report in it failed.)
func TestALeadWhoseBuyerLeftStillSendsTheBatch(t *testing.T) {
	old := reportRetries
	reportRetries = []time.Duration{time.Hour} // watch the batched outcome only
	defer func() { reportRetries = old }()
	vf := startVerifier(t)
	first := vf.pendingPaid(t)
	gone := vf.pendingPaid(t)
	others := []string{vf.pendingPaid(t), vf.pendingPaid(t), vf.pendingPaid(t)}
	g := &Gate{logger: zap.NewNop()}
	defer g.stopResolver()
	const path = "/v1/gateway/settlement"
	up := &verifierdUpstream{url: vf.srv.URL, wait: func() bool { return queued(g, path) == 1+len(others) }}
	live := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
	ctx, cancel := context.WithCancel(context.Background())
	left := httptest.NewRequest(http.MethodPost, "/verify/schema", nil).WithContext(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); g.reportBatched(live, up, path, outcomeReport{first, "paid"}) }()
	for !up.first.Load() {
		time.Sleep(time.Millisecond)
	}
	wg.Add(1)
	go func() { defer wg.Done(); g.reportBatched(left, up, path, outcomeReport{gone, "paid"}) }()
	for queued(g, path) < 1 {
		time.Sleep(time.Millisecond)
	}
	cancel() // the buyer of "gone" hangs up while waiting
	reportConnected(t, g, vf, up, path, &wg, others)
}

// reportConnected reports ids at once from buyers still connected, waits
// for every report started on wg, and fails t unless each was taken and
// is recorded paid: verifierd is healthy.
func reportConnected(t *testing.T, g *Gate, vf *verifierFixture, up *verifierdUpstream, path string, wg *sync.WaitGroup, ids []string) {
	t.Helper()
	live := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
	taken := make([]bool, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); taken[i] = g.reportBatched(live, up, path, outcomeReport{id, "paid"}) }()
	}
	wg.Wait()
	for i, id := range ids {
		rec, _ := vf.db.Verification(context.Background(), id)
		if !taken[i] || rec.Payment != store.PaymentPaid {
			t.Errorf("report %s of a buyer still connected: taken=%v, record payment=%q; want taken and paid (only another buyer hung up)", id, taken[i], rec.Payment)
		}
	}
}

// fakeHistory is a FAKE verifierd as the gate's handler chain reaches it,
// following the report protocol of SPEC/README: a paid call carrying
// X-Aov-Settlement: pending is recorded pending and answered with
// X-Aov-Settlement-Report and its verification_id; a call carrying
// X-Aov-Payment: paid without it is recorded paid at once (a run again);
// reports POSTed to /v1/gateway/settlement are final (the first outcome
// wins). It stands in for verifierd where a test needs what the real one
// cannot be made to do on cue: refuse a report once, stall on reports
// alone, or answer past maxHeldAnswer (1 MiB, fakeHistoryBig) so that a
// held record keeps no answer.
type fakeHistory struct{}

var fakeHistoryBig atomic.Bool

// fakeHistoryRefuse is how many report POSTs the fake answers 503 (a
// verifierd blip); fakeHistorySlow makes a paid run take that long;
// fakeHistoryStall holds each report that long (a stalled verifierd
// behind reverse_proxy), until the gate gives up on it, or until the stall
// is lifted (set to 0: verifierd recovers, and takes the reports it held).
var fakeHistoryRefuse atomic.Int32
var fakeHistorySlow atomic.Int64
var fakeHistoryStall atomic.Int64

var fakeHistoryState struct {
	sync.Mutex
	seq     int
	records map[string]string // verification id -> payment (final once not pending)
	order   []string
	reports []string
}

// fakeHistoryReset forgets every record and report.
func fakeHistoryReset() {
	fakeHistoryState.Lock()
	defer fakeHistoryState.Unlock()
	fakeHistoryState.seq, fakeHistoryState.records, fakeHistoryState.order, fakeHistoryState.reports = 0, map[string]string{}, nil, nil
}

func (fakeHistory) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_fake_history", New: func() caddy.Module { return new(fakeHistory) }}
}

func (fakeHistory) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.URL.Path == "/v1/gateway/settlement" {
		b, _ := io.ReadAll(r.Body)
		if d := fakeHistoryStall.Load(); d > 0 {
			// A stalled verifierd behind reverse_proxy: the gate's deadline
			// ends the wait, as does verifierd's recovery.
			for end := time.Now().Add(time.Duration(d)); fakeHistoryStall.Load() > 0 && time.Now().Before(end); {
				select {
				case <-time.After(10 * time.Millisecond):
				case <-r.Context().Done():
					return r.Context().Err()
				}
			}
		}
		if fakeHistoryRefuse.Add(-1) >= 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return nil
		}
		fakeHistoryState.Lock()
		fakeHistoryState.reports = append(fakeHistoryState.reports, string(b))
		for _, id := range fakeHistoryState.order {
			if strings.Contains(string(b), `"`+id+`"`) && fakeHistoryState.records[id] == "pending" {
				switch {
				case strings.Contains(string(b), `"paid"`):
					fakeHistoryState.records[id] = "paid"
				case strings.Contains(string(b), `"unpaid"`):
					fakeHistoryState.records[id] = "unpaid"
				}
			}
		}
		fakeHistoryState.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, err := io.WriteString(w, `{"results":[]}`)
		return err
	}
	io.Copy(io.Discard, r.Body)
	if d := fakeHistorySlow.Load(); d > 0 && r.Header.Get(HeaderUpstreamPayment) == "paid" {
		time.Sleep(time.Duration(d))
	}
	fakeHistoryState.Lock()
	fakeHistoryState.seq++
	id := fmt.Sprintf("ver_fake_%d", fakeHistoryState.seq)
	payment := "unknown"
	if r.Header.Get(HeaderUpstreamPayment) == "paid" {
		payment = "paid"
		if r.Header.Get(HeaderUpstreamSettlement) == "pending" {
			payment = "pending"
		}
	}
	fakeHistoryState.records[id] = payment
	fakeHistoryState.order = append(fakeHistoryState.order, id)
	fakeHistoryState.Unlock()
	w.Header().Set("Content-Type", "application/json")
	if payment == "pending" {
		w.Header().Set(headerSettlementReport, "/v1/gateway/settlement")
	}
	pad := ""
	if fakeHistoryBig.Load() {
		pad = strings.Repeat("a", maxHeldAnswer+1024)
	}
	_, err := fmt.Fprintf(w, `{"verification_id":%q,"passed":true,"payment":%q,"pad":%q}`, id, r.Header.Get(HeaderUpstreamPayment), pad)
	return err
}

func init() {
	caddy.RegisterModule(fakeHistory{})
	httpcaddyfile.RegisterHandlerDirective("test_fake_history", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return fakeHistory{}, nil
	})
}

// fakeHistoryRecords are the records in the order the calls came, and the
// reports taken.
func fakeHistoryRecords() (ids []string, payments []string, reports []string) {
	fakeHistoryState.Lock()
	defer fakeHistoryState.Unlock()
	for _, id := range fakeHistoryState.order {
		ids = append(ids, id)
		payments = append(payments, fakeHistoryState.records[id])
	}
	return ids, payments, slices.Clone(fakeHistoryState.reports)
}

// fakeHistorySite is a site whose route /v1/* is gated (store storeLine,
// facilitator fac) in front of fakeHistory.
func fakeHistorySite(storeLine, fac string) string {
	return fmt.Sprintf(`:{port} {
	route /v1/* {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator %[2]s
			store %[1]s
			public_base_url https://gateway.test
		}
		test_fake_history
	}
}
`, storeLine, fac, payTo.Hex())
}

// A queue is kept only while reports use it: there is one per route the
// gate's requests came by, each client's address among them, and the
// queues of clients long gone would otherwise be kept as long as the
// gate.
func TestAnIdleReportQueueIsDropped(t *testing.T) {
	g := &Gate{logger: zap.NewNop()}
	defer g.stopResolver()
	sink := &reportSink{}
	const path = "/internal/report"
	for i, addr := range []string{"192.0.2.1:1000", "192.0.2.2:1000"} {
		r := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
		r.RemoteAddr = addr
		if !g.reportBatched(r, caddyhttp.Handler(sink), path, outcomeReport{VerificationID: fmt.Sprint("v", i), Payment: "paid"}) {
			t.Fatalf("the report from %s was not taken", addr)
		}
	}
	if got := sink.got(); len(got) != 2 {
		t.Fatalf("upstream got %v, want each report in a request of its own", got)
	}
	reportQueues.Range(func(k, _ any) bool {
		if k.(reportQueueKey).g == g {
			t.Errorf("an idle queue is still kept: %+v", k)
		}
		return true
	})
}
