package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuTime is this process's user and system CPU time: the budgets are
// about work, so they are measured with the process's own counters, never
// with a wall clock.
func cpuTime(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The hostile requests of the verification budgets, at verifierd: refused
// or answered within their budgets, nothing recorded for a refusal.
func TestHostileVerificationsStayWithinBudgets(t *testing.T) {
	f := newFixture(t, fixtureOpts{})

	t.Run("a pattern too costly for its string is a 422, at a fraction of the CPU", func(t *testing.T) {
		// Before budgets this request cost about a minute of CPU.
		body := []byte(`{"task_id":"t","expected_schema":{"type":"object","properties":{"s":{"type":"string",` +
			`"pattern":"(?:a?){1000}a{1000}b"}}},"submitted_output":{"s":"` + strings.Repeat("a", 1<<20-200) + `"}}`)
		before := cpuTime(t)
		w := f.do("POST", "/verify/schema", body, map[string]string{"X-Aov-Gateway-Token": gatewayToken})
		spent := cpuTime(t) - before
		m := decode(t, w)
		if w.Code != http.StatusUnprocessableEntity || m["code"] != "invalid_request" || m["charged"] != false ||
			!strings.Contains(m["message"].(string), "expected_schema needs more than 10000000 units of regular-expression work") {
			t.Fatalf("status %d %v", w.Code, m)
		}
		if strings.Contains(w.Body.String(), "aaaa") {
			t.Error("the refusal echoes the output")
		}
		if spent > 10*time.Second {
			t.Errorf("the refusal cost %v of CPU; the budget should stop it before any match runs", spent)
		}
		t.Logf("CPU for the hostile pattern: %v", spent)
	})

	t.Run("a flood of failures is answered with capped lists and bounded allocation", func(t *testing.T) {
		body := []byte(`{"task_id":"t","expected_schema":{"type":"array","items":{"type":"string"}},"submitted_output":[` +
			strings.TrimSuffix(strings.Repeat("1,", 200_000), ",") + `]}`)
		var a, b runtime.MemStats
		runtime.ReadMemStats(&a)
		w := f.do("POST", "/verify/schema", body, map[string]string{"X-Aov-Gateway-Token": gatewayToken})
		runtime.ReadMemStats(&b)
		m := decode(t, w)
		if w.Code != http.StatusOK || m["result"] != "fail" || m["errors_total"] != 200_000.0 || len(m["errors"].([]any)) != 50 {
			t.Fatalf("status %d, result %v, errors_total %v", w.Code, m["result"], m["errors_total"])
		}
		// Describing every failure allocated about 0.6 KB each (236 MB in all
		// here); the validator's own error tree (about 400 B each) remains.
		if alloc := b.TotalAlloc - a.TotalAlloc; alloc > 180<<20 {
			t.Errorf("200,000 failures allocated %d MB; want the descriptions capped", alloc>>20)
		} else {
			t.Logf("200,000 failures allocated %d MB", alloc>>20)
		}
	})

	t.Run("a caller that goes away stops the verification: 503, nothing recorded", func(t *testing.T) {
		before := len(f.allRecords(t))
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r := newRequest("POST", "/verify/schema", invoice("129.5", ""), map[string]string{"X-Aov-Gateway-Token": gatewayToken}).WithContext(ctx)
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		m := decode(t, w)
		if w.Code != http.StatusServiceUnavailable || m["code"] != "verification_timeout" || m["retryable"] != true || w.Header().Get("Retry-After") != "1" {
			t.Fatalf("status %d %v", w.Code, m)
		}
		if after := len(f.allRecords(t)); after != before {
			t.Errorf("a stopped verification was recorded (%d → %d records)", before, after)
		}
	})
}
