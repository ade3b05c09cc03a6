package caddymodule

import (
	"fmt"
	"math/big"
	"net/http"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// With settle before the payment is settled before the upstream runs. An
// upstream that then fails before answering (here: nothing listens) is
// answered by the gate itself, not by Caddy's error handling: the
// handle_errors block of Caddyfile.example would tell the charged buyer
// "nothing was charged; retry". The gate's answer carries the
// settlement's PAYMENT-RESPONSE and says charged true, and does not invite
// a retry with the spent payment.
func TestSettleBeforeUpstreamDownAnswerSaysCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	dead := freePort(t) // nothing listens
	site := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http {
				url %[1]s
			}
			store badger {data}/gate
			validate verify_request
			settle before
		}
		reverse_proxy 127.0.0.1:%[3]d
	}
	handle_errors 502 503 504 {
		header Content-Type application/json
		header Retry-After 5
		respond `+"`"+`{"code":"upstream_unavailable","message":"The backend service is unavailable and nothing was charged; retry after 5 seconds.","status":503,"retryable":true,"retry_after":5,"charged":false}`+"`"+` 503
	}
}
`, fac, payTo.Hex(), dead)
	base := startCaddy(t, site)
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[5].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 5)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	m := readJSON(t, resp)
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v on chain, want the one settlement", got)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || m["code"] != "upstream_unavailable" || m["charged"] != true || m["retryable"] != false {
		t.Fatalf("answer %d %v, want 503 upstream_unavailable, charged true, not retryable", resp.StatusCode, m)
	}
	if resp.Header.Get("Retry-After") != "" {
		t.Fatalf("Retry-After %q on an answer whose payment is spent", resp.Header.Get("Retry-After"))
	}
	if sr := settlementOf(t, resp); !sr.Success || sr.Transaction == "" {
		t.Fatalf("PAYMENT-RESPONSE %+v, want the settlement", sr)
	}
}
