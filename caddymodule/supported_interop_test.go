package caddymodule

import (
	"fmt"
	"math/big"
	"net/http"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// TestOfficialExpressServerPricesTheDevnetFromSupported: a seller on the
// official @x402/express middleware prices a route on the devnet (a network
// the official packages know no asset for) from our facilitator's GET
// /supported alone, served by x402_facilitator in Caddy; a payment to it
// settles and the money moves once.
func TestOfficialExpressServerPricesTheDevnetFromSupported(t *testing.T) {
	interop.Dir(t, "@x402/express", "@x402/evm", "viem")
	d, fac := sharedDevnet(t)
	payee := evmfacilitator.DevAccounts()[7]
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	handle_path /facilitator/* {
		x402_facilitator {
			pay_to %s
			http %s
		}
	}
}
`, payee.Address.Hex(), fac))
	var ready struct {
		URL   string         `json:"url"`
		Extra map[string]any `json:"extra"`
	}
	interop.Start(t, "express-evm-server.mjs", []string{"FACILITATOR_URL=" + base + "/facilitator", "PAY_TO=" + payee.Address.Hex()}, &ready)
	token := d.Token().Hex()
	if ready.Extra["asset"] != token || ready.Extra["decimals"] != float64(6) || ready.Extra["name"] != "USD Coin" || ready.Extra["version"] != "2" {
		t.Fatalf("/supported extra %v, want the devnet token %s, 6 decimals, USD Coin v2", ready.Extra, token)
	}

	resp, err := http.Get(ready.URL + "/paid")
	if err != nil {
		t.Fatal(err)
	}
	pr := paymentRequired(t, resp)
	if len(pr.Accepts) != 1 || pr.Accepts[0].Asset != token || pr.Accepts[0].Amount != "10000" {
		t.Fatalf("the official server's offer %+v, want 10000 of %s", pr.Accepts, token)
	}
	payer := evmfacilitator.DevAccounts()[8]
	before := balance(t, d, payer.Address)
	p, err := x402.SignExactEVM(payer.Key(), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, ready.URL+"/paid", nil)
	req.Header.Set(x402.HeaderPaymentSignature, sig)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("paid call: %d, PAYMENT-RESPONSE %q", resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse))
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(10000)) != 0 {
		t.Fatalf("payer charged %v, want 10000", got)
	}
}
