package e2e

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// Returning buyers through Caddyfile.example: a wallet pays once for an
// agent's score, then re-reads it with a sign-in-with-x proof signed by the
// official @x402/extensions client, without a second payment; another
// wallet's proof, and the first wallet's proof for another agent, get 402.
func TestSignInWithXReturningBuyer(t *testing.T) {
	interop.Dir(t, "@x402/extensions", "viem")
	s := newStack(t)
	// The sign-in challenge names the site as the README's commands
	// address it, localhost:<port>.
	_, port, _ := net.SplitHostPort(s.caddyAddr)
	site := "localhost:" + port
	at := func(path string) string { return "http://" + site + path }
	url := at("/score/e2e-siwx-agent")
	payer, other := evmfacilitator.DevAccounts()[4], evmfacilitator.DevAccounts()[5]

	demand := func(t *testing.T, url string) (x402.PaymentRequired, map[string]any) {
		t.Helper()
		r := get(t, url)
		mustStatus(t, r, http.StatusPaymentRequired)
		var pr x402.PaymentRequired
		if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentRequired), &pr); err != nil {
			t.Fatalf("PAYMENT-REQUIRED: %v", err)
		}
		ext, _ := pr.Extensions["sign-in-with-x"].(map[string]any)
		info, _ := ext["info"].(map[string]any)
		if info == nil || info["domain"] != site || info["uri"] != url {
			t.Fatalf("sign-in-with-x challenge %v, want domain %s and uri %s", ext, site, url)
		}
		return pr, info
	}
	signIn := func(t *testing.T, acct evmfacilitator.DevAccount, url string) string {
		t.Helper()
		_, info := demand(t, url)
		var out struct {
			Header string `json:"header"`
		}
		interop.Run(t, "siwx-evm.mjs", nil, map[string]any{
			"privateKey": acct.PrivateKeyHex, "chainId": "eip155:1337", "info": info, "url": url,
		}, &out)
		return out.Header
	}

	pr, _ := demand(t, url)
	payment, err := x402.SignExactEVM(payer.Key(), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, err := x402.EncodeHeader(payment)
	if err != nil {
		t.Fatal(err)
	}
	r := do(t, http.MethodGet, url, nil, map[string]string{x402.HeaderPaymentSignature: sig})
	mustStatus(t, r, http.StatusOK)
	if r.header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatal("the paid call has no PAYMENT-RESPONSE")
	}
	asset := pr.Accepts[0].Asset
	balance := usdc(t, s, asset, payer.Address)

	t.Run("the wallet that paid re-enters with a sign-in-with-x proof, without paying", func(t *testing.T) {
		r := do(t, http.MethodGet, url, nil, map[string]string{"SIGN-IN-WITH-X": signIn(t, payer, url)})
		mustStatus(t, r, http.StatusOK)
		if r.header.Get(x402.HeaderPaymentResponse) != "" {
			t.Fatal("a sign-in was settled as a payment")
		}
		if got := usdc(t, s, asset, payer.Address); got.Cmp(balance) != 0 {
			t.Fatalf("balance moved from %s to %s", balance, got)
		}
	})
	t.Run("another wallet's proof does not let it in", func(t *testing.T) {
		r := do(t, http.MethodGet, url, nil, map[string]string{"SIGN-IN-WITH-X": signIn(t, other, url)})
		mustStatus(t, r, http.StatusPaymentRequired)
	})
	t.Run("the payer's proof for another agent's score does not let it in", func(t *testing.T) {
		u := at("/score/e2e-other-agent")
		r := do(t, http.MethodGet, u, nil, map[string]string{"SIGN-IN-WITH-X": signIn(t, payer, u)})
		mustStatus(t, r, http.StatusPaymentRequired)
	})
}
