package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
	"github.com/aovhq/aov/x402"
)

// The gateway benchmarks compare, in one run, Caddy's plain reverse_proxy
// with the same route behind the gate:
//
//	BenchmarkPlainProxy           baseline: reverse_proxy to a small upstream
//	BenchmarkFreePath             the gate serving from the free allowance
//	BenchmarkFreePathNoSync       the same with the store's fsync off
//	BenchmarkFreePathBatched      the same with fsync on and the allowance
//	                              counts flushed every 100ms (allowance_flush)
//	BenchmarkFreePathBatchedBehindWallet  the same behind wallet_auth on
//	                              the same store, as in Caddyfile.example
//	BenchmarkPaidPathNoSettlement a paid call whose facilitator answers at
//	                              once: decode, match, claim, verify call,
//	                              buffer, settle call, claim settled
//	BenchmarkPaidPathNoSettlementNoSync  the same with the store's fsync off
//	BenchmarkPaidCallDevnet       a real paid call settled on the devnet
//	BenchmarkPaidPathRemoteParallel  paid calls from 8 and 32 clients through
//	                              a facilitator reached over HTTP, beside the
//	                              plain proxy at the same concurrency
//	                              (paid_bench_test.go, with the gate's own
//	                              pieces alone: decode, claim keys, headers)
//	BenchmarkExampleFreePath      Caddyfile.example's whole site serving a
//	                              free call, against BenchmarkExampleBaseline,
//	                              load/baseline.Caddyfile's plain proxy
//	                              (example_bench_test.go): make load's free
//	                              and baseline scenarios in process
//
// Subtract the baseline from the others for the gate's own cost.

func init() {
	caddy.RegisterModule(instantFacilitator{})
}

// instantFacilitator accepts every payment at once. It exists only in the
// test binary, to measure the gate without the facilitator's cost; every
// test of behaviour uses the real facilitator.
type instantFacilitator struct{}

func (instantFacilitator) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.instant_benchmark_only", New: func() caddy.Module { return new(instantFacilitator) }}
}

func (instantFacilitator) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	return nil
}

