package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/aovhq/aov/store"
)

// garblingUpstream is a FAKE in front of the real verifierd: it forwards
// every report to it, and answers a batch with a status and body of its
// own instead of verifierd's (a proxy, or a broken build, answering a
// success that is not one result per report). verifierd never sends such
// an answer, so nothing else produces it.
type garblingUpstream struct {
	*verifierdUpstream
	status int
	body   string

	mu      sync.Mutex
	singles []string // the ids reported alone
}

func (u *garblingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	var doc struct {
		outcomeReport
		Reports []outcomeReport `json:"reports"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	if doc.Reports == nil {
		u.mu.Lock()
		u.singles = append(u.singles, doc.VerificationID)
		u.mu.Unlock()
		return u.verifierdUpstream.ServeHTTP(w, r)
	}
	if err := u.verifierdUpstream.ServeHTTP(httptest.NewRecorder(), r); err != nil {
		return err
	}
	w.WriteHeader(u.status)
	_, err = io.WriteString(w, u.body)
	return err
}

func (u *garblingUpstream) alone() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Sorted(slices.Values(u.singles))
}

// A success answer to a batch that is not the per report shape verifierd
// sends (204, or 200 {"results": [...]} with one known result per report)
// does not say which reports were recorded: the batch is treated as
// failed, logged once, and each of its reports is sent again alone, as
// after a 5xx. Before, any 200 was taken as every report recorded and
// counted as reported, with nothing logged. The reports reach a real
// verifierd (through the fake that garbles the batch's answer), which
// records each once whatever is resent; each is counted as reported once.
func TestGarbledBatchAnswerIsNotTakenAsRecorded(t *testing.T) {
	old := reportRetries
	reportRetries = []time.Duration{10 * time.Millisecond, 10 * time.Millisecond}
	defer func() { reportRetries = old }()
	vf := startVerifier(t)
	pending := func() string { return vf.pendingPaid(t) }
	const path = "/v1/gateway/settlement"
	for _, tc := range []struct {
		name   string
		status int
		body   string
		taken  bool // the one shape that says what happened to each
	}{
		{"one result per report", http.StatusOK, `{"results":["recorded","final"]}`, true},
		{"one result for two", http.StatusOK, `{"results":["not_found"]}`, false},
		{"three results for two", http.StatusOK, `{"results":["recorded","not_found","final"]}`, false},
		{"truncated", http.StatusOK, `{"results":`, false},
		{"a proxy's page", http.StatusOK, `<html>502 from a proxy that said 200</html>`, false},
		{"no body", http.StatusOK, ``, false},
		{"not a result", http.StatusOK, `{"results":["recorded","paid"]}`, false},
		{"another member", http.StatusOK, `{"results":["recorded","final"],"more":true}`, false},
		{"two documents", http.StatusOK, `{"results":["recorded","final"]}{"results":[]}`, false},
		{"another success", http.StatusAccepted, ``, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, a, b := pending(), pending(), pending()
			core, logs := observer.New(zap.WarnLevel)
			g := &Gate{logger: zap.New(core)}
			defer g.stopResolver()
			up := &garblingUpstream{status: tc.status, body: tc.body,
				verifierdUpstream: &verifierdUpstream{url: vf.srv.URL, wait: func() bool { return queued(g, path) == 2 }}}
			before := reportedCount(t, "reported_paid")
			r := httptest.NewRequest(http.MethodPost, "/verify/schema", nil)
			var wg sync.WaitGroup
			for _, id := range []string{first, a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					g.report(r, up, path, id, store.PaymentPaid)
				}()
				if id == first {
					for !up.first.Load() {
						time.Sleep(time.Millisecond)
					}
				}
			}
			wg.Wait()
			want := []string{first}
			if !tc.taken {
				want = slices.Sorted(slices.Values([]string{first, a, b})) // a and b again, alone
			}
			for deadline := time.Now().Add(5 * time.Second); !slices.Equal(up.alone(), want) && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond) // past the retries: a resend of a taken report would show
			if got := up.alone(); !slices.Equal(got, want) {
				t.Fatalf("reports sent alone %v, want %v", got, want)
			}
			for _, id := range []string{first, a, b} {
				if rec, err := vf.db.Verification(context.Background(), id); err != nil || rec.Payment != store.PaymentPaid {
					t.Errorf("record %s: %+v, %v; want paid", id, rec, err)
				}
			}
			if d := reportedCount(t, "reported_paid") - before; d != 3 {
				t.Errorf("%v outcomes counted as reported, want 3 (each once)", d)
			}
			wantLogs := 0
			if !tc.taken {
				wantLogs = 1
			}
			if logs.Len() != wantLogs {
				t.Errorf("logged %+v, want %d entry", logs.All(), wantLogs)
			}
		})
	}
}

// batchResults takes a batch's answer only in the shapes verifierd sends
// (verifierd/server's settlementResults): a 204, or 200 with one known
// result per report and nothing else.
func TestBatchResultsShapes(t *testing.T) {
	for _, tc := range []struct {
		status   int
		body     string
		notFound []bool
		ok       bool
	}{
		{http.StatusNoContent, ``, nil, true},
		{http.StatusOK, `{"results":["recorded","final"]}`, nil, true},
		{http.StatusOK, ` {"results": ["recorded", "not_found"]}` + "\n", []bool{false, true}, true},
		{http.StatusOK, `{"results":["not_found"]}`, nil, false},
		{http.StatusOK, `{"results":["recorded","not_found","final"]}`, nil, false},
		{http.StatusOK, `{"results":`, nil, false},
		{http.StatusOK, `<html>502 from a proxy that said 200</html>`, nil, false},
		{http.StatusOK, `{"results":["recorded",null]}`, nil, false},
		{http.StatusOK, `{"results":null}`, nil, false},
		{http.StatusOK, `{}`, nil, false},
		{http.StatusOK, `{"results":["recorded","final"]} x`, nil, false},
		{http.StatusCreated, `{"results":["recorded","final"]}`, nil, false},
	} {
		notFound, ok := batchResults(tc.status, []byte(tc.body), 2)
		if ok != tc.ok || !slices.Equal(notFound, tc.notFound) {
			t.Errorf("%d %q: %v, %v; want %v, %v", tc.status, tc.body, notFound, ok, tc.notFound, tc.ok)
		}
	}
}

// FuzzBatchResults: an answer is taken only when it is a 204, or a 200
// whose body is one JSON object of the member "results" alone with one
// known result per report, and notFound then marks exactly the not_found
// ones; every such answer is taken. Never a panic.
func FuzzBatchResults(f *testing.F) {
	for _, s := range []string{`{"results":["recorded","final"]}`, `{"results":["not_found","recorded","final"]}`,
		`{"results":["recorded"]}`, `{"results":`, `<html></html>`, ``, `{"results":["recorded","final"],"x":1}`,
		`{"Results":["final","final"]}`, `{"results":["recorded","final"]}{}`, `{"results":[null,"final"]}`} {
		f.Add(http.StatusOK, []byte(s), uint8(2))
	}
	f.Add(http.StatusNoContent, []byte(nil), uint8(3))
	f.Fuzz(func(t *testing.T, status int, body []byte, n uint8) {
		if n < 2 {
			return // a batch has two reports or more
		}
		notFound, ok := batchResults(status, body, int(n))
		// The oracle: the exact shape, read another way.
		var doc map[string]json.RawMessage
		var results []*string
		exact := status == http.StatusOK && json.Unmarshal(body, &doc) == nil && len(doc) == 1 &&
			doc["results"] != nil && json.Unmarshal(doc["results"], &results) == nil && len(results) == int(n)
		for _, r := range results {
			exact = exact && r != nil && (*r == reportRecorded || *r == reportFinal || *r == reportNotFound)
		}
		switch {
		case status == http.StatusNoContent:
			if !ok || notFound != nil {
				t.Fatalf("204: %v, %v", notFound, ok)
			}
		case exact:
			if !ok {
				t.Fatalf("%q refused", body)
			}
			for i, r := range results {
				if (notFound != nil && notFound[i]) != (*r == reportNotFound) {
					t.Fatalf("%q: notFound %v", body, notFound)
				}
			}
		case ok:
			// Taken, yet not the exact shape: only a member named
			// "results" in another case is allowed (encoding/json
			// matches names so), with the same results.
			if status != http.StatusOK || !json.Valid(body) || len(notFound) != 0 && len(notFound) != int(n) {
				t.Fatalf("%d %q taken: %v", status, body, notFound)
			}
			for k := range doc {
				if !strings.EqualFold(k, "results") {
					t.Fatalf("%q taken with member %q", body, k)
				}
			}
		}
	})
}
