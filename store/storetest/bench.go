package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// Concurrency is the numbers of concurrent callers the benchmarks run at.
var Concurrency = []int{1, 16, 64}

// parallel runs op b.N times over c goroutines and reports throughput and
// the p50 and p99 latency of one op.
func parallel(b *testing.B, c int, op func(i int) error) {
	b.ReportAllocs()
	lat := make([]time.Duration, b.N)
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	b.ResetTimer()
	start := time.Now()
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= b.N {
					return
				}
				t0 := time.Now()
				if err := op(i); err != nil {
					failed.Store(err)
					return
				}
				lat[i] = time.Since(t0)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "ops/s")
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkGateway measures reserve+commit of the free allowance (each
// caller its own client, as requests from many IPs are) and a payment claim
// of two fresh keys, at each Concurrency.
func BenchmarkGateway(b *testing.B, gw Gateway) {
	ctx := context.Background()
	day := time.Now()
	run := fmt.Sprint(time.Now().UnixNano())
	var seq atomic.Int64 // claim keys are never reused, whatever b.N runs
	for _, c := range Concurrency {
		b.Run(fmt.Sprintf("reserve+commit/c=%d", c), func(b *testing.B) {
			parallel(b, c, func(i int) error {
				r, err := gw.Allowance.Reserve(ctx, "bench", fmt.Sprintf("%s-%d-%d", run, c, i%1000), day, 1<<30)
				if err != nil {
					return err
				}
				return gw.Allowance.Commit(ctx, r)
			})
		})
		b.Run(fmt.Sprintf("claim/c=%d", c), func(b *testing.B) {
			parallel(b, c, func(int) error {
				k := fmt.Sprintf("%s-%d", run, seq.Add(1))
				_, err := gw.Claims.Claim(ctx, []string{"payload:" + k, "nonce:" + k}, time.Now().Add(time.Minute))
				return err
			})
		})
	}
}

// BenchmarkHistory measures recording a verification (concurrent callers,
// one agent: the counts row is the hot spot) and reading a page of 20 of
// that agent's records.
func BenchmarkHistory(b *testing.B, h History) {
	ctx := context.Background()
	run := fmt.Sprint(time.Now().UnixNano())
	base := time.Now()
	var seq atomic.Int64
	for _, c := range []int{1, 16} {
		b.Run(fmt.Sprintf("record/c=%d", c), func(b *testing.B) {
			parallel(b, c, func(int) error {
				n := seq.Add(1)
				return h.RecordVerification(ctx, Sample(fmt.Sprintf("%s-%d", run, n), "bench-agent", base.Add(time.Duration(n)), "pass"))
			})
		})
	}
	for n := seq.Load(); n < 200; n = seq.Add(1) {
		if err := h.RecordVerification(ctx, Sample(fmt.Sprintf("%s-%d", run, n), "bench-agent", base.Add(time.Duration(n)), "pass")); err != nil && !errors.Is(err, store.ErrDuplicate) {
			b.Fatal(err)
		}
	}
	b.Run("page", func(b *testing.B) {
		parallel(b, 1, func(int) error {
			vs, _, err := h.Verifications(ctx, "bench-agent", "", 20)
			if err == nil && len(vs) != 20 {
				err = fmt.Errorf("a page of %d", len(vs))
			}
			return err
		})
	})
}
