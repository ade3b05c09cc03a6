package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
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

	t.Run("rules over the integrity-work budget are a 422 before any check runs, nothing recorded", func(t *testing.T) {
		// Before the budget, Check spent about 7 s of CPU on this request,
		// after the time limit and outside the concurrency slots.
		out, _ := numbersOutput(1<<20 - 8000)
		body := rulesBody(strings.Repeat(`{"type":"unique","field":"a[]"},`, 99)+`{"type":"unique","field":"a[]"}`, out)
		before := len(f.allRecords(t))
		w := f.do("POST", "/verify/schema", body, map[string]string{"X-Aov-Gateway-Token": gatewayToken})
		m := decode(t, w)
		if w.Code != http.StatusUnprocessableEntity || m["code"] != "invalid_request" || m["charged"] != false ||
			!strings.Contains(m["message"].(string), "rules need more than 16777216 units of integrity-check work") {
			t.Fatalf("status %d %v", w.Code, m)
		}
		if strings.Contains(w.Body.String(), "0.5,") {
			t.Error("the refusal echoes the output")
		}
		if after := len(f.allRecords(t)); after != before {
			t.Errorf("a refused verification was recorded (%d → %d records)", before, after)
		}
	})

	t.Run("a 1 MiB output under a handful of rules is checked", func(t *testing.T) {
		out, sum := numbersOutput(1<<20 - 2000)
		body := rulesBody(`{"type":"sum_equals","field":"a[]","equals":`+strconv.FormatFloat(sum, 'f', 1, 64)+`,"tolerance":1},`+
			`{"type":"gte","field":"a[]","value":0},{"type":"unique","field":"a[]"},{"type":"exists_in","field":"a[]","in_field":"a[]"}`, out)
		w := f.do("POST", "/verify/schema", body, map[string]string{"X-Aov-Gateway-Token": gatewayToken})
		m := decode(t, w)
		if w.Code != http.StatusOK || m["result"] != "pass" {
			t.Fatalf("status %d, result %v, errors %v", w.Code, m["result"], m["errors"])
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

// numbersOutput is an output {"a": [0.5, 1.5, ...]} of about size bytes,
// and the sum of its numbers.
func numbersOutput(size int) (string, float64) {
	var b strings.Builder
	b.WriteString(`{"a":[`)
	sum := 0.0
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(i))
		b.WriteString(".5")
		sum += float64(i) + 0.5
	}
	b.WriteString(`]}`)
	return b.String(), sum
}

func rulesBody(rules, output string) []byte {
	return []byte(`{"task_id":"t","expected_schema":{"type":"object"},"rules":[` + rules + `],"submitted_output":` + output + `}`)
}
