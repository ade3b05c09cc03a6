// Package redisstore keeps the gateway's shared state (free allowance
// counters, payment claims, wallet-proof and sign-in-with-x nonces, paid
// access records) in Redis, so several gateway instances behind one load
// balancer grant a client's free calls and accept a payment exactly as one
// instance would. It implements store.Allowance and store.Claims with one
// Lua script per operation (see scripts.go; reading a claim by a key other
// than its first, whose note is under the first, takes a second), on
// go-redis's UniversalClient: a standalone server, a primary and replicas
// under Sentinel, or a Cluster.
//
// The Caddy module x402.stores.redis (module.go) wraps it; *Store works on
// its own too.
package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/store"
)

// Options tune a Store. The zero value (with a Prefix) is the safe default.
type Options struct {
	// Prefix starts every key, so several deployments can share one Redis.
	// It must not contain '{' or '}': the store adds its own Cluster hash
	// tag after it. Default "aov".
	Prefix string

	// ReservationTTL is how long an allowance reservation holds a unit
	// before it lapses uncommitted. Zero means store.DefaultReservationTTL.
	ReservationTTL time.Duration

	// WaitReplicas, when positive, makes every write wait (Redis WAIT) until
	// that many replicas have it, for at most WaitTimeout. A write not
	// acknowledged in time is an error (the caller answers 503): the write
	// may still be on the primary, so nothing is granted or charged on it
	// (a claim or reservation is undone: see Store.undo).
	// Without it, a primary that dies before replicating loses its last
	// writes when a replica is promoted.
	WaitReplicas int
	// WaitTimeout bounds each WAIT (less when the operation's deadline is
	// nearer: waitFor). Default 100 ms. With WaitReplicas, New refuses a
	// client whose read timeout is shorter than WaitTimeout + 0.5 s
	// (checkReadTimeout).
	WaitTimeout time.Duration

	// Logger receives the start-up check's warnings (see checkPolicy).
	// Nil discards them.
	Logger *slog.Logger
}

// now is the gateway's clock. Nothing of the store is judged by it but the
// time elapsed on this gateway (its monotonic reading): expiry is the
// server's clock's to judge. Tests move it, to show that.
var now = time.Now

// ErrNotReplicated reports a write that fewer than Options.WaitReplicas
// replicas acknowledged in time.
var ErrNotReplicated = errors.New("redisstore: write not acknowledged by enough replicas in time")

// Store is the shared gateway state on one Redis deployment. It is safe for
// concurrent use.
type Store struct {
	rdb  redis.UniversalClient
	opts Options
	// Key prefixes: allowance keys spread over the Cluster (each is one
	// key); claim keys share one hash tag, because a claim takes several
	// keys in one script and Cluster runs a script on one slot only.
	allowPrefix, claimPrefix string
	heldIndex                string // the index of held claims (held.go)
	// retries counts the commits and releases being retried after
	// their request returned (allowance.retryFinish); AfterRetries waits
	// for them.
	retries sync.WaitGroup
	// span is the last attempt span ClaimHeld was given, boxed (spanArg).
	span atomic.Pointer[boxedMS]
	// skew is the server's clock minus the gateway's (ms), as an allowance
	// script last found it off the server's day (onServerDay).
	skew atomic.Int64
	// opTimeout bounds each script run as a whole (bounded); zero: no
	// bound but the caller's.
	opTimeout time.Duration
	// asks are the clients of the nodes ASK answers name (write).
	asks askNodes
	// rereadMu guards rereading, closed when the slot map's reread under
	// way (reread) ends, nil when none is, and lastReread, when the last
	// one ended.
	rereadMu   sync.Mutex
	rereading  chan struct{}
	lastReread time.Time
}

// boxedMS is a number of milliseconds and the same as a script argument.
type boxedMS struct {
	ms  int64
	arg any
}

// spanArg is span in milliseconds as a script argument, boxed once per
// span: every paid call passes its gate's span, the same call after call,
// and boxing it anew cost each one an allocation. Gates of other spans on
// one Store only box it again.
func (s *Store) spanArg(span time.Duration) any {
	ms := max(span, 0).Milliseconds()
	if b := s.span.Load(); b != nil && b.ms == ms {
		return b.arg
	}
	b := &boxedMS{ms: ms, arg: ms}
	s.span.Store(b)
	return b.arg
}

