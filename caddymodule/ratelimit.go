package caddymodule

import (
	"bufio"
	"container/heap"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"golang.org/x/time/rate"

	"github.com/aovhq/aov/apierr"
)

// Defaults of rate_limit.
const (
	defaultRateEvents = 120
	defaultRateWindow = time.Minute
	defaultRateZone   = "default"
)

// maxRateClients bounds the clients one zone tracks, and, in a table of
// their own, the prefixes of the clients it has no room for
// (rateZone.bucket). It is a variable only so that tests can fill a table
// without sending 65,536 requests; a zone takes it when it is created.
var maxRateClients = 1 << 16

// RateLimit bounds how often one client may be refused by the gate or
// served unpaid. Every answer nobody paid for counts one event: a 402 (a
// demand for payment, a refused payment), a 4xx refusal of the gate (413,
// 422, a refused tool call), a paid call the upstream worked for that
// settled nothing (a 4xx or 5xx answer, upstream_timeout, its client
// leaving while the upstream works: the charge is given back, so were it
// not counted, a client could have work done free by causing such an end
// each time; a call the upstream could not be connected to at all is not
// counted: workRan), and, in a budget of its own, a call served from the
// free allowance, whatever its answer (per wallet, the allowance alone
// bounds nothing: anyone mints wallets; Gate.unsettled). A client with
// Events such answers within Window is answered 429 rate_limited with
// Retry-After until its budget refills, before the gate reads its body.
// Paid calls never count, and a settled payment gives one event back
// (rateZone.credit): the 402 that told the client the price.
//
// A request passes when its client's budget has an event left, one
// carrying a payment while its refusal would leave the debt within Events
// (arrival, wait), and spends nothing on arrival. Before work that costs
// the server whatever comes of it (a payment's /verify and its call's
// upstream, a wallet proof's check) it takes one of the budget's Events
// slots of its kind, given back when the work ends or its answer starts to
// be written (enter, slotWriter); with none free it is answered 429,
// counting nothing. A refusal is counted once known, after the work it
// cost, even past an empty budget (note), down to a debt of Events: the
// client waits until the debt is repaid. So at most Events of a client's
// costly requests of each kind (paid calls, proof checks) run at once, a
// burst of refusals overdraws the budget by at most Events, and the
// longest wait is Window plus one event's refill (Window/Events); on
// average a client is refused at most Events times per Window for each
// kind of work.
//
// The client is clientAddr: Caddy's resolved client IP (honouring the
// server's trusted_proxies, never a raw header), an IPv6 client per /64,
// the same identity the free allowance counts. The state is kept in memory
// per zone and survives config reloads; it is not shared between Caddy
// instances.
type RateLimit struct {
	// Events is how many refused or unpaid answers one client may get per
	// Window. Default 120.
	Events int `json:"events,omitempty"`
	// Window is the period Events is counted over; the budget refills
	// evenly across it (a token bucket of Events tokens). Default 1m.
	Window caddy.Duration `json:"window,omitempty"`
	// Zone names the budget: gates that name the same zone (and the same
	// events and window) share one per client. Default "default", so all
	// gates of a server share it.
	Zone string `json:"zone,omitempty"`
	// Off turns the limit off.
	Off bool `json:"off,omitempty"`
}

func (rl *RateLimit) provision() {
	if rl.Events == 0 {
		rl.Events = defaultRateEvents
	}
	if rl.Window == 0 {
		rl.Window = caddy.Duration(defaultRateWindow)
	}
	if rl.Zone == "" {
		rl.Zone = defaultRateZone
	}
}

// validate refuses what only the JSON config can say (the Caddyfile
// refuses it while parsing). The error names the field, not the directive:
// the caller prefixes its own name (x402's rate_limit, aov_rate_limit).
func (rl *RateLimit) validate() error {
	if rl.Events < 0 {
		return fmt.Errorf("events must be positive, not %d", rl.Events)
	}
	if rl.Window < 0 {
		return fmt.Errorf("window must be positive, not %s", time.Duration(rl.Window))
	}
	return nil
}

// rateZones keeps every zone's clients across config reloads (Caddy
// provisions the new config before it cleans up the old one).
var rateZones = caddy.NewUsagePool()

