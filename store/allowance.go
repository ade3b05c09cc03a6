package store

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Allowance is a per-client daily counter of free calls that only counts
// calls that end well. A request first reserves a unit; when its answer is
// a success it commits the reservation, otherwise it releases it. Live
// reservations count against the limit, so concurrent requests can never
// be served more than the limit, and a reservation neither committed nor
// released (a hung request, a crash) lapses after a TTL and gives its unit
// back.
//
// Every operation is atomic on the one client-day record. A Redis
// implementation keeps that record in one hash (committed count plus a
// pending id → expiry map) and runs each operation as one Lua script:
// drop lapsed pending ids, compare committed+pending with the limit, add,
// remove or move one id.
type Allowance interface {
	// Reserve takes one unit of client's allowance in pool for the UTC day
	// of day. A store shared by several gateways that judges time by its
	// server's clock (Redis) takes the day by that clock instead, day being
	// the caller's guess, so that gateways whose clocks disagree around
	// midnight still count one client's calls in one day. The
	// Reservation's Day names the day counted in; Commit and Release go to
	// it, after midnight too. When none is left it returns ErrExhausted
	// (and a Reservation whose Remaining is 0, for the caller's headers).
	Reserve(ctx context.Context, pool, client string, day time.Time, limit int) (Reservation, error)
	// Commit turns the reservation into a used unit. It returns
	// ErrNotReserved, counting nothing, when the reservation was already
	// committed, released or has lapsed.
	Commit(ctx context.Context, r Reservation) error
	// Release gives the unit back. ErrNotReserved as for Commit.
	Release(ctx context.Context, r Reservation) error
	// Remaining reports how many units client can still reserve on the
	// day Reserve would take, counting live reservations as taken.
	Remaining(ctx context.Context, pool, client string, day time.Time, limit int) (int, error)
}

// Reservation is one reserved unit, to be committed or released.
type Reservation struct {
	Pool   string
	Client string
	Day    string // the UTC date counted in, 2006-01-02 (Reserve)
	ID     string // opaque, unique
	Limit  int
	// Remaining is what is left for the client today with this unit taken.
	Remaining int
	// Expires is when the unit lapses if neither committed nor released,
	// on the caller's clock: a store that judges expiry by a clock of its
	// own (Redis's) gives the lifetime it granted from the caller's now,
	// so that a caller waiting on it goes by its own elapsed time,
	// however far apart the clocks are.
	Expires time.Time
}

var (
	// ErrExhausted reports that the day's allowance is used up (or fully
	// reserved by requests in flight).
	ErrExhausted = errors.New("store: allowance exhausted")
	// ErrNotReserved reports a commit or release of a reservation that is
	// no longer pending.
	ErrNotReserved = errors.New("store: reservation is not pending")
)

// The embedded implementation.
//
// Badger locks its folder, so one process owns a database, and only the
// committed count of a client-day needs the disk: the reservations in
// flight are a guard between concurrent requests of that one process, and
// they live in memory (allowances). A crash then gives the units of
// unanswered requests back at once instead of after their TTL, which is
// what the TTL was for: a reserved unit is committed before its answer is
// delivered, so no delivered call loses its count.
//
// Commit is durable before it returns (one write per free call, sharing a
// group commit with concurrent writers) unless Options.AllowanceFlush asks
// for batched writes with a bounded loss (see there). Reserve, Release and
// Remaining never write; Reserve reads the disk only for a client-day it
// does not hold in memory.

// allowanceDay identifies one client-day in memory.
type allowanceDay struct {
	pool, client string
	day          int64 // Unix seconds of the day's UTC midnight
}

// clientDay is the live state of one client-day.
type clientDay struct {
	committed int // used units, counting those not yet on disk
	durable   int // used units known to be on disk
	pending   []pendingUnit
	end       time.Time // when the UTC day ends
	writes    int       // writes of this record under way
}

type pendingUnit struct {
	id      uint64        // 0: left on disk by an older version, never issued
	expires time.Duration // on the monotonic clock, elapsed
}

