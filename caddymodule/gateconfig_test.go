package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// Configurations of the gate that used to load without a word and then
// lose the buyer's money, or could never be paid, or did something other
// than what they say. Each is refused when the config loads, naming the
// option and what is wrong with its value.

// cfgPayTo is a valid pay_to of nobody in particular.
const cfgPayTo = "0x70997970c51812dc3a010c7d01b50e68099b4c7f"

// cfgRelayerKey is the first well-known development key (go-ethereum's and
// Hardhat's): the embedded facilitator needs one to provision, and none of
// these tests sends anything with it.
const cfgRelayerKey = "ac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"

// cfgGate is a gate on a route with the given accept lines and other
// options; its facilitator is remote and nobody listens on it (no EVM
// offer asks the facilitator anything at load).
func cfgGate(accept, extra string) string {
	return fmt.Sprintf(`:{port} {
	route /paid/* {
		x402 {
			%s
			facilitator http http://127.0.0.1:1
			store badger {data}/gate
			%s
		}
		respond "paid content"
	}
}
`, accept, extra)
}

// cfgLoad loads site into this process's Caddy and returns the load's
// error; a config that loaded is stopped before the test's folders are
// removed (Badger's Close hangs on a folder removed while open).
func cfgLoad(t *testing.T, site string) error {
	t.Helper()
	err := tryLoadCaddy(t, freePort(t), site)
	if err == nil {
		t.Cleanup(func() { caddy.Stop() })
	}
	return err
}

// A pay_to no payment reaches, or one that swallows it: USDC refuses a
// transfer to address(0), so every settlement fails after the upstream did
// the work; a transfer to the token's own contract (or, on Solana, to an
// account owned by the mint or by the system program) succeeds and nobody
// can ever move the money again.
func TestPayToThatLosesThePaymentIsRefused(t *testing.T) {
	for _, tc := range []struct{ desc, accept, want string }{
		{"the zero address", "accept base $0.01 0x0000000000000000000000000000000000000000", "pay_to: address \"0x0000000000000000000000000000000000000000\" is the zero address"},
		{"the USDC contract", "accept base $0.01 0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "is the address of the offer's asset"},
		{"the USDC contract in lower case", "accept base $0.01 0x833589fcd6edb6e08f4c7c32d4f71b54bda02913", "is the address of the offer's asset"},
		{"a custom token's own contract", "accept {\n\tnetwork base\n\tamount 1\n\tasset 0x1111111111111111111111111111111111111111\n\tasset_name T\n\tasset_version 1\n\tpay_to 0x1111111111111111111111111111111111111111\n}", "is the address of the offer's asset"},
		{"the Solana system program", "accept solana $0.01 11111111111111111111111111111111", "is the zero address"},
		{"the Solana USDC mint", "accept solana $0.01 EPjFWdd5AufqSSqeM2qN1xzybapC8G4wEGGkZwyTDt1v", "is the address of the offer's asset"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, cfgLoad(t, cfgGate(tc.accept, "")), tc.want)
		})
	}
	t.Run("a valid pay_to loads", func(t *testing.T) {
		wantErr(t, cfgLoad(t, cfgGate("accept base $0.01 "+cfgPayTo, "")), "")
	})
}

// x402_facilitator settles only to its operator's pay_to addresses: one of
// them being the zero address or the USDC it settles would have its fee
// payer send buyers' money where it is refused or lost.
func TestFacilitatorPayToThatLosesThePaymentIsRefused(t *testing.T) {
	for _, tc := range []struct{ desc, payTo, facilitator, want string }{
		{"the zero address", "0x0000000000000000000000000000000000000000", `{"type":"http","url":"http://127.0.0.1:1"}`, "is the zero address"},
		{"the Solana zero key", "11111111111111111111111111111111", `{"type":"http","url":"http://127.0.0.1:1"}`, "is the zero address"},
		{"the USDC it settles", "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", `{"type":"evm","network":"base","rpc_url":"http://127.0.0.1:1","relayer_key":"` + cfgRelayerKey + `"}`, "is the address of the offer's asset"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
			defer cancel()
			_, err := ctx.LoadModuleByID("http.handlers.x402_facilitator", json.RawMessage(`{"pay_to":["`+tc.payTo+`"],"facilitator":`+tc.facilitator+`}`))
			wantErr(t, err, tc.want)
			if !strings.Contains(err.Error(), "x402_facilitator: pay_to") {
				t.Errorf("error %v does not name x402_facilitator's pay_to", err)
			}
		})
	}
}