// New checks the server and returns a Store on rdb. It refuses a server
// whose maxmemory-policy is not noeviction (every primary and connected
// replica; see checkPolicy): every
// key of the store has a lifetime, so a volatile-* or allkeys-* policy would
// silently evict live claims and reservations, and each evicted claim is a
// replay the gateway would accept.
func New(ctx context.Context, rdb redis.UniversalClient, opts Options) (*Store, error) {
	if opts.Prefix == "" {
		opts.Prefix = "aov"
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, errors.New("redisstore: prefix must not contain '{' or '}'")
	}
	if opts.ReservationTTL <= 0 {
		opts.ReservationTTL = store.DefaultReservationTTL
	}
	if opts.WaitTimeout <= 0 {
		opts.WaitTimeout = 100 * time.Millisecond
	}
	if opts.WaitReplicas < 0 {
		return nil, errors.New("redisstore: wait_replicas must not be negative")
	}
	if err := checkReadTimeout(readTimeout(rdb), opts); err != nil {
		return nil, err
	}
	s := &Store{rdb: rdb, opts: opts, allowPrefix: opts.Prefix + ":a:", claimPrefix: opts.Prefix + ":{c}:", heldIndex: opts.Prefix + ":{c}!held",
		opTimeout: readTimeout(rdb)}
	if err := s.checkPolicy(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Ping reports whether the server answers.
func (s *Store) Ping(ctx context.Context) error { return s.rdb.Ping(ctx).Err() }

// Close closes the client, and those of the nodes ASK answers named.
func (s *Store) Close() error {
	s.asks.close()
	return s.rdb.Close()
}

// AfterRetries runs fn, in a goroutine of its own, once no commit or
// release of this Store is being retried. A commit (or release) that
// failed on a transport error is retried after its request has returned, until the reservation lapses
// (up to 5 minutes): the client it uses must not be closed under it, or
// the served call is never counted and its unit is granted again. So a
// caller gives the client back through it once no request uses the Store
// any more, and never waits for it.
func (s *Store) AfterRetries(fn func()) {
	go func() {
		s.retries.Wait()
		fn()
	}()
}

// Allowance returns the free allowance counters.
func (s *Store) Allowance() store.Allowance { return allowance{s} }

// Claims returns the payment, nonce and paid-access claims.
func (s *Store) Claims() store.Claims { return claims{s} }

// readTimeout is rdb's read timeout, zero when it has none or is of a
// kind whose options the store does not know.
func readTimeout(rdb redis.UniversalClient) time.Duration {
	var d time.Duration
	switch c := rdb.(type) {
	case *redis.Client: // standalone, and a primary under Sentinel
		d = c.Options().ReadTimeout
	case *redis.ClusterClient:
		d = c.Options().ReadTimeout
	}
	return max(d, 0)
}

// waitReadMargin is how much longer than WaitTimeout a client's read
// timeout must be for a Store that waits for replicas (minReadTimeout).
const waitReadMargin = 500 * time.Millisecond

// minReadTimeout is the shortest read timeout of a client a Store whose
// writes wait up to wait for replicas runs on: the read timeout bounds
// the whole operation (bounded), and the write, its WAIT and the WAIT's
// answer must fit in it with room for a redirection or a rerun. The
// module makes its default timeout at least this.
func minReadTimeout(wait time.Duration) time.Duration { return wait + waitReadMargin }

// checkReadTimeout refuses a client read timeout (read; zero: none) too
// short for opts' WAIT (minReadTimeout). Accepted, every WAIT of a
// write's first run gets the whole WaitTimeout (waitFor); a shorter one
// cut each WAIT short, and one of WaitTimeout or less left no time for a
// WAIT at all, so every write failed though the replicas were healthy.
func checkReadTimeout(read time.Duration, opts Options) error {
	if opts.WaitReplicas == 0 || read <= 0 || read >= minReadTimeout(opts.WaitTimeout) {
		return nil
	}
	return fmt.Errorf("redisstore: the client's read timeout (timeout) %v is shorter than the wait timeout (wait_timeout) %v + %v: a write's WAIT and its answer must fit in it",
		read, opts.WaitTimeout, waitReadMargin)
}

// bounded is ctx ending at most the client's read timeout from now, for
// one store operation, go-redis's resends included. go-redis resends a
// command whose read timed out on another connection (MaxRetries), each
// waiting a full read timeout: with Redis stalled and a warm pool, one
// script run took three read timeouts, and the caller's 503 came that
// late. A resend that the deadline leaves no time for is not sent. A read
// already under way ends at the deadline only on a client made with
// ContextTimeoutEnabled (as the module makes it); on any other, it waits
// its full read timeout whatever the deadline.
func (s *Store) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.opTimeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.opTimeout)
}

