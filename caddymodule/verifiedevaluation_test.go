package caddymodule

import (
	"bytes"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// With settle before, a call whose payment the facilitator verified has
// its request compiled and then evaluated with verifierd's default budgets
// before the payment settles. A request over them is refused 422, charged
// nothing, and its payment may be sent again: the evaluation is work done
// for nothing as the compile is, so both run within one hold of the
// payer's turn (one of its calls checked at a time) and of one of the
// gateway's paidCheckSlots. Checked: one payer's calls, and several
// payers' calls with only two paid check slots free, are never checked
// (compiled or evaluated) more at once than those bounds, each is refused
// 422 uncharged, and every turn and slot is given back. (Before: only the
// compile was held; one payer's calls for a schema over the step budget
// were all evaluated at once, 8 of them with paidCheckSlots 4.)
func TestAVerifiedPaymentsEvaluationHoldsItsPayersTurnAndAPaidSlot(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "settle before"))
	url := base + "/verify/schema"
	body := overStepBudget()
	pr := paymentRequired(t, post(t, url, body, nil)) // compile-only: offered
	accounts := evmfacilitator.DevAccounts()

	for _, tc := range []struct {
		name   string
		payers []int
		free   int // paid check slots left free
		most   int // checks at once allowed
	}{
		{"one payer's calls", []int{9, 9, 9, 9}, cap(paidCheckSlots), 1},
		{"four payers' calls, two paid check slots free", []int{6, 7, 8, 9}, 2, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			held := cap(paidCheckSlots) - tc.free
			for range held {
				paidCheckSlots <- struct{}{}
			}
			t.Cleanup(func() {
				for range held {
					<-paidCheckSlots
				}
			})
			headers := make([]string, len(tc.payers))
			before := map[int]string{}
			for i, p := range tc.payers {
				headers[i] = signFor(t, pr, p) // a fresh nonce each
				before[p] = balance(t, d, accounts[p].Address).String()
			}
			most := mostChecksAtOnce(func() {
				var wg sync.WaitGroup
				for _, h := range headers {
					wg.Go(func() {
						resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: h})
						b := string(readAll(t, resp))
						if resp.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(b, `"invalid_request"`) ||
							!strings.Contains(b, `"charged":false`) || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
							t.Errorf("a verified payment for a request over the evaluation budget: %d (PAYMENT-RESPONSE %q) %.300s; want 422 invalid_request, charged false",
								resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse), b)
						}
					})
				}
				wg.Wait()
			})
			if most < 1 || most > tc.most {
				t.Errorf("%s (%d calls): at most %d checked (compiled or evaluated) at once; want 1 to %d", tc.name, len(headers), most, tc.most)
			}
			for p, was := range before {
				if now := balance(t, d, accounts[p].Address).String(); now != was {
					t.Errorf("payer %d charged: balance %s, was %s", p, now, was)
				}
			}
			paidCheckTurns.Lock()
			turns := len(paidCheckTurns.m)
			paidCheckTurns.Unlock()
			if len(paidCheckSlots) != held || turns != 0 {
				t.Errorf("after the calls: %d paid check slots taken (want the %d held here), %d payers' turns kept (want 0)", len(paidCheckSlots), held, turns)
			}
		})
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("the upstream ran %d times", n)
	}
}

// mostChecksAtOnce runs calls and returns the most goroutines seen at once
// checking a verification request, sampled every millisecond.
func mostChecksAtOnce(calls func()) int {
	most := 0
	stop, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			most = max(most, checksNow())
		}
	}()
	calls()
	close(stop)
	<-sampled
	return most
}

// checksNow counts the goroutines checking a verification request now:
// compiling its schema (Precheck, PrecheckTree) or parsing and evaluating
// it (ParseContext).
func checksNow() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		if bytes.Contains(g, []byte("verify.(*Verifier).Precheck")) || bytes.Contains(g, []byte("verify.(*Verifier).ParseContext")) {
			n++
		}
	}
	return n
}
