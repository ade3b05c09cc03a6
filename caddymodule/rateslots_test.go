package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// heldSlots is how many rate slots requests hold, in every zone: 0 once
// every request has ended, whatever its end.
func heldSlots() int {
	n := 0
	rateZones.Range(func(_, v any) bool {
		z := v.(*rateZone)
		z.mu.Lock()
		defer z.mu.Unlock()
		n += z.overflow.busy[slotPaid] + z.overflow.busy[slotProof]
		for _, tab := range []*rateTable{&z.clients, &z.prefixes} {
			for _, b := range tab.buckets {
				n += b.busy[slotPaid] + b.busy[slotProof]
			}
		}
		return true
	})
	return n
}

// heldBodies sends n POSTs to u whose headers go out at once (each passing
// the arrival check, which spends nothing) and whose bodies (body(i)) are
// held back, then sent all together after hold; it returns how many got
// each status (-1: no answer).
func heldBodies(t *testing.T, n int, u string, hold time.Duration, hdr func(i int) map[string]string, body func(i int) string) map[int]int {
	t.Helper()
	var mu sync.Mutex
	st := map[int]int{}
	var wg sync.WaitGroup
	pws := make([]*io.PipeWriter, n)
	for i := range n {
		pr, pw := io.Pipe()
		pws[i] = pw
		req, _ := http.NewRequest(http.MethodPost, u, pr)
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr(i) {
			req.Header.Set(k, v)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := testClient.Do(req)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				st[-1]++
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			st[resp.StatusCode]++
		}()
	}
	time.Sleep(hold)
	for i, pw := range pws {
		go func() { io.WriteString(pw, body(i)); pw.Close() }()
	}
	wg.Wait()
	return st
}

// unfundedHeaders are the headers of n requests of one client (ip), each
// with an unfunded payment for pr's first offer (unfundedPayments).
func unfundedHeaders(t *testing.T, pr x402.PaymentRequired, n int, ip string) []map[string]string {
	t.Helper()
	hdrs := make([]map[string]string, n)
	for i, p := range unfundedPayments(t, pr, n) {
		h, _ := x402.EncodeHeader(p)
		hdrs[i] = map[string]string{"X-Forwarded-For": ip, x402.HeaderPaymentSignature: h}
	}
	return hdrs
}

// Many refused payments of one client at once, against a slow facilitator:
// each passes the arrival check (its budget has an event left, none is
// spent), but only rate_limit's events of them hold a slot and are
// verified at once; the others are answered 429 before any work. Their
// refusals, counted once known, leave the budget at most events in debt,
// so the client's /verify calls are at most its budget plus the slots.
// (Before: rate_limit 2 1h, 120 at once, 120 /verify calls.)
func TestConcurrentRefusedPaymentsAreBoundedByTheSlots(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, verifies := countingFacilitator(t, fac, 400*time.Millisecond)
	up := newUpstream(t)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, facURL, 0, "rate_limit 2 1h"))
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.200")))

	const n = 120
	hdrs := unfundedHeaders(t, pr, n, "198.51.100.77")
	before := verifies.Load()
	st := sendAtOnce(t, n, func(i int) (string, string, string, map[string]string) {
		return http.MethodPost, u, validRequest, hdrs[i]
	})
	got := verifies.Load() - before
	if got < 1 || got > 4 || st[http.StatusPaymentRequired] != int(got) || st[http.StatusTooManyRequests] != n-int(got) {
		t.Errorf("one client, rate_limit 2 1h, %d refused payments sent at once: %d facilitator /verify calls (statuses %v); want at most 4 (the budget's 2 and its 2 slots), each 402, the rest 429", n, got, st)
	}
	if h := heldSlots(); h != 0 {
		t.Errorf("every request ended: %d rate slots still held", h)
	}
}

