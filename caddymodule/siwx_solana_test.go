package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// TestSignInWithXReturningSolanaBuyer: a Solana wallet that paid for an
// agent's score with the official client re-reads it with a sign-in-with-x
// proof from the official @x402/extensions signer (ed25519), without
// paying again; another Solana wallet's proof still gets 402.
func TestSignInWithXReturningSolanaBuyer(t *testing.T) {
	interop.Dir(t, "@x402/extensions", "@solana/kit")
	e := newSolanaEnv(t)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /score/* {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			siwx
		}
		@unpaid not vars {http.auth.wallet.paid_access} true
		x402 @unpaid {
			siwx 127.0.0.1:{port}
			accept solana-devnet $0.01 %s
			route "GET /score/{agent_id}"
			facilitator %s
			store badger {data}/gate
		}
		reverse_proxy %s
	}
}
`, e.payee.Address, e.svmBlock(), strings.TrimPrefix(up.URL, "http://")))
	url := base + "/score/agent-1"
	payOnSolana(t, e, url, 10000)

	signIn := func(w solanachain.Wallet) string {
		t.Helper()
		pr := paymentRequired(t, corsDo(t, http.MethodGet, url, nil))
		ext, _ := pr.Extensions["sign-in-with-x"].(map[string]any)
		info, _ := ext["info"].(map[string]any)
		if info == nil || fmt.Sprint(ext["supportedChains"]) != fmt.Sprint([]any{map[string]any{"chainId": x402.NetworkSolanaDevnet, "type": "ed25519"}}) {
			t.Fatalf("sign-in-with-x challenge %v", ext)
		}
		var out struct {
			Header string `json:"header"`
		}
		interop.Run(t, "siwx-solana.mjs", nil, map[string]any{"secretKey": w.SecretKey, "chainId": x402.NetworkSolanaDevnet, "info": info, "url": url}, &out)
		return out.Header
	}
	balance := e.usdc(t, e.payer.Address)
	r := corsDo(t, http.MethodGet, url, map[string]string{walletauth.SIWXHeaderName: signIn(e.payer)})
	if r.StatusCode != http.StatusOK || r.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("the payer's sign-in: status %d, PAYMENT-RESPONSE %q", r.StatusCode, r.Header.Get(x402.HeaderPaymentResponse))
	}
	if got := e.usdc(t, e.payer.Address); got != balance {
		t.Errorf("the sign-in moved the payer's USDC from %d to %d", balance, got)
	}
	other := e.chain.Wallets[2]
	if r := corsDo(t, http.MethodGet, url, map[string]string{walletauth.SIWXHeaderName: signIn(other)}); r.StatusCode != http.StatusPaymentRequired {
		t.Errorf("another wallet's sign-in: status %d, want 402", r.StatusCode)
	}
	if n := up.calls.Load(); n != 2 {
		t.Errorf("the upstream ran %d times, want 2 (the paid call and the sign-in)", n)
	}
}