// clean reports whether the entry holds nothing the disk lacks, so it can
// be dropped and read again later. A batched flush may still name a clean
// entry; it finds it gone and knows its units are on disk (flush).
func (c *clientDay) clean() bool {
	return c.committed == c.durable && len(c.pending) == 0 && c.writes == 0
}

// dropLapsed removes pending units whose TTL has passed at t (elapsed).
func (c *clientDay) dropLapsed(t time.Duration) {
	live := c.pending[:0]
	for _, p := range c.pending {
		if p.expires > t {
			live = append(live, p)
		}
	}
	c.pending = live
}

func (c *clientDay) remaining(limit int) int {
	return max(0, limit-c.committed-len(c.pending))
}

// take removes id from the pending units and reports whether it was there
// and still live at t (elapsed).
func (c *clientDay) take(id uint64, t time.Duration) bool {
	for i, p := range c.pending {
		if p.id == id {
			c.pending = append(c.pending[:i], c.pending[i+1:]...)
			return p.expires > t
		}
	}
	return false
}

// allowanceShards spreads the client-days over locks, so a disk read for
// one client holds up only the clients of its shard.
const allowanceShards = 32

// maxCleanPerShard bounds the clean client-days a shard keeps for fast
// reserves; past it the clean ones are dropped (they are on disk).
const maxCleanPerShard = 2048

// allowanceCounts is the in-memory part of the embedded Allowance, one per
// database: every handle of Shared counts in the same client-days, so the
// limit holds across them.
type allowanceCounts struct {
	db     *DB // the handle that opened the database
	seed   maphash.Seed
	nextID atomic.Uint64
	shards [allowanceShards]allowanceShard

	// The handles on these counts by the way they commit: handles that
	// ask alike share one, so one flusher and one loss bound serve them
	// all.
	hmu     sync.Mutex
	handles map[commitMode]*allowances
}

// commitMode is how a handle commits: AllowanceFlush and
// AllowanceFlushUnits (zero: durable).
type commitMode struct {
	every time.Duration
	units int
}

// allowances is one handle's Allowance: the database's counts, committed
// the way that handle's Options ask (durable, or batched by its own
// flusher). Handles of one database may ask differently: a Caddy config
// whose wallet_auth opens the store with the defaults must not decide
// whether the gate's counts are batched, and a reload that changes
// allowance_flush takes effect with the new config.
type allowances struct {
	*allowanceCounts

	// Batched flushing (Options.AllowanceFlush > 0).
	every     time.Duration
	maxUnits  int
	fmu       sync.Mutex
	flushed   *sync.Cond                  // broadcast after every flush, and on close
	unflushed int                         // units acknowledged (or being) that no completed flush covers
	applying  int                         // commits between taking a slot and counting their unit
	flushErr  error                       // the last flush's error, nil after a good one
	queue     map[allowanceDay]*queuedDay // client-days with units this handle has not yet put on disk
	kick      chan struct{}               // asks the flusher for a flush now
	stop      chan struct{}               // closed by close
	stopped   chan struct{}               // closed when the flusher has finished
	closing   bool
	closeOnce sync.Once
	flushing  sync.Mutex // one flush at a time: each writes the counts as they stand, and an older one must not land last
	refs      int        // handles given out, under allowanceCounts.hmu
}

type allowanceShard struct {
	mu   sync.Mutex
	days map[allowanceDay]*clientDay
}

type dirtyDay struct {
	s   *allowanceShard
	k   allowanceDay
	day *clientDay
}

// queuedDay is a client-day with units a batching handle acknowledged and
// has not yet written.
type queuedDay struct {
	s     *allowanceShard
	k     allowanceDay
	units int
}

// newAllowances makes the counts of a database just opened, and the
// opener's handle on them.
func newAllowances(db *DB) *allowances {
	c := &allowanceCounts{db: db, seed: maphash.MakeSeed(), handles: make(map[commitMode]*allowances)}
	for i := range c.shards {
		c.shards[i].days = make(map[allowanceDay]*clientDay)
	}
	return c.handle(db.opts)
}

