package caddymodule

import (
	"bytes"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// A reload that changes a route's offers (its price, or its pay_to) must not
// strand a payment the gate already holds: the buyer's retry of a paid call
// whose settlement was unknown gets the held answer with PAYMENT-RESPONSE,
// though its payment matches none of the new offers. A new payment signed
// for the old offer is still refused: only a payment with a claim is
// resolved by it.
func TestReloadChangingTheOfferStillResolvesAHeldPayment(t *testing.T) {
	for _, tc := range []struct {
		name      string
		old, new_ string
		key       int
	}{
		{"price", "$0.02", "$0.03", 8},
		{"pay_to", payTo.Hex(), cfgPayTo, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _ := sharedDevnet(t)
			up := newUpstream(t)
			storeDir := gateDir(t)
			site := pendingSite(up.URL, "lose_reply", storeDir, "")
			base := startCaddy(t, site)
			url := base + "/verify/schema"
			payer := evmfacilitator.DevAccounts()[tc.key].Address
			before := balance(t, d, payer)
			oldOffer := paymentRequired(t, post(t, url, "", nil))
			sig := signFor(t, oldOffer, tc.key)

			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("first try: status %d: %s", resp.StatusCode, b)
			}
			if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
				t.Fatalf("charged %v on chain, want the one transfer", got)
			}

			var port int
			fmt.Sscanf(base[strings.LastIndex(base, ":")+1:], "%d", &port)
			loadCaddy(t, port, strings.Replace(site, tc.old, tc.new_, 1))

			// A new payment for the offer the route no longer makes.
			fresh := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, oldOffer, tc.key)})
			fb, _ := io.ReadAll(fresh.Body)
			if fresh.StatusCode != http.StatusPaymentRequired || !bytes.Contains(fb, []byte("no_matching_requirements")) {
				t.Fatalf("a new payment for the old offer: %d %s", fresh.StatusCode, fb)
			}

			resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			b, _ = io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte("paid_content")) || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
				t.Fatalf("the held payment's retry after the reload: %d %.300s (charged %v on chain)", resp.StatusCode, b, charged(t, d, payer, before))
			}
			if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
				t.Fatalf("charged %v on chain, upstream ran %d times; want one transfer and one run", got, up.calls.Load())
			}
		})
	}
}

// The same for a payment identifier's saved answer: after a reload that
// changed the price, the settled call's retry with the same payment gets
// the saved answer and the first settlement, and nothing is charged again.
func TestReloadChangingThePriceStillServesASavedAnswer(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	site := strings.ReplaceAll(gateSite(up.URL, fac, 0, "payment_identifier"), "{data}", t.TempDir())
	base := startCaddy(t, site)
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[2]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, pr, payer.Key(), "pay_reload_saved_answer_01")

	first := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	firstBody := readAll(t, first)
	if first.StatusCode != http.StatusOK {
		t.Fatalf("first call: %d %s", first.StatusCode, firstBody)
	}
	firstTx := settlementOf(t, first).Transaction

	var port int
	fmt.Sscanf(base[strings.LastIndex(base, ":")+1:], "%d", &port)
	loadCaddy(t, port, strings.Replace(site, "$0.02", "$0.03", 1))

	again := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body := readAll(t, again)
	if again.StatusCode != http.StatusOK || !bytes.Equal(body, firstBody) {
		t.Fatalf("retry after the reload: %d %.300s\nwant the saved %s", again.StatusCode, body, firstBody)
	}
	if tx := settlementOf(t, again).Transaction; tx != firstTx {
		t.Fatalf("PAYMENT-RESPONSE names %s, want the first settlement %s", tx, firstTx)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
		t.Fatalf("charged %v, upstream ran %d times; want one payment and one run", got, up.calls.Load())
	}
}