// write runs a write script and, when configured, waits for replicas on
// the same connection (WAIT counts the writes of its own connection only).
// In a Cluster both go to the primary of the keys' slot, by the client's
// slot map; one that answers that another node serves the slot (MOVED,
// ASK) sends them there (moved, askNodes), and the node a MOVED named may
// answer ASK in turn, sent on once more (writeOnce). A write refused with
// TRYAGAIN is tried again after a wait (tryAgainFirst). One that could not
// reach its node on a Cluster, or timed out, has the slot map read again
// (reread), so the next write goes to the node that serves the slot now,
// but is not sent again: go-redis reports its last try's error only, and
// an earlier try may have been cut after it was sent, and run. One
// deadline bounds the
// whole operation (bounded): the slot map's read, the write sent again
// where a redirection names, a rerun after NOSCRIPT and the tries again
// take what the first attempt left, so a store operation ends within the
// client's read timeout however many nodes it went to.
func (s *Store) write(ctx context.Context, sc *redis.Script, keys []string, args ...any) (any, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	giveUp := time.Now().Add(tryAgainUnbounded)
	if d, ok := ctx.Deadline(); ok {
		giveUp = d
	}
	var refused error // the last TRYAGAIN
	for wait := tryAgainFirst; ; wait = min(2*wait, tryAgainMax) {
		v, err := s.writeOnce(ctx, sc, keys, args)
		if unreachedNode(err) || timedOut(err) {
			s.reread(ctx)
		}
		again := redis.HasErrorPrefix(err, "TRYAGAIN")
		if refused != nil && err != nil && !again && (ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded)) {
			// The deadline cut the last try short: the refusals that
			// used it up are the cause.
			return v, fmt.Errorf("%w; tried again until the deadline: %w", refused, err)
		}
		if !again || time.Until(giveUp) <= wait {
			return v, err
		}
		refused = err
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return v, err
		case <-t.C:
		}
	}
}

// tryAgainFirst is the wait before a write answered TRYAGAIN is tried
// again, doubled after each try up to tryAgainMax; tryAgainUnbounded
// bounds the tries of a write whose context has no deadline (a client
// with no read timeout). While a slot's keys are moving, a Cluster node
// answers TRYAGAIN, before it runs anything, to a command on several of
// its keys unless it holds them all: the old primary when it holds some
// but not all (holding none, it answers ASK), the new one, after ASKING,
// when any is missing there, even a key that exists nowhere yet. So every
// claim of a paid call (its keys are new, and share one slot with the
// index of held claims) and every new claim of two keys is refused for as
// long as the move lasts; refused at once, every paid call was a 503 for
// all of it. The move of a slot's keys ends within moments, and the
// write, tried again meanwhile, is served when it does.
const (
	tryAgainFirst     = 25 * time.Millisecond
	tryAgainMax       = 200 * time.Millisecond
	tryAgainUnbounded = time.Second
)

// rereadEvery is the shortest time between two of a Store's slot map
// rereads after a node could not be reached (reread).
const rereadEvery = 250 * time.Millisecond