// rateZone is one budget: a token bucket per client, in a bounded table;
// a bucket per prefix (clientPrefix) for the clients that table has no
// room for, in a second; and one overflow bucket shared by the clients
// neither has room for (bucket).
type rateZone struct {
	limit rate.Limit
	burst int
	every time.Duration

	mu       sync.Mutex
	clients  rateTable
	prefixes rateTable
	overflow *rateBucket // in no table: never dropped
}

// rateTable is a bounded table of buckets by key.
type rateTable struct {
	size    int // the most keys tracked: maxRateClients
	buckets map[string]*rateBucket
	due     dueBuckets // the same buckets, the earliest due first
	looked  int        // buckets sweep has looked at, ever: its cost, for the tests
}

// rateBucket is one client's token bucket in a zone.
type rateBucket struct {
	*rate.Limiter
	key string // its client, or its prefix
	// due is no later than the time the bucket has refilled completely:
	// before it, dropping the bucket could give its client a fresh
	// budget. Spending, into debt too, only delays the refill; a credit
	// brings it forward, and due with it (credit).
	due time.Time
	at  int // index in rateZone.due
	// busy is how many of the bucket's slots of each kind requests hold
	// (enter): at most burst of each. A bucket with one held is never
	// dropped (sweep), so a client cannot have its slots counted afresh in
	// a new bucket. z.mu guards it.
	busy [slotKinds]int
}

// slotKind names the work a slot is held for (enter). Each kind has a
// bucket's Events slots of its own: a proof's check is bounded by the
// checks in flight, not by paid calls, which a wallet_auth in front of
// several gates would otherwise wait on in every zone of its server,
// however unrelated the route it guards.
type slotKind uint8

const (
	slotPaid  slotKind = iota // a paid call: /verify, upstream, settlement
	slotProof                 // a wallet_auth proof's check
	slotCheck                 // a request's precheck before an unpaid answer (Gate.precheck)
	slotKinds
)

// dueBuckets is a min-heap of buckets by due (container/heap), so that
// finding the buckets that may have refilled costs no walk of the table.
type dueBuckets []*rateBucket

func (h dueBuckets) Len() int           { return len(h) }
func (h dueBuckets) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h dueBuckets) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].at, h[j].at = i, j
}
func (h *dueBuckets) Push(x any) {
	b := x.(*rateBucket)
	b.at = len(*h)
	*h = append(*h, b)
}
func (h *dueBuckets) Pop() any {
	old := *h
	b := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return b
}

// What a zone counts: a gate's rate_limit counts refusals, and, in a
// budget of the same size of its own, free calls; aov_rate_limit counts
// requests. None shares a bucket with another, even under one zone name: a
// gate refuses a client whose refusal budget is spent, paid calls
// included, so requests or free calls counted into it would let free
// traffic stop a buyer from paying. A spent free budget refuses free calls
// only (serveFree).
const (
	zoneRefusals = "refusals"
	zoneFree     = "free"
	zoneRequests = "requests"
)

