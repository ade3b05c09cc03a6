package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// The pieces of the gate's own work on a paid call, each alone, so a change
// to one shows apart from the store's and the proxy's share
// (BenchmarkGatePaidDirect is them all together).

func benchPayment(b *testing.B) (string, x402.PaymentPayload, x402.PaymentRequirements) {
	usdc, _ := x402.USDC(x402.NetworkBase)
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkBase, Amount: "20000", Asset: usdc.Address, PayTo: "0x1111111111111111111111111111111111111111", MaxTimeoutSeconds: 60, Extra: usdc.Extra()}
	h := signHeader(b, 1, offer, "http://example.com")
	p, err := x402.DecodePaymentSignature(h)
	if err != nil {
		b.Fatal(err)
	}
	return h, p, offer
}

// BenchmarkPaidDecode is the PAYMENT-SIGNATURE decode and check.
func BenchmarkPaidDecode(b *testing.B) {
	h, _, _ := benchPayment(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := x402.DecodePaymentSignature(h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPaidClaimKeys is reading the authorization (ExactEVMValues) and
// naming it for the replay guard.
func BenchmarkPaidClaimKeys(b *testing.B) {
	h, p, offer := benchPayment(b)
	b.ReportAllocs()
	for b.Loop() {
		v, err := x402.ExactEVMValues(p)
		if err != nil {
			b.Fatal(err)
		}
		if keys, _ := claimKeys(h, offer, &v, nil); len(keys) != 2 {
			b.Fatal(keys)
		}
	}
}

// BenchmarkPaidHeaders is PAYMENT-RESPONSE and the other headers of a paid
// answer.
func BenchmarkPaidHeaders(b *testing.B) {
	g := &Gate{}
	sr := x402.SettleResponse{Success: true, Payer: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8",
		Transaction: "0x5c504ed432cb51138bcf09aa5e8a410dd4a1e204ef84bfed1be16dfba1b22060", Network: x402.NetworkBase}
	b.ReportAllocs()
	for b.Loop() {
		h := make(http.Header, 4)
		g.setPaidHeaders(h, sr)
		if h.Get(x402.HeaderPaymentResponse) == "" {
			b.Fatal("no PAYMENT-RESPONSE")
		}
	}
}

// remotePaidBench is the paid gate of the parallel benchmarks: an instant
// facilitator reached over the x402 facilitator HTTP API and the offer the
// gate makes.
type remotePaidBench struct {
	fac   *httptest.Server
	offer x402.PaymentRequirements
}

func newRemotePaidBench(b *testing.B) remotePaidBench {
	fac := httptest.NewServer(x402.NewFacilitatorHandler(instantFacilitator{}))
	b.Cleanup(fac.Close)
	usdc, _ := x402.USDC(x402.NetworkBase)
	return remotePaidBench{fac: fac, offer: x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkBase, Amount: "20000", Asset: usdc.Address, PayTo: "0x1111111111111111111111111111111111111111", MaxTimeoutSeconds: 60, Extra: usdc.Extra()}}
}

// config is the site that sells upstream (host:port) through the gate,
// its store without fsync.
func (p remotePaidBench) config(upstream string) string {
	return fmt.Sprintf(`:{port} {
	x402 {
		accept base $0.02 0x1111111111111111111111111111111111111111
		facilitator http %s
		store badger {data}/gate {
			no_sync
		}
	}
	reverse_proxy %s
}
`, p.fac.URL, upstream)
}

// headers signs b.N payments for the gate at base, before the clock runs.
func (p remotePaidBench) headers(b *testing.B, base string) []string {
	headers := make([]string, b.N)
	for i := range headers {
		headers[i] = signHeader(b, 1, p.offer, base)
	}
	runtime.GC()
	return headers
}

// BenchmarkPaidPathRemoteParallel is the paid path as a gateway with a
// remote facilitator runs it: the gate reaches the (instant) facilitator
// over the x402 facilitator HTTP API, from 8 and 32 concurrent clients,
// each call with its own payment, the store without fsync; the plain
// reverse_proxy at the same concurrency in the same run is its baseline.
// The facilitator's handler runs in the same process, so cpu-ns/op includes
// its side of the two calls as well as the gate's.
func BenchmarkPaidPathRemoteParallel(b *testing.B) {
	p := newRemotePaidBench(b)
	for _, clients := range []int{8, 32} {
		for _, paid := range []bool{false, true} {
			name := "plain"
			if paid {
				name = "paid-remote-nosync"
			}
			b.Run(fmt.Sprintf("clients=%d/%s", clients, name), func(b *testing.B) {
				up := benchUpstream(b)
				cfg := fmt.Sprintf(":{port} {\n\treverse_proxy %s\n}\n", up)
				if paid {
					cfg = p.config(up)
				}
				base := startCaddy(b, cfg)
				var headers []string
				if paid {
					headers = p.headers(b, base)
				}
				var next atomic.Int64
				runParallelPostsWith(b, base+"/verify/schema", clients, func(req *http.Request) {
					if headers != nil {
						req.Header.Set(x402.HeaderPaymentSignature, headers[next.Add(1)-1])
					}
				})
			})
		}
	}
}

// BenchmarkPaidPathReportedParallel is BenchmarkPaidPathRemoteParallel's
// paid path with an upstream that asks for each call's settlement outcome,
// as verifierd does: the gate reports every settled call before its answer
// goes out. The upstream takes a report in about a millisecond, the latency
// of the synced write verifierd makes for it (a wait, not CPU), during which
// the reports of other calls queue and go together in the next request.
func BenchmarkPaidPathReportedParallel(b *testing.B) {
	p := newRemotePaidBench(b)
	var ids, reports atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/gateway/settlement" {
			reports.Add(1)
			time.Sleep(time.Millisecond)
			w.WriteHeader(http.StatusNoContent)
			return
		}
		if r.Header.Get(HeaderUpstreamSettlement) == "pending" {
			w.Header().Set(headerSettlementReport, "/v1/gateway/settlement")
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"summary":{"result":"pass","blocking_checks":[]},"result":"pass","verification_id":"v-%d"}`, ids.Add(1))
	}))
	b.Cleanup(up.Close)
	for _, clients := range []int{8, 32} {
		b.Run(fmt.Sprintf("clients=%d", clients), func(b *testing.B) {
			base := startCaddy(b, p.config(strings.TrimPrefix(up.URL, "http://")))
			headers := p.headers(b, base)
			reports.Store(0)
			var next atomic.Int64
			runParallelPostsWith(b, base+"/verify/schema", clients, func(req *http.Request) {
				req.Header.Set(x402.HeaderPaymentSignature, headers[next.Add(1)-1])
			})
			b.ReportMetric(float64(reports.Load())/float64(b.N), "report-requests/op")
		})
	}
}