// The requests whose work runs at once are not the client's to choose by
// holding bodies back: it sends the headers of many paid requests (each
// passing the arrival check), then every body at once; with an instant
// facilitator, still only the slots' events are verified at once. (Before:
// rate_limit 2 1h, 300 held bodies, 300 /verify calls.)
func TestHeldPaymentBodiesAreBoundedByTheSlots(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, verifies := countingFacilitator(t, fac, 0)
	up := newUpstream(t)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, facURL, 0, "rate_limit 2 1h"))
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.202")))
	const n = 300
	hdrs := unfundedHeaders(t, pr, n, "198.51.100.79")
	before := verifies.Load()
	st := heldBodies(t, n, u, 1500*time.Millisecond, func(i int) map[string]string { return hdrs[i] }, func(int) string { return validRequest })
	if got := verifies.Load() - before; got > 4 {
		t.Errorf("one client, rate_limit 2 1h, instant facilitator, %d refused payments with bodies held then sent at once: %d /verify calls (statuses %v); want at most 4 (the budget's 2 and its 2 slots)", n, got, st)
	}
	if h := heldSlots(); h != 0 {
		t.Errorf("every request ended: %d rate slots still held", h)
	}
}

// Refusals that cost nothing (a 402 to a request without a payment) put
// the budget at most events in debt, however many were held open past the
// arrival check at once: a request without a payment from the same
// address (a NAT, a shared /64) waits at most a window and one event's
// refill, and a funded payment, which passes while its refusal would keep
// the debt within events (rateZone.arrival), one event's refill. (Before:
// 100 held probes, rate_limit 2 1h, the payment refused 429 with
// Retry-After 178,200 s, 49.5 h.) The gate does not check the requests
// (no validate): with validate verify_request a 402 costs a schema compile,
// which holds a slot (Gate.precheck), and is not cheap.
func TestCheapRefusalsLockAnAddressOutForAtMostAWindow(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	site := strings.Replace(gateSite(up.URL, fac, 0, "rate_limit 2 1h"), "validate verify_request", "", 1)
	base := startCaddyServers(t, proxiedClients, "", site)
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.201")))

	const n = 100
	st := heldBodies(t, n, u, time.Second, func(int) map[string]string { return from("198.51.100.78") }, func(int) string { return validRequest })
	resp, _ := send(t, http.MethodPost, u, validRequest, from("198.51.100.78"))
	ra, _ := strconv.Atoi(resp.Header.Get("Retry-After"))
	// 2 events of debt and the one to spend, 30 min each.
	if resp.StatusCode != http.StatusTooManyRequests || ra <= 3600 || ra > 5400 {
		t.Errorf("%d unpaid requests at once (statuses %v), rate_limit 2 1h: another from the same address gets %d with Retry-After %d s; want 429 for the debt of 2 and one event, 1.5 h (5,400 s)", n, st, resp.StatusCode, ra)
	}
	resp, _ = send(t, http.MethodPost, u, validRequest, map[string]string{"X-Forwarded-For": "198.51.100.78", x402.HeaderPaymentSignature: signFor(t, pr, 1)})
	ra, _ = strconv.Atoi(resp.Header.Get("Retry-After"))
	// One event of the debt repaid leaves room for the payment's refusal.
	if resp.StatusCode != http.StatusTooManyRequests || ra <= 0 || ra > 1800 {
		t.Errorf("%d unpaid requests at once (statuses %v), rate_limit 2 1h: a funded payment from the same address gets %d with Retry-After %d s; want 429 for one event, 30 min (1,800 s)", n, st, resp.StatusCode, ra)
	}
}

// A zone's debt stops at events: refusals counted past it are not, so the
// longest wait is a window and one event's refill.
func TestRateZoneDebtStopsAtEvents(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	stubNow(t, &at)
	z := refusalZone(t, 4, time.Hour)
	for range 100 {
		z.note("c")
	}
	// 4 events of debt and one to spend, 15 min each.
	if w := z.wait("c", false); w != 75*60 {
		t.Errorf("100 refusals of a budget of 4 an hour: wait %d s; want 4,500 s (a window and one event)", w)
	}
}

