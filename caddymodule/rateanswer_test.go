package caddymodule

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// unreadConn opens a connection to base with a tiny receive buffer, sends
// one HTTP/1.1 GET of path and never reads the answer: the server's write
// of a large answer blocks (Caddy sets no write deadline by default). The
// connection stays open until the test ends.
func unreadConn(t *testing.T, base, path string, hdr map[string]string) {
	t.Helper()
	host := strings.TrimPrefix(base, "http://")
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		return c.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
	}}
	c, err := d.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	w := bufio.NewWriter(c)
	fmt.Fprintf(w, "GET %s HTTP/1.1\r\nHost: %s\r\n", path, host)
	for k, v := range hdr {
		fmt.Fprintf(w, "%s: %s\r\n", k, v)
	}
	w.WriteString("\r\n")
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
}

// unreadPaywalls opens an unread connection (unreadConn) per payment, each
// a browser's request (Accept: text/html) from ip carrying the payment: it
// is refused with the official paywall page (2.3 MB), whose write blocks.
func unreadPaywalls(t *testing.T, base, path, ip string, ps []x402.PaymentPayload) {
	t.Helper()
	for _, p := range ps {
		h, err := x402.EncodeHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		unreadConn(t, base, path, map[string]string{"X-Forwarded-For": ip, "Accept": "text/html", x402.HeaderPaymentSignature: h})
	}
}

// A slot covers the server's work for a paid request, not the writing of
// its answer: events browsers' requests with unfunded payments whose
// paywall pages are never read, their connections left open, hold no
// slot once the budget has refilled, and an honest payment from the same
// address is served.
func TestUnreadAnswersHoldNoRateSlot(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddyServers(t, proxiedClients, "",
		paywallSite(up.URL, fac, "paywall official\n\t\t\trate_limit 2 2s"))
	u := base + "/score/agent-1"
	r0, _ := send(t, http.MethodGet, u, "", from("192.0.2.150"))
	pr := paymentRequired(t, r0)

	const nat = "198.51.100.150"
	unreadPaywalls(t, base, "/score/agent-1", nat, unfundedPayments(t, pr, 2))
	time.Sleep(6 * time.Second) // the budget (2 per 2 s) refills three times over
	held := heldSlots()
	resp, body := send(t, http.MethodGet, u, "", map[string]string{"X-Forwarded-For": nat, x402.HeaderPaymentSignature: signFor(t, pr, 1)})
	if resp.StatusCode != http.StatusOK {
		t.Errorf("2 unfunded browser payments whose paywall pages are never read, 6 s (3 windows) on, an honest payment from the same address: %d %s (%d slots held); want 200",
			resp.StatusCode, strings.TrimSpace(string(body)), held)
	}
}

// The same where the client counts in its network's budget (the table of
// clients full): the unread answers of one address of a /24 leave the
// /24's slots to its other addresses.
func TestUnreadAnswersHoldNoSlotOfANetworkBudget(t *testing.T) {
	old := maxRateClients
	maxRateClients = 1
	t.Cleanup(func() { maxRateClients = old })
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddyServers(t, proxiedClients, "",
		paywallSite(up.URL, fac, "paywall official\n\t\t\trate_limit 2 3s"))
	u := base + "/score/agent-1"
	r0, _ := send(t, http.MethodGet, u, "", from("192.0.2.151")) // fills the table of clients
	pr := paymentRequired(t, r0)
	ps := unfundedPayments(t, pr, 3)
	// An unread answer of 192.0.2.151 would keep its bucket, and so the
	// table of clients full, were its slot held while it is written.
	unreadPaywalls(t, base, "/score/agent-1", "192.0.2.151", ps[2:])
	time.Sleep(300 * time.Millisecond)
	unreadPaywalls(t, base, "/score/agent-1", "203.0.113.15", ps[:2])
	time.Sleep(7 * time.Second)
	held := heldSlots()
	resp, body := send(t, http.MethodGet, u, "", map[string]string{"X-Forwarded-For": "203.0.113.19", x402.HeaderPaymentSignature: signFor(t, pr, 2)})
	if resp.StatusCode != http.StatusOK {
		t.Errorf("table of clients full; 2 unread paywall pages of 203.0.113.15, 7 s on, an honest payment from 203.0.113.19: %d %s (%d slots held); want 200",
			resp.StatusCode, strings.TrimSpace(string(body)), held)
	}
}

