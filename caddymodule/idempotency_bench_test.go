package caddymodule

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// BenchmarkPaymentIdentifier measures, in one run and through Caddy in
// process with the instant facilitator and the store's fsync off (the
// gate's own CPU, not the disk's):
//
//	paid/no-id      baseline: a paid call on a route with payment_identifier, without an id
//	paid/id         a paid call with a fresh id: fingerprint, bind, save
//	replay          the same id and payment again: the saved answer
func BenchmarkPaymentIdentifier(b *testing.B) {
	up := benchUpstream(b)
	base := startCaddy(b, fmt.Sprintf(`:{port} {
	x402 {
		accept base $0.02 0x1111111111111111111111111111111111111111
		facilitator instant_benchmark_only
		store badger {data}/gate {
			no_sync
		}
		payment_identifier
	}
	reverse_proxy %s
}
`, up))
	usdc, _ := x402.USDC(x402.NetworkBase)
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkBase, Amount: "20000", Asset: usdc.Address, PayTo: "0x1111111111111111111111111111111111111111", MaxTimeoutSeconds: 60, Extra: usdc.Extra()}
	pr := x402.PaymentRequired{Accepts: []x402.PaymentRequirements{offer}, Resource: x402.Resource{URL: base + "/verify/schema"},
		Extensions: map[string]any{x402.PaymentIdentifierExtension: x402.DeclarePaymentIdentifier(false)}}
	sign := func(id string) string {
		p, err := x402.SignExactEVM(evmfacilitator.DevKey(1), offer, &pr.Resource, time.Now())
		if err != nil {
			b.Fatal(err)
		}
		if id != "" {
			p.Extensions = map[string]any{x402.PaymentIdentifierExtension: map[string]any{"info": map[string]any{"required": false, "id": id}}}
		}
		h, err := x402.EncodeHeader(p)
		if err != nil {
			b.Fatal(err)
		}
		return h
	}
	// Ids are never reused across the benchmark's runs (a new payment under
	// a used id is a conflict), and the replayed payment is signed once.
	run := time.Now().UnixNano()
	var seq atomic.Int64
	replayed := sign(fmt.Sprintf("pay_bench_%d_replayed", run))
	for _, c := range []struct {
		name string
		id   func(i int) string
	}{
		{"paid/no-id", func(int) string { return "" }},
		{"paid/id", func(int) string { return fmt.Sprintf("pay_bench_%d_%d", run, seq.Add(1)) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			headers := make([]string, b.N)
			for i := range headers {
				headers[i] = sign(c.id(i))
			}
			runtime.GC()
			runPosts(b, base+"/verify/schema", func(i int) map[string]string {
				return map[string]string{x402.HeaderPaymentSignature: headers[i]}
			})
		})
	}
	b.Run("replay", func(b *testing.B) {
		runPosts(b, base+"/verify/schema", func(int) map[string]string {
			return map[string]string{x402.HeaderPaymentSignature: replayed}
		})
	})
}
