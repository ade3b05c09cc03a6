package store

import (
	"sync"
	"sync/atomic"

	"github.com/dgraph-io/badger/v4"
)

// versions is the store's own timestamp oracle: Badger runs in managed
// mode (badger.OpenManaged), and the store says at which version each
// transaction reads and commits.
//
// Badger's own oracle exists to order concurrent optimistic transactions:
// it keeps two watermarks, each a goroutine fed over a channel, and every
// transaction sends it two marks (a write transaction four). On a small
// machine each send wakes that goroutine: the watermarks were about a
// tenth of a verifierd request's CPU. The store needs none of it: its writes
// are already serial, one commit group at a time (committer), so the next
// version is a counter the group's leader alone advances, and a read sees
// the last group committed.
//
// What Badger's read watermark also did is kept: old versions are
// discarded by compaction only below the oldest snapshot a reader still
// holds (SetDiscardTs), so a long iteration never loses a key under it.
type versions struct {
	bdb *badger.DB
	// committed is the version of the last group whose commit returned:
	// every read from now on sees it and everything before it.
	committed atomic.Uint64
	// next is the last version handed to a commit; only the committer's
	// leader (and Open's replay of the log, before anybody writes)
	// advance it.
	next uint64

	mu sync.Mutex
	// reading counts the read snapshots open, by version.
	reading map[uint64]int
}

func newVersions(bdb *badger.DB) *versions {
	v := &versions{bdb: bdb, reading: make(map[uint64]int)}
	// Everything on disk, whether written in managed mode or not, is at or
	// below Badger's highest version.
	v.next = bdb.MaxVersion()
	v.committed.Store(v.next)
	bdb.SetDiscardTs(v.next) // nobody reads yet
	return v
}

// read opens a read-only transaction on the last committed version; the
// caller ends it with done.
func (v *versions) read() *badger.Txn {
	v.mu.Lock()
	ts := v.committed.Load()
	v.reading[ts]++
	v.mu.Unlock()
	return v.bdb.NewTransactionAt(ts, false)
}

// done discards a transaction from read.
func (v *versions) done(txn *badger.Txn) {
	txn.Discard()
	ts := txn.ReadTs()
	v.mu.Lock()
	if v.reading[ts]--; v.reading[ts] == 0 {
		delete(v.reading, ts)
	}
	v.mu.Unlock()
}

// write opens a read-write transaction on the last committed version, for
// the committer (or Open's replay) to commit with commit.
func (v *versions) write() *badger.Txn {
	return v.bdb.NewTransactionAt(v.committed.Load(), true)
}

// commit commits txn at the next version and, once Badger has applied it,
// makes it what reads see. A failed commit still uses up its version: a
// version Badger may have partly written is never handed out again.
func (v *versions) commit(txn *badger.Txn) error {
	v.next++
	ts := v.next
	if err := txn.CommitAt(ts, nil); err != nil {
		return err
	}
	v.committed.Store(ts)
	v.bdb.SetDiscardTs(v.oldestRead())
	return nil
}

// oldestRead is the oldest version a reader may still need: the oldest
// open snapshot, or the last committed version when nobody reads. A
// reader that opens a snapshot after this returns reads at a version at
// least as new (committed only grows, and read takes it under mu).
func (v *versions) oldestRead() uint64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	oldest := v.committed.Load()
	for ts := range v.reading {
		oldest = min(oldest, ts)
	}
	return oldest
}
