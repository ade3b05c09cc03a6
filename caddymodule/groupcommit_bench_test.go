package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// BenchmarkFreePathParallel is the gate's free path under 8 and 32
// concurrent clients, with the store's fsync on and off. Every client is
// 127.0.0.1, so every call reserves and commits on the same allowance
// counter: the case group commit is for (concurrent calls share one commit
// and one flush, and never conflict). ns/op is wall time per call across
// all clients; compare fsync with nosync within one run.
func BenchmarkFreePathParallel(b *testing.B) {
	for _, clients := range []int{8, 32} {
		for _, m := range []struct{ name, opts string }{
			{"fsync", ""},
			{"nosync", "{\n\t\t\tno_sync\n\t\t}"},
		} {
			b.Run(fmt.Sprintf("clients=%d/%s", clients, m.name), func(b *testing.B) {
				up := benchUpstream(b)
				base := startCaddy(b, fmt.Sprintf(`:{port} {
	x402 {
		accept base $0.02 0x1111111111111111111111111111111111111111
		facilitator instant_benchmark_only
		store badger {data}/gate %s
		free_allowance {
			per_day 1000000000
		}
		rate_limit 1000000000 1m # never reached; counting each free call is part of the path
	}
	reverse_proxy %s
}
`, m.opts, up))
				client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
				url := base + "/verify/schema"
				b.ReportAllocs()
				b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
						req.Header.Set("Content-Type", "application/json")
						resp, err := client.Do(req)
						if err != nil {
							b.Error(err)
							return
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							b.Errorf("status %d", resp.StatusCode)
							return
						}
					}
				})
			})
		}
	}
}
