package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// sendAtOnce sends n requests together (request(i) says what each is) and
// returns how many got each status.
func sendAtOnce(t *testing.T, n int, request func(i int) (method, url, body string, hdr map[string]string)) map[int]int {
	t.Helper()
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		method, url, body, hdr := request(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, _ := send(t, method, url, body, hdr)
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return statuses
}

// unfundedPayments signs n payments for pr's first offer, each by a new
// wallet that holds nothing: the facilitator's /verify refuses them.
func unfundedPayments(t *testing.T, pr x402.PaymentRequired, n int) []x402.PaymentPayload {
	t.Helper()
	ps := make([]x402.PaymentPayload, n)
	for i := range ps {
		key, _ := crypto.GenerateKey()
		p, err := x402.SignExactEVM(key, pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = p
	}
	return ps
}

// Concurrent tools/call messages of one client, each with an unfunded
// payment in _meta, cost at most the budget's events and its events of
// slots /verify calls (TestConcurrentRefusedPaymentsAreBoundedByTheSlots),
// and spend the budget: a second wave passes only while its refusals keep
// the debt within events (rateZone.arrival), a third costs none, its calls
// rate_limited tool results.
func TestConcurrentRefusedToolCallPaymentsAreBoundedByTheSlots(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, verifies := countingFacilitator(t, fac, 400*time.Millisecond)
	up := newMCPUpstream(t)
	site := strings.Replace(mcpSite(up.URL, facURL, 0), "validate verify_request", "validate verify_request\n\t\t\trate_limit 2 1m", 1)
	base := startCaddyServers(t, proxiedClients, "", site)
	u := base + "/mcp"
	pr := demandOf(t, callTool(t, mcpSession(t, u), "verify_schema", verifyArgs, nil))

	const n = 12
	bodies := make([]string, n)
	for i, p := range unfundedPayments(t, pr, n) {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
			"name": "verify_schema", "arguments": verifyArgs, "_meta": mcp.Meta{mcpMetaPayment: p},
		}})
		bodies[i] = string(b)
	}
	wave := func() int64 {
		before := verifies.Load()
		sendAtOnce(t, n, func(i int) (string, string, string, map[string]string) {
			return http.MethodPost, u, bodies[i], from("198.51.100.9")
		})
		return verifies.Load() - before
	}
	v1 := wave()
	v2 := wave()
	v3 := wave()
	if v1 < 1 || v1 > 4 || v1+v2 > 6 || v3 != 0 {
		t.Errorf("three waves of %d concurrent tool calls of one client with unfunded payments (rate_limit 2 1m): %d, %d, then %d /verify calls; want at most 4 (the budget's 2 and its 2 slots), 6 with the debt's 2, then none", n, v1, v2, v3)
	}
}

// wallet_auth checks a proof holding a slot of each of its server's gates'
// budgets and counts a failed check, past an empty budget too: concurrent
// contract-wallet proofs of one client whose check fails at the chain cost
// at most the budget's events and its events of slots chain checks, the
// others 429 before any, and put the budget in debt, so a second wave
// costs none, all 429. (Before: 12 proofs at once, 12 chain
// checks with rate_limit 3 1m, every time.)
func TestConcurrentWalletChecksAreBoundedByTheSlots(t *testing.T) {
	_, fac := sharedDevnet(t)
	var checks atomic.Int64
	rpc := refusingChainRPCWith(t, -32000, "header not found", func() {
		checks.Add(1)
		time.Sleep(300 * time.Millisecond)
	})
	up := walletUpstream(t)
	base := startCaddyServers(t, proxiedClients, "", rateLimitedWalletSite(up.URL, fac, rpc.URL))
	u := base + "/api/x"
	const n = 12
	hdrs := make([]map[string]string, n)
	for i := range n {
		e, err := walletauth.Parse(walletProof(t, walletKey(1), "GET", u, func(r *walletauth.Request) { r.ChainID = "eip155:8453" }))
		if err != nil {
			t.Fatal(err)
		}
		e.Address = walletAddr(2) // a contract wallet: checked at the chain
		h, _ := e.Encode()
		hdrs[i] = map[string]string{"X-Forwarded-For": "198.51.100.9", walletauth.HeaderName: h}
	}
	wave := func() (map[int]int, int64) {
		before := checks.Load()
		st := sendAtOnce(t, n, func(i int) (string, string, string, map[string]string) {
			return http.MethodGet, u, "", hdrs[i]
		})
		return st, checks.Load() - before
	}
	s1, c1 := wave()
	s2, c2 := wave()
	if c1 < 1 || c1 > 6 || s1[http.StatusTooManyRequests] != n-int(c1) || c2 != 0 || s2[http.StatusTooManyRequests] != n {
		t.Errorf("two waves of %d concurrent failing contract-wallet proofs of one client (rate_limit 3 1m): %d chain checks (statuses %v), then %d (%v); want at most 6 (the budget's 3 and its 3 slots), the others 429, then none, all 429", n, c1, s1, c2, s2)
	}
	if h := heldSlots(); h != 0 {
		t.Errorf("every request ended: %d rate slots still held", h)
	}
}

