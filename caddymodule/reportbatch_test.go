package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
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
	v, ok := reportQueues.Load(reportQueueKey{g, path})
	if !ok {
		return 0
	}
	q := v.(*reportQueue)
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting)
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
	if _, ok := reportQueues.Load(reportQueueKey{g, path}); ok {
		reportQueues.Delete(reportQueueKey{g, path})
		t.Fatal("a report queue keyed by a cleaned-up gate was created after its Cleanup; nothing drops it (it pins the old gate)")
	}
}
