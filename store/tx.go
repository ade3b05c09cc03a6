package store

import "github.com/dgraph-io/badger/v4"

// tx is the only transaction the store's code sees: a Badger transaction
// whose writes go through Set, SetEntry and Delete here, never through the
// Badger transaction itself, so that each write Badger accepts is also
// recorded for the write-ahead log (wal.go). The raw *badger.Txn is not
// reachable from a tx: a write site that bypassed the log would not
// compile.
type tx struct {
	b   *badger.Txn
	rec *walRecord // nil: not logged (no log, or a read-only transaction)
	// bytes is about what the writes take on disk (entryBytes each),
	// for the space guard (space.go).
	bytes uint64
}

// Get reads key, seeing the transaction's own pending writes.
func (t *tx) Get(key []byte) (*badger.Item, error) { return t.b.Get(key) }

// NewIterator iterates over the transaction's view (its pending writes
// included); the caller closes it.
func (t *tx) NewIterator(opts badger.IteratorOptions) *badger.Iterator {
	return t.b.NewIterator(opts)
}

// Set writes value under key.
func (t *tx) Set(key, value []byte) error { return t.SetEntry(badger.NewEntry(key, value)) }

// SetEntry writes e (its key, value, expiry and user meta). A group whose
// record would outgrow the log's bound is too big, as when Badger says so:
// the committer splits it.
func (t *tx) SetEntry(e *badger.Entry) error {
	if err := t.b.SetEntry(e); err != nil {
		return err
	}
	t.bytes += entryBytes(e.Key, e.Value)
	if t.rec != nil {
		t.rec.set(e.Key, e.Value, e.ExpiresAt, e.UserMeta)
		if t.rec.full() {
			return badger.ErrTxnTooBig
		}
	}
	return nil
}

// Delete deletes key.
func (t *tx) Delete(key []byte) error {
	if err := t.b.Delete(key); err != nil {
		return err
	}
	t.bytes += entryBytes(key, nil)
	if t.rec != nil {
		t.rec.delete(key)
		if t.rec.full() {
			return badger.ErrTxnTooBig
		}
	}
	return nil
}
