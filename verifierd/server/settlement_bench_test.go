package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/callers"
	"github.com/aovhq/aov/store"
)

// BenchmarkSettlementReport is the gateway's report of a paid call's
// outcome (POST /v1/gateway/settlement), the second history write every
// paid call makes: one outcome at a time, and batches of 16 (the gateway
// sends the reports that arrive while one is in flight together), with the
// history write synced and with -no-sync. The pending records are written
// before the timer starts (concurrently, so their synced writes share
// commits). ns/op and cpu-ns/op are per report request, ns/outcome per
// outcome reported.
func BenchmarkSettlementReport(b *testing.B) {
	ctx := context.Background()
	hdr := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "Content-Type": "application/json"}
	for _, sync := range []struct {
		name   string
		noSync bool
	}{{"fsync", false}, {"nosync", true}} {
		for _, batch := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/batch=%d", sync.name, batch), func(b *testing.B) {
				f := newFixture(b, fixtureOpts{noSync: sync.noSync, localSigner: true})
				at := time.Now().UTC()
				ids := make([]string, b.N*batch)
				for i := range ids {
					ids[i] = fmt.Sprintf("%08x-0000-4000-8000-%012x", i/(1<<16), i)
				}
				next := make(chan string, len(ids))
				for _, id := range ids {
					next <- id
				}
				close(next)
				if _, err := callers.Run(32, len(ids), func(int) error {
					return f.db.RecordVerification(ctx, store.Verification{ID: <-next, VerifiedAt: at, AgentID: "seller-7",
						TaskID: "t", Result: "pass", Payment: store.PaymentPending})
				}); err != nil {
					b.Fatal(err)
				}
				bodies := make([][]byte, b.N)
				for i := range bodies {
					type report struct {
						ID      string `json:"verification_id"`
						Payment string `json:"payment"`
					}
					reps := make([]report, batch)
					for j := range reps {
						reps[j] = report{ids[i*batch+j], store.PaymentPaid}
					}
					if batch == 1 {
						bodies[i], _ = json.Marshal(reps[0])
					} else {
						bodies[i], _ = json.Marshal(map[string]any{"reports": reps})
					}
				}
				b.ReportAllocs()
				cpu := startCPU()
				b.ResetTimer()
				for i := range b.N {
					if w := f.do(http.MethodPost, "/v1/gateway/settlement", bodies[i], hdr); w.Code != http.StatusNoContent {
						b.Fatalf("status %d: %s", w.Code, w.Body)
					}
				}
				b.StopTimer()
				cpu.report(b)
				b.ReportMetric(float64(b.Elapsed())/float64(b.N*batch), "ns/outcome")
				if rec, err := f.db.Verification(ctx, ids[len(ids)-1]); err != nil || rec.Payment != store.PaymentPaid {
					b.Fatalf("the last outcome was not recorded: %+v, %v", rec, err)
				}
			})
		}
	}
}
