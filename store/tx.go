package store

import "github.com/dgraph-io/badger/v4"

// tx is the only transaction the store's code sees: a Badger transaction
// whose writes go through Set, SetEntry and Delete here, never through the
// Badger transaction itself, so that the store controls everything a
// transaction writes. The raw *badger.Txn is not reachable from a tx: a
// write site that bypassed it would not compile.
type tx struct {
	b *badger.Txn
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

// SetEntry writes e (its key, value, expiry and user meta).
func (t *tx) SetEntry(e *badger.Entry) error { return t.b.SetEntry(e) }

// Delete deletes key.
func (t *tx) Delete(key []byte) error { return t.b.Delete(key) }
