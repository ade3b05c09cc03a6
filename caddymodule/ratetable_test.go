package caddymodule

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/x402"
)

// shrinkRateTable makes the zones created during t track at most n clients,
// so a test can fill a table with a few requests.
func shrinkRateTable(t *testing.T, n int) {
	t.Helper()
	prev := maxRateClients
	maxRateClients = n
	t.Cleanup(func() { maxRateClients = prev })
}

// sprayFrom64s sends one unpaid request from each of n distinct IPv6 /64s
// (one holder of a short prefix), as the trusted balancer of the test
// servers forwards them, and returns how many got each status.
func sprayFrom64s(t *testing.T, url, body string, n int) map[int]int {
	t.Helper()
	statuses := map[int]int{}
	for i := range n {
		resp, _ := send(t, http.MethodPost, url, body, from(fmt.Sprintf("2001:db8:%x:%x::1", i>>16, i&0xffff)))
		statuses[resp.StatusCode]++
	}
	return statuses
}

// A zone's table is full of buckets that stay partly spent for a long
// window (rate_limit 20 24h, as README suggests for key wallet), and the
// newcomers' shared overflow budget is spent: a client never seen before
// that sends a payment is still served and charged. Only the unpaid are
// held to the overflow budget. (From the audit: one holder of a /47 made
// every new buyer's payment a 429.)
func TestFullRateTableStillServesANewcomersPayment(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	const size = 32
	shrinkRateTable(t, size)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32\n\t\ttrusted_proxies_strict", "", gateSite(up.URL, fac, 0, "rate_limit 20 24h"))
	url := base + "/verify/schema"

	// The price, as any client learns it, before the table fills.
	pr := paymentRequired(t, post(t, url, validRequest, from("192.0.2.200")))
	got := sprayFrom64s(t, url, validRequest, size+25)
	if got[http.StatusTooManyRequests] == 0 {
		t.Fatalf("the spray %v never reached the overflow budget's limit", got)
	}

	resp, body := send(t, http.MethodPost, url, validRequest, from("198.51.100.7"))
	wantRateLimited(t, resp, body, "")
	resp, body = send(t, http.MethodPost, url, validRequest, map[string]string{"X-Forwarded-For": "198.51.100.8", x402.HeaderPaymentSignature: signFor(t, pr, 1)})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("a newcomer's payment with the table full: %d %s, want 200 with %s", resp.StatusCode, body, x402.HeaderPaymentResponse)
	}
}

// fullZone returns a zone of events per window whose table of size clients
// is full of partly spent buckets.
func fullZone(t *testing.T, size, events int, window time.Duration) *rateZone {
	t.Helper()
	shrinkRateTable(t, size)
	z, key, err := loadZone(&RateLimit{Events: events, Window: caddy.Duration(window), Zone: t.Name()}, zoneRefusals)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rateZones.Delete(key) })
	for i := range size {
		z.note(fmt.Sprintf("c%d", i))
	}
	return z
}

// With the table full, a newcomer carrying a payment is not held to the
// overflow budget, but each refusal of its payment counts in it: the
// newcomers who do not pay are limited by those refusals as by their own.
// A tracked client is held to its own budget, payment or not.
func TestRateZoneOverflowLetsPaymentsThroughAndCountsTheirRefusals(t *testing.T) {
	z := fullZone(t, 8, 2, 24*time.Hour)
	if z.wait("new-1", false) != 0 {
		t.Fatal("a newcomer is limited before the overflow budget was spent")
	}
	z.note("payer") // two refused payments of one newcomer
	z.note("payer")
	if z.wait("new-1", false) == 0 {
		t.Error("refused payments of a newcomer did not count in the overflow budget")
	}
	if z.wait("payer", true) != 0 || z.wait("new-2", true) != 0 {
		t.Error("a newcomer carrying a payment is held to the spent overflow budget")
	}
	z.note("c0")
	if z.wait("c0", true) == 0 {
		t.Error("a tracked client with its budget spent is not limited when it pays")
	}
}

// wallet_auth answers within its server's gates' budgets before it checks a
// proof: a request carrying a payment header is paying there too.
func TestServerRateWaitLetsANewcomersPaymentThrough(t *testing.T) {
	z := fullZone(t, 8, 1, 24*time.Hour)
	z.note("203.0.113.1") // spends the overflow budget
	srv := new(caddyhttp.Server)
	addServerZone(srv, z)
	t.Cleanup(func() { removeServerZone(srv, z) })
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.RemoteAddr = "198.51.100.7:1234"
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.ServerCtxKey, srv))
	if serverRateWait(r) == 0 {
		t.Fatal("an unpaid newcomer is not held to the spent overflow budget")
	}
	r.Header.Set(x402.HeaderPaymentSignature, "a payment")
	if w := serverRateWait(r); w != 0 {
		t.Errorf("a newcomer carrying a payment waits %d s for the overflow budget", w)
	}
}
