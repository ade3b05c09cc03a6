package caddymodule

import (
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// TestUnknownOutcomeWithoutRPCNeverAsksToPayAgain: a remote `facilitator
// http` without `rpc` answers the official npm facilitator's failure after
// a send (invalid_exact_evm_transaction_failed naming the transaction that
// did pay payTo). The gate cannot read the chain, so nothing can resolve
// the payment: it is held (503 settlement_pending, saying why it will not
// resolve by itself), and the retry of the same, charged payment once its
// claim has lapsed (validBefore + 1 min) is still 503 settlement_pending,
// never a 402 asking for a new payment. (Before: once the claim lapsed the
// retry was claimed anew, the remote refused the spent authorization as
// expired, and the charged buyer was told 402 "sign a new payment".)
func TestUnknownOutcomeWithoutRPCNeverAsksToPayAgain(t *testing.T) {
	d, fac := sharedDevnet(t)
	remote := fakeFailedAfterSendFacilitator(t, fac, true)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept {
				network devnet
				price $0.01
				pay_to %[3]s
				max_timeout 20s
			}
			upstream_timeout 1s
			facilitator http {
				url %[2]s
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote.URL, payTo.Hex()))
	url := base + "/verify/schema"
	const acct = 7
	payer := evmfacilitator.DevAccounts()[acct].Address
	before := balance(t, d, payer)
	signed := time.Now()
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), acct)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body := readJSON(t, resp)
	paid := new(big.Int).Sub(before, balance(t, d, payer))
	if paid.Sign() <= 0 {
		t.Fatalf("the payer was not charged (first answer %d %v): the fake must let the real settlement through", resp.StatusCode, body)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || body["code"] != x402.ReasonSettlementPending {
		t.Fatalf("charged %s atoms, first answer %d %v; want 503 settlement_pending", paid, resp.StatusCode, body["code"])
	}
	unresolvable := func(what string, resp *http.Response) {
		t.Helper()
		s := readJSONString(t, resp)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(s, `"code":"settlement_pending"`) || !strings.Contains(s, "cannot read the chain") {
			t.Fatalf("%s of a charged payment this gateway cannot resolve: %d %.600s; want 503 settlement_pending saying the gateway cannot read the chain (never a 402 asking for a new payment)", what, resp.StatusCode, s)
		}
		if resp.Header.Get(x402.HeaderPaymentRequired) != "" {
			t.Fatalf("%s carries PAYMENT-REQUIRED: a new offer to a charged buyer", what)
		}
	}
	unresolvable("the retry while the claim lasts", post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	// The claim lapses at validBefore (20 s from signing: the devnet's
	// block time runs ahead of the wall clock after many quick blocks, so
	// a shorter one may expire before it settles) plus a minute.
	time.Sleep(time.Until(signed.Add(20*time.Second + time.Minute + 2*time.Second)))
	unresolvable("the retry after the claim lapsed", post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	if n := up.calls.Load(); n != 1 {
		t.Errorf("the upstream ran %d times; want once", n)
	}
}