// A bucket's slots: at most events held at once, the next request told to
// retry in 1 s (or after the budget's wait, when it is spent) and given
// none; a slot given back (twice: once) frees one; a bucket with a slot
// held stays in a full table however long it has been full.
func TestRateZoneSlotsBoundTheWorkInFlight(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0
	stubNow(t, &at)
	z := fullZone(t, 2, 2, time.Minute) // c0, c1: one event spent each
	s1, w1 := z.enter("c0", slotPaid, false)
	s2, w2 := z.enter("c0", slotPaid, false)
	if w1 != 0 || w2 != 0 {
		t.Fatalf("a client with an event left, none of its slots held: waits %d, %d", w1, w2)
	}
	if _, w := z.enter("c0", slotPaid, false); w != 1 {
		t.Errorf("both slots of rate_limit 2 held: a third waits %d s; want 1", w)
	}
	s1.leave()
	s1.leave()
	s3, w3 := z.enter("c0", slotPaid, false)
	if w3 != 0 {
		t.Errorf("a slot given back: the next request waits %d s", w3)
	}
	// The budget spent while the slots are held: the wait is the budget's.
	z.note("c0")
	if _, w := z.enter("c0", slotPaid, false); w != 30 {
		t.Errorf("slots held and the budget spent: waits %d s; want the budget's 30", w)
	}
	// An hour on: c0 has refilled, but holds its slots; c1 has refilled
	// and holds none. A newcomer takes c1's place, never c0's.
	at = t0.Add(time.Hour)
	z.note("n1")
	if !tracks(z, &z.clients, "c0") || tracks(z, &z.clients, "c1") {
		t.Fatal("a full table dropped a bucket whose slots are held, or kept a refilled one instead")
	}
	if _, w := z.enter("c0", slotPaid, false); w != 1 {
		t.Errorf("c0's slots still held an hour on: a third request waits %d s; want 1", w)
	}
	s2.leave()
	s3.leave()
	at = t0.Add(2 * time.Hour)
	z.note("n2")
	if tracks(z, &z.clients, "c0") {
		t.Error("a refilled bucket whose slots were given back was not dropped for a newcomer")
	}
}

// wallet_auth after a gate in a route checks the proof of a paid call
// inside the gate's call, which holds the gate's slot: the check is part
// of that work and takes no second slot, so with rate_limit 1 the paid
// call is served, not refused 429 by its own slot.
func TestWalletAuthInsideAPaidCallTakesNoSecondSlot(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	site := `:{port} {
	route /api/* {
		x402 {
			accept devnet $0.02 ` + cfgPayTo + `
			facilitator http {
				url ` + fac + `
			}
			store badger {data}/gate
			rate_limit 1 1h
		}
		wallet_auth required {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		reverse_proxy ` + strings.TrimPrefix(up.URL, "http://") + `
	}
}
`
	base := startCaddyServers(t, proxiedClients, "", site)
	u := base + "/api/items"
	pr := paymentRequired(t, post(t, u, `{"a":1}`, from("192.0.2.210")))
	st, _, body := walletCall(t, http.MethodPost, u, `{"a":1}`, map[string]string{
		"X-Forwarded-For":           "198.51.100.90",
		x402.HeaderPaymentSignature: signFor(t, pr, 1),
		walletauth.HeaderName:       walletProof(t, walletKey(3), "POST", u, nil),
	})
	if st != http.StatusOK || body["payment"] != "paid" || body["wallet"] != walletAddr(3) {
		t.Errorf("a paid call with a wallet proof checked after the gate, rate_limit 1 1h: %d %v; want 200, paid, the wallet", st, body)
	}
	if h := heldSlots(); h != 0 {
		t.Errorf("every request ended: %d rate slots still held", h)
	}
}

// A call settled before its upstream runs is paid for once settled:
// nothing of it will count, so while its upstream runs (a stream may run
// long) it holds no slot of its client's refusal budget.
func TestSettledBeforeCallHoldsNoSlotWhileItsUpstreamRuns(t *testing.T) {
	_, fac := sharedDevnet(t)
	running, release := make(chan struct{}, 1), make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		running <- struct{}{}
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"valid":true}`)
	}))
	t.Cleanup(up.Close)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, fac, 0, "settle before\n\t\t\trate_limit 1 1h"))
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.211")))
	done := make(chan int, 1)
	go func() {
		resp, _ := send(t, http.MethodPost, u, validRequest, map[string]string{"X-Forwarded-For": "198.51.100.91", x402.HeaderPaymentSignature: signFor(t, pr, 1)})
		done <- resp.StatusCode
	}()
	select {
	case <-running:
	case st := <-done:
		t.Fatalf("the paid call ended %d before its upstream ran", st)
	}
	held := heldSlots()
	close(release)
	if st := <-done; st != http.StatusOK {
		t.Fatalf("the paid call: %d, want 200", st)
	}
	if held != 0 {
		t.Errorf("a call settled before its upstream ran: %d rate slots held while the upstream runs; want none", held)
	}
}