// unreachedNode reports whether err is go-redis's failure to connect to a
// node (a dial error): on a Cluster, the node that the client's slot map
// names for the keys may be gone, its replica promoted (reread). It says
// nothing of whether the write ran: go-redis reports its last try's error
// only, and a try before it may have been sent on a connection then cut,
// and run there, so the write is never sent again for it.
func unreachedNode(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// timedOut reports whether err is a deadline's: the write's own (bounded)
// or the caller's, or a read's. go-redis dials a node again and again, up
// to a dozen times for one command (its retries within its Cluster
// redirections), so a node whose host is gone, whose dials hang rather
// than being refused, fails the write with the deadline, never with the
// dial's error (unreachedNode), whatever dial_timeout is.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// rereadUnbounded bounds a slot map's reread on a client with no read
// timeout (reread), which bounds it otherwise.
const rereadUnbounded = 5 * time.Second

// reread reads a Cluster's slot map again after a write could not reach
// its node or timed out (on a Cluster only: a standalone server or
// Sentinel's primary has no map to read). A primary that died and whose
// replica the Cluster promoted answers nothing, no MOVED to follow
// (moved): without it, every write of its slots went on to the dead
// address until the client reread its map by itself, a minute later
// (ClusterStateReloadInterval), every paid call a 503 meanwhile; with it,
// the write that found the node unreachable fails (503, nothing charged)
// and the next goes to the new primary. While a node is down and not yet
// replaced every write of its slots fails so, and the rereads of all
// callers are one per rereadEvery at most, so an outage is no storm of
// CLUSTER SLOTS on the nodes still up.
//
// The reread runs on its own, bounded by the client's read timeout, and
// the caller waits for it (or one under way) only as long as its own
// deadline (ctx) allows: a write to a host that is gone fails at that
// deadline, when a reread started then has all its time still ahead
// (CLUSTER SLOTS asks the known nodes in a random order, the gone one
// maybe first, a dial that hangs), and never holds its caller past it.
// One that ends first means the caller's next write uses the map it read.
func (s *Store) reread(ctx context.Context) {
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return
	}
	s.rereadMu.Lock()
	done := s.rereading
	if done == nil && time.Since(s.lastReread) >= rereadEvery {
		ch := make(chan struct{})
		s.rereading, done = ch, ch
		bound := s.opTimeout
		if bound <= 0 {
			bound = rereadUnbounded
		}
		go func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
			defer cancel()
			// ForEachMaster reads the slot map again before it goes through it.
			cc.ForEachMaster(rctx, func(context.Context, *redis.Client) error { return nil })
			s.rereadMu.Lock()
			s.rereading, s.lastReread = nil, time.Now()
			s.rereadMu.Unlock()
			close(ch)
		}()
	}
	s.rereadMu.Unlock()
	if done == nil {
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// writeOnce is one attempt of write, on ctx (bounded).
func (s *Store) writeOnce(ctx context.Context, sc *redis.Script, keys []string, args []any) (any, error) {
	if s.opts.WaitReplicas == 0 {
		return sc.Run(ctx, s.rdb, keys, args...).Result()
	}
	cc, ok := s.rdb.(*redis.ClusterClient)
	if !ok {
		return s.waitedWrite(ctx, s.rdb, false, sc, keys, args)
	}
	node, err := cc.MasterForKey(ctx, keys[0])
	if err != nil {
		return nil, err
	}
	v, err := s.waitedWrite(ctx, node, false, sc, keys, args)
	// At most two redirections, a MOVED and then an ASK: a slot that
	// moved since the map was read (MOVED, to its new primary) may be
	// moving on from there (ASK, to the next one). Nothing is followed
	// after an ASK, nor a second MOVED (the map was just read again).
	if next := s.moved(ctx, cc, err); next != nil {
		node = next
		v, err = s.waitedWrite(ctx, node, false, sc, keys, args)
	}
	if addr, ask := redis.IsAskError(err); ask {
		// A slot whose keys are moving: this one write goes to the
		// node named, after ASKING, and the map stays as it is.
		next, done, err := s.asks.get(node, addr)
		if err != nil {
			return nil, err
		}
		defer done()
		return s.waitedWrite(ctx, next, true, sc, keys, args)
	}
	return v, err
}

// waitedWrite runs sc and WAIT on c (after ASKING when asking), loading
// the script first if the server lacks it.
func (s *Store) waitedWrite(ctx context.Context, c redis.Cmdable, asking bool, sc *redis.Script, keys []string, args []any) (any, error) {
	v, loaded, err := s.waitedRun(ctx, c, asking, sc, keys, args, true)
	if loaded {
		// The server answered that it lacked the script, which did not
		// run: run it again with WAIT, in what is left of the
		// operation's deadline.
		v, _, err = s.waitedRun(ctx, c, asking, sc, keys, args, false)
	}
	return v, err
}

// moved is the primary a write's MOVED answer (err) names, for the write
// to be sent there once more; nil for any other answer, or a node the
// client does not know as a primary. A Cluster node checks a script's
// declared keys against the slots it serves before it runs the script,
// and MOVED, ASK and TRYAGAIN are that check's refusals: the script did
// not run on the node that answered them, so sending it to the node
// named runs it once, not twice. That holds hop by hop, so a second hop
// is as safe as the first: after a MOVED and then an ASK (writeOnce)
// neither node that refused ran it, and it runs once, on the node that
// did not refuse. (Any other failure of the write, a WAIT not
// acknowledged or an answer lost included, may come after the script
// ran, and is never sent again.) A MOVED (a slot resharded, or its
// primary failed over) means the client's slot map is stale: it is read
// again here, at once, so the next writes go to the new primary directly;
// without it, every write of the slot answered 503 until the client
// reread the map by itself, up to a minute later.
func (s *Store) moved(ctx context.Context, cc *redis.ClusterClient, err error) (node *redis.Client) {
	addr, moved := redis.IsMovedError(err)
	if !moved {
		return nil
	}
	var mu sync.Mutex
	// ForEachMaster reads the slot map again before it goes through it.
	cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			node = c
			mu.Unlock()
		}
		return nil
	})
	return node
}

// waitedRun is one run of sc followed by WAIT on c, after ASKING when
// asking. When load and the server lacks the script (NOSCRIPT), it loads
// it and reports loaded: the script did not run. The WAIT ends
// waitReplyMargin before ctx's deadline at the latest (waitFor).
func (s *Store) waitedRun(ctx context.Context, c redis.Cmdable, asking bool, sc *redis.Script, keys []string, args []any, load bool) (v any, loaded bool, err error) {
	waitMS, err := s.waitFor(ctx)
	if err != nil {
		return nil, false, err
	}
	var ask, res, wait *redis.Cmd
	_, err = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		if asking {
			ask = p.Do(ctx, "asking")
		}
		res = sc.EvalSha(ctx, p, keys, args...)
		wait = p.Do(ctx, "wait", s.opts.WaitReplicas, waitMS)
		return nil
	})
	if ask != nil && ask.Err() != nil {
		// ASKING refused (a user without it): the node then answers the
		// script MOVED, to the node that named it, and that answer would
		// hide the cause. Nothing ran.
		return nil, false, ask.Err()
	}
	if err != nil && load && redis.HasErrorPrefix(res.Err(), "NOSCRIPT") {
		if err := sc.Load(ctx, c).Err(); err != nil {
			return nil, false, err
		}
		return nil, true, nil
	}
	if err := res.Err(); err != nil {
		return nil, false, err
	}
	acked, err := wait.Int64()
	if err != nil {
		return nil, false, err
	}
	if acked < int64(s.opts.WaitReplicas) {
		return nil, false, ErrNotReplicated
	}
	return res.Val(), false, nil
}

