package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// paid-solana against a gateway stand-in that does what the gate's money
// path does with a payment (the real Solana facilitator verifies and
// settles it on a real local chain, litesvm): every payment the load
// generator builds is accepted and lands, each one its own transaction
// although they share a blockhash, and the payee's balance grows by the
// price per served call exactly.
func TestPaidSolanaPaymentsVerifyAndSettle(t *testing.T) {
	chain := solanachain.Start(t) // it funds the development fee payer
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: chain.URL},
		Network: x402.NetworkSolanaDevnet, FeePayer: svmfacilitator.DevFeePayer()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	payee := chain.Wallets[len(chain.Wallets)-1]
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet, Amount: "20000",
		Asset: solanachain.USDC, PayTo: payee.Address, MaxTimeoutSeconds: 60,
		Extra: map[string]any{"feePayer": f.FeePayer().String()}}
	evm := x402.PaymentRequirements{Scheme: "exact", Network: "eip155:1337", Amount: "20000", Asset: "0x0", PayTo: "0x0"}
	required, err := x402.EncodeHeader(x402.PaymentRequired{X402Version: 2, Accepts: []x402.PaymentRequirements{evm, offer}})
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int64
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := r.Header.Get(x402.HeaderPaymentSignature)
		if h == "" {
			w.Header().Set(x402.HeaderPaymentRequired, required)
			w.WriteHeader(http.StatusPaymentRequired)
			return
		}
		var p x402.PaymentPayload
		if err := x402.DecodeHeader(h, &p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// Settle even when the phase's end cancels the request: a
		// settlement cut off after sending would move money no count
		// here sees (the real gate holds such an outcome as pending).
		s, err := f.Settle(context.WithoutCancel(r.Context()), p, offer)
		if err != nil || !s.Success {
			http.Error(w, "not settled", http.StatusPaymentRequired)
			return
		}
		served.Add(1)
		w.Write([]byte(`{"result":"pass"}`))
	}))
	defer gw.Close()

	file := filepath.Join(t.TempDir(), "solana-chain.json")
	b, _ := json.Marshal(map[string]any{"url": chain.URL, "usdc": solanachain.USDC, "wallets": chain.Wallets})
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	u, _ := loopbackURL(gw.URL)
	before := chain.TokenBalance(svmfacilitator.AssociatedTokenAddress(mustPub(t, payee.Address), mustPub(t, solanachain.USDC), svmfacilitator.TokenProgram).String())
	cfg := config{gateway: u, path: "/verify/schema", body: invoice, duration: 300 * time.Millisecond, solanaChain: file}
	st, err := measure(context.Background(), cfg, "paid-solana", 4)
	if err != nil {
		t.Fatal(err)
	}
	if st.errors != 0 || st.ok() == 0 {
		t.Fatalf("%d of %d paid requests failed (%s)", st.errors, st.requests, st.firstErr)
	}
	// Close waits for the handlers still settling what the phase's end
	// cut off, so every transfer read below has been counted.
	gw.Close()
	after := chain.TokenBalance(svmfacilitator.AssociatedTokenAddress(mustPub(t, payee.Address), mustPub(t, solanachain.USDC), svmfacilitator.TokenProgram).String())
	// The first request (measure's check) is paid too, and so are those
	// the phase's end cut off after the gateway had settled them.
	if got, want := after-before, 20000*served.Load(); got != want || served.Load() < int64(st.ok())+1 {
		t.Fatalf("the payee got %d for %d served calls (%d measured), want %d", got, served.Load(), st.ok(), want)
	}

	// A refused payment is named as one, not as a used-up free allowance.
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(x402.HeaderPaymentRequired, required)
		w.WriteHeader(http.StatusPaymentRequired)
		if r.Header.Get(x402.HeaderPaymentSignature) != "" {
			w.Write([]byte(`{"error":"payment_invalid"}`))
		}
	}))
	defer refuse.Close()
	cfg.gateway, _ = loopbackURL(refuse.URL)
	if _, err := measure(context.Background(), cfg, "paid-solana", 1); err == nil ||
		!strings.Contains(err.Error(), `the payment was refused: {"error":"payment_invalid"}`) {
		t.Fatalf("error = %v, want the refused payment named", err)
	}
}

