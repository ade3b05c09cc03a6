package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// TestFacilitatorAPIIsRateLimitedPaidCallsAreNot runs the shape of
// Caddyfile.example with AOV_FACILITATOR=remote in one Caddy: a gateway
// whose /facilitator/* passes, behind aov_rate_limit in zone facilitator,
// to a facilitator on a port of its own, and whose gate verifies and
// settles with that facilitator directly. A client past the limit gets
// the contract's 429 on every facilitator endpoint, before the facilitator
// is asked; the gate's verify and settle calls (two per paid call) count
// against no one, so a client's paid calls go on while it is over the
// limit and leave its facilitator budget as it was.
func TestFacilitatorAPIIsRateLimitedPaidCallsAreNot(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	facPort := freePort(t)
	facilitator := fmt.Sprintf("http://127.0.0.1:%d", facPort)
	gateway := strings.Replace(gateSite(up.URL, facilitator, 0, ""), "\tx402_discovery /.well-known/x402\n", fmt.Sprintf(`	x402_discovery /.well-known/x402
	handle_path /facilitator/* {
		aov_rate_limit 2 1m {
			zone facilitator
		}
		reverse_proxy 127.0.0.1:%d
	}
`, facPort), 1)
	facSite := fmt.Sprintf(`:%d {
	x402_facilitator {
		pay_to %s
		http %s
	}
}
`, facPort, payTo.Hex(), fac)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32", "", gateway+facSite)

	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now = func() time.Time { return t0 }
	t.Cleanup(func() { now = time.Now })

	a := from("203.0.113.31")
	supported := func(t *testing.T, hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		return send(t, http.MethodGet, base+"/facilitator/supported", "", hdr)
	}
	paid := func(t *testing.T) {
		t.Helper()
		resp := post(t, base+"/verify/schema", validRequest, a)
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("unpaid: status %d, want 402", resp.StatusCode)
		}
		hdr := map[string]string{"X-Forwarded-For": a["X-Forwarded-For"], x402.HeaderPaymentSignature: signFor(t, paymentRequired(t, resp), 3)}
		resp = post(t, base+"/verify/schema", validRequest, hdr)
		var sr x402.SettleResponse
		if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); resp.StatusCode != http.StatusOK || err != nil || !sr.Success {
			t.Fatalf("paid call: status %d, PAYMENT-RESPONSE %+v (%v)", resp.StatusCode, sr, err)
		}
	}

	if resp, body := supported(t, a); resp.StatusCode != http.StatusOK {
		t.Fatalf("within the limit: %d %.300s", resp.StatusCode, body)
	}
	payer := evmfacilitator.DevAccounts()[3].Address
	before := balance(t, d, payer)
	for range 3 { // six facilitator calls of the gate, more than the limit
		paid(t)
	}
	if got := before.Sub(before, balance(t, d, payer)); got.Int64() != 3*20000 {
		t.Fatalf("the paid calls were charged %v, want 60000", got)
	}
	// The client's second request of the minute is still within its budget.
	if resp, body := supported(t, a); resp.StatusCode != http.StatusOK {
		t.Fatalf("the gate's facilitator calls were counted: %d %.300s", resp.StatusCode, body)
	}
	resp, body := supported(t, a)
	wantRateLimited(t, resp, body, "30")
	for _, ep := range []string{"/verify", "/settle"} {
		resp, body := send(t, http.MethodPost, base+"/facilitator"+ep, `{"x402Version":2}`, a)
		wantRateLimited(t, resp, body, "30")
	}
	// Over the facilitator limit, the client's paid calls are served.
	paid(t)
	if resp, body := supported(t, from("203.0.113.32")); resp.StatusCode != http.StatusOK {
		t.Fatalf("another client: %d %.300s", resp.StatusCode, body)
	}
}
