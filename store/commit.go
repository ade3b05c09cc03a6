package store

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
)

// committer is group commit for every read-write transaction of a DB: the
// transactions that are waiting run one after another inside a single
// Badger transaction that is committed once, so concurrent writers share one
// commit and one write to the write-ahead log (wal.go). A writer is answered
// only after the group that holds its writes is durable (unless
// Options.NoSync): its record written to the log, then its Badger
// transaction committed. That is the durability promise of one commit per
// call at the cost of one log write per group.
//
// There is no committer goroutine: the first writer to find nobody
// committing leads, builds a group of what is queued (its own transaction
// among it), and later hands the lead to the first writer still waiting, so
// a lone writer commits on its own goroutine without a hand-off.
//
// With the log, groups are pipelined: the lead is handed on as soon as the
// group's record starts its write to the log, not when the group is done,
// so the next group's fns run (and its writers' requests are gathered)
// while the disk writes this one; the log is kept busy instead of waiting
// for a group's fns, its Badger commit and the hand-off between writers.
// Order is kept by each group waiting for the one built before it twice:
// its record is written only after the previous record's write returned,
// and its Badger transaction commits only after the previous one's did. So
// the log's order is the commit order, Badger shows nothing that is not
// durable, and a writer is answered only once its group is durable and
// visible. A group built while the one before it is not yet committed sees
// that one's writes because they are copied into its Badger transaction
// first (pipeline), and committed again with it, unchanged or overwritten:
// every group's transaction holds the writes of the groups it was built
// on, exactly as a reader of the committed state will find them. Without
// the log (Options.NoSync) there is no write to overlap, and a group is
// committed before the lead is handed on.
//
// Running the group serially inside one transaction keeps each call's
// semantics exactly: every fn sees the writes of those before it (Badger
// transactions read their own pending writes), as if they had committed one
// by one in that order. And since no other transaction writes meanwhile,
// there is nothing for Badger's optimistic-concurrency checks to find
// (Open turns them off; a pipelined group's transaction starts before the
// previous one commits, and would otherwise conflict with it): the per-agent
// counts key that every history record of an agent rewrites no longer
// serialises concurrent records through conflicts and retries.
//
// Badger has no savepoints, so a fn that fails cannot be undone alone: the
// group's transaction is discarded and the fns before it run again on a
// fresh one, without it (build). Failures are the exception (a replayed
// payment, an exhausted allowance), and each costs a re-run of the
// successful fns before it in its group, never an extra commit.
type committer struct {
	bdb *badger.DB
	log *wal // nil without a log (Options.NoSync, InMemory)

	mu    sync.Mutex
	queue []*commitOp
	// spare is the queue's other buffer: a leader takes the queue whole
	// and leaves spare in its place, so taking a group allocates nothing
	// once its buffer is given back (when the group is answered).
	spare   []*commitOp
	leading bool // a writer holds the lead (builds groups)
	// lastGroup is how many ops the last group answered (see lead).
	lastGroup int
	// last is the group built last, until it is answered: the next group
	// waits for it (see group). pending are the groups built whose writes
	// are not yet committed to Badger, in order: a new group's transaction
	// starts with their writes. active counts the groups not yet answered.
	last    *group
	pending []*group
	active  int
	// records are free log records for the next groups.
	records []*walRecord
	closed  bool
	idle    *sync.Cond // signalled when leading ends or a group is answered
	// broken is set when a group failed after its record may have
	// reached the log (see fail): every later write gets it.
	broken error

	// beforeLog and afterLog, when set (by tests), are called by a
	// group's writer just before its record's write to the log and just
	// after it returned (before the group is committed), with the
	// record's number (from 1).
	beforeLog, afterLog func(n int)
	logged              int // records written, for the hooks
}

// group is one group between its build and its answer.
type group struct {
	ops []*commitOp
	txn *tx
	// carried: txn started with the writes of groups before it (carry).
	carried bool
	// logged is closed once this group's record write returned (or it
	// will never be written), applied once its Badger transaction
	// committed (or never will): a failure in either broke the committer
	// first, so the groups after it, which wait on these, find it broken.
	logged, applied chan struct{}
}

