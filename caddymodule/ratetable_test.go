package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/walletauth"
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
// window (rate_limit 20 24h, README's example for key wallet), filled by
// one holder of a short IPv6 prefix, who also spends the budget of its /48
// for newcomers. A client never seen before from another prefix asks the
// price and pays: it is served and charged, its /24 having a budget of its
// own. A newcomer of the filler's /48 is held to its spent budget: a
// payment skips none, and once the /48's refused payments put it events in
// debt (rateZone.arrival), a payment from it is 429. (Before: one
// holder of a /47 made every new buyer's payment a 429.)
func TestFullRateTableServesANewcomerFromAnotherPrefix(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	const size = 32
	shrinkRateTable(t, size)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, fac, 0, "rate_limit 20 24h"))
	url := base + "/verify/schema"

	got := sprayFrom64s(t, url, validRequest, size+25)
	if got[http.StatusTooManyRequests] == 0 {
		t.Fatalf("the spray %v never reached the limit of its /48", got)
	}
	pr := paymentRequired(t, post(t, url, validRequest, from("198.51.100.7")))
	resp, body := send(t, http.MethodPost, url, validRequest, map[string]string{"X-Forwarded-For": "198.51.100.8", x402.HeaderPaymentSignature: signFor(t, pr, 1)})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("a newcomer's payment with the table full: %d %s, want 200 with %s", resp.StatusCode, body, x402.HeaderPaymentResponse)
	}
	for _, p := range unfundedPayments(t, pr, 20) {
		h, _ := x402.EncodeHeader(p)
		send(t, http.MethodPost, url, validRequest, map[string]string{"X-Forwarded-For": "2001:db8:0:fffe::1", x402.HeaderPaymentSignature: h})
	}
	resp, body = send(t, http.MethodPost, url, validRequest, map[string]string{"X-Forwarded-For": "2001:db8:0:ffff::1", x402.HeaderPaymentSignature: signFor(t, pr, 2)})
	wantRateLimited(t, resp, body, "")
}

// countingFacilitator is a reverse proxy in front of fac that counts the
// /verify calls it forwards, each delayed by delay (a facilitator's own
// latency, which keeps concurrent requests in flight together).
func countingFacilitator(t *testing.T, fac string, delay time.Duration) (string, *atomic.Int64) {
	t.Helper()
	target, _ := neturl.Parse(fac)
	rp := httputil.NewSingleHostReverseProxy(target)
	var verifies atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/verify") {
			verifies.Add(1)
			time.Sleep(delay)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(s.Close)
	return s.URL, &verifies
}

// With the table full, a client it does not track sends well-formed
// payments that are all refused (unfunded wallets), each of which costs a
// facilitator /verify: the refusals count in the budget of its prefix and
// stop at rate_limit's events and as many of debt (rateZone.arrival), as a
// tracked client's do. (Before:
// a request carrying a payment skipped the newcomers' budget while its
// refusal counted only there, so they were unbounded.)
func TestFullRateTableBoundsAnUntrackedClientsRefusedPayments(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, verifies := countingFacilitator(t, fac, 0)
	up := newUpstream(t)
	const size = 8
	shrinkRateTable(t, size)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, facURL, 0, "rate_limit 2 24h"))
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.200")))
	sprayFrom64s(t, u, validRequest, size+3)

	before := verifies.Load()
	statuses := map[int]int{}
	const n = 12
	for range n {
		key, _ := crypto.GenerateKey() // an unfunded wallet: every payment is refused
		p, err := x402.SignExactEVM(key, pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		h, _ := x402.EncodeHeader(p)
		resp, _ := send(t, http.MethodPost, u, validRequest, map[string]string{"X-Forwarded-For": "198.51.100.9", x402.HeaderPaymentSignature: h})
		statuses[resp.StatusCode]++
	}
	if got := verifies.Load() - before; got > 4 || statuses[http.StatusTooManyRequests] != n-4 {
		t.Errorf("%d refused payments of an untracked client (rate_limit 2 24h): %d /verify calls, statuses %v; want 4 (2 and 2 of debt), then 429", n, got, statuses)
	}
}

