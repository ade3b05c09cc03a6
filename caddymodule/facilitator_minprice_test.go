package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// Two test networks whose USDC-like token has other decimals than USDC's
// 6, registered once for the whole process (RegisterAsset cannot take a
// registration back, and these chain ids are used nowhere else).
const (
	minPriceNet18 = "eip155:990018"
	minPriceNet2  = "eip155:990002"
)

func registerMinPriceAssets(t *testing.T) {
	t.Helper()
	for _, a := range []x402.Asset{
		{Network: minPriceNet18, Address: "0x1800000000000000000000000000000000000018", Name: "Eighteen", Version: "1", Decimals: 18},
		{Network: minPriceNet2, Address: "0x0200000000000000000000000000000000000002", Name: "Two", Version: "1", Decimals: 2},
	} {
		if err := x402.RegisterAsset(a); err != nil {
			t.Fatal(err)
		}
	}
}

// minPriceFacilitator is an x402_facilitator with min_price over an evm
// facilitator on network (dialing makes no request, so the chain is never
// reached by what these tests send).
func minPriceFacilitator(network, minPrice string) string {
	return fmt.Sprintf(`{"pay_to":[%q],"min_price":%q,"facilitator":{"type":"multi","facilitators":[{"type":"evm","network":%q,"rpc_url":"http://127.0.0.1:1","relayer_key":%q}]}}`,
		facPayTo(), minPrice, network, evmfacilitator.DevAccounts()[8].PrivateKeyHex)
}

// minPriceVerify asks h to verify a payment of amount atomic units of
// network's asset to the operator and returns the guard's refusal
// (invalidReason: invalidMessage). A payment the guard lets through goes
// to the facilitator, which asks the chain (unreachable here) and answers
// 503: then passed is true.
func minPriceVerify(t *testing.T, h *FacilitatorHandler, network, amount string) (passed bool, why string) {
	t.Helper()
	a, ok := x402.USDC(network)
	if !ok {
		t.Fatalf("no asset on %s", network)
	}
	req := x402.PaymentRequirements{Scheme: x402.SchemeExact, Network: network, Amount: amount, Asset: a.Address,
		PayTo: facPayTo(), MaxTimeoutSeconds: 60, Extra: a.Extra()}
	payload, _ := json.Marshal(map[string]any{
		"signature":     "0x" + strings.Repeat("00", 65),
		"authorization": map[string]any{"from": common.Address{1}.Hex(), "to": req.PayTo, "value": amount, "validAfter": "0", "validBefore": "99999999999", "nonce": "0x" + strings.Repeat("00", 32)},
	})
	p := x402.PaymentPayload{X402Version: 2, Accepted: req, Payload: payload}
	status, body := facServe(t, h, http.MethodPost, "/verify", x402.FacilitatorRequest{X402Version: 2, PaymentPayload: p, PaymentRequirements: req})
	if status == http.StatusServiceUnavailable && strings.Contains(string(body), `"upstream_unavailable"`) {
		return true, ""
	}
	var v x402.VerifyResponse
	if err := json.Unmarshal(body, &v); err != nil || status != http.StatusOK || v.IsValid {
		t.Fatalf("verify: %d %s", status, body)
	}
	return false, v.InvalidReason + ": " + v.InvalidMessage
}

// min_price is one rule: the price in the asset's own decimals. It is
// checked at provision against every asset the facilitator settles that is
// known then (not against USDC's 6 decimals), and each request compares
// the amount with the same floor: a min_price finer than an 18-decimal
// token's USDC-sized precision is fine there, and one finer than a
// 2-decimal token can express refuses the configuration instead of every
// payment.
func TestFacilitatorMinPriceIsInTheAssetsDecimals(t *testing.T) {
	registerMinPriceAssets(t)

	t.Run("18 decimals: a floor of 7 decimal places provisions and is compared exactly", func(t *testing.T) {
		mod, cancel := facLoad(t, "http.handlers.x402_facilitator", minPriceFacilitator(minPriceNet18, "$0.0000001"))
		defer cancel()
		h := mod.(*FacilitatorHandler)
		floor := new(big.Int).Exp(big.NewInt(10), big.NewInt(11), nil) // 0.0000001 × 10^18
		below := new(big.Int).Sub(floor, big.NewInt(1))
		if passed, why := minPriceVerify(t, h, minPriceNet18, below.String()); passed || !strings.Contains(why, "at least $0.0000001") {
			t.Fatalf("one atom below the floor: passed %v, %s", passed, why)
		}
		if passed, why := minPriceVerify(t, h, minPriceNet18, floor.String()); !passed {
			t.Fatalf("at the floor: %s", why)
		}
	})

	t.Run("2 decimals: a floor the asset cannot express is refused at provision", func(t *testing.T) {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		_, err := ctx.LoadModuleByID("http.handlers.x402_facilitator", json.RawMessage(minPriceFacilitator(minPriceNet2, "$0.001")))
		wantErr(t, err, `x402_facilitator: min_price: parsing price "$0.001": more than 2 decimal places, the asset's precision (the token of `+minPriceNet2+`)`)
	})

	t.Run("2 decimals: a floor it can express is compared in its atoms", func(t *testing.T) {
		mod, cancel := facLoad(t, "http.handlers.x402_facilitator", minPriceFacilitator(minPriceNet2, "$0.05"))
		defer cancel()
		h := mod.(*FacilitatorHandler)
		if passed, why := minPriceVerify(t, h, minPriceNet2, "4"); passed || !strings.Contains(why, "at least $0.05") {
			t.Fatalf("4 atoms, below $0.05: passed %v, %s", passed, why)
		}
		if passed, why := minPriceVerify(t, h, minPriceNet2, "5"); !passed {
			t.Fatalf("5 atoms, $0.05: %s", why)
		}
	})

	// A remote facilitator's networks are not known at provision: the
	// price is checked for its form only, and a request in an asset too
	// coarse for it is refused saying so, not as a payment below it.
	t.Run("a remote facilitator's asset too coarse for the floor is named per request", func(t *testing.T) {
		mod, cancel := facLoad(t, "http.handlers.x402_facilitator",
			fmt.Sprintf(`{"pay_to":[%q],"min_price":"$0.001","facilitator":{"type":"http","url":"http://127.0.0.1:1"}}`, facPayTo()))
		defer cancel()
		h := mod.(*FacilitatorHandler)
		if passed, why := minPriceVerify(t, h, minPriceNet2, "100"); passed || !strings.Contains(why, "min_price $0.001 cannot be stated in the 2 decimals of the token of "+minPriceNet2) {
			t.Fatalf("a coarse asset: passed %v, %s", passed, why)
		}
	})
}

// Without a network known at provision, min_price is still checked for its
// form, and any amount that is a price is accepted.
func TestFacilitatorMinPriceFormWithoutAKnownAsset(t *testing.T) {
	cfg := func(minPrice string) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"pay_to":[%q],"min_price":%q,"facilitator":{"type":"http","url":"http://127.0.0.1:1"}}`, facPayTo(), minPrice))
	}
	for _, c := range []struct{ minPrice, want string }{
		{"1e-2", `x402_facilitator: min_price: parsing price "1e-2": only digits`},
		{"$0", "x402_facilitator: min_price: parsing price \"$0\": price is zero"},
		{"$1000", ""},
		{"$0.000000000000000001", ""},
	} {
		t.Run(c.minPrice, func(t *testing.T) {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			_, err := ctx.LoadModuleByID("http.handlers.x402_facilitator", cfg(c.minPrice))
			wantErr(t, err, c.want)
		})
	}
}