// ErrNeedsReopen is returned by every write after one failed half-way: its
// record may be in the write-ahead log but Badger did not take it, or a
// write to the log itself failed. The log and Badger may then disagree
// until Open replays the log, so the store refuses writes (reads go on)
// until it is closed and opened again. The writes of the failed group were
// answered with the failure; the replay may still apply them (like any
// write whose commit failed, its outcome is unknown to its caller).
var ErrNeedsReopen = errors.New("store: a commit failed half-way; writes are refused until the store is reopened")

// maxGroup bounds the fns of one group: it bounds the work redone after a
// failure and the latency of the group's last writer.
const maxGroup = 64

// Op states: queued until a leader takes it (or makes it the next leader),
// or cancelled by a caller whose context ended first (leaders skip it).
const (
	opQueued int32 = iota
	opTaken
	opLead
	opCancelled
)

type commitOp struct {
	fn    func(txn *tx) error
	state atomic.Int32
	err   error
	// done and lead exist only for an op queued behind a leader (a leader
	// learns its own outcome by committing it): done is closed when fn's
	// outcome is known, lead when this op's caller is to lead.
	done chan struct{}
	lead chan struct{}
}

func newCommitter(bdb *badger.DB, log *wal) *committer {
	c := &committer{bdb: bdb, log: log}
	c.idle = sync.NewCond(&c.mu)
	return c
}

// close stops taking transactions once the groups built are answered;
// writers still queued get ErrClosed.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	for c.leading || c.active > 0 {
		c.idle.Wait()
	}
	q := c.queue
	c.queue = nil
	c.mu.Unlock()
	for _, op := range q {
		if op.state.CompareAndSwap(opQueued, opTaken) || op.state.CompareAndSwap(opLead, opTaken) {
			op.finish(ErrClosed)
		}
	}
}

// do runs fn in the next group and returns once the group's commit has
// returned: fn's error, the commit's error, or nil when fn's writes are
// committed. A context that ends before fn was taken returns its error with
// nothing written; once taken, fn's outcome is awaited (the commit is
// bounded by the disk), so an answer never hides a write.
func (c *committer) do(ctx context.Context, fn func(txn *tx) error) error {
	op := &commitOp{fn: fn}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.broken != nil {
		err := c.broken
		c.mu.Unlock()
		return err
	}
	if !c.leading {
		// Nobody leads: lead at once. The op is first in the queue, so
		// the group lead takes holds it and commits (or fails) it before
		// lead returns.
		c.queue = append(c.queue, op)
		c.leading = true
		op.state.Store(opLead)
		c.mu.Unlock()
		c.lead()
		return op.err
	}
	op.done, op.lead = make(chan struct{}), make(chan struct{})
	c.queue = append(c.queue, op)
	c.mu.Unlock()
	select {
	case <-op.done:
		return op.err
	case <-op.lead:
		c.lead()
	case <-ctx.Done():
		if op.state.CompareAndSwap(opQueued, opCancelled) {
			return ctx.Err()
		}
		// Taken, or made the next leader: see it through.
		select {
		case <-op.done:
			return op.err
		case <-op.lead:
			c.lead()
		}
	}
	<-op.done
	return op.err
}