// The same for one valid payment resent while the upstream fails: the
// charge is given back each time, so were the unsettled calls of an
// untracked client not bounded, the upstream would work without end.
func TestFullRateTableBoundsAnUntrackedClientsUnsettledPayment(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	const size = 8
	shrinkRateTable(t, size)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, fac, 0, "rate_limit 2 24h"))
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.200")))
	sprayFrom64s(t, u, validRequest, size+3)

	pay := signFor(t, pr, 4)
	before := up.calls.Load()
	statuses := map[int]int{}
	for range 8 {
		resp, _ := send(t, http.MethodPost, u, validRequest, map[string]string{"X-Forwarded-For": "198.51.100.9", x402.HeaderPaymentSignature: pay, "X-Test-Status": "500"})
		statuses[resp.StatusCode]++
	}
	if got := up.calls.Load() - before; got > 4 {
		t.Errorf("one payment that never settles, from an untracked client, had the upstream work %d times (rate_limit 2 24h), statuses %v; want at most 4 (2 and 2 of debt), then 429", got, statuses)
	}
}

// wallet_auth answers within the gates' budgets before it checks a proof,
// the budget of an untracked client's prefix included, whatever headers
// the request carries: a contract-wallet proof the chain cannot check,
// sent with a junk PAYMENT-SIGNATURE (which lets it pass while its
// refusal keeps the debt within events: rateZone.arrival), costs chain
// calls twice rate_limit's events times, then gets 429.
func TestFullRateTableBoundsAnUntrackedClientsWalletChecks(t *testing.T) {
	_, fac := sharedDevnet(t)
	var rpcCalls atomic.Int64
	rpc := refusingChainRPCWith(t, -32000, "header not found", func() {
		rpcCalls.Add(1)
	})
	up := walletUpstream(t)
	const size = 8
	shrinkRateTable(t, size)
	site := strings.Replace(rateLimitedWalletSite(up.URL, fac, rpc.URL), "rate_limit 3 1m", "rate_limit 3 24h", 1)
	base := startCaddyServers(t, proxiedClients, "", site)
	sprayFrom64s(t, base+"/paid/x", "", size+4)

	u := base + "/api/x"
	e, err := walletauth.Parse(walletProof(t, walletKey(1), "GET", u, func(r *walletauth.Request) { r.ChainID = "eip155:8453" }))
	if err != nil {
		t.Fatal(err)
	}
	e.Address = walletAddr(2) // a contract wallet: checked at the chain
	h, _ := e.Encode()
	var statuses []int
	var checked int64
	for i := range 8 {
		st, _, _ := walletCall(t, "GET", u, "", map[string]string{"X-Forwarded-For": "198.51.100.9", walletauth.HeaderName: h, x402.HeaderPaymentSignature: "junk"})
		statuses = append(statuses, st)
		if i == 5 {
			checked = rpcCalls.Load()
		}
	}
	if checked == 0 || rpcCalls.Load() != checked || slices.Index(statuses, http.StatusTooManyRequests) != 6 {
		t.Errorf("an untracked client's proofs with a junk PAYMENT-SIGNATURE: %v, chain calls %d (%d after 6); want 6 checked (3 and 3 of debt), then 429 without a chain call", statuses, rpcCalls.Load(), checked)
	}
}

// fullZone returns a zone of events per window whose table of size clients
// is full of partly spent buckets.
func fullZone(t testing.TB, size, events int, window time.Duration) *rateZone {
	t.Helper()
	shrinkRateTable(t, size)
	z := refusalZone(t, events, window)
	for i := range size {
		z.note(fmt.Sprintf("c%d", i))
	}
	return z
}

// tracks reports whether tab holds a bucket of key.
func tracks(z *rateZone, tab *rateTable, key string) bool {
	z.mu.Lock()
	defer z.mu.Unlock()
	return tab.buckets[key] != nil
}