// loadZone returns the shared zone of kind (zoneRefusals or zoneRequests)
// for rl, creating it on first use. The caller must release it with
// rateZones.Delete(key) on cleanup. The key holds events and window, since
// a bucket's state is tokens of that size refilling at that rate: a reload
// that keeps them keeps every client's budget, one that changes them starts
// a zone of its own, empty, and the old one goes with the old config.
func loadZone(rl *RateLimit, kind string) (*rateZone, string, error) {
	key := fmt.Sprintf("%s:%s/%d/%s", kind, rl.Zone, rl.Events, time.Duration(rl.Window))
	v, _, err := rateZones.LoadOrNew(key, func() (caddy.Destructor, error) {
		w := time.Duration(rl.Window)
		limit := rate.Limit(float64(rl.Events) / w.Seconds())
		return &rateZone{
			limit:    limit,
			burst:    rl.Events,
			every:    w,
			clients:  rateTable{size: maxRateClients, buckets: make(map[string]*rateBucket)},
			prefixes: rateTable{size: maxRateClients, buckets: make(map[string]*rateBucket)},
			overflow: &rateBucket{Limiter: rate.NewLimiter(limit, rl.Events)},
		}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(*rateZone), key, nil
}

// Destruct drops the zone's state when the last config using it is gone.
func (z *rateZone) Destruct() error { return nil }

// bucket returns the bucket that counts client at t, creating it when
// create is set; nil when there is none yet (a full budget). tab is the
// table the bucket is in, nil for the overflow bucket.
//
// A client has a bucket of its own while the table of clients has room.
// Buckets that have refilled completely mean the same as no bucket, and
// are dropped before a newcomer is turned away (sweep); a partly spent one
// is never dropped to make room: its client would get a fresh budget, and
// one holder of more addresses than the table (an IPv6 /47 has 2^17 /64s)
// could cycle through them unlimited. A client the full table does not
// track is counted in the bucket of its prefix (clientPrefix), in a table
// of its own under the same rule, so one holder of a short prefix who
// fills the table of clients spends the budgets of its own few prefixes,
// not those of the newcomers from elsewhere. Only a client whose prefix
// that table has no room for either shares the one overflow bucket, so
// under a flood from more prefixes than the table holds (an IPv6 /32 has
// 2^16 /48s) the limit tightens instead of lapsing. Whatever a request
// carries, its client is held to the bucket that counts it: a payment is
// no pass, since each refused or unsettled one costs work too.
// z.mu must be held.
func (z *rateZone) bucket(client string, t time.Time, create bool) (b *rateBucket, tab *rateTable) {
	if b, ok := find(z, &z.clients, client, t, create); ok {
		return b, &z.clients
	}
	var buf [maxPrefixLen]byte
	if b, ok := find(z, &z.prefixes, appendClientPrefix(buf[:0], client), t, create); ok {
		return b, &z.prefixes
	}
	return z.overflow, nil
}

// find returns key's bucket in tab, making one when create is set and tab
// has room once refilled buckets are dropped; ok is false when key has no
// bucket and tab is full, so the key counts elsewhere (bucket). A key of
// bytes (a prefix, built without a string: appendClientPrefix) becomes a
// string only for a new bucket.
// z.mu must be held.
func find[K string | []byte](z *rateZone, tab *rateTable, key K, t time.Time, create bool) (b *rateBucket, ok bool) {
	if b := tab.buckets[string(key)]; b != nil {
		return b, true
	}
	z.sweep(tab, t)
	if len(tab.buckets) >= tab.size {
		return nil, false
	}
	if !create {
		return nil, true
	}
	// A new bucket is spent at once (note, take): one event refills in
	// refillIn(burst-1), more spent only later. One left full is due later
	// than it could go, which only delays dropping what means nothing.
	b = &rateBucket{Limiter: rate.NewLimiter(z.limit, z.burst), key: string(key), due: t.Add(z.refillIn(float64(z.burst - 1)))}
	tab.buckets[b.key] = b
	heap.Push(&tab.due, b)
	return b, true
}

// sweep drops the buckets of tab that have refilled completely by t. It
// looks only at the buckets due by t, earliest first: each goes, or, spent
// since it was last looked at, is due again when it can have refilled,
// after t (a bucket in debt, tokens below 0, refills its debt first:
// refillIn). A bucket with a slot held (busy) stays, full or not, and is
// looked at again no sooner than one event's refill later, as if spent
// by one. So no request walks the table under the zone's lock: a sweep
// costs O(log n) per bucket it drops or that was spent or held since its
// last look, each paid for by a request.
// z.mu must be held.
func (z *rateZone) sweep(tab *rateTable, t time.Time) {
	for len(tab.due) > 0 && !t.Before(tab.due[0].due) {
		b := tab.due[0]
		tab.looked++
		tokens := b.TokensAt(t)
		if b.held() {
			tokens = min(tokens, float64(z.burst-1))
		}
		if tokens < float64(z.burst) {
			b.due = t.Add(z.refillIn(tokens))
			heap.Fix(&tab.due, 0)
			continue
		}
		heap.Pop(&tab.due)
		delete(tab.buckets, b.key)
	}
}

// refillIn is how long a bucket holding tokens (below 0 for one in debt)
// takes to refill completely, rounded up to the millisecond, so that it
// has by then.
func (z *rateZone) refillIn(tokens float64) time.Duration {
	return time.Duration(math.Ceil((float64(z.burst)-tokens)/float64(z.limit)*1e3)) * time.Millisecond
}

// retryAfter is how many whole seconds from t until bucket l holds need
// tokens (arrival); 0 when it holds them now.
func (z *rateZone) retryAfter(l *rate.Limiter, t time.Time, need float64) int {
	tokens := l.TokensAt(t)
	if tokens >= need {
		return 0
	}
	return max(1, int(math.Ceil((need-tokens)/float64(z.limit))))
}

// arrival is how many tokens a request's client's budget must hold for the
// request to pass on arrival (wait, enter). A request without a payment
// needs one event left. A request carrying one needs only room in the
// debt for its refusal (1-Events: one more refusal counted, note, keeps
// the debt within Events), and enter also counts the refusals of the
// same kind of work in flight into that room: an x402 buyer asks the
// price of each call first, and that 402 counts until the payment settles
// (credit), so Events buyers behind one address who asked the price at
// once would otherwise find their budget spent and every payment refused
// 429 on arrival. So a refused payment whose work ran is counted unless
// the client's refused proof checks took the room first, and a flood of
// refused payments gets Events per Window on average, after one burst of
// the budget and its debt.
func (z *rateZone) arrival(paying bool) float64 {
	if paying {
		return float64(1 - z.burst)
	}
	return 1
}

// rateSpend is one event spent from a bucket of a zone (rateZone.spend),
// naming the bucket, so that refund gives it back where it was spent.
type rateSpend struct {
	z   *rateZone
	b   *rateBucket // nil: nothing was spent
	tab *rateTable  // the bucket's table; nil for the overflow bucket
}

// spend spends one event of client's budget, or, when the budget is
// spent, returns how many seconds the client must wait and spends
// nothing: a client that keeps asking is told the same wait, not a longer
// one.
func (z *rateZone) spend(client string) (rateSpend, int) {
	t := now()
	z.mu.Lock()
	b, tab := z.bucket(client, t, true)
	z.mu.Unlock()
	if b.AllowN(t, 1) {
		return rateSpend{z: z, b: b, tab: tab}, 0
	}
	return rateSpend{}, z.retryAfter(b.Limiter, t, 1)
}

// take counts one request of client (aov_rate_limit) and returns 0, or,
// when its budget is spent, how many seconds it must wait (spend).
func (z *rateZone) take(client string) int {
	_, wait := z.spend(client)
	return wait
}

// wait is how many seconds client must wait before its budget lets a
// request pass (arrival; paying: the request carries a payment), 0 when it
// does now, spending none: what a request must pass on arrival before any
// work is done for it.
func (z *rateZone) wait(client string, paying bool) int {
	t := now()
	z.mu.Lock()
	b, _ := z.bucket(client, t, false)
	z.mu.Unlock()
	if b == nil {
		return 0
	}
	return z.retryAfter(b.Limiter, t, z.arrival(paying))
}

// note counts one refused or unpaid answer to client, even past an empty
// budget. A refusal is known only after the work it cost (a facilitator's
// /verify, a chain check), and the requests in flight passed wait before
// it: were a refusal past the budget not counted, the Events requests
// whose work runs at once (enter) would cost Events pieces of work per
// Window, again and again. Counted, the budget goes into debt (tokens
// below 0) and its client waits until the debt is repaid: at most Events
// refusals per Window on average.
//
// The debt stops at Events: a refusal that would take the budget deeper
// is not counted. Past that, the refusals were cheap ones (a 402 to a
// request without a payment, which any number of requests held open at
// once can get) or their work was bounded by the slots; counted, they
// would lock a shared address (a NAT, a /64) out for as many windows as
// requests were held, an honest buyer behind it with the rest. So the
// longest wait is Window plus one event's refill.
func (z *rateZone) note(client string) {
	t := now()
	z.mu.Lock()
	defer z.mu.Unlock()
	b, _ := z.bucket(client, t, true)
	// Under z.mu, so that concurrent notes cannot both pass the floor.
	if b.TokensAt(t)-1 < -float64(z.burst) {
		return
	}
	// A reservation never cancelled: x/time/rate takes the event even from
	// an empty bucket (AllowN would refuse it).
	b.ReserveN(t, 1)
}

// held reports whether a request holds one of b's slots, of any kind.
// z.mu must be held.
func (b *rateBucket) held() bool {
	for _, n := range b.busy {
		if n > 0 {
			return true
		}
	}
	return false
}

// rateSlot is one slot of a bucket held by a request whose work costs the
// server (enter); the zero rateSlot holds none.
type rateSlot struct {
	z    *rateZone
	b    *rateBucket
	kind slotKind
}

// enter takes one of the slots of kind of the bucket that counts client,
// for work whose failure will be counted as a refusal (note): a payment's
// /verify and its call's upstream, a wallet proof's check. It returns 0,
// or, when the bucket's Events slots of kind are all held or its budget
// does not let the request pass (arrival; paying: it carries a payment),
// how many seconds the client must wait, and takes nothing: the arrival
// check (wait) spends nothing, so without the slots every request of a
// client held open past it (a body sent late, a slow facilitator) would
// start its work before the first refusal is counted. With them, at most
// Events such requests work at once, and their refusals put the budget at
// most Events in debt. With the slots held the wait is 1 s (one may be
// given back any moment), or the budget's, if longer.
//
// The slot must be given back (leave) when the work ends, whatever its
// end. A bucket with a slot held is never dropped (sweep).
func (z *rateZone) enter(client string, kind slotKind, paying bool) (rateSlot, int) {
	t := now()
	z.mu.Lock()
	defer z.mu.Unlock()
	b, _ := z.bucket(client, t, true)
	need := z.arrival(paying)
	wait := z.retryAfter(b.Limiter, t, need)
	// A payment's refusal counts only within the debt's floor (note): with
	// the room left there taken by the payments in flight, its work would
	// go uncounted, as the slots' work would for ever at the floor. Each
	// kind counts its own in flight, so the refused work of each is
	// bounded on its own (Events per Window of each): wallet_auth checks
	// a proof in every zone of its server, and a room shared with the paid
	// calls would have a paid call on one route refuse a proof for another.
	full := paying && b.TokensAt(t)-float64(b.busy[kind]) < need
	if b.busy[kind] >= z.burst || full {
		return rateSlot{}, max(1, wait)
	}
	if wait > 0 {
		return rateSlot{}, wait
	}
	return z.hold(b, kind), 0
}

// reenter is enter for more work of a request that passed the budget's
// check already, when its first part entered (a proof an earlier
// wallet_auth verified, checked again): the slots alone bound it, so it
// waits 1 s with all of kind held, and never for the budget.
func (z *rateZone) reenter(client string, kind slotKind) (rateSlot, int) {
	z.mu.Lock()
	defer z.mu.Unlock()
	b, _ := z.bucket(client, now(), true)
	if b.busy[kind] >= z.burst {
		return rateSlot{}, 1
	}
	return z.hold(b, kind), 0
}

// hold takes one of b's slots of kind. z.mu must be held.
func (z *rateZone) hold(b *rateBucket, kind slotKind) rateSlot {
	b.busy[kind]++
	return rateSlot{z: z, b: b, kind: kind}
}

// leave gives the slot back, once: a second call does nothing, so a path
// that ends the work early may call it as well as the deferred call.
func (s *rateSlot) leave() {
	if s.b == nil {
		return
	}
	s.z.mu.Lock()
	s.b.busy[s.kind]--
	s.z.mu.Unlock()
	s.b = nil
}

// slotWriter is the client's writer of a request that holds a rate slot
// (servePaid): the answer's first write gives the slot back (leave). A
// slot covers the server's work for the request (the facilitator's /verify
// and settlement, the upstream run and its hold, the gate's checks), never
// the writing of the answer: Caddy sets no write deadline by default, so a
// client that does not read a large answer (the official paywall page)
// would hold the slot for as long as it kept the connection open, and
// events such connections would keep its address, or a network's or the
// last shared budget it counts in, from paying at all. An answer starts
// with WriteHeader, Write, ReadFrom (io.Copy), a flush or a hijack, so
// each gives the slot back first; Push passes through, and Unwrap lets
// http.ResponseController reach the real writer.
type slotWriter struct {
	caddyhttp.ResponseWriterWrapper // by value: one allocation per request
	slot                            rateSlot
	left                            atomic.Bool // slot given back
}

// leave gives the slot back, once, whichever goroutine writes first.
func (w *slotWriter) leave() {
	if w.left.CompareAndSwap(false, true) {
		w.slot.leave()
	}
}

func (w *slotWriter) WriteHeader(status int) {
	w.leave()
	w.ResponseWriterWrapper.WriteHeader(status)
}

func (w *slotWriter) Write(b []byte) (int, error) {
	w.leave()
	return w.ResponseWriterWrapper.Write(b)
}

func (w *slotWriter) ReadFrom(r io.Reader) (int64, error) {
	w.leave()
	return w.ResponseWriterWrapper.ReadFrom(r)
}

// FlushError is http.ResponseController's flush: it sends the header.
func (w *slotWriter) FlushError() error {
	w.leave()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Flush is FlushError for handlers that look for an http.Flusher.
func (w *slotWriter) Flush() { _ = w.FlushError() }

// Hijack hands the connection over (a protocol switch, settled by then).
func (w *slotWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.leave()
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// refund gives back the event s spent, to the bucket it was spent from, up
// to a full budget. A bucket dropped since had refilled completely, its
// event back already: nothing is given then, and no other bucket gains.
func (s rateSpend) refund() {
	if s.b == nil {
		return
	}
	z := s.z
	t := now()
	z.mu.Lock()
	defer z.mu.Unlock()
	if s.tab == nil || s.tab.buckets[s.b.key] == s.b {
		z.give(s.b, s.tab, t)
	}
}

// credit gives client back one event, up to a full budget, for a payment
// that settled. In the x402 flow a paying client's first attempt at every
// paid call is answered 402 (it learns the price), which counts; without
// the credit the limit would cap paying clients at Events paid calls per
// Window. The credit does not reopen what the limit closes (refusals that
// cost the gate work and bring nothing): it is earned only by a settled
// payment, never by a refused, replayed or unsettled one, so an unpaying
// client still gets Events refusals per Window, and a paying one at most
// one more per payment; and a budget never grows beyond Events, so no
// credit can be saved up.
//
// The event goes to the bucket that counts the client now (bucket): the
// budget its next request must pass. A newcomer to a full table, counted
// in its prefix's or the overflow bucket, earns it there, so it is not
// capped at Events paid calls per Window; what the others sharing such a
// bucket gain is one refusal per payment settled. A client with a bucket
// of its own that is full (it paid without a 402 first, or the 402 has
// refilled) gains nothing, and nor does any bucket it shares: a payment
// never reopens a shared budget its client is not counted in.
func (z *rateZone) credit(client string) {
	t := now()
	z.mu.Lock()
	defer z.mu.Unlock()
	if b, tab := z.bucket(client, t, false); b != nil {
		z.give(b, tab, t)
	}
}

// give adds one event to b, in tab (nil: the overflow bucket), unless it
// is full. A bucket never holds more than a full budget: the limiter caps
// its tokens at burst whenever it reads them.
// z.mu must be held.
func (z *rateZone) give(b *rateBucket, tab *rateTable, t time.Time) {
	if b.TokensAt(t) >= float64(z.burst) {
		return
	}
	// Reserving -1 events adds one token (x/time/rate: tokens -= n), also
	// to a bucket in debt, which AllowN would refuse.
	b.ReserveN(t, -1)
	if due := t.Add(z.refillIn(b.TokensAt(t))); tab != nil && due.Before(b.due) {
		b.due = due
		heap.Fix(&tab.due, b.at)
	}
}

// countsAgainstRate reports whether answering e counts one event against
// the client's rate limit: every refusal of the request (4xx) but the 429
// itself, by the gate or by wallet_auth in front of it.
func countsAgainstRate(e *apierr.Error) bool {
	return e.Status >= 400 && e.Status < 500 && e.Code != apierr.CodeRateLimited
}

// serverZones lists the rate zones of each server's gates, so that
// wallet_auth, which runs before any gate and verifies proofs at a cost
// (ecrecover, an eth_call for a contract wallet, a synced nonce claim),
// answers within the same budgets: a client its server's gates would answer
// 429 gets 429 before any proof is checked, and every proof refused counts
// like a gate's refusal. Neither module can see the other (they are
// siblings in a route, and wallet_auth is provisioned first), but both see
// their server: a gate registers its zone under the server it is
// provisioned for, and wallet_auth finds it through the request's server.
// With several zones on one server (gates naming different zones), each is
// honoured and each counts the refusal: the limit can only tighten.
var serverZones = struct {
	sync.RWMutex
	m map[*caddyhttp.Server]map[*rateZone]int // zone -> gates using it
}{m: make(map[*caddyhttp.Server]map[*rateZone]int)}

// addServerZone registers z for srv's gates (one reference per gate).
func addServerZone(srv *caddyhttp.Server, z *rateZone) {
	serverZones.Lock()
	defer serverZones.Unlock()
	if serverZones.m[srv] == nil {
		serverZones.m[srv] = make(map[*rateZone]int)
	}
	serverZones.m[srv][z]++
}

// removeServerZone drops one gate's reference to z (Cleanup).
func removeServerZone(srv *caddyhttp.Server, z *rateZone) {
	serverZones.Lock()
	defer serverZones.Unlock()
	zs := serverZones.m[srv]
	if zs[z]--; zs[z] <= 0 {
		delete(zs, z)
	}
	if len(zs) == 0 {
		delete(serverZones.m, srv)
	}
}

// serverRateWait is how many seconds the request's client must wait
// before each of its server's gates' zones lets the request pass (0: each
// does; rateZone.arrival, paying: it carries a payment), spending none:
// what wallet_auth asks before it checks a proof of a request that holds a
// gate's slot already (enterServerRate).
func serverRateWait(r *http.Request, paying bool) int {
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	serverZones.RLock()
	defer serverZones.RUnlock()
	wait := 0
	if zs := serverZones.m[srv]; len(zs) > 0 {
		client := clientAddr(r)
		for z := range zs {
			wait = max(wait, z.wait(client, paying))
		}
	}
	return wait
}

// rateSlots are the slots one request holds, one per zone (enterServerRate).
type rateSlots []rateSlot

// leave gives every slot back (rateSlot.leave: once).
func (ss rateSlots) leave() {
	for i := range ss {
		ss[i].leave()
	}
}

// enterServerRate takes a proof's slot (slotProof) for the request's
// client in each of its server's gates' zones (rateZone.enter), what
// wallet_auth does before it checks a proof (paying: the request carries
// a payment, rateZone.arrival); or returns how many seconds the client
// must wait, and holds none. So at most events of a client's proof checks
// run at once, in every zone, whatever its paid calls in flight. A request
// a gate runs its upstream for holds that gate's slot already
// (Gate.enterRate), and the proof's check is part of that work: it takes
// none, and is held to the budgets' check only. A check again (recheck:
// of proofs an earlier wallet_auth on the request verified, the budgets'
// check passed there) takes a slot as the first did (rateZone.reenter),
// since the first gave its own back before passing the request on: so
// at most events of a client's proof checks run at once, however many
// wallet_auth check each proof.
func enterServerRate(r *http.Request, paying, recheck bool) (rateSlots, int) {
	if caddyhttp.GetVar(r.Context(), varRateSlot) != nil {
		if recheck {
			return nil, 0
		}
		return nil, serverRateWait(r, paying)
	}
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	serverZones.RLock()
	defer serverZones.RUnlock()
	zs := serverZones.m[srv]
	if len(zs) == 0 {
		return nil, 0
	}
	client := clientAddr(r)
	ss := make(rateSlots, 0, len(zs))
	for z := range zs {
		var s rateSlot
		var wait int
		if recheck {
			s, wait = z.reenter(client, slotProof)
		} else {
			s, wait = z.enter(client, slotProof, paying)
		}
		if wait > 0 {
			ss.leave()
			return nil, wait
		}
		ss = append(ss, s)
	}
	return ss, 0
}

// varRateSlot marks a request that holds a gate's slot (Gate.enterRate)
// while the gate runs its upstream.
const varRateSlot = "aov.x402.rate_slot"

// noteServerEvent counts one event against the request's client in each of
// its server's gates' zones, even past an empty budget (rateZone.note).
func noteServerEvent(r *http.Request) {
	srv, _ := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	serverZones.RLock()
	defer serverZones.RUnlock()
	if zs := serverZones.m[srv]; len(zs) > 0 {
		client := clientAddr(r)
		for z := range zs {
			z.note(client)
		}
	}
}

// rateWait is how many seconds the request's client must wait before g's
// refusal budget lets the request pass (rateZone.wait; paying: it carries
// a payment); 0 with rate_limit off.
func (g *Gate) rateWait(r *http.Request, paying bool) int {
	if g.rates == nil {
		return 0
	}
	return g.rates.wait(clientAddr(r), paying)
}

// enterRate takes a slot of g's refusal budget for the request's client,
// whose payment is about to be verified, before work whose failure counts
// as a refusal (rateZone.enter), or returns how many seconds it must wait;
// with rate_limit off it takes none.
func (g *Gate) enterRate(r *http.Request) (rateSlot, int) {
	if g.rates == nil {
		return rateSlot{}, 0
	}
	s, wait := g.rates.enter(clientAddr(r), slotPaid, true)
	if wait == 0 {
		caddyhttp.SetVar(r.Context(), varRateSlot, true)
	}
	return s, wait
}

// creditSettled gives back the event of the 402 before the request's
// payment, which settled (rateZone.credit).
func (g *Gate) creditSettled(r *http.Request) {
	if g.rates != nil {
		g.rates.credit(clientAddr(r))
	}
}

// Interface guards
var _ caddy.Destructor = (*rateZone)(nil)