// lead builds one group of the queued transactions (this caller's among
// them: a leader's op is first in the queue), sees it through its log
// write and its Badger commit, and hands the lead to the first writer
// still waiting, or ends it when nobody waits: with the log, once the
// group's record write may start (see committer and finish); without,
// once the group is committed. It returns when the group is answered.
//
// Without the log, when the last group answered others besides its
// leader, the new leader first yields its processor once (runtime.Gosched)
// before it takes the queue. Writers answered together come back together:
// without the yield, the first one back (often the last leader, which was
// running already) commits a group of its own and the others queue behind
// it, so groups alternate between small and large. The yield lets the
// writers that are runnable reach the queue first, and costs a lone writer
// nothing (its last group answered only itself), nor does it ever wait for
// a writer that is not already running or runnable. With the log, the
// writers that reach the queue while the group before is being written
// join the group before its own write (finish).
func (c *committer) lead() {
	c.mu.Lock()
	if c.log == nil && c.lastGroup > 1 {
		c.mu.Unlock()
		runtime.Gosched()
		c.mu.Lock()
	}
	ops := c.take(maxGroup)
	c.mu.Unlock()
	n, handed := len(ops), false
	for len(ops) > 0 {
		var g *group
		g, ops = c.build(ops)
		if g != nil {
			// A group split for its size is seen through before the
			// next part is built: only the last part hands the lead on.
			handed = len(ops) == 0
			c.finish(g, handed)
		}
	}
	if !handed {
		c.handLead(n)
	}
}

// take takes up to n ops off the queue, skipping those cancelled. c.mu is
// held.
func (c *committer) take(n int) []*commitOp {
	var q []*commitOp
	if len(c.queue) <= n {
		q, c.queue, c.spare = c.queue, c.spare[:0], nil
	} else {
		q = append([]*commitOp(nil), c.queue[:n]...)
		c.queue = append(c.queue[:0], c.queue[n:]...)
	}
	var live []*commitOp
	for _, op := range q {
		if op.state.CompareAndSwap(opQueued, opTaken) || op.state.CompareAndSwap(opLead, opTaken) {
			live = append(live, op)
		}
	}
	// The queue's buffer is spare again: live is a copy, so that a group
	// in flight never shares a buffer with the queue.
	clear(q)
	if c.spare == nil {
		c.spare = q[:0]
	}
	return live
}

// handLead gives the lead to the first writer still waiting, or ends it;
// n is the size of the group just built.
func (c *committer) handLead(n int) {
	c.mu.Lock()
	c.lastGroup = n
	var next *commitOp
	for len(c.queue) > 0 && next == nil {
		if c.queue[0].state.CompareAndSwap(opQueued, opLead) {
			next = c.queue[0]
		} else {
			c.queue = c.queue[1:] // cancelled
		}
	}
	if next == nil {
		c.leading = false
		c.idle.Broadcast()
	}
	c.mu.Unlock()
	if next != nil {
		close(next.lead)
	}
}

// build runs ops in one transaction, started with the writes of the groups
// not yet committed to Badger (carry), and returns it as the next group
// (nil when none of ops is left to commit), answering every op it settles.
// An op whose fn fails is answered with its error and taken out, and the
// others run again on a fresh transaction (and a fresh log record), so the
// group holds exactly the writes of the ops that succeeded. An op that
// makes the transaction too big for Badger (or for the log) ends the group
// after the ops before it: it and the ones after are returned, to start
// the next group; when it is the first, the group is built again once the
// groups before it are committed, without their writes.
func (c *committer) build(ops []*commitOp) (g *group, rest []*commitOp) {
	// ops is never written below: a shortened group is a new slice.
	for {
		c.mu.Lock()
		// At most the group being written is carried: one whose write
		// returned is committed soon, and carrying more would make
		// every group commit their writes again.
		for len(c.pending) > 1 {
			p := c.pending[0]
			c.mu.Unlock()
			<-p.applied
			c.mu.Lock()
		}
		err := c.broken
		// Taken before the transaction starts: a group committed
		// before then is in its view, one committed after is in pending.
		pending := append([]*group(nil), c.pending...)
		var rec *walRecord
		if c.log != nil {
			if n := len(c.records); n > 0 {
				rec, c.records = c.records[n-1], c.records[:n-1]
			} else {
				rec = new(walRecord)
			}
		}
		c.mu.Unlock()
		if err != nil {
			for _, op := range ops {
				op.finish(err)
			}
			return nil, rest
		}
		txn := &tx{b: c.bdb.NewTransaction(true)}
		err = carry(txn, pending)
		if rec != nil {
			txn.rec = rec
			txn.rec.reset()
		}
		failed := -1
		if err == nil {
			for i, op := range ops {
				if err = op.run(txn); err != nil {
					failed = i
					break
				}
			}
		}
		if err == nil {
			return &group{ops: ops, txn: txn, carried: len(pending) > 0, logged: make(chan struct{}), applied: make(chan struct{})}, rest
		}
		txn.b.Discard()
		c.freeRecord(rec)
		if errors.Is(err, badger.ErrDBClosed) {
			err = ErrClosed
		}
		if errors.Is(err, badger.ErrTxnTooBig) && failed <= 0 && len(pending) > 0 {
			// The carried writes made it too big: wait until they are
			// in Badger's view instead.
			<-pending[len(pending)-1].applied
			continue
		}
		if errors.Is(err, badger.ErrTxnTooBig) && failed > 0 {
			rest = append(ops[failed:len(ops):len(ops)], rest...)
			ops = ops[:failed]
			continue
		}
		if failed < 0 {
			// Carrying the pending writes failed: no fn ran.
			for _, op := range ops {
				op.finish(err)
			}
			return nil, rest
		}
		ops[failed].finish(err)
		ops = append(ops[:failed:failed], ops[failed+1:]...)
		if len(ops) == 0 {
			return nil, rest
		}
	}
}