func mustPub(t *testing.T, s string) svmfacilitator.PublicKey {
	t.Helper()
	k, err := svmfacilitator.ParsePublicKey(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// Without the chain's wallet file, or with one that is not there,
// paid-solana is skipped with the reason and the run goes on.
func TestPaidSolanaIsSkippedWithoutAChain(t *testing.T) {
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"result":"pass"}`))
	}))
	defer gw.Close()
	for _, tc := range []struct {
		desc, flag, want string
	}{
		{"no -solana-chain", "", "paid-solana: skipped: no Solana chain (-solana-chain"},
		{"no such file", filepath.Join(t.TempDir(), "absent.json"), "paid-solana: skipped: no Solana chain: "},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			var out bytes.Buffer
			err := run([]string{"-gateway", gw.URL, "-direct", "", "-scenarios", "free,paid-solana", "-c", "1,2",
				"-d", "50ms", "-warmup", "0", "-solana-chain", tc.flag}, &out)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), tc.want) || strings.Count(out.String(), "skipped") != 1 {
				t.Fatalf("output lacks one %q:\n%s", tc.want, out.String())
			}
			if !strings.Contains(out.String(), "\nfree ") {
				t.Fatalf("the free scenario did not run:\n%s", out.String())
			}
		})
	}
}

// The paid-solana line compares its rate with the plain reverse_proxy's
// (no block time bounds it) and Caddy's CPU per call with the baseline
// Caddy's, the facilitator's and the chain's own cost apart; with the
// facilitator inside Caddy it says its figure includes it.
func TestReportPaidSolana(t *testing.T) {
	mk := func(name string, n int, cpu map[string]time.Duration) stats {
		s := stats{name: name, concurrency: 8, requests: n, elapsed: time.Second, cpu: cpu}
		for range n {
			s.lat = append(s.lat, time.Millisecond)
		}
		return s
	}
	procs := []proc{{name: "caddy", pid: 1}, {name: "facilitator", pid: 2}, {name: "baseline", pid: 3}, {name: "solana-chain", pid: 4}}
	var out bytes.Buffer
	reportCores(&out, []stats{
		mk("baseline", 1000, map[string]time.Duration{"caddy": 0, "baseline": 100 * time.Millisecond}),
		mk("paid-solana", 800, map[string]time.Duration{"caddy": 100 * time.Millisecond, "facilitator": 200 * time.Millisecond, "solana-chain": 400 * time.Millisecond}),
	}, procs, 2)
	want := "paid-solana at 8: 800 req/s, 0.80x the plain reverse_proxy (target >= 0.9x); gateway caddy CPU/req 125µs, the facilitator in its own process 250µs for its verify and settle, the chain 500µs; the plain reverse_proxy's caddy 100µs per call: 0.80x"
	if !strings.Contains(out.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, out.String())
	}
	out.Reset()
	reportCores(&out, []stats{
		mk("baseline", 1000, map[string]time.Duration{"baseline": 100 * time.Millisecond}),
		mk("paid-solana", 1000, map[string]time.Duration{"caddy": 300 * time.Millisecond}),
	}, []proc{{name: "caddy", pid: 1}, {name: "baseline", pid: 3}}, 2)
	want = "paid-solana at 8: 1000 req/s, 1.00x the plain reverse_proxy (target >= 0.9x); caddy CPU/req 300µs, the facilitator's verify and settle inside it (AOV_FACILITATOR=remote measures the gateway alone); the plain reverse_proxy's caddy 100µs per call: 0.33x"
	if !strings.Contains(out.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, out.String())
	}
}