// waitReplyMargin is the time waitFor leaves between a WAIT's end and the
// operation's deadline, for its answer to come back. Redis ends a blocked
// WAIT on its timer, which runs hz times a second (10 by default): a WAIT
// answers up to 100 ms after its timeout, so a margin of 100 ms left a
// rerun's shortened WAIT failing on the deadline instead of answering
// ErrNotReplicated. It fits in waitReadMargin, so a first run's WAIT
// keeps its whole WaitTimeout.
const waitReplyMargin = 250 * time.Millisecond

// waitFor is the timeout of a WAIT sent now, in milliseconds: WaitTimeout,
// or less when ctx's deadline is nearer, so that the WAIT ends, and its
// answer (enough replicas or ErrNotReplicated) comes, in time. The first
// run of a write has its whole WaitTimeout (New refuses a client whose
// read timeout is shorter than WaitTimeout + 0.5 s: checkReadTimeout); a
// run after it in the same operation (the
// rerun after NOSCRIPT, the write sent where MOVED or ASK named, a try
// again after TRYAGAIN) may not, its first run's WAIT having waited
// already. With no time left for a WAIT, nothing is sent: an error.
func (s *Store) waitFor(ctx context.Context) (int64, error) {
	d := s.opts.WaitTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(dl)-waitReplyMargin)
	}
	if ms := d.Milliseconds(); ms >= 1 { // WAIT 0 would block for ever
		return ms, nil
	}
	return 0, fmt.Errorf("redisstore: no time left to wait for replicas: %w", context.DeadlineExceeded)
}

// undoTimeout bounds undo: the gateway answers the failed call only
// after it, and tells the client to retry after a second.
const undoTimeout = 500 * time.Millisecond

// undo makes a best-effort run of sc, a release keyed by the failed
// write's own claim token or reservation id, after a Claim or Reserve whose
// write failed once it may have reached the server (a lost reply, go-redis's
// resends exhausted, a timeout, a WAIT not acknowledged): the caller is
// told nothing was taken (the gateway answers 503, retry), so what the
// script may have taken must not be left to hold the client's retry off
// until it lapses. The token or id is the call's alone, so undoing a write
// that never ran, or that another resend made, touches nothing else. It
// runs even when ctx was cancelled (the client left), for undoTimeout at
// most.
func (s *Store) undo(ctx context.Context, sc *redis.Script, keys []string, args ...any) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), undoTimeout)
	defer cancel()
	s.write(ctx, sc, keys, args...) // best effort: otherwise it lapses
}

// errCorruptClaim reports a claim record the scripts would not have
// written: a field missing or malformed, or over its bound (claimFields).
var errCorruptClaim = errors.New("redisstore: corrupt claim record")

// corrupt reports whether err is a script's refusal of a record over the
// store's bounds (corruptReply): an answer of the server, not an outage.
func corrupt(err error) bool { return redis.HasErrorPrefix(err, corruptCode) }

// read runs a read-only script, bounded as write is.
func (s *Store) read(ctx context.Context, sc *redis.Script, keys []string, args ...any) (any, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	return sc.Run(ctx, s.rdb, keys, args...).Result()
}

type allowance struct{ s *Store }

// allowanceKey spells pool and client in hex: their bytes are the client's
// (an IP or a wallet), and hex can neither contain a Cluster hash tag nor
// let "pc"+"" impersonate "p"+"c".
func (a allowance) key(pool, client, day string) string {
	return a.s.allowPrefix + day + ":" + hex.EncodeToString([]byte(pool)) + ":" + hex.EncodeToString([]byte(client))
}

// dayOf is the UTC day of t: its label and its start and end (ms).
func dayOf(t time.Time) (label string, start, end int64) {
	d := t.UTC()
	first := time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)
	return first.Format(time.DateOnly), first.UnixMilli(), first.AddDate(0, 0, 1).UnixMilli()
}

// maxDayTries bounds the runs of one allowance script on the server's day:
// the first names the gateway's day; one whose server time is outside it
// answers with that time, and the next runs on the server's day, which is
// wrong again only if midnight passed between the two.
const maxDayTries = 3

// onServerDay runs an allowance script (reserveScript, remainingScript) for
// pool and client on the UTC day of the server's clock, guessing it from
// day, the gateway's clock (onDay), moved by the skew last learned: every
// gateway counts a client's calls in one day at one instant, whatever its
// own clock says, and one whose clock is far off the server's pays a
// second run once, not on every call. run gets the day's label and the
// script's day arguments, and returns the script's answer and error;
// onServerDay returns the answer that was on the server's day, and that
// day's label.
func (s *Store) onServerDay(day time.Time, run func(label string, start, end int64) (any, error)) (any, string, error) {
	guess := day.Add(time.Duration(s.skew.Load()) * time.Millisecond)
	for range maxDayTries {
		label, start, end := dayOf(guess)
		v, err := run(label, start, end)
		if err != nil {
			return nil, label, err
		}
		out, _ := v.([]any)
		if len(out) != 2 || out[0] != int64(2) {
			return v, label, nil
		}
		ms, _ := out[1].(int64)
		s.skew.Store(ms - day.UnixMilli())
		guess = time.UnixMilli(ms)
	}
	return nil, "", errors.New("redisstore: the server's day changed on every try")
}