// An offer on a network the gate's own facilitator does not settle: every
// buyer signs a payment and is refused invalid_network, again and again.
// What an embedded facilitator settles is known at load; a remote one's
// is not (and is not asked for: no network call at load).
func TestOfferOnANetworkTheFacilitatorDoesNotSettleIsRefused(t *testing.T) {
	evm := func(network string) string {
		return "evm {\n\t\t\t\tnetwork " + network + "\n\t\t\t\trpc_url http://127.0.0.1:1\n\t\t\t\trelayer_key " + cfgRelayerKey + "\n\t\t\t}"
	}
	site := func(facilitator string) string {
		return fmt.Sprintf(`:{port} {
	route /paid/* {
		x402 {
			accept base $0.01 %s
			facilitator %s
			store badger {data}/gate
		}
		respond "paid content"
	}
}
`, cfgPayTo, facilitator)
	}
	for _, tc := range []struct{ desc, facilitator, want string }{
		{"an evm facilitator on another network", evm("base-sepolia"), "accept 0: network eip155:8453: the facilitator settles on eip155:84532 only"},
		{"a multi facilitator without it", "multi {\n\t\t\t" + evm("base-sepolia") + "\n\t\t\t}", "the facilitator settles on eip155:84532 only"},
		{"an evm facilitator on the offer's network", evm("base"), ""},
		{"a multi facilitator with a remote member", "multi {\n\t\t\t" + evm("base-sepolia") + "\n\t\t\thttp http://127.0.0.1:1\n\t\t\t}", ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, cfgLoad(t, site(tc.facilitator)), tc.want)
		})
	}
}

// An EVM authorization is valid until the buyer's clock plus
// maxTimeoutSeconds, and the facilitator settles it only while it has
// x402.ValidBeforeMargin (6s) left. max_timeout under that, or so short
// that settle after (the upstream first, for up to upstream_timeout) comes
// too late, makes a route no buyer can pay. A negative one used to become
// the 60s default, and 500ms was offered as 0 seconds.
func TestMaxTimeoutNoAuthorizationCanBeSettledWithinIsRefused(t *testing.T) {
	accept := func(mt string) string {
		return "accept {\n\t\t\t\tnetwork base\n\t\t\t\tprice $0.01\n\t\t\t\tpay_to " + cfgPayTo + "\n\t\t\t\tmax_timeout " + mt + "\n\t\t\t}"
	}
	for _, tc := range []struct{ desc, maxTimeout, extra, want string }{
		{"500ms", "500ms", "settle before", "accept 0: max_timeout 500ms (offered as 0s) is too short: use at least 7s"},
		{"the margin itself", "6s", "settle before", "max_timeout 6s (offered as 6s) is too short: use at least 7s"},
		{"negative", "-1s", "", "accept 0: max_timeout -1s is negative"},
		{"the least settle before takes", "7s", "settle before", ""},
		{"under the default upstream_timeout and the margin", "36s", "", "use at least 37s"},
		{"the least the default upstream_timeout takes", "37s", "", ""},
		{"under a fractional upstream_timeout", "7s", "upstream_timeout 500ms", "use at least 8s"},
		{"a short upstream_timeout", "10s", "upstream_timeout 3s", ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, cfgLoad(t, cfgGate(accept(tc.maxTimeout), tc.extra)), tc.want)
		})
	}
}

// Two offers of one asset on one network: a buyer picks the cheaper, and
// whichever price was meant, the other is the one paid.
func TestTwoOffersOfOneAssetOnOneNetworkAreRefused(t *testing.T) {
	for _, tc := range []struct{ desc, accepts, want string }{
		{"two prices", "accept base $1.00 " + cfgPayTo + "\n\t\t\taccept base $0.000001 " + cfgPayTo, "accept 1: offers the asset of accept 0 (0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913 on eip155:8453) again"},
		{"two payees", "accept base $1.00 " + cfgPayTo + "\n\t\t\taccept base $1.00 0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC", "accept 1: offers the asset of accept 0"},
		{"one asset named two ways", "accept base $1.00 " + cfgPayTo + "\n\t\t\taccept {\n\t\t\t\tnetwork eip155:8453\n\t\t\t\tasset 0x833589fcd6edb6e08f4c7c32d4f71b54bda02913\n\t\t\t\tamount 1\n\t\t\t\tpay_to " + cfgPayTo + "\n\t\t\t}", "accept 1: offers the asset of accept 0"},
		{"two networks", "accept base $1.00 " + cfgPayTo + "\n\t\t\taccept base-sepolia $1.00 " + cfgPayTo, ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, cfgLoad(t, cfgGate(tc.accepts, "")), tc.want)
		})
	}
}