// carry writes into txn the writes of pending, the groups built but not yet
// committed to Badger, in order, so that txn sees the state they leave.
// They are not recorded for the log: their own records hold them, and
// such a transaction is never committed (finish commits the group's own
// record instead), so its entries may point into those records: a record's
// buffer is reused only by a group built after its own was committed, when
// no fn reads the transactions that carried it any more.
func carry(txn *tx, pending []*group) error {
	for _, p := range pending {
		if err := setPayload(txn.b, p.txn.rec.buf[walRecordHeader:]); err != nil {
			return err
		}
	}
	return nil
}

func (c *committer) freeRecord(rec *walRecord) {
	if rec == nil {
		return
	}
	c.mu.Lock()
	c.records = append(c.records, rec)
	c.mu.Unlock()
}

// extend adds to g, before its record is written, the writers that queued
// while the group before it was being written: their fns run on g's
// transaction after g's own, as if they had been in g from the start, so
// the group written next holds everyone waiting when the log is free. A
// fn that fails (or makes g too big) means building g again with them all
// (build), since Badger cannot undo one fn alone; what build leaves over
// goes back to the front of the queue.
func (c *committer) extend(g *group) {
	c.mu.Lock()
	more := c.take(maxGroup - len(g.ops))
	c.mu.Unlock()
	if len(more) == 0 {
		return
	}
	all := append(g.ops[:len(g.ops):len(g.ops)], more...)
	for _, op := range more {
		if op.run(g.txn) != nil {
			g.txn.b.Discard()
			c.freeRecord(g.txn.rec)
			built, rest := c.build(all)
			if built != nil {
				g.ops, g.txn = built.ops, built.txn
			} else {
				g.ops, g.txn = nil, &tx{b: c.bdb.NewTransaction(true)}
			}
			if len(rest) > 0 {
				c.requeue(rest)
			}
			return
		}
	}
	g.ops = all
}

// requeue puts ops back at the front of the queue, as if never taken.
func (c *committer) requeue(ops []*commitOp) {
	c.mu.Lock()
	for _, op := range ops {
		op.state.Store(opQueued)
	}
	c.queue = append(ops[:len(ops):len(ops)], c.queue...)
	c.mu.Unlock()
}

