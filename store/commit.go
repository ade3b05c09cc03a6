package store

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

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
// committing leads, commits what is queued (its own transaction among it)
// and hands the lead to the first writer still waiting, so a lone writer
// commits on its own goroutine without a hand-off.
//
// Running the group serially inside one transaction keeps each call's
// semantics exactly: every fn sees the writes of those before it (Badger
// transactions read their own pending writes), as if they had committed one
// by one in that order. And since no other transaction writes meanwhile,
// there are no optimistic-concurrency conflicts to retry: the per-agent
// counts key that every history record of an agent rewrites no longer
// serialises concurrent records through conflicts and retries.
//
// Badger has no savepoints, so a fn that fails cannot be undone alone: the
// group's transaction is discarded and the fns before it run again on a
// fresh one, without it (commitGroup). Failures are the exception (a
// replayed payment, an exhausted allowance), and each costs a re-run of the
// successful fns before it in its group, never an extra commit.
type committer struct {
	vers  *versions
	log   *wal        // nil without a log (Options.NoSync, InMemory)
	space *spaceGuard // nil in memory

	mu    sync.Mutex
	queue []*commitOp
	// spare is the queue's other buffer: a leader takes the queue whole
	// and leaves spare in its place, so taking a group allocates nothing.
	spare   []*commitOp
	leading bool // a writer is committing a group
	// lastGroup is how many ops the last group answered (see lead).
	lastGroup int
	closed    bool
	idle      *sync.Cond // signalled when leading ends
	// broken is set when a group failed after its record may have
	// reached the log (see fail): later writes get it until recover
	// succeeds, tried by the first write from retryAt (on elapsed) on.
	broken  error
	retryAt time.Duration
	// halted mirrors broken != nil for refusal, which must not take mu.
	halted atomic.Bool
	// redo is the payload of a logged group Badger refused, which
	// recover applies again (see fail).
	redo []byte
}

// ErrWritesHalted is returned by writes after one failed half-way: its
// record may be in the write-ahead log but Badger did not take it, or a
// write to the log itself failed. The log and Badger may then disagree, so
// the store takes no write (reads go on) until it has made them agree
// again (recover): tried by the first write after the failure, then at
// most every retryBroken, and done by a reopen too. The writes of the
// failed group were answered with the failure; the recovery may still
// apply them (like any write whose commit failed, its outcome is unknown
// to its caller).
var ErrWritesHalted = errors.New("store: a commit failed half-way; writes are refused until the write-ahead log can be written again (retried every second)")

// retryBroken is how often a halted committer tries to recover.
const retryBroken = time.Second

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
	ctx   context.Context
	fn    func(txn *tx) error
	state atomic.Int32
	err   error
	// done and lead exist only for an op queued behind a leader (a leader
	// learns its own outcome by committing it): done is closed when fn's
	// outcome is known, lead when this op's caller is to lead.
	done chan struct{}
	lead chan struct{}
}

func newCommitter(vers *versions, log *wal, space *spaceGuard) *committer {
	c := &committer{vers: vers, log: log, space: space}
	c.idle = sync.NewCond(&c.mu)
	return c
}

