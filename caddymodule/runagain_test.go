package caddymodule

import (
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// settle before, the settle reply lost: the retry that finds the transfer
// runs the upstream again, and the upstream fails before writing. The
// buyer is told it was charged and to retry with the same payment
// (retryable), and its retry once the upstream is back gets the call; a
// retry after that is payment_already_used (one call was paid for).
func TestRunAgainUpstreamFailureKeepsThePaidCall(t *testing.T) {
	d, _ := sharedDevnet(t)
	var failing atomic.Bool
	var served atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			c, _, _ := http.NewResponseController(w).Hijack()
			c.Close()
			return
		}
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"paid_content":true}`)
	}))
	t.Cleanup(up.Close)
	url := startCaddy(t, pendingSite(up.URL, "lose_reply", filepath.Join(t.TempDir(), "gate"), "settle before")) + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 6)
	failing.Store(true)
	hdr := map[string]string{x402.HeaderPaymentSignature: sig}
	if resp := post(t, url, validRequest, hdr); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d", resp.StatusCode)
	}
	resp := post(t, url, validRequest, hdr)
	var e struct {
		Code      string `json:"code"`
		Retryable bool   `json:"retryable"`
		Charged   bool   `json:"charged"`
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != http.StatusServiceUnavailable || !e.Retryable || !e.Charged {
		t.Fatalf("retry while the upstream fails: %d %s", resp.StatusCode, b)
	}
	failing.Store(false)
	resp = post(t, url, validRequest, hdr)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || served.Load() != 1 || !strings.Contains(string(b), "paid_content") {
		t.Fatalf("retry once the upstream is back: %d %s (served %d)", resp.StatusCode, b, served.Load())
	}
	resp = post(t, url, validRequest, hdr)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), x402.ReasonPaymentAlreadyUsed) || served.Load() != 1 {
		t.Fatalf("retry after the delivery: %d %s (served %d)", resp.StatusCode, b, served.Load())
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 { // $0.02 in USDC units
		t.Fatalf("charged %v", got)
	}
}

// A run again taken by a request that never came back (the gateway died
// between taking it and the upstream's answer; here its upstream stalls)
// is taken again once its span has passed; before that, a retry is told
// the payment is in use by another request.
func TestRunAgainTakenAndAbandonedIsRetakenAfterItsSpan(t *testing.T) {
	sharedDevnet(t)
	release := make(chan struct{})
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-release // the first run never answers while the test looks
		}
		io.WriteString(w, `{"paid_content":true}`)
	}))
	t.Cleanup(up.Close)
	url := startCaddy(t, pendingSite(up.URL, "lose_reply", filepath.Join(t.TempDir(), "gate"), "settle before\n\t\t\tupstream_timeout 1m")) + "/verify/schema"
	t.Cleanup(func() { close(release) })
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 7)
	hdr := map[string]string{x402.HeaderPaymentSignature: sig}
	if resp := post(t, url, validRequest, hdr); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d", resp.StatusCode)
	}
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
		req.Header.Set(x402.HeaderPaymentSignature, sig)
		req.Header.Set("Content-Type", "application/json")
		if resp, err := testClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); calls.Load() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the retry never ran the upstream")
		}
	}
	resp := post(t, url, validRequest, hdr)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b)+resp.Header.Get(x402.HeaderPaymentRequired), reasonPaymentInFlight) || calls.Load() != 1 {
		t.Fatalf("retry while the run is taken: %d %s (runs %d)", resp.StatusCode, b, calls.Load())
	}
	later := time.Now().Add(10 * time.Minute) // past the attempt span, about 5 minutes with upstream_timeout 1m
	now = func() time.Time { return later }
	t.Cleanup(func() { now = time.Now })
	resp = post(t, url, validRequest, hdr)
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || calls.Load() != 2 {
		t.Fatalf("retry once the taken run's span has passed: %d %s (runs %d)", resp.StatusCode, b, calls.Load())
	}
}
