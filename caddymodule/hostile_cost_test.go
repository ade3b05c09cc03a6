package caddymodule

import (
	"net/http"
	"runtime"
	rtmetrics "runtime/metrics"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hostileCosts are unpaid requests that once bought unbounded work at the
// gate: it evaluated every request before demanding payment.
var hostileCosts = []struct {
	desc string
	body func() string
}{
	{"a pathological pattern over a long string", func() string {
		return `{"task_id":"t","expected_schema":{"type":"string","pattern":"(?:a?){1000}a{1000}b"},"submitted_output":"` + strings.Repeat("a", 1_000_000) + `"}`
	}},
	{"an 880 KiB request with many failing items", func() string {
		return `{"task_id":"t","expected_schema":{"type":"array","items":{"type":"string","minLength":3}},"submitted_output":[` + strings.Repeat("1,", 450_000) + `1]}`
	}},
}

// processCost is what the whole test process (Caddy in it) spent on one
// request: CPU time from the kernel's own accounting, bytes allocated and
// the peak of live heap objects above the level before the request.
type processCost struct {
	cpu       time.Duration
	allocated uint64
	peakHeap  uint64
}

func cpuTime(t testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func heapObjects() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64()
}

// measure runs fn and reports its process cost. The peak heap is sampled
// every millisecond while fn runs.
func measure(t testing.TB, fn func()) processCost {
	runtime.GC()
	base := heapObjects()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	alloc0 := ms.TotalAlloc
	stop := make(chan struct{})
	var peak uint64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			if h := heapObjects(); h > peak {
				peak = h
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	cpu0 := cpuTime(t)
	fn()
	cpu := cpuTime(t) - cpu0
	close(stop)
	wg.Wait()
	runtime.ReadMemStats(&ms)
	c := processCost{cpu: cpu, allocated: ms.TotalAlloc - alloc0}
	if peak > base {
		c.peakHeap = peak - base
	}
	return c
}

func TestHostileUnpaidRequestsCostTheGateLittle(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, ""))
	url := base + "/verify/schema"
	// Budgets per request, far above what strict parsing and compiling
	// cost and far below what evaluating these requests costs.
	const (
		cpuBudget  = 2 * time.Second
		heapBudget = 96 << 20
	)
	for _, tc := range hostileCosts {
		t.Run(tc.desc, func(t *testing.T) {
			body := tc.body()
			var status int
			c := measure(t, func() {
				resp := post(t, url, body, nil)
				status = resp.StatusCode
				resp.Body.Close()
			})
			t.Logf("%s: %d bytes, status %d, CPU %v, allocated %d MiB, peak heap +%d MiB", tc.desc, len(body), status, c.cpu, c.allocated>>20, c.peakHeap>>20)
			if status != http.StatusPaymentRequired {
				t.Errorf("status %d, want 402 (valid, unpaid, too large for the free tier)", status)
			}
			if c.cpu > cpuBudget {
				t.Errorf("the process spent %v of CPU on one unpaid request (budget %v)", c.cpu, cpuBudget)
			}
			if c.peakHeap > heapBudget {
				t.Errorf("live heap grew by %d MiB for one unpaid request (budget %d MiB)", c.peakHeap>>20, heapBudget>>20)
			}
		})
	}
	if up.calls.Load() != 0 {
		t.Errorf("the upstream ran %d times for unpaid requests", up.calls.Load())
	}
}