// close stops taking transactions once the group being committed is done;
// writers still queued get ErrClosed.
func (c *committer) close() {
	c.mu.Lock()
	c.closed = true
	for c.leading {
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
// committed. A context that ends (or whose deadline passes) before a leader
// takes fn returns its error with nothing written; once taken, fn's outcome
// is awaited (the commit is bounded by the disk), so an answer never hides
// a write.
//
// The deadline is read from the clock when the group is formed, not only
// from ctx.Done: a process resumed after a stall runs its leader before the
// context's timer has fired, and a caller's deadline (verifierd's: when the
// gateway stops waiting for the answer) must hold at the last instant
// before the write is made.
func (c *committer) do(ctx context.Context, fn func(txn *tx) error) error {
	op := &commitOp{ctx: ctx, fn: fn}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if c.broken != nil && elapsed() < c.retryAt {
		err := c.broken
		c.mu.Unlock()
		return err
	}
	if !c.leading {
		// Nobody commits: lead at once. The op is first in the queue, so
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

// lead commits one group, the queued transactions (this caller's among
// them: a leader's op is first in the queue), then hands the lead to the
// first writer still waiting, or ends it when nobody waits.
//
// When the last group answered others besides its leader, the new leader
// first yields its processor once (runtime.Gosched) before it takes the
// queue. Writers answered together come back together: without the
// yield, the first one back (often the last leader, which was running
// already) commits a group of its own and the others queue behind its log
// write, so groups alternate between small and large. The yield lets the
// writers that are runnable reach the queue first, and costs a lone
// writer nothing (its last group answered only itself), nor does it ever
// wait for a writer that is not already running or runnable.
func (c *committer) lead() {
	c.mu.Lock()
	if c.lastGroup > 1 {
		c.mu.Unlock()
		runtime.Gosched()
		c.mu.Lock()
	}
	var group []*commitOp
	if len(c.queue) <= maxGroup {
		group, c.queue, c.spare = c.queue, c.spare[:0], nil
	} else {
		group = append([]*commitOp(nil), c.queue[:maxGroup]...)
		c.queue = append(c.queue[:0], c.queue[maxGroup:]...)
	}
	c.mu.Unlock()
	now := time.Now()
	live := group[:0]
	for _, op := range group {
		if !op.state.CompareAndSwap(opQueued, opTaken) && !op.state.CompareAndSwap(opLead, opTaken) {
			continue
		}
		if err := ContextEnded(op.ctx, now); err != nil {
			op.finish(err)
			continue
		}
		live = append(live, op)
	}
	for rest := live; len(rest) > 0; {
		rest = c.commitGroup(rest)
	}
	clear(group) // the ops are answered: do not keep them alive
	c.mu.Lock()
	c.lastGroup = len(live)
	if c.spare == nil {
		c.spare = group[:0]
	}
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

// commitGroup runs ops in one transaction and commits it, answering every op
// it settles. An op whose fn fails is answered with its error and taken out,
// and the others run again on a fresh transaction (and a fresh log record),
// so the commit holds exactly the writes of the ops that succeeded. An op
// that makes the transaction too big for Badger (or for the log) ends the
// group after the ops before it: it and the ones after are returned, to
// start the next group.
func (c *committer) commitGroup(ops []*commitOp) (rest []*commitOp) {
	// ops is never written below: a shortened group is a new slice.
	for {
		if err := c.recover(); err != nil {
			for _, op := range ops {
				op.finish(err)
			}
			return rest
		}
		txn := &tx{b: c.vers.write()}
		if c.log != nil {
			txn.rec = &c.log.rec
			txn.rec.reset()
		}
		failed, err := -1, error(nil)
		for i, op := range ops {
			if err = op.run(txn); err != nil {
				failed = i
				break
			}
		}
		if failed < 0 {
			err := c.commit(txn)
			for _, op := range ops {
				op.finish(err)
			}
			return rest
		}
		txn.b.Discard()
		if errors.Is(err, badger.ErrTxnTooBig) && failed > 0 {
			rest = append(ops[failed:len(ops):len(ops)], rest...)
			ops = ops[:failed]
			continue
		}
		if errors.Is(err, badger.ErrDBClosed) {
			err = ErrClosed
		}
		ops[failed].finish(err)
		ops = append(ops[:failed:failed], ops[failed+1:]...)
		if len(ops) == 0 {
			return rest
		}
	}
}

// commit makes txn durable, then visible: its record is written to the
// log, and only then is the Badger transaction committed (unsynced: the
// log holds it). A failure once the record may be in the log breaks the
// committer (fail). A group the disk has no room for is refused before
// anything is written (ErrDiskFull).
func (c *committer) commit(txn *tx) error {
	if txn.bytes > 0 {
		if err := c.space.admit(txn.bytes); err != nil {
			txn.b.Discard()
			return err
		}
	}
	logged := txn.rec != nil && txn.rec.ops > 0
	if logged {
		if err := c.log.append(txn.rec); err != nil {
			txn.b.Discard()
			return c.fail(err, nil)
		}
	}
	err := c.vers.commit(txn.b)
	switch {
	case err == nil:
		return nil
	case logged:
		return c.fail(fmt.Errorf("store: committing a logged group: %w", err), txn.rec.buf[walRecordHeader:])
	case errors.Is(err, badger.ErrDBClosed):
		return ErrClosed
	default:
		return fmt.Errorf("store: committing: %w", err)
	}
}

// fail breaks the committer after err left the log and Badger possibly
// disagreeing, and returns err for the group that failed. Going on would
// acknowledge later groups on top of a state that a replay changes: after
// a failed synced write neither the bytes on disk nor the kernel's copy of
// them can be trusted (it may drop the pages it failed to write), and a
// record Badger refused would be replayed after groups committed later.
// redo is that record's payload (nil when the log's write failed: Badger
// has nothing of the group).
func (c *committer) fail(err error, redo []byte) error {
	c.mu.Lock()
	if c.broken == nil {
		c.broken = fmt.Errorf("%w (%v)", ErrWritesHalted, err)
		c.halted.Store(true)
		c.redo = append([]byte(nil), redo...)
	}
	c.mu.Unlock()
	return err
}

// recover makes the log and Badger agree again after fail, as a reopen
// would, when the committer is broken and a retry is due; it returns the
// error a write gets meanwhile. Only the leader calls it: nothing else
// writes to Badger or the log while it runs.
//
// A record Badger refused is applied again (a reopen's replay would apply
// it: it may be in Badger in part); then the checkpoint syncs Badger and
// starts the log afresh at a new epoch, so whatever the failed write left
// in the log, torn or whole, is never replayed. If any step fails the
// committer stays broken. Tries are retryBroken apart, so a log that
// keeps failing costs a Badger sync a second, not one per write.
func (c *committer) recover() error {
	if !c.halted.Load() {
		return nil
	}
	c.mu.Lock()
	broken, redo := c.broken, c.redo
	if elapsed() < c.retryAt {
		c.mu.Unlock()
		return broken
	}
	c.retryAt = elapsed() + retryBroken
	c.mu.Unlock()
	err := error(nil)
	if redo != nil {
		err = replayRecord(c.vers, redo)
	}
	if err == nil {
		err = c.log.checkpoint()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		return broken
	}
	c.broken, c.redo = nil, nil
	c.halted.Store(false)
	return nil
}

// refusal is the error a write would be refused with now (ErrDiskFull,
// ErrWritesHalted), or nil, for a caller that acts before its write is
// made. A halted committer tries to recover first, as a write would.
func (c *committer) refusal() error {
	if c.halted.Load() {
		if err := c.do(context.Background(), func(*tx) error { return nil }); err != nil {
			return err
		}
	}
	return c.space.admit(0)
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

// ContextEnded is ctx's error, or context.DeadlineExceeded once now has
// reached its deadline even if its timer has not fired yet. Every history
// backend checks it just before a write is made.
func ContextEnded(ctx context.Context, now time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok && !now.Before(d) {
		return context.DeadlineExceeded
	}
	return nil
}

func (op *commitOp) finish(err error) {
	op.err = err
	if op.done != nil {
		close(op.done)
	}
}
