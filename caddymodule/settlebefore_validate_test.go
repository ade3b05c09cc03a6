package caddymodule

import (
	"bytes"
	"fmt"
	"math/big"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// countRequestChecks counts the gate's request checks (validate
// verify_request) while the test runs: the rule of one validation per call
// is asserted by counting, never by timing. Set before Caddy starts and
// cleared after it stops (cleanups run last in, first out).
func countRequestChecks(t *testing.T) *atomic.Int64 {
	t.Helper()
	n := new(atomic.Int64)
	requestChecked = func() { n.Add(1) }
	t.Cleanup(func() { requestChecked = nil })
	return n
}

// With settle before, the payment is settled before the upstream runs, so
// the upstream's own check of the request comes after the money moved. The
// gate with validate must check the request first: an invalid body with a
// valid payment is 422 invalid_request, charged false, nothing on chain,
// the upstream not run, no PAYMENT-RESPONSE and none of the input echoed;
// the claim (and a payment identifier's binding) is given back, so the
// same payment then buys the fixed request; and the free allowance is
// untouched. Each paid call is checked once by the gate.
func TestSettleBeforeValidatesBeforeSettling(t *testing.T) {
	d, fac := sharedDevnet(t)
	payer := evmfacilitator.DevAccounts()[4]
	for i, tc := range []struct {
		name, extra string
		withID      bool
	}{
		{name: "plain", extra: "settle before"},
		{name: "payment identifier", extra: "settle before\n\t\t\tpayment_identifier", withID: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checks := countRequestChecks(t)
			up := newUpstream(t)
			base := startCaddy(t, gateSite(up.URL, fac, 1, tc.extra))
			url := base + "/verify/schema"
			pr := paymentRequired(t, post(t, url, "", nil))
			sig := signFor(t, pr, payer.Index)
			if tc.withID {
				sig = signWithID(t, pr, payer.Key(), fmt.Sprintf("pay_settle_before_invalid_%d", i))
			}
			before := balance(t, d, payer.Address)

			// The upstream (verifierd) would refuse this body with 422.
			bad := post(t, url, invalidRequest, map[string]string{x402.HeaderPaymentSignature: sig, "X-Test-Status": "422"})
			body := readAll(t, bad)
			if bad.StatusCode != http.StatusUnprocessableEntity || !bytes.Contains(body, []byte(`"code":"invalid_request"`)) || !bytes.Contains(body, []byte(`"charged":false`)) {
				t.Fatalf("invalid body with a valid payment: status %d, %s; want 422 invalid_request, charged false", bad.StatusCode, body)
			}
			if pr := bad.Header.Get(x402.HeaderPaymentResponse); pr != "" {
				t.Fatalf("the refusal carries PAYMENT-RESPONSE %q: the payment was settled", pr)
			}
			if bytes.Contains(body, []byte("t-1")) {
				t.Fatalf("the refusal echoes the request: %s", body)
			}
			if got := charged(t, d, payer.Address, before); got.Sign() != 0 || up.calls.Load() != 0 {
				t.Fatalf("invalid request: charged %v, upstream ran %d times; want 0, never", got, up.calls.Load())
			}
			if n := checks.Load(); n != 1 {
				t.Fatalf("the gate checked the request %d times, want once", n)
			}

			// The same payment buys the fixed request, settled before the
			// upstream runs.
			good := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			if good.StatusCode != http.StatusOK {
				t.Fatalf("the same payment with a valid body: status %d, %s", good.StatusCode, readAll(t, good))
			}
			settlementOf(t, good)
			if got := charged(t, d, payer.Address, before); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
				t.Fatalf("valid request: charged %v, upstream ran %d times; want 20000, once", got, up.calls.Load())
			}
			if n := checks.Load(); n != 2 {
				t.Fatalf("the gate checked the requests %d times, want once per paid call (2)", n)
			}

			// No free call was spent: the day's one is still there.
			free := post(t, url, validRequest, nil)
			if free.StatusCode != http.StatusOK || free.Header.Get(HeaderFreeRemaining) != "0" {
				t.Fatalf("free call after the refused paid one: status %d, remaining %q; want 200, 0", free.StatusCode, free.Header.Get(HeaderFreeRemaining))
			}
		})
	}
}

// With settle after (the default) a call the gate lets through, paid or
// free, valid or not, is checked once: by the upstream, never by the gate.
// An invalid paid body reaches the upstream, whose 422 is handed over
// uncharged.
func TestSettleAfterValidatesOncePerCall(t *testing.T) {
	d, fac := sharedDevnet(t)
	payer := evmfacilitator.DevAccounts()[4]
	checks := countRequestChecks(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 1, ""))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	before := balance(t, d, payer.Address)

	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, payer.Index)}); resp.StatusCode != http.StatusOK {
		t.Fatalf("valid paid call: status %d", resp.StatusCode)
	}
	bad := post(t, url, invalidRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, payer.Index), "X-Test-Status": "422"})
	if bad.StatusCode != http.StatusUnprocessableEntity || bad.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("invalid paid call: status %d, PAYMENT-RESPONSE %q; want the upstream's 422, unsettled", bad.StatusCode, bad.Header.Get(x402.HeaderPaymentResponse))
	}
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("free call: status %d", resp.StatusCode)
	}
	if got := charged(t, d, payer.Address, before); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 3 {
		t.Fatalf("charged %v, upstream ran %d times; want 20000 (the valid paid call), 3", got, up.calls.Load())
	}
	if n := checks.Load(); n != 0 {
		t.Fatalf("the gate checked calls it let through %d times; the upstream checks them, once", n)
	}
}
