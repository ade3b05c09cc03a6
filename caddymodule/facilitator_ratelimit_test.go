package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// TestFacilitatorAPIIsRateLimitedPaidCallsAreNot runs the shape of
// Caddyfile.example with AOV_FACILITATOR=remote in one Caddy, with the
// example's own facilitator_rate snippet (AOV_FACILITATOR_RATE=2): a
// gateway whose /facilitator/* passes, behind that limit, to a facilitator
// on a port of its own, and whose gate verifies and settles with that
// facilitator directly; beside it, a seller's gateway on the same machine
// whose gate settles through the public route. A client past the limit
// gets the contract's 429 on every facilitator endpoint, before the
// facilitator is asked. Neither gate's verify and settle calls (two per
// paid call) count against anyone: a client's paid calls go on while it is
// over the limit, and the seller sells on past the limit.
func TestFacilitatorAPIIsRateLimitedPaidCallsAreNot(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	facPort, sellerPort := freePort(t), freePort(t)
	facilitator := fmt.Sprintf("http://127.0.0.1:%d", facPort)
	t.Setenv("AOV_FACILITATOR_RATE", "2")
	gateway := strings.Replace(gateSite(up.URL, facilitator, 0, ""), "\tx402_discovery /.well-known/x402\n", fmt.Sprintf(`	x402_discovery /.well-known/x402
	handle_path /facilitator/* {
		import facilitator_rate
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
	sellerSite := fmt.Sprintf(`:%d {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %s
			route "POST /verify/schema"
			facilitator http {
				url http://127.0.0.1:{port}/facilitator
			}
			store badger {data}/seller
		}
		reverse_proxy %s
	}
}
`, sellerPort, payTo.Hex(), strings.TrimPrefix(up.URL, "http://"))
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32", "", exampleSnippet(t, "facilitator_rate")+gateway+facSite+sellerSite)
	seller := fmt.Sprintf("http://127.0.0.1:%d", sellerPort)

	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now = func() time.Time { return t0 }
	t.Cleanup(func() { now = time.Now })

	a := from("203.0.113.31")
	supported := func(t *testing.T, hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		return send(t, http.MethodGet, base+"/facilitator/supported", "", hdr)
	}
	paid := func(t *testing.T, base string) {
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
	for range 3 { // six facilitator calls of each gate, more than the limit
		paid(t, base)
		paid(t, seller)
	}
	if got := before.Sub(before, balance(t, d, payer)); got.Int64() != 6*20000 {
		t.Fatalf("the paid calls were charged %v, want 120000", got)
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
	paid(t, base)
	if resp, body := supported(t, from("203.0.113.32")); resp.StatusCode != http.StatusOK {
		t.Fatalf("another client: %d %.300s", resp.StatusCode, body)
	}
}

// exampleSnippet is the snippet name of Caddyfile.example, as a definition
// to put before a test's sites: a test of it runs the example's own lines.
func exampleSnippet(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), "\n("+name+") {\n")
	body, _, ok2 := strings.Cut(rest, "\n}\n")
	if !ok || !ok2 {
		t.Fatalf("Caddyfile.example has no snippet %s", name)
	}
	return "(" + name + ") {\n" + body + "\n}\n"
}

// A facilitator that refuses with 429 and a Retry-After (a real
// x402_facilitator behind aov_rate_limit, here counting the gate's own
// calls): the buyer's 503 says to come back when the facilitator said,
// not after the gate's own 2 s, and nothing is charged.
func TestFacilitatorRetryAfterReachesTheBuyer(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	facPort := freePort(t)
	facSite := fmt.Sprintf(`:%d {
	aov_rate_limit 1 1m {
		zone facilitator
	}
	x402_facilitator {
		pay_to %s
		http %s
	}
}
`, facPort, payTo.Hex(), fac)
	base := startCaddyServers(t, "", "", gateSite(up.URL, fmt.Sprintf("http://127.0.0.1:%d", facPort), 0, "")+facSite)
	payer := evmfacilitator.DevAccounts()[3].Address
	before := balance(t, d, payer)
	url := base + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, validRequest, nil)), 3)
	// The verify takes the facilitator's one request a minute; the settle
	// is refused with 429 and Retry-After: 60.
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "60" || !strings.Contains(string(body), `"retry_after":60`) {
		t.Fatalf("status %d, Retry-After %q: %.300s; want 503 after the facilitator's 60 s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if got := before.Sub(before, balance(t, d, payer)); got.Sign() != 0 {
		t.Fatalf("charged %v for a settlement the facilitator refused", got)
	}
}