// A newcomer to a full table has its 402 counted in its network's budget,
// and so does its payment's check: the settled payment's credit goes back
// there, the budget that counts it. Once it has a bucket of its own, that
// one counts it, and a full one gains nothing: neither its network's nor
// the overflow bucket shared by a flood gets the credit. (Before:
// the credit fell through from a client's full bucket to the shared ones,
// so every payment settled by anyone gave the flood one more refusal.)
func TestSettledPaymentCreditsOnlyTheBudgetThatCountsItsClient(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0
	stubNow(t, &at)
	const size = 8
	z := fullZone(t, size, 2, 24*time.Hour) // clients table full: c0..c7
	g := &Gate{rates: z}
	settle := func(client string) {
		t.Helper()
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: client}))
		if wait := g.rateWait(r, false); wait != 0 {
			t.Fatalf("%s's payment waits %d s", client, wait)
		}
		g.creditSettled(r)
	}
	tokens := func(tab *rateTable, key string) float64 {
		z.mu.Lock()
		defer z.mu.Unlock()
		if key == "" {
			return z.overflow.TokensAt(at)
		}
		return tab.buckets[key].TokensAt(at)
	}

	const newcomer = "203.0.113.1"
	z.note(newcomer) // its 402, counted in 203.0.113.0/24
	settle(newcomer)
	if tracks(z, &z.clients, newcomer) || tokens(&z.prefixes, "203.0.113.0/24") < 2 {
		t.Fatalf("a newcomer's payment settled with the table full: its /24 holds %.3f events; want the credit there (2), no bucket of its own", tokens(&z.prefixes, "203.0.113.0/24"))
	}

	// Room in the table: c0 refills (credit) and is dropped. The
	// newcomer's next refusal is counted in a bucket of its own, which its
	// next payments top up; the /24 they no longer count in gains nothing.
	z.credit("c0")
	z.note(newcomer)
	z.note("203.0.113.2") // another client of the /24, counted there
	if !tracks(z, &z.clients, newcomer) {
		t.Fatal("with room in the table, the newcomer has no bucket of its own")
	}
	for range 3 {
		settle(newcomer)
	}
	if own, p := tokens(&z.clients, newcomer), tokens(&z.prefixes, "203.0.113.0/24"); own < 2 || p >= 2 {
		t.Errorf("3 payments of a client with a bucket of its own: it holds %.3f events, its /24 (counted in by others) %.3f; want its own full (2), the /24 given nothing (1)", own, p)
	}

	// The table of prefixes full too: a flood shares the overflow bucket,
	// and spends it. A tracked client's payments, with no 402 before them,
	// give the flood nothing.
	for i := range size {
		z.note(fmt.Sprintf("10.%d.0.1", i))
	}
	const flooder = "2001:db8:1:1::/64"
	z.note(flooder)
	z.note(flooder)
	if z.wait(flooder, false) == 0 {
		t.Fatal("the overflow budget is not spent")
	}
	for range 3 {
		settle("c1")
	}
	if got := tokens(nil, ""); got >= 1 {
		t.Errorf("another client's payments, none after a 402 counted in the overflow, left the overflow budget a flood shares with %.3f events; want 0", got)
	}
}