// maxComponent matches the embedded store's bound on pool and client.
const maxComponent = 1<<16 - 1

func checkAllowanceKey(pool, client string) error {
	if len(pool) > maxComponent || len(client) > maxComponent {
		return errors.New("store: allowance pool or client too long")
	}
	return nil
}

// Reserve implements store.Allowance. The unit is counted in the UTC day
// of the server's clock (onServerDay), day being the gateway's guess; the
// reservation names that day, for its commit or release.
func (a allowance) Reserve(ctx context.Context, pool, client string, day time.Time, limit int) (store.Reservation, error) {
	res := store.Reservation{Pool: pool, Client: client, Limit: limit}
	res.Day, _, _ = dayOf(day)
	if err := checkAllowanceKey(pool, client); err != nil {
		return res, err
	}
	if limit <= 0 {
		return res, store.ErrExhausted
	}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return res, fmt.Errorf("making reservation id: %w", err)
	}
	res.ID = hex.EncodeToString(id[:])
	v, label, err := a.s.onServerDay(day, func(label string, start, end int64) (any, error) {
		key := a.key(pool, client, label)
		v, err := a.s.write(ctx, reserveScript, []string{key},
			start, end, limit, a.s.opts.ReservationTTL.Milliseconds(), res.ID)
		if err != nil {
			a.s.undo(ctx, finishScript, []string{key}, res.ID, "0")
		}
		return v, err
	})
	if label != "" {
		res.Day = label
	}
	if err != nil {
		return res, fmt.Errorf("redisstore: reserving: %w", err)
	}
	out, ok := v.([]any)
	if !ok || len(out) == 0 {
		return res, fmt.Errorf("redisstore: unexpected reserve answer %v", v)
	}
	if out[0] != int64(1) || len(out) != 3 {
		return res, store.ErrExhausted
	}
	rem, _ := out[1].(int64)
	left, _ := out[2].(int64)
	res.Remaining = int(rem)
	// Expires is on the gateway's clock, from the lifetime the server
	// granted: the server's expiry compared with the gateway's clock
	// would be off by however far the two clocks are apart (retryFinish
	// gave up at once, or went on for hours). Taken after the reply, it
	// is never before the real lapse.
	res.Expires = now().Add(time.Duration(left) * time.Millisecond)
	return res, nil
}

// Commit implements store.Allowance.
func (a allowance) Commit(ctx context.Context, r store.Reservation) error {
	return a.finish(ctx, r, "1")
}

// Release implements store.Allowance.
func (a allowance) Release(ctx context.Context, r store.Reservation) error {
	return a.finish(ctx, r, "0")
}

func (a allowance) finish(ctx context.Context, r store.Reservation, commit string) error {
	if n, err := hex.DecodeString(r.ID); err != nil || len(n) != 16 {
		return store.ErrNotReserved
	}
	if _, err := time.Parse(time.DateOnly, r.Day); err != nil {
		return store.ErrNotReserved
	}
	if err := checkAllowanceKey(r.Pool, r.Client); err != nil {
		return err
	}
	key := a.key(r.Pool, r.Client, r.Day)
	v, err := a.s.write(ctx, finishScript, []string{key}, r.ID, commit)
	if err != nil {
		// Keep trying in the background while the reservation lives (the
		// script finishes only a live, pending unit, so a late or repeated
		// try counts or frees it at most once). A commit: the call was
		// served, and a unit never committed would come back when it
		// lapses and be granted a second time. A release: the call was
		// refused (a 422, an upstream error) and charged nothing, and a
		// unit never released would hold one of the client's free calls
		// off until it lapses (5 minutes).
		a.s.retries.Add(1)
		go func() {
			defer a.s.retries.Done()
			a.retryFinish(key, r, commit)
		}()
		return fmt.Errorf("redisstore: finishing reservation: %w", err)
	}
	if v != int64(1) {
		return store.ErrNotReserved
	}
	return nil
}

// retryFinish retries a commit ("1") or release ("0") that failed on a
// transport error, with backoff, until it lands, the server says the unit
// is no longer pending, the reservation has lapsed, or the client was
// closed. The lapse is judged by the time elapsed on the gateway
// (r.Expires is on its clock, with its monotonic reading: Reserve); the
// server judges it for good.
func (a allowance) retryFinish(key string, r store.Reservation, commit string) {
	delay := 50 * time.Millisecond
	for now().Before(r.Expires) {
		time.Sleep(delay)
		delay = min(2*delay, time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), r.Expires.Sub(now()))
		_, err := a.s.write(ctx, finishScript, []string{key}, r.ID, commit)
		cancel()
		if err == nil || errors.Is(err, redis.ErrClosed) {
			return
		}
	}
}

