package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// TestFacilitatorAPIGuards runs the facilitator API in real Caddy on a
// devnet with pay_to and a bearer token, and attacks it: no token, a
// wrong one, and a well-signed payment to someone else's address. Nothing
// of that reaches the chain: the relayer sends no transaction.
func TestFacilitatorAPIGuards(t *testing.T) {
	rpc := facFreeAddr(t)
	t.Setenv("FAC_GUARD_TOKEN", "guard-token-0123456789")
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	handle_path /facilitator/* {
		x402_facilitator {
			pay_to %s
			token {env.FAC_GUARD_TOKEN}
			devnet {
				rpc_listen %s
			}
		}
	}
}
`, facPayTo(), rpc))
	chain, err := ethclient.Dial("http://" + rpc)
	if err != nil {
		t.Fatal(err)
	}
	defer chain.Close()
	accts := evmfacilitator.DevAccounts()
	relayer := accts[0].Address
	sent := func(t *testing.T) uint64 {
		t.Helper()
		n, err := chain.NonceAt(context.Background(), relayer, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	good := "Bearer guard-token-0123456789"
	body := func(t *testing.T, payer, payTo int) string {
		t.Helper()
		req := facDevnetRequirements(accts[payTo].Address)
		p, err := x402.SignExactEVM(accts[payer].Key(), req, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(x402.FacilitatorRequest{X402Version: 2, PaymentPayload: p, PaymentRequirements: req})
		return string(b)
	}

	for _, c := range []struct{ desc, method, path, auth string }{
		{"settle without a token", "POST", "/settle", ""},
		{"settle with a wrong token", "POST", "/settle", "Bearer guard-token-0123456780"},
		{"settle with the token but not as a bearer", "POST", "/settle", "guard-token-0123456789"},
		{"settle with the token sent twice", "POST", "/settle", good + "\x00" + good},
		{"verify without a token", "POST", "/verify", ""},
		{"supported without a token", "GET", "/supported", ""},
	} {
		t.Run(c.desc+" is 401", func(t *testing.T) {
			before := sent(t)
			hdr := map[string]string{}
			if c.auth != "" {
				hdr["Authorization"] = c.auth
			}
			b := ""
			if c.method == "POST" {
				b = body(t, 1, 2)
			}
			status, h, m := walletCall(t, c.method, base+"/facilitator"+c.path, b, hdr)
			if status != http.StatusUnauthorized || m["code"] != "unauthorized" || m["charged"] != false ||
				!strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer") {
				t.Fatalf("%d %v %v", status, h, m)
			}
			if strings.Contains(fmt.Sprint(m), "guard-token") {
				t.Fatal("the answer echoes the token")
			}
			if after := sent(t); after != before {
				t.Fatalf("the relayer sent %d transactions", after-before)
			}
		})
	}

	for _, ep := range []string{"/verify", "/settle"} {
		t.Run(ep+" of a payment to a foreign pay_to is refused with invalid_payment_requirements", func(t *testing.T) {
			before := sent(t)
			status, _, m := walletCall(t, "POST", base+"/facilitator"+ep, body(t, 1, 5), map[string]string{"Authorization": good})
			if status != 200 {
				t.Fatalf("%d %v", status, m)
			}
			reason, ok := "invalidReason", m["isValid"] == false
			if ep == "/settle" {
				reason, ok = "errorReason", m["success"] == false && m["transaction"] == ""
			}
			if !ok || m[reason] != x402.ReasonInvalidPaymentRequirements {
				t.Fatalf("answer %v", m)
			}
			if after := sent(t); after != before {
				t.Fatalf("the relayer sent %d transactions for a foreign payment", after-before)
			}
		})
	}

	// The caller writes the requirements: a payment to the operator's own
	// address in a token of the caller's making, or of one atom, would
	// still cost the relayer its gas (the fee payer its fee on Solana),
	// as often as the caller liked.
	for _, c := range []struct {
		desc, why string
		edit      func(r *x402.PaymentRequirements)
	}{
		{"in another token", "its network's USDC only", func(r *x402.PaymentRequirements) { r.Asset = accts[4].Address.Hex() }},
		{"below min_price ($0.01)", "at least $0.01", func(r *x402.PaymentRequirements) { r.Amount = "9999" }},
	} {
		for _, ep := range []string{"/verify", "/settle"} {
			t.Run(ep+" of a payment "+c.desc+" is refused with invalid_payment_requirements", func(t *testing.T) {
				before := sent(t)
				req := facDevnetRequirements(accts[2].Address)
				c.edit(&req)
				p, err := x402.SignExactEVM(accts[1].Key(), req, nil, time.Now())
				if err != nil {
					t.Fatal(err)
				}
				b, _ := json.Marshal(x402.FacilitatorRequest{X402Version: 2, PaymentPayload: p, PaymentRequirements: req})
				status, _, m := walletCall(t, "POST", base+"/facilitator"+ep, string(b), map[string]string{"Authorization": good})
				reason, message, ok := "invalidReason", "invalidMessage", m["isValid"] == false
				if ep == "/settle" {
					reason, message, ok = "errorReason", "errorMessage", m["success"] == false && m["transaction"] == ""
				}
				if status != 200 || !ok || m[reason] != x402.ReasonInvalidPaymentRequirements || !strings.Contains(fmt.Sprint(m[message]), c.why) {
					t.Fatalf("%d %v", status, m)
				}
				if after := sent(t); after != before {
					t.Fatalf("the relayer sent %d transactions", after-before)
				}
			})
		}
	}

	t.Run("a settle to the operator's own pay_to goes through", func(t *testing.T) {
		status, _, m := walletCall(t, "POST", base+"/facilitator/settle", body(t, 1, 2), map[string]string{"Authorization": good})
		if status != 200 || m["success"] != true {
			t.Fatalf("%d %v", status, m)
		}
	})
	t.Run("the operator's pay_to matches in any letter case", func(t *testing.T) {
		req := facDevnetRequirements(accts[2].Address)
		req.PayTo = strings.ToLower(req.PayTo)
		p, _ := x402.SignExactEVM(accts[3].Key(), req, nil, time.Now())
		b, _ := json.Marshal(x402.FacilitatorRequest{X402Version: 2, PaymentPayload: p, PaymentRequirements: req})
		status, _, m := walletCall(t, "POST", base+"/facilitator/verify", string(b), map[string]string{"Authorization": good})
		if status != 200 || m["isValid"] != true {
			t.Fatalf("%d %v", status, m)
		}
	})
}

func TestFacilitatorHandlerConfigErrors(t *testing.T) {
	for _, c := range []struct{ desc, cfg, want string }{
		{"pay_to is required", `{"facilitator":{"type":"evm","devnet":{}}}`, "pay_to is required"},
		{"an empty pay_to is refused", `{"pay_to":[" "],"facilitator":{"type":"evm","devnet":{}}}`, "is not an address"},
		{"an unset placeholder is not an address", `{"pay_to":["{env.FAC_UNSET_PAY_TO_X}"],"facilitator":{"type":"evm","devnet":{}}}`, "is not an address"},
		{"a min_price that is not a price is refused", `{"pay_to":["` + facPayTo() + `"],"min_price":"1e-2","facilitator":{"type":"evm","devnet":{}}}`, "min_price"},
		{"a short token is refused", `{"pay_to":["` + facPayTo() + `"],"token":"short","facilitator":{"type":"evm","devnet":{}}}`, "at least 16"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			_, err := ctx.LoadModuleByID("http.handlers.x402_facilitator", json.RawMessage(c.cfg))
			wantErr(t, err, c.want)
		})
	}
	t.Run("pay_to needs an address in the Caddyfile", func(t *testing.T) {
		wantErr(t, adaptSiteError("x402_facilitator {\n\tpay_to\n\tdevnet\n}"), "wrong argument count")
	})
	t.Run("token takes one argument", func(t *testing.T) {
		wantErr(t, adaptSiteError("x402_facilitator {\n\ttoken a b\n\tdevnet\n}"), "wrong argument count")
	})
}
