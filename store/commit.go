package store

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
)

// committer is group commit for every read-write transaction of a DB: one
// goroutine takes the transactions that are waiting, runs them one after
// another inside a single Badger transaction and commits that once, so
// concurrent writers share one commit and its fsync (Badger syncs its value
// log and write-ahead log once per commit). A writer is answered only after
// the commit that holds its writes has returned, synced unless
// Options.NoSync: the durability promise of one commit per call, at the cost
// of one commit per group.
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
	bdb  *badger.DB
	ops  chan *commitOp // unbuffered: an op is either taken by run or not sent
	stop chan struct{}
	done chan struct{}
}

// maxGroup bounds the fns of one group: it bounds the work redone after a
// failure and the latency of the group's last writer.
const maxGroup = 64

// Op states: queued until run takes it, or cancelled by a caller whose
// context ended first (run then skips it).
const (
	opQueued int32 = iota
	opTaken
	opCancelled
)

type commitOp struct {
	fn    func(txn *badger.Txn) error
	state atomic.Int32
	err   error
	done  chan struct{}
}

func newCommitter(bdb *badger.DB) *committer {
	c := &committer{bdb: bdb, ops: make(chan *commitOp), stop: make(chan struct{}), done: make(chan struct{})}
	go c.run()
	return c
}

// close stops taking transactions; the group being committed finishes
// first. Callers waiting to be taken get ErrClosed.
func (c *committer) close() {
	close(c.stop)
	<-c.done
}

// do runs fn in the next group and returns once the group's commit has
// returned: fn's error, the commit's error, or nil when fn's writes are
// committed. A context that ends before fn was taken returns its error with
// nothing written; once taken, fn's outcome is awaited (the commit is
// bounded by the disk), so an answer never hides a write.
func (c *committer) do(ctx context.Context, fn func(txn *badger.Txn) error) error {
	op := &commitOp{fn: fn, done: make(chan struct{})}
	select {
	case c.ops <- op:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.stop:
		return ErrClosed
	}
	select {
	case <-op.done:
		return op.err
	case <-ctx.Done():
		if op.state.CompareAndSwap(opQueued, opCancelled) {
			return ctx.Err()
		}
		<-op.done
		return op.err
	}
}

func (c *committer) run() {
	defer close(c.done)
	group := make([]*commitOp, 0, maxGroup)
	for {
		select {
		case op := <-c.ops:
			group = append(group[:0], op)
		case <-c.stop:
			return
		}
	fill:
		for len(group) < maxGroup {
			select {
			case op := <-c.ops:
				group = append(group, op)
			default:
				break fill
			}
		}
		live := group[:0]
		for _, op := range group {
			if op.state.CompareAndSwap(opQueued, opTaken) {
				live = append(live, op)
			}
		}
		for rest := live; len(rest) > 0; {
			rest = c.commitGroup(rest)
		}
		clear(group)
	}
}

// commitGroup runs ops in one transaction and commits it, answering every op
// it settles. An op whose fn fails is answered with its error and taken out,
// and the others run again on a fresh transaction, so the commit holds
// exactly the writes of the ops that succeeded. An op that makes the
// transaction too big for Badger ends the group after the ops before it: it
// and the ones after are returned, to start the next group.
func (c *committer) commitGroup(ops []*commitOp) (rest []*commitOp) {
	ops = append([]*commitOp(nil), ops...) // taken apart below
	for {
		txn := c.bdb.NewTransaction(true)
		failed, err := -1, error(nil)
		for i, op := range ops {
			if err = op.run(txn); err != nil {
				failed = i
				break
			}
		}
		if failed < 0 {
			err := txn.Commit()
			if errors.Is(err, badger.ErrDBClosed) {
				err = ErrClosed
			} else if err != nil {
				err = fmt.Errorf("store: committing: %w", err)
			}
			for _, op := range ops {
				op.finish(err)
			}
			return rest
		}
		txn.Discard()
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

// run calls fn, turning a panic into its error: it fails this op, not the
// committer every writer of the process depends on.
func (op *commitOp) run(txn *badger.Txn) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("store: transaction panicked: %v", p)
		}
	}()
	return op.fn(txn)
}

func (op *commitOp) finish(err error) {
	op.err = err
	close(op.done)
}
