package server_test

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/callers"
	"github.com/aovhq/aov/verify"
)

// BenchmarkVerifyRatio puts two of the service's targets on one line each,
// measured in the same run: a whole verifierd request in process (parse,
// check, sign with the in-process signer, record, answer) against the
// verification core of the same request (parse with the four hashes,
// check), and the same request with its history write durable against
// -no-sync. It runs alone (clients=1) and with 8 and 32 callers at once,
// each caller for its own agent. Each run makes b.N calls of each kind in
// alternating rounds on the same processors, so the other work of a shared
// machine weighs on all three alike, and reports:
//
//   - request/core: the whole request's time per call over the core's
//     (the target is at most 3);
//   - durable/nosync: the durable request's throughput as a share of the
//     -no-sync one's (the target is at least 0.7);
//
// with each kind's wall time per call.
func BenchmarkVerifyRatio(b *testing.B) {
	at := time.Now()
	for _, clients := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			v := verify.New(verify.Config{VerifierVersion: "test"})
			nosync := newFixture(b, fixtureOpts{noSync: true, localSigner: true})
			durable := newFixture(b, fixtureOpts{localSigner: true})
			bodies := make([][]byte, clients)
			for i := range bodies {
				bodies[i] = bytes.Replace(invoice("135.0", ""), []byte(`"seller-7"`), []byte(fmt.Sprintf(`"seller-%d"`, i)), 1)
			}
			core := func(client int) error {
				req, err := v.Parse(bodies[client])
				if err != nil {
					return err
				}
				if res := v.Check(req, "3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", at); res.Result != "fail" {
					return fmt.Errorf("result %s", res.Result)
				}
				return nil
			}
			request := func(f *fixture) func(int) error {
				return func(client int) error {
					if w := f.do(http.MethodPost, "/verify/schema", bodies[client], nil); w.Code != http.StatusOK {
						return fmt.Errorf("status %d: %s", w.Code, w.Body)
					}
					return nil
				}
			}
			kinds := []func(int) error{core, request(nosync), request(durable)}
			var wall [3]time.Duration
			b.ReportAllocs()
			callers.Rounds(b.N, len(kinds), func(kind, calls int) {
				w, err := callers.Run(clients, calls, kinds[kind])
				if err != nil {
					b.Fatal(err)
				}
				wall[kind] += w
			})
			b.ReportMetric(float64(wall[1])/float64(wall[0]), "request/core")
			b.ReportMetric(float64(wall[1])/float64(wall[2]), "durable/nosync")
			b.ReportMetric(float64(wall[0])/float64(b.N), "core-ns/op")
			b.ReportMetric(float64(wall[1])/float64(b.N), "request-ns/op")
			b.ReportMetric(float64(wall[2])/float64(b.N), "durable-ns/op")
		})
	}
}
