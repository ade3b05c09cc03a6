package e2e

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

// BenchmarkVerification is one passing verification of the SPEC §10
// invoice (checked, signed by certd, recorded in Badger) on a real stack,
// through Caddy (x402 gate with the free allowance, proxy) and directly at
// verifierd: the difference of the two ns/op is what the gateway adds to one
// call. make load measures the same under concurrency.
func BenchmarkVerification(b *testing.B) {
	s := newStack(b, "AOV_FREE_PER_DAY=1000000000", "AOV_GATE_RATE=1000000000")
	body := example(b, "invoice-fixed.json")
	for _, tc := range []struct{ name, url string }{
		{"through_caddy", s.url("/verify/schema")},
		{"direct", "http://" + s.verifierdAddr + "/verify/schema"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				resp, err := client.Post(tc.url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