// join is another handle on a's counts, committing as opts ask; close
// gives it back.
func (a *allowances) join(opts Options) *allowances {
	return a.allowanceCounts.handle(opts)
}

// handle returns the handle that commits as opts ask, making it on first
// use.
func (c *allowanceCounts) handle(opts Options) *allowances {
	m := commitMode{}
	if opts.AllowanceFlush > 0 {
		m = commitMode{every: opts.AllowanceFlush, units: opts.AllowanceFlushUnits}
		if m.units <= 0 {
			m.units = DefaultAllowanceFlushUnits
		}
	}
	c.hmu.Lock()
	defer c.hmu.Unlock()
	if a := c.handles[m]; a != nil {
		a.refs++
		return a
	}
	a := &allowances{allowanceCounts: c, every: m.every, maxUnits: m.units, refs: 1}
	c.handles[m] = a
	a.flushed = sync.NewCond(&a.fmu)
	if a.every > 0 {
		a.kick = make(chan struct{}, 1)
		a.stop = make(chan struct{})
		a.stopped = make(chan struct{})
		go a.flusher()
	}
	return a
}

func (a *allowanceCounts) shard(k allowanceDay) *allowanceShard {
	return &a.shards[maphash.String(a.seed, k.client)%allowanceShards]
}

// dayOf is the client-day of an instant: its key, its label and its end.
func dayOf(pool, client string, t time.Time) (allowanceDay, time.Time) {
	d := t.UTC()
	start := time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)
	return allowanceDay{pool: pool, client: client, day: start.Unix()}, start.AddDate(0, 0, 1)
}

// dayLabel is a Reservation's Day for the UTC day starting at Unix second
// day, formatted once per day rather than per call.
func dayLabel(day int64) string {
	if l := lastLabel.Load(); l != nil && l.day == day {
		return l.text
	}
	l := &labelledDay{day: day, text: time.Unix(day, 0).UTC().Format(time.DateOnly)}
	lastLabel.Store(l)
	return l.text
}

// parseDayLabel is dayLabel's inverse: the day's start in Unix seconds.
func parseDayLabel(s string) (int64, bool) {
	if l := lastLabel.Load(); l != nil && l.text == s {
		return l.day, true
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return 0, false
	}
	return t.Unix(), true
}

type labelledDay struct {
	day  int64
	text string
}

var lastLabel atomic.Pointer[labelledDay]

func (k allowanceDay) key() []byte {
	return allowanceKey(k.pool, k.client, time.Unix(k.day, 0).UTC().Format("20060102"))
}