// Remaining implements store.Allowance, on the server's day as Reserve.
func (a allowance) Remaining(ctx context.Context, pool, client string, day time.Time, limit int) (int, error) {
	if err := checkAllowanceKey(pool, client); err != nil {
		return 0, err
	}
	v, _, err := a.s.onServerDay(day, func(label string, start, end int64) (any, error) {
		return a.s.read(ctx, remainingScript, []string{a.key(pool, client, label)}, start, end, limit)
	})
	if err != nil {
		return 0, fmt.Errorf("redisstore: reading allowance: %w", err)
	}
	out, _ := v.([]any)
	if len(out) != 2 || out[0] != int64(1) {
		return 0, fmt.Errorf("redisstore: unexpected remaining answer %v", v)
	}
	n, _ := out[1].(int64)
	return int(n), nil
}

type claims struct{ s *Store }

func (c claims) keys(keys []string) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = c.s.claimPrefix + k
	}
	return out
}

// ceilMS rounds up to the millisecond Redis keeps: a claim is never held
// for less time than asked.
func ceilMS(t time.Time) int64 {
	ns := t.UnixNano()
	ms := ns / 1e6
	if ns%1e6 > 0 {
		ms++
	}
	return ms
}

// Claim implements store.Claims.
func (c claims) Claim(ctx context.Context, keys []string, until time.Time) (store.Claim, error) {
	return c.claim(ctx, keys, until, 0, nil)
}

// claim is Claim, with the note made by note (nil: none) written on the
// new claim in the same script, and its attempt span (store.HeldClaims.ClaimHeld).
func (c claims) claim(ctx context.Context, keys []string, until time.Time, span time.Duration, note func(store.Claim) (string, error)) (store.Claim, error) {
	keys, err := store.ClaimKeys(keys)
	if err != nil {
		return store.Claim{}, err
	}
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return store.Claim{}, fmt.Errorf("making claim token: %w", err)
	}
	token := hex.EncodeToString(tok[:])
	var n string
	if note != nil {
		if n, err = note(store.Claim{Keys: keys, Token: token, Until: until}); err != nil {
			return store.Claim{}, err
		}
		if err := store.CheckHoldNote(n); err != nil {
			return store.Claim{}, err
		}
	}
	for try := 1; ; try++ {
		var v any
		if note == nil {
			v, err = c.s.write(ctx, claimScript, c.keys(keys), token, ceilMS(until))
		} else {
			v, err = c.s.write(ctx, claimHeldScript, c.indexedKeys(keys), token, ceilMS(until), n, keys[0], c.s.spanArg(span))
		}
		if corrupt(err) {
			return store.Claim{}, errCorruptClaim // refused before any write
		}
		if err != nil {
			c.s.undo(ctx, releaseScript, c.indexedKeys(keys), token, keys[0])
			return store.Claim{}, fmt.Errorf("redisstore: claiming: %w", err)
		}
		out, ok := v.([]any)
		if !ok || len(out) == 0 {
			return store.Claim{}, fmt.Errorf("redisstore: unexpected claim answer %v", v)
		}
		switch out[0] {
		case int64(1):
			return store.Claim{Keys: keys, Token: token, Until: until}, nil
		case int64(2):
			return store.Claim{}, errors.New("store: claim expiry is not in the future")
		}
		if len(out) < 3 {
			return store.Claim{}, fmt.Errorf("redisstore: unexpected claim answer %v", v)
		}
		i, _ := out[1].(int64)
		if i < 1 || int(i) > len(keys) {
			return store.Claim{}, fmt.Errorf("redisstore: unexpected claim answer %v", v)
		}
		if out[0] == int64(3) {
			// The held key's note is under a key this claim does not
			// name: read the claim declaring it. Nothing was claimed,
			// so if that claim has gone meanwhile, claim again.
			ref, _ := out[2].(string)
			st, err := c.lookup(ctx, c.s.claimPrefix+keys[i-1], ref)
			if errors.Is(err, store.ErrNotFound) && try < maxRefReads {
				continue
			}
			if err != nil {
				return store.Claim{}, err
			}
			return store.Claim{}, &store.ClaimedError{Key: keys[i-1], State: st}
		}
		if len(out) != 6 {
			return store.Claim{}, fmt.Errorf("redisstore: unexpected claim answer %v", v)
		}
		st, err := claimState(out[2:])
		if err != nil {
			return store.Claim{}, err
		}
		return store.Claim{}, &store.ClaimedError{Key: keys[i-1], State: st}
	}
}

// maxRefReads bounds the reads of one claim through a ref (claims.lookup)
// and the claims tried again when the claim held against them went away
// meanwhile: each further one needs another claim on the key in between,
// so a bound reached is a key claimed over and over, answered as an error.
const maxRefReads = 3