// Events x402 buyers behind one address ask the price (events 402s, each
// counted until its payment settles) and then pay at once: a payment
// passes on arrival while its refusal would leave the debt within events,
// so all are served.
func TestEventsBuyersAfterTheir402sAreServed(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, fac, 0, "rate_limit 4 1h"))
	u := base + "/verify/schema"
	const k = 4
	var pr x402.PaymentRequired
	for range k {
		pr = paymentRequired(t, post(t, u, validRequest, from("198.51.100.151")))
	}
	hdrs := make([]map[string]string, k)
	for i := range k {
		hdrs[i] = map[string]string{"X-Forwarded-For": "198.51.100.151", x402.HeaderPaymentSignature: signFor(t, pr, 1)}
	}
	st := sendAtOnce(t, k, func(i int) (string, string, string, map[string]string) {
		return http.MethodPost, u, validRequest, hdrs[i]
	})
	if st[http.StatusOK] != k {
		t.Errorf("one client, rate_limit 4 1h: %d calls asked the price (402) then paid at once: statuses %v; want all %d served", k, st, k)
	}
}

// Paid calls hold slots: with a slow upstream, a client with a full budget
// sending events+1 funded payments at once has events of them served and
// one refused 429, as README's rate_limit says.
func TestPaidCallsInFlightAreCappedAtEvents(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	up.during = func() { time.Sleep(1500 * time.Millisecond) }
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, fac, 0, "rate_limit 2 1h"))
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.152")))
	const k = 3
	hdrs := make([]map[string]string, k)
	for i := range k {
		hdrs[i] = map[string]string{"X-Forwarded-For": "198.51.100.152", x402.HeaderPaymentSignature: signFor(t, pr, 1)}
	}
	st := sendAtOnce(t, k, func(i int) (string, string, string, map[string]string) {
		return http.MethodPost, u, validRequest, hdrs[i]
	})
	if st[http.StatusOK] != 2 || st[http.StatusTooManyRequests] != 1 {
		t.Errorf("one client, rate_limit 2 1h, full budget, slow upstream: %d funded payments at once: statuses %v; want 2 served, 1 refused 429", k, st)
	}
}

// A proof's check holds a proof's slot, apart from paid calls' slots: a
// client's one paid call in flight on a route of rate_limit 1 (zone
// slowzone) leaves its wallet-proved paid calls to a route of another zone
// served.
func TestPaidCallInOneZoneLeavesWalletProofsOfAnotherServed(t *testing.T) {
	_, fac := sharedDevnet(t)
	slow := newUpstream(t)
	slow.during = func() { time.Sleep(2 * time.Second) }
	up := walletUpstream(t)
	site := `:{port} {
	route /slow/* {
		x402 {
			accept devnet $0.02 ` + cfgPayTo + `
			facilitator http {
				url ` + fac + `
			}
			store badger {data}/gate
			rate_limit 1 1h {
				zone slowzone
			}
		}
		reverse_proxy ` + strings.TrimPrefix(slow.URL, "http://") + `
	}
	route /api/* {
		wallet_auth required {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		x402 {
			accept devnet $0.02 ` + cfgPayTo + `
			facilitator http {
				url ` + fac + `
			}
			store badger {data}/gate
			rate_limit 20 1h {
				zone apizone
			}
		}
		reverse_proxy ` + strings.TrimPrefix(up.URL, "http://") + `
	}
}
`
	base := startCaddyServers(t, proxiedClients, "", site)
	r0, _ := send(t, http.MethodPost, base+"/slow/x", `{"a":1}`, from("192.0.2.153"))
	prSlow := paymentRequired(t, r0)
	r1, _ := send(t, http.MethodPost, base+"/api/items", `{"a":1}`, map[string]string{"X-Forwarded-For": "192.0.2.154", "X-Wallet-Auth": walletProof(t, walletKey(4), "POST", base+"/api/items", nil)})
	prAPI := paymentRequired(t, r1)
	const me = "198.51.100.153"
	// The client asks /slow's price itself, as x402 clients do: slowzone's
	// budget is spent, and its paid call then fills the debt's room. The
	// proof's check on /api, counted in slowzone too, still has the room
	// of its own kind. (Before: a room shared by both kinds refused it 429.)
	ask, _ := send(t, http.MethodPost, base+"/slow/x", `{"a":1}`, from(me))
	paymentRequired(t, ask)
	done := make(chan int, 1)
	go func() {
		resp, _ := send(t, http.MethodPost, base+"/slow/x", `{"a":1}`, map[string]string{"X-Forwarded-For": me, x402.HeaderPaymentSignature: signFor(t, prSlow, 1)})
		done <- resp.StatusCode
	}()
	time.Sleep(700 * time.Millisecond) // the slow paid call runs its upstream
	u := base + "/api/items"
	st, _, body := walletCall(t, http.MethodPost, u, `{"a":1}`, map[string]string{
		"X-Forwarded-For":           me,
		x402.HeaderPaymentSignature: signFor(t, prAPI, 3),
		"X-Wallet-Auth":             walletProof(t, walletKey(3), "POST", u, nil),
	})
	slowSt := <-done
	if st != http.StatusOK || slowSt != http.StatusOK {
		t.Errorf("a paid call to /slow (zone slowzone, rate_limit 1) in flight, ending %d; the same client's paid, wallet-proved call to /api (zone apizone, rate_limit 20): %d %v; want both 200", slowSt, st, body)
	}
}