// entry returns the live state of k, reading it from disk when it is not in
// memory. The shard must be locked.
func (a *allowanceCounts) entry(ctx context.Context, s *allowanceShard, k allowanceDay, end time.Time) (*clientDay, error) {
	if c := s.days[k]; c != nil {
		return c, nil
	}
	var committed int
	var pending []pendingUnit
	err := a.db.view(ctx, func(txn *tx) error {
		item, err := txn.Get(k.key())
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading allowance: %w", err)
		}
		return item.Value(func(b []byte) error {
			committed, pending, err = decodeAllowance(b)
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	if len(s.days) >= maxCleanPerShard {
		for k, c := range s.days {
			if c.clean() {
				delete(s.days, k)
			}
		}
	}
	c := &clientDay{committed: committed, durable: committed, pending: pending, end: end}
	s.days[k] = c
	return c, nil
}

// decodeAllowance reads a client-day record: the committed count (uint32,
// big endian), which is all this version writes, followed in records of
// older versions by their pending reservations (16 id bytes and the
// expiry in Unix ns, int64, each). Those are kept as anonymous pending
// units until they lapse, as their writer promised (their wall-clock
// expiry moved onto the monotonic clock as read now).
func decodeAllowance(b []byte) (int, []pendingUnit, error) {
	const pendingSize = 16 + 8
	if len(b) < 4 || (len(b)-4)%pendingSize != 0 {
		return 0, nil, errors.New("store: corrupt allowance record")
	}
	committed := int(binary.BigEndian.Uint32(b))
	var pending []pendingUnit
	mono, wall := elapsed(), now()
	for b = b[4:]; len(b) > 0; b = b[pendingSize:] {
		left := time.Unix(0, int64(binary.BigEndian.Uint64(b[16:]))).Sub(wall)
		pending = append(pending, pendingUnit{expires: mono + left})
	}
	return committed, pending, nil
}

// allowanceExpiry is when Badger may drop a client-day record: a day after
// the day ended, and never sooner than a day from now by the real clock
// (Badger's TTL reads the real clock, not the store's).
func allowanceExpiry(dayEnd time.Time) uint64 {
	return uint64(max(dayEnd.Add(24*time.Hour).Unix(), time.Now().Add(24*time.Hour).Unix()))
}

// setCommitted writes the committed count n of k into txn.
func setCommitted(txn *tx, k allowanceDay, n int, end time.Time) error {
	e := badger.NewEntry(k.key(), binary.BigEndian.AppendUint32(nil, uint32(n)))
	e.ExpiresAt = allowanceExpiry(end)
	return txn.SetEntry(e)
}

func checkAllowanceKey(pool, client string) error {
	if len(pool) > maxComponent || len(client) > maxComponent {
		return errors.New("store: allowance pool or client too long")
	}
	return nil
}

// Allowance returns the embedded implementation of Allowance.
func (db *DB) Allowance() Allowance { return db.allow }

// Reserve implements Allowance.
func (a *allowances) Reserve(ctx context.Context, pool, client string, day time.Time, limit int) (Reservation, error) {
	if err := checkAllowanceKey(pool, client); err != nil {
		return Reservation{}, err
	}
	k, end := dayOf(pool, client, day)
	res := Reservation{Pool: pool, Client: client, Day: dayLabel(k.day), Limit: limit}
	if err := a.db.usable(ctx); err != nil {
		return res, err
	}
	// The unit is granted here and written only after the call is
	// served: while writes are refused it would be served uncounted.
	if err := a.db.commits.refusal(); err != nil {
		return res, err
	}
	s := a.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := a.entry(ctx, s, k, end)
	if err != nil {
		return res, err
	}
	t := elapsed()
	c.dropLapsed(t)
	if c.remaining(limit) == 0 {
		return res, ErrExhausted
	}
	id := a.nextID.Add(1)
	res.ID = formatReservationID(id)
	res.Expires = now().Add(a.db.opts.ReservationTTL)
	c.pending = append(c.pending, pendingUnit{id: id, expires: t + a.db.opts.ReservationTTL})
	res.Remaining = c.remaining(limit)
	return res, nil
}

func formatReservationID(id uint64) string {
	return hex.EncodeToString(binary.BigEndian.AppendUint64(nil, id))
}

func parseReservationID(s string) (uint64, bool) {
	var b [8]byte
	if len(s) != 16 {
		return 0, false
	}
	if _, err := hex.Decode(b[:], []byte(s)); err != nil {
		return 0, false
	}
	id := binary.BigEndian.Uint64(b[:])
	return id, id != 0
}

// Commit implements Allowance.
func (a *allowances) Commit(ctx context.Context, r Reservation) error {
	return a.finish(ctx, r, true)
}

// Release implements Allowance.
func (a *allowances) Release(ctx context.Context, r Reservation) error {
	return a.finish(ctx, r, false)
}

func (a *allowances) finish(ctx context.Context, r Reservation, commit bool) error {
	id, ok := parseReservationID(r.ID)
	if !ok {
		return ErrNotReserved
	}
	if err := checkAllowanceKey(r.Pool, r.Client); err != nil {
		return err
	}
	day, ok := parseDayLabel(r.Day)
	if !ok {
		return ErrNotReserved
	}
	if err := a.db.usable(ctx); err != nil {
		return err
	}
	k := allowanceDay{pool: r.Pool, client: r.Client, day: day}
	s := a.shard(k)
	batched := commit && a.every > 0
	if batched {
		if err := a.takeSlot(); err != nil {
			return err
		}
	}
	s.mu.Lock()
	c := s.days[k]
	t := elapsed()
	if c == nil || !c.take(id, t) {
		// A lapsed unit is dropped by the next Reserve anyway.
		s.mu.Unlock()
		if batched {
			a.giveSlot(nil, k, false)
		}
		return ErrNotReserved
	}
	c.dropLapsed(t)
	if !commit {
		s.mu.Unlock()
		return nil
	}
	c.committed++
	if batched {
		s.mu.Unlock()
		// Counted before it is queued, so the flush that takes it
		// reads a count that includes it.
		a.giveSlot(s, k, true)
		return nil
	}
	c.writes++
	s.mu.Unlock()
	return a.write(ctx, []dirtyDay{{s: s, k: k, day: c}})
}

// write puts the committed counts of days on disk in one commit (synced
// unless Options.NoSync), each as it stands when the commit runs, and
// records them as durable. The caller has counted a write on each day.
func (a *allowanceCounts) write(ctx context.Context, days []dirtyDay) error {
	wrote := make([]int, len(days))
	err := a.db.update(ctx, func(txn *tx) error {
		for i, d := range days {
			d.s.mu.Lock()
			n, end := d.day.committed, d.day.end
			d.s.mu.Unlock()
			wrote[i] = n
			if err := setCommitted(txn, d.k, n, end); err != nil {
				return err
			}
		}
		return nil
	})
	for i, d := range days {
		d.s.mu.Lock()
		d.day.writes--
		if err == nil && wrote[i] > d.day.durable {
			d.day.durable = wrote[i]
		}
		d.s.mu.Unlock()
	}
	return err
}

// Remaining implements Allowance.
func (a *allowances) Remaining(ctx context.Context, pool, client string, day time.Time, limit int) (int, error) {
	if err := checkAllowanceKey(pool, client); err != nil {
		return 0, err
	}
	if err := a.db.usable(ctx); err != nil {
		return 0, err
	}
	k, end := dayOf(pool, client, day)
	s := a.shard(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	c, err := a.entry(ctx, s, k, end)
	if err != nil {
		return 0, err
	}
	c.dropLapsed(elapsed())
	return c.remaining(limit), nil
}

// Batched flushing.
//
// With Options.AllowanceFlush set, Commit counts the unit in memory and
// returns; a flusher writes every changed client-day in one synced commit
// every AllowanceFlush, and at once when AllowanceFlushUnits acknowledged
// units are waiting, in which case further commits wait for that flush
// (takeSlot). So at any instant at most AllowanceFlushUnits acknowledged
// units are missing from the disk, and none committed more than
// AllowanceFlush (plus the duration of one flush) ago while the disk keeps
// up. Close flushes everything.

// takeSlot reserves room for one unit that is not yet on disk, waiting for
// a flush when AllowanceFlushUnits are waiting. It fails when the store is
// closing or the flush it waited for failed: the commit is then refused,
// never acknowledged without its bound.
func (a *allowances) takeSlot() error {
	a.fmu.Lock()
	defer a.fmu.Unlock()
	for a.unflushed >= a.maxUnits && !a.closing {
		a.askFlush()
		a.flushErr = nil
		a.flushed.Wait()
		if a.flushErr != nil && a.unflushed >= a.maxUnits {
			return a.flushErr
		}
	}
	if a.closing {
		return ErrClosed
	}
	a.unflushed++
	a.applying++
	return nil
}

// giveSlot ends a commit that took a slot: counted (its unit, of
// client-day k in shard s, waits for the next flush) or not (the slot is
// given back).
func (a *allowances) giveSlot(s *allowanceShard, k allowanceDay, counted bool) {
	a.fmu.Lock()
	a.applying--
	if counted {
		a.enqueue(s, k, 1)
	} else {
		a.unflushed--
	}
	a.flushed.Broadcast()
	a.fmu.Unlock()
}

// enqueue adds units of client-day k to the queue. a.fmu must be held.
func (a *allowances) enqueue(s *allowanceShard, k allowanceDay, units int) {
	if q := a.queue[k]; q != nil {
		q.units += units
		return
	}
	if a.queue == nil {
		a.queue = make(map[allowanceDay]*queuedDay)
	}
	a.queue[k] = &queuedDay{s: s, k: k, units: units}
}

func (a *allowances) askFlush() {
	select {
	case a.kick <- struct{}{}:
	default:
	}
}

func (a *allowances) flusher() {
	defer close(a.stopped)
	tick := time.NewTicker(a.every)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-a.kick:
		case <-a.stop:
			return
		}
		a.flush()
	}
}

// maxFlushDays bounds the client-days of one flush commit (Badger bounds a
// transaction's size).
const maxFlushDays = 1024

// flush writes every queued client-day and counts its units as flushed.
// Each count is written as it stands, so it covers every unit queued
// before the flush took the queue (each was counted before it was
// queued). A client-day no longer in memory was dropped because it was
// clean: its units are on disk already.
func (a *allowances) flush() error {
	a.flushing.Lock()
	defer a.flushing.Unlock()
	a.fmu.Lock()
	queue := make([]*queuedDay, 0, len(a.queue))
	for _, q := range a.queue {
		queue = append(queue, q)
	}
	a.queue = nil
	a.fmu.Unlock()
	var firstErr error
	for len(queue) > 0 {
		batch := queue[:min(len(queue), maxFlushDays)]
		queue = queue[len(batch):]
		days := make([]dirtyDay, 0, len(batch))
		live := batch[:0:0]
		units, gone := 0, 0
		for _, q := range batch {
			units += q.units
			q.s.mu.Lock()
			if c := q.s.days[q.k]; c != nil {
				c.writes++
				days = append(days, dirtyDay{s: q.s, k: q.k, day: c})
				live = append(live, q)
			} else {
				gone += q.units
			}
			q.s.mu.Unlock()
		}
		var err error
		if len(days) > 0 {
			err = a.write(context.Background(), days)
		}
		a.fmu.Lock()
		if err != nil {
			// Queue them again: their units stay unflushed, and the
			// commits waiting on the bound are told.
			for _, q := range live {
				a.enqueue(q.s, q.k, q.units)
			}
			units = gone
			a.flushErr = err
			if firstErr == nil {
				firstErr = err
			}
			if a.db.opts.Logger != nil {
				a.db.opts.Logger.Warn("flushing free allowance counts", "error", err.Error())
			}
		}
		a.unflushed -= units
		a.flushed.Broadcast()
		a.fmu.Unlock()
	}
	return firstErr
}

// FlushAllowance writes now the free-allowance counts this handle has
// acknowledged and not yet written (Options.AllowanceFlush; without it
// there are none). A Caddy config being unloaded calls it at once, while
// its handle's Close waits for the config's last request: a process that
// stops before that request finishes still leaves every count
// acknowledged before the stop on disk.
func (db *DB) FlushAllowance() error {
	if db.allow.every <= 0 {
		return nil
	}
	return db.allow.flush()
}

// close gives a handle back. The last one of its mode stops the flusher
// after writing every counted unit; commits after it are refused. It runs
// before the database closes.
func (a *allowances) close() {
	a.hmu.Lock()
	a.refs--
	last := a.refs == 0
	if last {
		delete(a.handles, commitMode{every: a.every, units: a.maxUnits})
	}
	a.hmu.Unlock()
	if !last || a.every <= 0 {
		return
	}
	a.closeOnce.Do(func() {
		a.fmu.Lock()
		a.closing = true
		a.flushed.Broadcast()
		for a.applying > 0 {
			a.flushed.Wait()
		}
		a.fmu.Unlock()
		close(a.stop)
		<-a.stopped
		a.flush()
	})
}