// An honest x402 client asks the price of three calls (three 402s, three
// events of rate_limit 4 1h) and then pays all three at once: a payment
// passes while its refusal would keep the debt within events and spends
// none on arrival, so all three are served. (Before: each payment held an event while
// /verify ran, one was left, and two paid calls got 429 for 15 minutes.)
func TestParallelPaidCallsAfterTheir402sAreServed(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, _ := countingFacilitator(t, fac, 400*time.Millisecond)
	up := newUpstream(t)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, facURL, 0, "rate_limit 4 1h"))
	u := base + "/verify/schema"
	const k = 3
	var pr x402.PaymentRequired
	for range k {
		pr = paymentRequired(t, post(t, u, validRequest, from("198.51.100.20")))
	}
	hdrs := make([]map[string]string, k)
	for i := range k {
		hdrs[i] = map[string]string{"X-Forwarded-For": "198.51.100.20", x402.HeaderPaymentSignature: signFor(t, pr, 1)}
	}
	st := sendAtOnce(t, k, func(i int) (string, string, string, map[string]string) {
		return http.MethodPost, u, validRequest, hdrs[i]
	})
	if st[http.StatusOK] != k {
		t.Errorf("one client, rate_limit 4 1h: %d calls asked the price (402) then paid at once: statuses %v; want all %d served", k, st, k)
	}
}

// A client that hangs up while the facilitator verifies its payment ends
// the call unsettled: the gate answers it as the facilitator's outage
// (503), which alone would count nothing, yet the facilitator did the
// work. It counts as a refusal, so unfunded payments each abandoned during
// /verify cost at most rate_limit's events (2 per 4 s) /verify calls and
// as many of debt (rateZone.arrival), the rest 429 before any work. (Before: every one was given
// its event back, and /verify calls were unbounded.)
func TestHangingUpDuringVerifyCountsAsARefusal(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, verifies := countingFacilitator(t, fac, 400*time.Millisecond)
	up := newUpstream(t)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, facURL, 0, "rate_limit 2 4s"))
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.200")))

	const n = 10
	hangUp := &http.Client{Timeout: 150 * time.Millisecond}
	start := time.Now()
	before := verifies.Load()
	for _, p := range unfundedPayments(t, pr, n) {
		h, _ := x402.EncodeHeader(p)
		req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(validRequest))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", "198.51.100.9")
		req.Header.Set(x402.HeaderPaymentSignature, h)
		if resp, err := hangUp.Do(req); err == nil {
			resp.Body.Close()
		}
		time.Sleep(300 * time.Millisecond) // the /verify ends, the request with it
	}
	time.Sleep(300 * time.Millisecond)
	got := verifies.Load() - before
	// 2 events, 2 of debt, and one more per 2 s the run took.
	want := 4 + int64(time.Since(start)/(2*time.Second))
	if got > want {
		t.Errorf("one client, rate_limit 2 4s, %d unfunded payments each abandoned during /verify within %s: %d /verify calls; want at most %d", n, time.Since(start).Round(time.Millisecond), got, want)
	}
}

// A bucket in debt is spent: the table of clients keeps it until its debt
// and then its budget have refilled, and its client waits until the debt
// is repaid, longer than a window, never handed a fresh budget by a
// newcomer that takes its place. The debt stops at events (note).
func TestRateTableKeepsABucketInDebt(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0
	stubNow(t, &at)
	z := fullZone(t, 1, 2, 24*time.Hour) // c0, one event spent: due in 12 h
	for range 4 {
		z.note("c0") // refusals of requests that were in flight at once
	}
	// -2 events, the debt's floor (the 4th not counted): 1 is left after
	// 36 h, the budget full after 48 h.
	at = t0.Add(12*time.Hour + time.Second)
	z.note("n1")
	if !tracks(z, &z.clients, "c0") || tracks(z, &z.clients, "n1") {
		t.Fatal("a bucket in debt was dropped when it would have refilled without the debt")
	}
	// 1 event in debt after 12 h of refill: 2 to refill for one, 12 h each.
	if w := z.wait("c0", false); w < 24*3600-60 || w > 24*3600 {
		t.Errorf("a client 2 events in debt of a budget of 2 a day, 12 h later: waits %d s; want 24 h (86,400 s)", w)
	}
	at = t0.Add(48*time.Hour + time.Second)
	z.note("n2")
	if tracks(z, &z.clients, "c0") || !tracks(z, &z.clients, "n2") {
		t.Error("a bucket whose debt and budget have refilled was not dropped for a newcomer")
	}
}
