package server_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/verify"
)

// BenchmarkVerifyInvoice is one verification of the SPEC §10 invoice end to
// end in process: parse, check, sign by a real certd over its unix socket
// (or, "inprocess", by the in-process signer with the same keys), record in
// Badger, answer. "core" is the verification alone (parse with the four
// hashes, check) of the same request, the baseline the whole request is
// measured against in the same run.
func BenchmarkVerifyInvoice(b *testing.B) {
	b.Run("core", func(b *testing.B) {
		v := verify.New(verify.Config{VerifierVersion: "test"})
		body := invoice("135.0", "")
		at := time.Now()
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		cpu := startCPU()
		for b.Loop() {
			req, err := v.Parse(body)
			if err != nil {
				b.Fatal(err)
			}
			if res := v.Check(req, "3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", at); res.Result != "fail" {
				b.Fatalf("result %s", res.Result)
			}
		}
		cpu.report(b)
	})
	// "harness" is what the rows below spend outside the server: the test
	// request built and parsed (httptest.NewRequest), the recorder and
	// the copy of a response of the same size into it. A daemon's
	// net/http has its own (pooled) versions of these.
	b.Run("harness", func(b *testing.B) {
		f := newFixture(b, fixtureOpts{noSync: true, localSigner: true})
		body := invoice("135.0", "")
		doc := f.do(http.MethodPost, "/verify/schema", body, nil).Body.Bytes()
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = []string{"application/json"}
			w.WriteHeader(http.StatusOK)
			w.Write(doc)
		})
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		cpu := startCPU()
		for b.Loop() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, newRequest(http.MethodPost, "/verify/schema", body, nil))
			if w.Code != http.StatusOK {
				b.Fatalf("status %d", w.Code)
			}
		}
		cpu.report(b)
	})
	for _, c := range []struct {
		name          string
		noSync, local bool
	}{
		{"fsync", false, false},
		{"nosync", true, false},
		{"fsync-inprocess", false, true},
		{"nosync-inprocess", true, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			f := newFixture(b, fixtureOpts{noSync: c.noSync, localSigner: c.local})
			body := invoice("135.0", "")
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			cpu := startCPU()
			for b.Loop() {
				w := f.do(http.MethodPost, "/verify/schema", body, nil)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
			cpu.report(b)
		})
	}
}

// cpuClock is the process's CPU time (user + system, every goroutine: the
// in-process certd and Badger's own goroutines included) from startCPU on.
// Reported per op as cpu-ns/op, it is the cost of a request that other work
// on a shared machine does not inflate, as it inflates wall time by
// delaying every hand-off between goroutines.
type cpuClock time.Duration

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func startCPU() cpuClock { return cpuClock(processCPU()) }

func (c cpuClock) report(b *testing.B) {
	b.ReportMetric(float64(processCPU()-time.Duration(c))/float64(b.N), "cpu-ns/op")
}

// BenchmarkVerifyInvoiceParallel is the same with 8 and 32 concurrent
// callers, each for its own agent, with and without fsync: parsing,
// checking and signing overlap, and the history writes of concurrent
// callers share one commit and one fsync (group commit). ns/op is wall
// time per request across all callers; compare fsync with nosync within
// one run.
func BenchmarkVerifyInvoiceParallel(b *testing.B) {
	for _, clients := range []int{8, 32} {
		// The core (parse and check) with as many callers: the baseline of
		// the rows below, whose CPU per request is lower than sequentially
		// (Badger's commits are shared, its goroutines wake less often).
		b.Run(fmt.Sprintf("clients=%d/core", clients), func(b *testing.B) {
			v := verify.New(verify.Config{VerifierVersion: "test"})
			at := time.Now()
			b.ReportAllocs()
			b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
			cpu := startCPU()
			defer cpu.report(b)
			b.RunParallel(func(pb *testing.PB) {
				body := invoice("135.0", "")
				for pb.Next() {
					req, err := v.Parse(body)
					if err != nil {
						b.Error(err)
						return
					}
					if res := v.Check(req, "3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", at); res.Result != "fail" {
						b.Errorf("result %s", res.Result)
						return
					}
				}
			})
		})
		for _, c := range []struct {
			name          string
			noSync, local bool
		}{
			{"fsync", false, false},
			{"nosync", true, false},
			{"fsync-inprocess", false, true},
			{"nosync-inprocess", true, true},
		} {
			b.Run(fmt.Sprintf("clients=%d/%s", clients, c.name), func(b *testing.B) {
				f := newFixture(b, fixtureOpts{noSync: c.noSync, localSigner: c.local})
				var next atomic.Int32
				b.ReportAllocs()
				b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				cpu := startCPU()
				defer cpu.report(b)
				b.RunParallel(func(pb *testing.PB) {
					agent := fmt.Sprintf(`"seller-%d"`, next.Add(1))
					body := bytes.Replace(invoice("135.0", ""), []byte(`"seller-7"`), []byte(agent), 1)
					for pb.Next() {
						w := f.do(http.MethodPost, "/verify/schema", body, nil)
						if w.Code != http.StatusOK {
							b.Errorf("status %d", w.Code)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkRefusal is the cost of a malformed request: nothing is signed
// or recorded.
func BenchmarkRefusal(b *testing.B) {
	f := newFixture(b, fixtureOpts{})
	body := []byte(`{"task_id":"x","expected_schema":{},"submitted_output":1,"rules":[{"type":"nope"}]}`)
	b.ReportAllocs()
	for b.Loop() {
		w := f.do(http.MethodPost, "/verify/schema", body, nil)
		if w.Code != http.StatusUnprocessableEntity {
			b.Fatalf("status %d", w.Code)
		}
	}
}