// With the table of clients full, a newcomer is counted in the bucket of
// its prefix, payment or not; a prefix the table of prefixes has no room
// for shares the overflow bucket. A tracked client is held to its own
// budget, and a credit goes to the bucket that counted the 402.
func TestRateZoneCountsNewcomersToAFullTableByPrefix(t *testing.T) {
	z := fullZone(t, 8, 2, 24*time.Hour)
	z.note("203.0.113.1") // two refusals of a newcomer
	z.note("203.0.113.1")
	if !tracks(z, &z.prefixes, "203.0.113.0/24") || tracks(z, &z.clients, "203.0.113.1") {
		t.Fatal("a newcomer to a full table was not counted in its prefix")
	}
	if z.wait("203.0.113.2", false) == 0 {
		t.Error("a newcomer of a prefix whose budget is spent is not limited")
	}
	if z.wait("198.51.100.1", false) != 0 {
		t.Error("a newcomer from another prefix is limited")
	}
	z.credit("203.0.113.2") // a payment of the prefix settled
	if z.wait("203.0.113.1", false) != 0 {
		t.Error("a settled payment gave its prefix's budget nothing back")
	}
	z.note("c0")
	z.note("c0")
	if z.wait("c0", false) == 0 {
		t.Error("a tracked client with its budget spent is not limited")
	}

	// The table of prefixes full too: the rest share one overflow bucket.
	for i := range 7 {
		z.note(fmt.Sprintf("192.0.%d.1", i))
	}
	z.note("2001:db8:1:1::/64")
	z.note("2001:db8:2:1::/64")
	if tracks(z, &z.prefixes, "2001:db8:1::/48") {
		t.Fatal("a prefix was tracked past the table's size")
	}
	if z.wait("2001:db8:3:1::/64", false) == 0 {
		t.Error("a newcomer the tables have no room for is not held to the overflow budget")
	}
	if z.wait("192.0.1.9", false) != 0 {
		t.Error("a tracked prefix with budget left is limited")
	}
}