// finish sees g through: its record written after the previous group's,
// its transaction committed after the previous group's, and its ops
// answered. With hand, it hands the lead on: with the log, once the
// previous group's write returned and g took in the writers that queued
// meanwhile (extend), just before g's own write; without, once g is
// committed. A failure once the record may be in the log breaks the
// committer (fail), and so fails every group after it.
func (c *committer) finish(g *group, hand bool) {
	c.mu.Lock()
	prev := c.last
	c.last = g
	c.active++
	c.mu.Unlock()
	if prev != nil {
		<-prev.logged
	}
	if hand && c.log != nil {
		if prev != nil {
			// The log is free: yield once, as lead does without the
			// log, so that the writers already runnable reach the
			// queue and join g (extend) instead of the write after.
			// Under load it saves log writes, which cost CPU of
			// their own (system time); a writer that is not running
			// or runnable is never waited for.
			runtime.Gosched()
		}
		c.extend(g)
	}
	rec := g.txn.rec
	logs := rec != nil && rec.ops > 0
	if logs {
		c.mu.Lock()
		c.pending = append(c.pending, g)
		c.mu.Unlock()
	}
	if hand && c.log != nil {
		c.handLead(len(g.ops))
	}
	err := c.brokenErr()
	if err == nil && logs {
		if c.log.wraps(rec) && prev != nil {
			// The checkpoint makes Badger durable and drops the log's
			// records: the groups logged before g must be in Badger by
			// then, or their writes would be in neither.
			<-prev.applied
		}
		c.logged++
		if c.beforeLog != nil {
			c.beforeLog(c.logged)
		}
		if err = c.log.append(rec); err != nil {
			err = c.fail(err)
		}
	}
	close(g.logged)
	if logs && c.afterLog != nil {
		c.afterLog(c.logged)
	}
	if prev != nil {
		<-prev.applied
	}
	if err == nil {
		// The group before may have failed after g's record was
		// written: g is then not committed either.
		err = c.brokenErr()
	}
	switch {
	case err == nil && logs && g.carried:
		// Its transaction holds the writes of the groups before it too,
		// committed already: commit its record's writes alone.
		g.txn.b.Discard()
		if err = applyRecord(c.bdb, rec.buf[walRecordHeader:]); err != nil {
			err = c.fail(fmt.Errorf("store: committing a logged group: %w", err))
		}
	case err == nil && (logs || rec == nil):
		err = c.commit(g.txn, logs)
	default:
		// Failed, or nothing of its own to commit (with the log, a group
		// that wrote nothing holds only the writes it carried, which the
		// groups before it committed).
		g.txn.b.Discard()
	}
	c.mu.Lock()
	if logs {
		// Groups commit in order: g is the first pending.
		n := copy(c.pending, c.pending[1:])
		c.pending[n] = nil
		c.pending = c.pending[:n]
	}
	if c.last == g {
		c.last = nil
	}
	c.active--
	c.idle.Broadcast()
	if rec != nil {
		c.records = append(c.records, rec)
	}
	c.mu.Unlock()
	close(g.applied)
	for _, op := range g.ops {
		op.finish(err)
	}
	if hand && c.log == nil {
		c.handLead(len(g.ops))
	}
}

// commit commits txn to Badger (unsynced: the log holds it, when logged is
// true). A failure of a logged group breaks the committer (fail).
func (c *committer) commit(txn *tx, logged bool) error {
	err := txn.b.Commit()
	switch {
	case err == nil:
		return nil
	case logged:
		return c.fail(fmt.Errorf("store: committing a logged group: %w", err))
	case errors.Is(err, badger.ErrDBClosed):
		return ErrClosed
	default:
		return fmt.Errorf("store: committing: %w", err)
	}
}

// fail breaks the committer after err left the log and Badger possibly
// disagreeing, and returns err for the group that failed. Going on would
// acknowledge later groups on top of a state that a reopen changes: after
// a failed synced write neither the bytes on disk nor the kernel's copy of
// them can be trusted (it may drop the pages it failed to write), and a
// record Badger refused would be replayed after groups committed later.
func (c *committer) fail(err error) error {
	c.mu.Lock()
	if c.broken == nil {
		c.broken = fmt.Errorf("%w (%v)", ErrNeedsReopen, err)
	}
	c.mu.Unlock()
	return err
}

func (c *committer) brokenErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// run calls fn, turning a panic into its error: it fails this op, not the
// leader's whole group, and the lead is still handed on.
func (op *commitOp) run(txn *tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("store: transaction panicked: %v", p)
		}
	}()
	return op.fn(txn)
}

func (op *commitOp) finish(err error) {
	op.err = err
	if op.done != nil {
		close(op.done)
	}
}
