package caddymodule

import (
	"math/big"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// With settle before, a call whose payment the facilitator verified has its
// request checked before the payment settles. A payment for an invalid
// request is then refused 422, nothing charged, its claim given back, and
// may be sent again: the check is work done for nothing, so it is bounded
// as an unpaid one's is, by bounds of its own: one check at a time per
// payer (paidCheckTurns) and one of the gateway's paidCheckSlots, waiting
// at most precheckWait for both, then 503 verification_timeout, nothing
// charged, the claim given back so the same payment is taken once the
// gateway is free. The unpaid bounds (every one of precheckSlots and the
// address's turn, held here as unpaid floods would) never hold it up.
// (Before: it was compiled at once, past every bound: one address's 24
// compile-heavy invalid requests paid from one funded wallet were all
// compiled at once, +255 MiB of heap, none charged, and one payment sent
// again was compiled again each time.)
func TestAVerifiedPaymentsRequestCheckIsBounded(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "settle before"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[5]
	shortenPrecheckWait(t, 300*time.Millisecond)
	holdCompileSlots(t)
	holdTurn(t, "127.0.0.1")

	for _, held := range []struct {
		name string
		hold func(t *testing.T)
	}{
		{"its payer's turn taken", func(t *testing.T) { holdPaidCheckTurn(t, payer.Address.Hex()) }},
		{"every paid check slot busy", holdPaidCheckSlots},
	} {
		t.Run(held.name, func(t *testing.T) {
			const n = 8
			headers := make([]string, n)
			for i := range headers {
				headers[i] = signFor(t, pr, payer.Index) // a fresh nonce each
			}
			before := balance(t, d, payer.Address)
			t.Run("held", func(t *testing.T) {
				held.hold(t)
				var wg sync.WaitGroup
				for _, h := range headers {
					wg.Go(func() {
						t0 := time.Now()
						resp := post(t, url, invalidRequest, map[string]string{x402.HeaderPaymentSignature: h})
						took := time.Since(t0)
						body := string(readAll(t, resp))
						if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"verification_timeout"`) ||
							!strings.Contains(body, `"charged":false`) || resp.Header.Get(x402.HeaderPaymentResponse) != "" || took < precheckWait {
							t.Errorf("a verified payment for an invalid request, %s: %d after %v (PAYMENT-RESPONSE %q): %.300s; want 503 verification_timeout, charged false, after precheckWait (%v)",
								held.name, resp.StatusCode, took, resp.Header.Get(x402.HeaderPaymentResponse), body, precheckWait)
						}
					})
				}
				wg.Wait()
			})
			// Released, the same payments are taken again (their claims
			// were given back), checked, and refused 422 uncharged.
			for _, h := range headers[:2] {
				resp := post(t, url, invalidRequest, map[string]string{x402.HeaderPaymentSignature: h})
				body := string(readAll(t, resp))
				if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(body, `"charged":false`) {
					t.Errorf("the same payment once the gateway is free: %d %.300s; want 422, charged false", resp.StatusCode, body)
				}
			}
			if got := charged(t, d, payer.Address, before); got.Cmp(big.NewInt(0)) != 0 {
				t.Errorf("charged %v for invalid requests, want 0", got)
			}
		})
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// holdPaidCheckTurn takes payer's turn of the verified calls' checks
// (paidCheckTurns) until the test ends, as one of its calls being checked
// would.
func holdPaidCheckTurn(t *testing.T, payer string) {
	t.Helper()
	turn := paidCheckTurns.join(payer)
	turn.c <- struct{}{}
	t.Cleanup(func() {
		<-turn.c
		paidCheckTurns.leave(payer, turn)
	})
}

// holdPaidCheckSlots takes every one of the gateway's slots for verified
// calls' checks (paidCheckSlots) until the test ends, as calls of other
// payers being checked would.
func holdPaidCheckSlots(t *testing.T) {
	t.Helper()
	for range cap(paidCheckSlots) {
		paidCheckSlots <- struct{}{}
	}
	t.Cleanup(func() {
		for range cap(paidCheckSlots) {
			<-paidCheckSlots
		}
	})
}
