package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// A gate with nothing behind it in its handle block (the proxy written in
// another, exclusive handle block) reaches the end of Caddy's handler
// chain, where nothing writes an answer. That is not an answer the buyer
// pays for: the paid call is refused 502 no_upstream in the error shape
// and nothing moves on chain, and a free call is not counted either.
func TestGateWithNothingBehindItChargesNothing(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	site := fmt.Sprintf(`:{port} {
	handle /verify/schema {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http {
				url %[1]s
			}
			store badger {data}/gate
			validate verify_request
		}
	}
	handle /free/schema {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http {
				url %[1]s
			}
			store badger {data}/free
			free_allowance {
				per_day 1
			}
		}
	}
	handle /verify/* {
		reverse_proxy %[3]s
	}
}
`, fac, payTo.Hex(), strings.TrimPrefix(up.URL, "http://"))
	base := startCaddy(t, site)
	url := base + "/verify/schema"

	// Free: refused, and the day's one free call is still there.
	for i := range 2 {
		resp := post(t, base+"/free/schema", validRequest, nil)
		m := readJSON(t, resp)
		if resp.StatusCode != http.StatusBadGateway || m["code"] != codeNoUpstream || m["charged"] != false {
			t.Fatalf("free call %d: %d %v", i+1, resp.StatusCode, m)
		}
	}

	payer := evmfacilitator.DevAccounts()[4].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 4)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	m := readJSON(t, resp)
	if got := charged(t, d, payer, before); got.Sign() != 0 {
		t.Fatalf("charged %v on chain for %d %v", got, resp.StatusCode, m)
	}
	if resp.StatusCode != http.StatusBadGateway || m["code"] != codeNoUpstream || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("paid call: %d %v", resp.StatusCode, m)
	}
	if up.calls.Load() != 0 {
		t.Fatalf("upstream ran %d times", up.calls.Load())
	}
}

// With settle before the payment is settled before anything runs behind
// the gate: a gate with nothing behind it cannot give it back, but its
// answer says so (502 no_upstream, charged true, PAYMENT-RESPONSE), never
// Caddy's empty 200.
func TestSettleBeforeGateWithNothingBehindItSaysCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	site := fmt.Sprintf(`:{port} {
	handle /verify/schema {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http {
				url %[1]s
			}
			store badger {data}/gate
			validate verify_request
			settle before
		}
	}
}
`, fac, payTo.Hex())
	url := startCaddy(t, site) + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 6)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	m := readJSON(t, resp)
	if got := charged(t, d, payer, before); got.Sign() == 0 {
		t.Fatalf("nothing charged: the settle before test settled nothing (%d %v)", resp.StatusCode, m)
	}
	if resp.StatusCode != http.StatusBadGateway || m["code"] != codeNoUpstream || m["charged"] != true {
		t.Fatalf("answer %d %v, want 502 no_upstream, charged true", resp.StatusCode, m)
	}
	if sr := settlementOf(t, resp); !sr.Success {
		t.Fatalf("PAYMENT-RESPONSE %+v, want the settlement", sr)
	}
}
