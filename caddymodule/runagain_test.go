package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
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
	url := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "settle before")) + "/verify/schema"
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
	url := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "settle before\n\t\t\tupstream_timeout 1m")) + "/verify/schema"
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

// fakeSentThenFailedUnnamed is a fake for one fault: the facilitator
// sends the settlement (the transfer happens on the devnet) and then
// reports a failure naming no transaction, which the gate takes as an
// unknown outcome whose hold keeps no answer (failedUnnamed): the retry
// that finds the transfer runs the upstream again, once. Verify and
// SettlementStatus are the real facilitator's (faultyFacilitator's).
type fakeSentThenFailedUnnamed struct{ faultyFacilitator }

func init() { caddy.RegisterModule(&fakeSentThenFailedUnnamed{}) }

func (*fakeSentThenFailedUnnamed) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.fake_sent_then_failed_unnamed", New: func() caddy.Module { return new(fakeSentThenFailedUnnamed) }}
}

func (m *fakeSentThenFailedUnnamed) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	return nil
}

func (m *fakeSentThenFailedUnnamed) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	if _, err := m.f.Settle(ctx, p, req); err != nil {
		return x402.SettleResponse{}, err
	}
	reply := x402.SettleResponse{ErrorReason: "unexpected_settle_error", Network: req.Network}
	return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Reply: &reply, Err: errors.New("fault injected: failed naming no transaction after sending")}
}

// One payment is one paid verification in verifierd's history when its
// settlement failed naming no transaction after sending it: the call
// (recorded pending, V1) is answered 503 settlement_pending and held with
// no answer kept; the buyer's retry finds the transfer and runs the
// upstream again, which verifierd records as a verification of its own,
// paid (V2). V1's answer was never delivered, so V1 ends unpaid. (Before:
// V1 was reported paid too, two paid verifications for one payment.)
func TestRunAgainCountsItsPaymentOnce(t *testing.T) {
	_, _ = sharedDevnet(t)
	vf := startVerifier(t)
	const passing = "`{\"type\":\"object\",\"required\":[\"verification_id\"]}`"
	base := startCaddy(t, sellerOverVerifierdSite(vf, "fake_sent_then_failed_unnamed", "", passing, vf.srv.URL, ""))
	url := base + "/verify/schema"
	const agent = "buyer-run-again-once"
	body := `{"task_id":"t-1","agent_id":"` + agent + `","expected_schema":{"type":"object"},"submitted_output":{"ok":true}}`
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 4)
	resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
	if answer := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %d %.300s; want 503 settlement_pending", resp.StatusCode, answer)
	}
	var retried *http.Response
	var answer []byte
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		retried = post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
		answer = readAll(t, retried)
		if retried.StatusCode != http.StatusServiceUnavailable || time.Now().After(end) {
			break
		}
	}
	if retried.StatusCode != http.StatusOK {
		t.Fatalf("retry: %d %.300s; want 200 (the transfer happened)", retried.StatusCode, answer)
	}
	var got []string
	paid := 0
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		recs, _, err := vf.db.Verifications(context.Background(), agent, "", 10)
		if err != nil {
			t.Fatal(err)
		}
		got, paid = got[:0], 0
		final := 0
		for _, rec := range recs {
			got = append(got, rec.Payment)
			switch rec.Payment {
			case store.PaymentPaid:
				paid++
				final++
			case store.PaymentUnpaid:
				final++
			}
		}
		if (final == 2 && len(recs) == 2) || time.Now().After(end) {
			break
		}
	}
	if paid != 1 || len(got) != 2 {
		t.Errorf("verifierd's records for one payment: %v; want two, one of them paid (the run again's), the undelivered first unpaid", got)
	}
}