func (instantFacilitator) Verify(context.Context, x402.PaymentPayload, x402.PaymentRequirements) (x402.VerifyResponse, error) {
	return x402.VerifyResponse{IsValid: true, Payer: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"}, nil
}

func (instantFacilitator) Settle(_ context.Context, _ x402.PaymentPayload, r x402.PaymentRequirements) (x402.SettleResponse, error) {
	return x402.SettleResponse{Success: true, Transaction: "0x01", Network: r.Network}, nil
}

func (instantFacilitator) Supported(context.Context) (x402.SupportedResponse, error) {
	return x402.SupportedResponse{}, nil
}

func benchUpstream(b *testing.B) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"result":"pass","summary":{"result":"pass","blocking_checks":[]}}`)
	}))
	b.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func runPosts(b *testing.B, url string, header func(i int) map[string]string) {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	b.ReportAllocs()
	b.ResetTimer()
	defer reportCPU(b)()
	for i := 0; i < b.N; i++ {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
		req.Header.Set("Content-Type", "application/json")
		if header != nil {
			// Payments are signed before the clock starts (benchPaid), or
			// by a header func that stops the clock itself: stopping it for
			// every call here would read the memory statistics twice per
			// call (a stop of the world) and charge that to the gateway.
			for k, v := range header(i) {
				req.Header.Set(k, v)
			}
		}
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d: %.300s", resp.StatusCode, body)
		}
	}
}

func BenchmarkPlainProxy(b *testing.B) {
	up := benchUpstream(b)
	base := startCaddy(b, fmt.Sprintf(":{port} {\n\treverse_proxy %s\n}\n", up))
	runPosts(b, base+"/verify/schema", nil)
}

func benchFree(b *testing.B, storeOpts string) {
	up := benchUpstream(b)
	base := startCaddy(b, fmt.Sprintf(`:{port} {
	x402 {
		accept base $0.02 0x1111111111111111111111111111111111111111
		facilitator instant_benchmark_only
		store badger {data}/gate %s
		validate verify_request
		free_allowance {
			per_day 1000000000
		}
		rate_limit 1000000000 1m # never reached; counting each free call is part of the path
	}
	reverse_proxy %s
}
`, storeOpts, up))
	runPosts(b, base+"/verify/schema", nil)
}

func BenchmarkFreePath(b *testing.B)       { benchFree(b, "") }
func BenchmarkFreePathNoSync(b *testing.B) { benchFree(b, "{\n\t\t\tno_sync\n\t\t}") }
func BenchmarkFreePathBatched(b *testing.B) {
	benchFree(b, "{\n\t\t\tallowance_flush 100ms\n\t\t}")
}

// BenchmarkFreePathBatchedBehindWallet is BenchmarkFreePathBatched with
// wallet_auth in front of the gate on the same store folder, as in
// Caddyfile.example: wallet_auth opens the store first, with the defaults,
// and the gate's allowance_flush must still batch its counts.
func BenchmarkFreePathBatchedBehindWallet(b *testing.B) {
	up := benchUpstream(b)
	base := startCaddy(b, fmt.Sprintf(`:{port} {
	route {
		wallet_auth optional {
			domains localhost
			store badger {data}/gate
		}
		x402 {
			accept base $0.02 0x1111111111111111111111111111111111111111
			facilitator instant_benchmark_only
			store badger {data}/gate {
				allowance_flush 100ms
			}
			validate verify_request
			free_allowance {
				per_day 1000000000
			}
			rate_limit 1000000000 1m # never reached; counting each free call is part of the path
		}
		reverse_proxy %s
	}
}
`, up))
	runPosts(b, base+"/verify/schema", nil)
}

func BenchmarkPaidPathNoSettlement(b *testing.B)       { benchPaid(b, "") }
func BenchmarkPaidPathNoSettlementNoSync(b *testing.B) { benchPaid(b, "{\n\t\t\tno_sync\n\t\t}") }

func benchPaid(b *testing.B, storeOpts string) {
	up := benchUpstream(b)
	base := startCaddy(b, fmt.Sprintf(`:{port} {
	x402 {
		accept base $0.02 0x1111111111111111111111111111111111111111
		facilitator instant_benchmark_only
		store badger {data}/gate %s
	}
	reverse_proxy %s
}
`, storeOpts, up))
	req, _ := x402.USDC(x402.NetworkBase)
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkBase, Amount: "20000", Asset: req.Address, PayTo: "0x1111111111111111111111111111111111111111", MaxTimeoutSeconds: 60, Extra: req.Extra()}
	// Every call needs its own authorization: the replay guard refuses a
	// second use.
	// Signed before the clock starts, so neither the signing nor the garbage
	// it leaves is counted as the gateway's.
	headers := make([]string, b.N)
	for i := range headers {
		headers[i] = signHeader(b, 1, offer, base)
	}
	runtime.GC()
	runPosts(b, base+"/verify/schema", func(i int) map[string]string {
		return map[string]string{x402.HeaderPaymentSignature: headers[i]}
	})
}

// signHeader signs a fresh payment from development account payer.
func signHeader(b *testing.B, payer int, offer x402.PaymentRequirements, base string) string {
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(payer), offer, &x402.Resource{URL: base + "/verify/schema"}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	h, err := x402.EncodeHeader(p)
	if err != nil {
		b.Fatal(err)
	}
	return h
}

func BenchmarkPaidCallDevnet(b *testing.B) {
	_, fac := sharedDevnet(b)
	up := benchUpstream(b)
	base := startCaddy(b, fmt.Sprintf(`:{port} {
	x402 {
		accept devnet $0.02 %s
		facilitator http {
			url %s
		}
		store badger {data}/gate
	}
	reverse_proxy %s
}
`, payTo.Hex(), fac, up))
	usdc, _ := x402.USDC(x402.NetworkDevnet)
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkDevnet, Amount: "20000", Asset: usdc.Address, PayTo: payTo.Hex(), MaxTimeoutSeconds: 60, Extra: usdc.Extra()}
	start := time.Now()
	runPosts(b, base+"/verify/schema", func(int) map[string]string {
		// Signing is the client's cost (its CPU still shows in cpu-ns/op:
		// the authorization must be fresh when the chain settles it).
		b.StopTimer()
		defer b.StartTimer()
		return map[string]string{x402.HeaderPaymentSignature: signHeader(b, 2, offer, base)}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "paid_calls/s")
}

// BenchmarkGatePaidDirect measures the gate alone on the paid path: its
// ServeHTTP called in process (no HTTP, no proxy), the upstream a handler
// that writes a small JSON answer, the facilitator the instant one, the
// store Badger without fsync. BenchmarkUpstreamDirect is the same handler
// without the gate; the difference is the gate's own cost per paid call.
func BenchmarkGatePaidDirect(b *testing.B) {
	g, offer := directGate(b, store.Options{NoSync: true}, nil)
	headers := make([]string, b.N)
	for i := range headers {
		headers[i] = signHeader(b, 1, offer, "http://example.com")
	}
	runtime.GC()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := httptest.NewRequest(http.MethodPost, "http://example.com/verify/schema", strings.NewReader(validRequest))
		req.Header.Set(x402.HeaderPaymentSignature, headers[i])
		w := httptest.NewRecorder()
		if err := g.ServeHTTP(w, req, benchAnswer); err != nil || w.Code != 200 {
			b.Fatalf("status %d, %v: %s", w.Code, err, w.Body)
		}
	}
}

// BenchmarkGateFreeDirect is BenchmarkGatePaidDirect's twin for the free
// path: the gate's ServeHTTP in process, serving every call from the
// allowance (Badger without fsync, the verify_request validator on, as in
// Caddyfile.example).
func BenchmarkGateFreeDirect(b *testing.B) { benchGateFreeDirect(b, store.Options{NoSync: true}) }

// BenchmarkGateFreeDirectBatched is the same with the counts batched
// (allowance_flush 100ms, fsync on).
func BenchmarkGateFreeDirectBatched(b *testing.B) {
	benchGateFreeDirect(b, store.Options{AllowanceFlush: 100 * time.Millisecond})
}

func benchGateFreeDirect(b *testing.B, opts store.Options) {
	// A rate limit never reached: counting each free call against it is
	// part of the free path.
	rates, key, err := loadZone(&RateLimit{Events: 1 << 30, Window: caddy.Duration(time.Minute), Zone: "bench-free-direct"}, zoneFree)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { rateZones.Delete(key) })
	g, _ := directGate(b, opts, func(g *Gate) { g.Free, g.freeRates = &FreeAllowance{PerDay: 1 << 30}, rates })
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		req := httptest.NewRequest(http.MethodPost, "http://example.com/verify/schema", strings.NewReader(validRequest))
		w := httptest.NewRecorder()
		if err := g.ServeHTTP(w, req, benchAnswer); err != nil || w.Code != 200 {
			b.Fatalf("status %d, %v: %s", w.Code, err, w.Body)
		}
	}
}

func BenchmarkUpstreamDirect(b *testing.B) {
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		req := httptest.NewRequest(http.MethodPost, "http://example.com/verify/schema", strings.NewReader(validRequest))
		w := httptest.NewRecorder()
		if err := benchAnswer.ServeHTTP(w, req); err != nil || w.Code != 200 {
			b.Fatal(w.Code, err)
		}
	}
}

// benchAnswer stands for the upstream in the direct benchmarks.
var benchAnswer = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	_, err := io.WriteString(w, `{"result":"pass","summary":{"result":"pass","blocking_checks":[]}}`)
	return err
})

// directStore gives the gate a store without Caddy's module loading.
type directStore struct{ db *store.DB }

func (s directStore) Allowance() store.Allowance { return s.db.Allowance() }
func (s directStore) Claims() store.Claims       { return s.db.Claims() }

// BenchmarkGatewayParallel compares, at 8 and 32 concurrent clients in one
// run, the plain reverse_proxy with the gate's free path (one client IP,
// so every call counts on one allowance record), durable and batched. The
// ratio plain/free is the gate's cost under load.
func BenchmarkGatewayParallel(b *testing.B) {
	for _, clients := range []int{8, 32} {
		for _, c := range []struct{ name, store string }{
			{"plain", ""},
			{"free", ""},
			{"free-batched", "{\n\t\t\tallowance_flush 100ms\n\t\t}"},
		} {
			b.Run(fmt.Sprintf("clients=%d/%s", clients, c.name), func(b *testing.B) {
				up := benchUpstream(b)
				cfg := fmt.Sprintf(":{port} {\n\treverse_proxy %s\n}\n", up)
				if c.name != "plain" {
					cfg = fmt.Sprintf(`:{port} {
	x402 {
		accept base $0.02 0x1111111111111111111111111111111111111111
		facilitator instant_benchmark_only
		store badger {data}/gate %s
		validate verify_request
		free_allowance {
			per_day 1000000000
		}
	}
	reverse_proxy %s
}
`, c.store, up)
				}
				runParallelPosts(b, startCaddy(b, cfg)+"/verify/schema", clients)
			})
		}
	}
}

// runParallelPosts posts the valid request from clients goroutines.
func runParallelPosts(b *testing.B, url string, clients int) {
	runParallelPostsWith(b, url, clients, nil)
}

// runParallelPostsWith is runParallelPosts with each request passed to
// prepare (when set) before it is sent.
func runParallelPostsWith(b *testing.B, url string, clients int, prepare func(*http.Request)) {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: clients}}
	b.ReportAllocs()
	b.SetParallelism((clients + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	defer reportCPU(b)()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
			req.Header.Set("Content-Type", "application/json")
			if prepare != nil {
				prepare(req)
			}
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
}

// reportCPU reports the process's CPU time (user and system) per operation
// from now until the returned function runs, as cpu-ns/op. Client, Caddy
// and upstream share the process, so against the plain proxy in the same
// run the difference is the gate's CPU, whatever else the machine runs
// (wall time is not: on a shared machine it measures the neighbours too).
func reportCPU(b *testing.B) func() {
	start := processCPU()
	return func() {
		b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// directGate is a gate called in process, as the Direct benchmarks and the
// MCP answer tests run it: a store of its own in Badger (opts), the instant
// facilitator, one offer of 0.02 USDC on Base, the verify_request
// validator on, as in Caddyfile.example. set adjusts it (a free allowance,
// an MCP tool) before its allowance is provisioned.
func directGate(tb testing.TB, opts store.Options, set func(*Gate)) (*Gate, x402.PaymentRequirements) {
	tb.Helper()
	db, err := store.Open(tb.TempDir(), opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	usdc, _ := x402.USDC(x402.NetworkBase)
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkBase, Amount: "20000", Asset: usdc.Address, PayTo: "0x1111111111111111111111111111111111111111", MaxTimeoutSeconds: 60, Extra: usdc.Extra()}
	g := &Gate{Settle: "after", MaxBuffer: defaultMaxBuffer, MaxBody: defaultMaxBody, UpstreamTimeout: caddy.Duration(defaultUpstreamTimeout),
		facilitator: instantFacilitator{}, state: directStore{db}, offers: []x402.PaymentRequirements{offer}, logger: zap.NewNop(),
		verifier: verify.New(verify.Config{MaxBodyBytes: defaultMaxBody, SchemaCacheSize: gateSchemaCache})}
	if set != nil {
		set(g)
	}
	if g.Free != nil {
		if err := g.Free.provision(); err != nil {
			tb.Fatal(err)
		}
	}
	if err := g.encodeOffers(); err != nil { // as Provision does
		tb.Fatal(err)
	}
	if g.MCPTool != "" { // as Provision does for a gate alone on its server
		g.mcpRead = new(atomic.Int64)
		g.mcpRead.Store(g.MaxBody)
	}
	return g, offer
}
