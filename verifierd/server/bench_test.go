package server_test

import (
	"bytes"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
)

// BenchmarkVerifyInvoice is one verification of the SPEC §10 invoice end to
// end in process: parse, check, sign by a real certd over its unix socket,
// record in Badger, answer.
func BenchmarkVerifyInvoice(b *testing.B) {
	for _, c := range []struct {
		name   string
		noSync bool
	}{
		{"fsync", false},
		{"nosync", true},
	} {
		b.Run(c.name, func(b *testing.B) {
			f := newFixture(b, fixtureOpts{noSync: c.noSync})
			body := invoice("135.0", "")
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				w := f.do(http.MethodPost, "/verify/schema", body, nil)
				if w.Code != http.StatusOK {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}

// BenchmarkVerifyInvoiceParallel is the same with 8 callers per CPU, each
// for its own agent: parsing, checking and signing overlap, while the
// history commits queue on the disk (one flush per commit).
func BenchmarkVerifyInvoiceParallel(b *testing.B) {
	f := newFixture(b, fixtureOpts{})
	var next atomic.Int32
	b.ReportAllocs()
	b.SetParallelism(8)
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