// The arrival rule: a request without a payment passes while its budget
// has an event left; one carrying a payment while its refusal, counted,
// would leave the debt within events, and is told to wait for that
// otherwise.
func TestRateZonePaymentsPassUntilTheDebtFloor(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	stubNow(t, &at)
	z := refusalZone(t, 4, time.Hour)
	for range 4 {
		z.note("c") // four 402s: the budget spent
	}
	if w := z.wait("c", false); w != 15*60 {
		t.Errorf("budget of 4 an hour spent: a request without a payment waits %d s; want 900 (one event)", w)
	}
	if w := z.wait("c", true); w != 0 {
		t.Errorf("budget of 4 an hour spent, no debt: a payment waits %d s; want 0", w)
	}
	for range 3 {
		z.note("c") // three refused payments: 3 in debt
	}
	if w := z.wait("c", true); w != 0 {
		t.Errorf("3 in debt of 4: a payment waits %d s; want 0 (its refusal keeps the debt within 4)", w)
	}
	s, w := z.enter("c", slotPaid, true)
	if w != 0 {
		t.Errorf("3 in debt of 4: a payment's slot refused, wait %d s", w)
	}
	// The one in flight would take the debt's last room: its refusal
	// counts, a second one's would not.
	if _, w := z.enter("c", slotPaid, true); w != 1 {
		t.Errorf("3 in debt of 4, a payment in flight: a second payment's slot given with wait %d s; want 1", w)
	}
	s.leave()
	z.note("c") // 4 in debt: at the floor
	if w := z.wait("c", true); w != 15*60 {
		t.Errorf("4 in debt of 4: a payment waits %d s; want 900 (one event)", w)
	}
	if _, w := z.enter("c", slotPaid, true); w != 15*60 {
		t.Errorf("4 in debt of 4: a payment's slot given with wait %d s; want 900", w)
	}
}

// Proofs' slots and paid calls' slots are apart: all of a bucket's paid
// slots held, a proof's check still gets one, and at most events of them.
func TestRateZoneProofSlotsAreApartFromPaidSlots(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	stubNow(t, &at)
	z := refusalZone(t, 1, time.Hour)
	paid, w := z.enter("c", slotPaid, true)
	if w != 0 {
		t.Fatalf("a fresh client's paid slot: wait %d", w)
	}
	defer paid.leave()
	proof, w := z.enter("c", slotProof, false)
	if w != 0 {
		t.Errorf("the one paid slot held: a proof's check waits %d s; want 0", w)
	}
	if _, w := z.enter("c", slotProof, false); w != 1 {
		t.Errorf("the one proof slot held: a second proof waits %d s; want 1", w)
	}
	proof.leave()
}

// At the debt's floor every refused payment whose work ran is counted: a
// client sending events payments at once each time one event has refilled
// gets one of them worked for, not events (whose refusals past the floor
// would go uncounted, events times the work per window).
func TestRateZonePaymentsAtTheDebtFloorAreCounted(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	stubNow(t, &at)
	z := refusalZone(t, 4, time.Hour)
	for range 8 {
		z.note("c") // the budget spent and 4 in debt
	}
	worked := 0
	for range 4 {
		at = at.Add(15 * time.Minute) // one event refilled
		var in []rateSlot
		for range 4 {
			if s, w := z.enter("c", slotPaid, true); w == 0 {
				in = append(in, s)
			}
		}
		for i := range in {
			z.note("c") // refused once verified
			in[i].leave()
		}
		worked += len(in)
	}
	if worked != 4 {
		t.Errorf("at the debt's floor of rate_limit 4 1h, 4 payments at once after each of 4 events refilled: %d worked for; want 4 (one per event)", worked)
	}
}

// Each kind of work has the debt's room to itself: at the floor, each
// refilled event lets in one paid call and one proof check of a request
// carrying a payment, not more. So the refused work of each kind is
// bounded by events per window, and a paid call in flight never refuses a
// proof's check (which wallet_auth makes in every zone of its server,
// whatever route the proof is for).
func TestRateZoneEachKindHasTheDebtRoomToItself(t *testing.T) {
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	stubNow(t, &at)
	z := refusalZone(t, 4, time.Hour)
	for range 8 {
		z.note("c") // the budget spent and 4 in debt
	}
	for i := range 4 {
		at = at.Add(15 * time.Minute) // one event refilled
		var in []rateSlot
		got := map[slotKind]int{}
		for _, kind := range []slotKind{slotPaid, slotProof} {
			for range 4 {
				if s, w := z.enter("c", kind, true); w == 0 {
					in = append(in, s)
					got[kind]++
				}
			}
		}
		if got[slotPaid] != 1 || got[slotProof] != 1 {
			t.Errorf("refill %d at the debt's floor of rate_limit 4 1h: %d paid calls and %d proof checks entered; want one of each", i+1, got[slotPaid], got[slotProof])
		}
		for i := range in {
			z.note("c")
			in[i].leave()
		}
	}
}