// wallet_auth answers within its server's gates' budgets before it checks a
// proof, a newcomer to a full table within its prefix's, whether or not
// the request carries a payment header; the check spends nothing.
func TestServerRateWaitHoldsANewcomerToItsPrefix(t *testing.T) {
	z := fullZone(t, 8, 1, 24*time.Hour)
	z.note("198.51.100.1") // spends the budget of 198.51.100.0/24
	srv := new(caddyhttp.Server)
	addServerZone(srv, z)
	t.Cleanup(func() { removeServerZone(srv, z) })
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.RemoteAddr = "198.51.100.7:1234"
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.ServerCtxKey, srv))
	r.Header.Set(x402.HeaderPaymentSignature, "a payment")
	if wait := serverRateWait(r, false); wait == 0 {
		t.Error("a newcomer carrying a payment header is not held to its prefix's spent budget")
	}
	r.RemoteAddr = "203.0.113.7:1234"
	for range 2 {
		if wait := serverRateWait(r, false); wait != 0 {
			t.Fatalf("a newcomer from another prefix with a budget of 1 waits %d s: the check spent it", wait)
		}
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
// request of the zone waits for. (Before: 6 ms a newcomer.) The
// same holds with the table of prefixes full too, for a newcomer counted
// in the overflow budget.
func TestNewcomerToAFullRateTableCostsNoWalkOfIt(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0
	stubNow(t, &at)
	z := fullZone(t, 1<<16, 20, 24*time.Hour)
	// What a newcomer costs is the buckets the sweep looks at (counted,
	// not timed: a busy machine must not fail the test). A walk of the
	// table looks at all of them for each newcomer.
	looked := func(client func(i int) string) int {
		before := z.clients.looked + z.prefixes.looked
		for i := range 200 {
			at = at.Add(time.Second)
			z.note(client(i))
		}
		return z.clients.looked + z.prefixes.looked - before
	}
	if n := looked(func(i int) string { return fmt.Sprintf("203.0.113.%d", i) }); n > 200 {
		t.Errorf("200 newcomers to a full table of %d made the sweep look at %d buckets, want at most one each", z.clients.size, n)
	}
	for i := range z.prefixes.size {
		z.note(fmt.Sprintf("10.%d.%d.1", i>>8, i&0xff))
	}
	if len(z.prefixes.buckets) != z.prefixes.size {
		t.Fatal("the table of prefixes is not full")
	}
	if n := looked(func(i int) string { return fmt.Sprintf("172.16.%d.1", i) }); n > 200 {
		t.Errorf("200 newcomers to full tables of %d clients and prefixes made the sweep look at %d buckets, want at most one each", z.clients.size, n)
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
	if tracks(z, &z.clients, "n1") {
		t.Fatal("a newcomer got a bucket of its own before any had refilled")
	}
	at = t0.Add(31 * time.Second)
	z.note("n2")
	if !tracks(z, &z.clients, "n2") {
		t.Error("a newcomer found no room once the table's buckets had refilled")
	}
	if tracks(z, &z.clients, "c0") {
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
	if !tracks(z, &z.clients, "n2") {
		t.Error("a newcomer found no room after a credited bucket had refilled")
	}
	if !tracks(z, &z.clients, "c1") {
		t.Error("a partly spent bucket was dropped to make room")
	}
}

// A newcomer to a full table costs no allocation: its prefix's bucket is
// looked up without a string of the prefix (appendClientPrefix), IPv4 and
// IPv6 alike, once the prefix has a bucket.
func TestNewcomerToAFullRateTableAllocatesNothing(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0
	stubNow(t, &at)
	z := fullZone(t, 64, 20, 24*time.Hour)
	for _, c := range []string{"203.0.113.1", "2001:db8:1:2::/64"} {
		z.note(c)
		if n := testing.AllocsPerRun(100, func() { z.note(c) }); n != 0 {
			t.Errorf("a newcomer %s to a full table: %.0f allocations a request", c, n)
		}
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

// An MCP tool call carries its payment in params._meta: with the table
// full, a newcomer from another prefix is served and charged, while calls
// of an untracked client of the filler's /48 are held to that prefix's
// spent budget whatever their _meta holds, a null payment or a payment of
// an unfunded wallet (which costs a /verify) alike: they pass only while
// their refusal keeps its debt within events (rateZone.arrival), 2 of 6,
// the first of them a null payment. (Before:
// any "x402/payment" key, even null, skipped the newcomers' budget.)
func TestFullRateTableHoldsToolCallsToTheirPrefixBudget(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, verifies := countingFacilitator(t, fac, 0)
	up := newMCPUpstream(t)
	const size = 8
	shrinkRateTable(t, size)
	site := strings.Replace(mcpSite(up.URL, facURL, 0), "validate verify_request", "validate verify_request\n\t\t\trate_limit 2 24h", 1)
	base := startCaddyServers(t, proxiedClients, "", site)
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
	const newcomer = "2001:db8:0:ffff::1" // of the filler's /48
	before := verifies.Load()
	limited := 0
	for i := range 6 {
		meta := mcp.Meta{mcpMetaPayment: nil}
		if i%2 == 1 {
			key, _ := crypto.GenerateKey()
			p, err := x402.SignExactEVM(key, pr.Accepts[0], &pr.Resource, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			meta = mcp.Meta{mcpMetaPayment: p}
		}
		if strings.Contains(call(newcomer, meta), apierr.CodeRateLimited) {
			limited++
		}
	}
	if got := verifies.Load() - before; limited != 4 || got > 1 {
		t.Errorf("paid and null-paid calls of an untracked client whose /48 spent its budget (rate_limit 2 24h): %d/6 rate_limited, %d /verify calls; want 4, at most 1", limited, got)
	}
	if got := call("198.51.100.8", payMeta(t, pr, 1)); !strings.Contains(got, mcpMetaPaymentResponse) || strings.Contains(got, apierr.CodeRateLimited) {
		t.Fatalf("a paid call of a newcomer from another prefix with the table full: %s, want it served and charged", got)
	}
}
