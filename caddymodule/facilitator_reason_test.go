package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/x402"
)

// reasonFacilitator (FAULT: a facilitator whose refusals carry free text
// where a reason code goes) forwards every call to the real devnet
// facilitator at real, except /verify (when verify is set) or /settle,
// which it refuses with reason(n) for the n-th such call.
func reasonFacilitator(t *testing.T, real string, verify bool, reason func(n int64) string) *httptest.Server {
	t.Helper()
	var n atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case verify && r.URL.Path == "/verify":
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"isValid": false, "invalidReason": reason(n.Add(1))})
			return
		case !verify && r.URL.Path == "/settle":
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"success": false, "errorReason": reason(n.Add(1)), "transaction": "", "network": x402.NetworkDevnet})
			return
		}
		req, _ := http.NewRequest(r.Method, real+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, "facilitator unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		w.Write(raw)
	}))
	t.Cleanup(s.Close)
	return s
}

// countSeries counts the series c holds.
func countSeries(c prometheus.Collector) int {
	ch := make(chan prometheus.Metric, 1024)
	go func() { c.Collect(ch); close(ch) }()
	n := 0
	for range ch {
		n++
	}
	return n
}

// TestFacilitatorReasonsDoNotGrowMetrics: 40 payments the facilitator
// refuses at /verify, each with a reason code of its own that the gateway
// does not know (one naming a recovered signer), add one outcomes_total
// series at most ("other"), not one per reason: every label value is kept
// for the process's life; over REST and over MCP alike. The buyer is
// still told the facilitator's code.
func TestFacilitatorReasonsDoNotGrowMetrics(t *testing.T) {
	_, fac := sharedDevnet(t)
	reason := func(n int64) string { return fmt.Sprintf("invalid_signer_0x%040x", n) }
	liar := reasonFacilitator(t, fac, true, reason)
	url := gatedSite(t, liar.URL)
	pr := paymentRequired(t, post(t, url, "", nil))
	before := countSeries(metrics.outcomes)
	const calls = 40
	for i := 0; i < calls; i++ {
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 3)})
		body := readJSON(t, resp)
		if want := reason(int64(i + 1)); resp.StatusCode != http.StatusPaymentRequired || body["reason"] != want {
			t.Fatalf("call %d: status %d, reason %v; want 402 %s", i, resp.StatusCode, body["reason"], want)
		}
	}
	if grew := countSeries(metrics.outcomes) - before; grew > 1 {
		t.Errorf("outcomes_total grew by %d series over %d refused payments, each with a reason of its own; want at most one (other)", grew, calls)
	}

	// The same over MCP, whose refusals are tool results.
	mup := newMCPUpstream(t)
	s := mcpSession(t, startCaddy(t, mcpSite(mup.URL, liar.URL, 1))+"/mcp")
	callTool(t, s, "verify_schema", verifyArgs, nil) // the free call
	mpr := demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil))
	before = countSeries(metrics.outcomes)
	for i := 0; i < calls; i++ {
		res := callTool(t, s, "verify_schema", verifyArgs, payMeta(t, mpr, 3))
		if !res.IsError {
			t.Fatalf("MCP call %d: %+v; want a payment-required result", i, res)
		}
	}
	if grew := countSeries(metrics.outcomes) - before; grew > 1 {
		t.Errorf("outcomes_total grew by %d series over %d refused MCP payments, each with a reason of its own; want at most one (other)", grew, calls)
	}
}

// TestFacilitatorLongErrorReasonIsNamedUnexpected: a facilitator refuses
// the settlement with a 60 KiB errorReason (its reply far under the 1 MiB
// the gate reads). The buyer is still told SPEC's 402 for a failed
// settlement, with PAYMENT-RESPONSE {success: false} and the reason
// unexpected_settle_error, not a 500: the text would not fit the headers.
func TestFacilitatorLongErrorReasonIsNamedUnexpected(t *testing.T) {
	_, fac := sharedDevnet(t)
	liar := reasonFacilitator(t, fac, false, func(int64) string { return strings.Repeat("x", 60<<10) })
	url := gatedSite(t, liar.URL)
	pr := paymentRequired(t, post(t, url, "", nil))
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 3)})
	body := readJSON(t, resp)
	var sr x402.SettleResponse
	perr := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr)
	if resp.StatusCode != http.StatusPaymentRequired || perr != nil || sr.Success || sr.ErrorReason != x402.ReasonUnexpectedSettleError || body["reason"] != x402.ReasonUnexpectedSettleError {
		t.Errorf("refused settlement answered: status %d, PAYMENT-RESPONSE %+v (%v), reason %v; want 402, PAYMENT-RESPONSE {success: false, errorReason: %s}, the same reason",
			resp.StatusCode, sr, perr, body["reason"], x402.ReasonUnexpectedSettleError)
	}
}

// A facilitator's transaction is told (and recorded) only in its network's
// shape: on EVM a 32-byte hash, 0x and 64 hex digits; on Solana the base58
// of a 64-byte signature; elsewhere at most 128 visible ASCII characters
// (Hedera's transaction ids are account@seconds.nanos). Anything else is
// told as none, "". (Before: any text was passed on, and 80 KB of it pushed
// PAYMENT-RESPONSE past x402.MaxHeaderBytes.)
func TestFacilitatorTransactionIsKeptOnlyInItsNetworksShape(t *testing.T) {
	hash := "0x" + strings.Repeat("aB", 32)
	sig := base58.Encode(bytes.Repeat([]byte{0xa7}, 64))
	for _, c := range []struct {
		network, tx string
		kept        bool
	}{
		{x402.NetworkBase, hash, true},
		{x402.NetworkDevnet, strings.ToLower(hash), true},
		{x402.NetworkBase, "", false},
		{x402.NetworkBase, hash[:65], false},
		{x402.NetworkBase, hash + "00", false},
		{x402.NetworkBase, strings.TrimPrefix(hash, "0x"), false},
		{x402.NetworkBase, "0x" + strings.Repeat("g", 64), false},
		{x402.NetworkBase, hash + "\n", false},
		{x402.NetworkBase, "0x" + strings.Repeat("ab", 40000), false},
		{x402.NetworkBase, sig, false},
		{x402.NetworkSolana, sig, true},
		{x402.NetworkSolanaDevnet, base58.Encode(make([]byte, 64)), true},
		{x402.NetworkSolana, base58.Encode(bytes.Repeat([]byte{0xa7}, 32)), false}, // an address, not a signature
		{x402.NetworkSolana, base58.Encode(bytes.Repeat([]byte{0xa7}, 65)), false},
		{x402.NetworkSolana, sig[:len(sig)-1] + "0", false}, // 0 is not base58
		{x402.NetworkSolana, hash, false},
		{x402.NetworkSolana, strings.Repeat("z", 80000), false},
		{"cosmos:cosmoshub-4", strings.Repeat("A1", 32), true},
		{"cosmos:cosmoshub-4", strings.Repeat("a", 129), false},
		{"cosmos:cosmoshub-4", "tx id", false},
		{"cosmos:cosmoshub-4", "tx\u00a0id", false},
		{"hedera:testnet", "0.0.9000@1700000000.123456789", true},
	} {
		want := ""
		if c.kept {
			want = c.tx
		}
		if got := facilitatorTransaction(c.tx, c.network); got != want {
			t.Errorf("%s transaction %.40q (%d bytes): told %.40q, want %.40q", c.network, c.tx, len(c.tx), got, want)
		}
	}
}