// claimState decodes {settled, until ms, note, attempt} as the scripts
// return them (attemptOf).
func claimState(v []any) (store.ClaimState, error) {
	if len(v) != 4 {
		return store.ClaimState{}, errCorruptClaim
	}
	s, _ := v[0].(string)
	u, _ := v[1].(string)
	n, _ := v[2].(string)
	a, _ := v[3].(string)
	ms, err := strconv.ParseInt(u, 10, 64)
	if err != nil || (s != "0" && s != "1") {
		return store.ClaimState{}, errCorruptClaim
	}
	st := store.ClaimState{Settled: s == "1", Note: n, Until: time.UnixMilli(ms).UTC()}
	switch a {
	case "1":
		st.Attempt = store.AttemptRunning
	case "0":
		st.Attempt = store.AttemptOver
	}
	return st, nil
}

func validClaim(cl store.Claim) bool {
	t, err := hex.DecodeString(cl.Token)
	return err == nil && len(t) == 16 && len(cl.Keys) > 0
}

// Settle implements store.Claims.
func (c claims) Settle(ctx context.Context, cl store.Claim, note string, keepUntil time.Time) error {
	if !validClaim(cl) {
		return store.ErrClaimLost
	}
	var keep int64
	if !keepUntil.IsZero() {
		keep = ceilMS(keepUntil)
	}
	v, err := c.s.write(ctx, settleScript, c.indexedKeys(cl.Keys), cl.Token, note, keep, cl.Keys[0])
	if err != nil {
		return fmt.Errorf("redisstore: settling claim: %w", err)
	}
	if v != int64(1) {
		return store.ErrClaimLost
	}
	return nil
}

// Release implements store.Claims. A release the server ran whose answer
// was lost (and which go-redis resent) reports ErrClaimLost: the keys are
// free either way.
func (c claims) Release(ctx context.Context, cl store.Claim) error {
	if !validClaim(cl) {
		return store.ErrClaimLost
	}
	v, err := c.s.write(ctx, releaseScript, c.indexedKeys(cl.Keys), cl.Token, cl.Keys[0])
	if err != nil {
		return fmt.Errorf("redisstore: releasing claim: %w", err)
	}
	switch v {
	case int64(1):
		return nil
	case int64(2):
		return store.ErrClaimSettled
	}
	return store.ErrClaimLost
}

// Record implements store.Claims. Run twice (go-redis resends a command
// whose answer was lost) it keeps what the first run wrote.
func (c claims) Record(ctx context.Context, key, note string, until time.Time) error {
	keys, err := store.ClaimKeys([]string{key})
	if err != nil {
		return err
	}
	var tok [16]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return fmt.Errorf("making claim token: %w", err)
	}
	v, err := c.s.write(ctx, recordScript, c.keys(keys), hex.EncodeToString(tok[:]), ceilMS(until), note)
	if err != nil {
		return fmt.Errorf("redisstore: recording claim: %w", err)
	}
	switch v {
	case int64(0), int64(1):
		return nil
	case int64(2):
		return errors.New("store: claim expiry is not in the future")
	}
	return fmt.Errorf("redisstore: unexpected record answer %v", v)
}

// Lookup implements store.Claims.
func (c claims) Lookup(ctx context.Context, key string) (store.ClaimState, error) {
	return c.lookup(ctx, c.s.claimPrefix+key, "")
}

// lookup reads the claim on key (as stored), declaring ref, when not "",
// with it: the key its ref names, where its note is (scripts.go). A claim's
// first key, which the gateway reads, carries its note: one read. Any other
// is read again declaring the key its ref names, since a script reads only
// the keys it is given.
func (c claims) lookup(ctx context.Context, key, ref string) (store.ClaimState, error) {
	keys := []string{key}
	for range maxRefReads {
		if ref != "" {
			// Written by the scripts as a claim key: anything else is
			// no ref of ours, and in a Cluster may be on another slot.
			if !strings.HasPrefix(ref, c.s.claimPrefix) {
				return store.ClaimState{}, errCorruptClaim
			}
			keys = append(keys[:1], ref)
		}
		v, err := c.s.read(ctx, lookupScript, keys)
		if corrupt(err) {
			return store.ClaimState{}, errCorruptClaim
		}
		if err != nil {
			return store.ClaimState{}, fmt.Errorf("redisstore: reading claim: %w", err)
		}
		out, _ := v.([]any)
		switch len(out) {
		case 0:
			return store.ClaimState{}, store.ErrNotFound
		case 1:
			ref, _ = out[0].(string)
			if ref == "" {
				return store.ClaimState{}, errCorruptClaim
			}
			continue // replaced meanwhile by a claim with another first key
		}
		return claimState(out)
	}
	return store.ClaimState{}, errors.New("redisstore: reading claim: its key was claimed again on every read")
}

// Interface guards
var (
	_ store.Allowance = allowance{}
	_ store.Claims    = claims{}
)
