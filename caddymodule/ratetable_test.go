package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/x402"
)

// shrinkRateTable makes the zones created during t track at most n clients,
// so a test can fill a table with a few requests.
func shrinkRateTable(t testing.TB, n int) {
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
func fullZone(t testing.TB, size, events int, window time.Duration) *rateZone {
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

// stubNow makes now return *at for the rest of t.
func stubNow(t testing.TB, at *time.Time) {
	now = func() time.Time { return *at }
	t.Cleanup(func() { now = time.Now })
}

// With the table full of buckets that will not refill for hours (rate_limit
// 20 24h), a newcomer costs what it costs with a small table: no request
// walks the 65,536 buckets under the zone's one lock, which every other
// request of the zone waits for. (From the audit: 6 ms a newcomer.)
func TestNewcomerToAFullRateTableCostsNoWalkOfIt(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0
	stubNow(t, &at)
	z := fullZone(t, 1<<16, 20, 24*time.Hour)
	var ds []time.Duration
	for i := range 200 {
		at = t0.Add(time.Duration(i+1) * time.Second)
		start := time.Now()
		z.note(fmt.Sprintf("203.0.113.%d", i))
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	if median := ds[len(ds)/2]; median > 200*time.Microsecond {
		t.Errorf("a newcomer to a full table of %d takes %v (median of %d)", z.size, median, len(ds))
	}
}

// A bucket is dropped once it has refilled completely, and not before: the
// next newcomer then gets a bucket of its own. A credit brings that time
// forward.
func TestFullRateTableMakesRoomWhenABucketHasRefilled(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0
	stubNow(t, &at)
	z := fullZone(t, 8, 2, time.Minute) // one event each: refilled at t0+30s
	at = t0.Add(29 * time.Second)
	z.note("n1")
	if z.limiter("n1", at, false) != nil {
		t.Fatal("a newcomer got a bucket of its own before any had refilled")
	}
	at = t0.Add(31 * time.Second)
	z.note("n2")
	if z.limiter("n2", at, false) == nil {
		t.Error("a newcomer found no room once the table's buckets had refilled")
	}
	if z.limiter("c0", at, false) != nil {
		t.Error("a refilled bucket was kept")
	}

	// Two events each: refilled at t0+60s; the one credited at t0+2s,
	// at t0+32s. The others stay: their clients keep what they spent.
	at = t0
	z = fullZone(t, 8, 2, time.Minute)
	for i := range 8 {
		z.note(fmt.Sprintf("c%d", i))
	}
	at = t0.Add(time.Second)
	z.note("n1")
	at = t0.Add(2 * time.Second)
	z.credit("c0")
	at = t0.Add(33 * time.Second)
	z.note("n2")
	if z.limiter("n2", at, false) == nil {
		t.Error("a newcomer found no room after a credited bucket had refilled")
	}
	if z.limiter("c1", at, false) == nil {
		t.Error("a partly spent bucket was dropped to make room")
	}
}

// BenchmarkRateZoneNewcomerToAFullTable is one request of a client the
// table has no room for, the table full of buckets of a long window
// (rate_limit 20 24h) that none of them will refill within the run.
func BenchmarkRateZoneNewcomerToAFullTable(b *testing.B) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0
	stubNow(b, &at)
	z := fullZone(b, 1<<16, 20, 24*time.Hour)
	newcomers := make([]string, 1024)
	for i := range newcomers {
		newcomers[i] = fmt.Sprintf("203.0.%d.%d", i>>8, i&0xff)
	}
	at = t0.Add(time.Second)
	z.note("203.0.113.1") // the first newcomer to the full table
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		z.note(newcomers[i%len(newcomers)])
	}
}

// An MCP tool call carries its payment in params._meta, which the gate
// reads before it checks the rate limit: with the table full and the
// overflow budget spent, a newcomer's paid call is served and charged,
// while its unpaid call is a rate_limited tool result.
func TestFullRateTableStillServesANewcomersPaidToolCall(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	const size = 8
	shrinkRateTable(t, size)
	site := strings.Replace(mcpSite(up.URL, fac, 0), "validate verify_request", "validate verify_request\n\t\t\trate_limit 2 24h", 1)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32\n\t\ttrusted_proxies_strict", "", site)
	url := base + "/mcp"
	pr := demandOf(t, callTool(t, mcpSession(t, url), "verify_schema", verifyArgs, nil))

	call := func(ip string, meta mcp.Meta) string {
		params := map[string]any{"name": "verify_schema", "arguments": verifyArgs}
		if meta != nil {
			params["_meta"] = meta
		}
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
		resp, body := send(t, http.MethodPost, url, string(b), from(ip))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("tools/call from %s: %d %s", ip, resp.StatusCode, body)
		}
		return string(body)
	}
	for i := range size + 3 {
		call(fmt.Sprintf("2001:db8:0:%x::1", i), nil)
	}
	if got := call("198.51.100.7", nil); !strings.Contains(got, apierr.CodeRateLimited) {
		t.Fatalf("an unpaid newcomer's call with the overflow budget spent: %s, want rate_limited", got)
	}
	if got := call("198.51.100.8", payMeta(t, pr, 1)); !strings.Contains(got, mcpMetaPaymentResponse) || strings.Contains(got, apierr.CodeRateLimited) {
		t.Fatalf("a newcomer's paid call with the table full: %s, want it served and charged", got)
	}
}
