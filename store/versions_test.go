package store

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/y"
)

// versionsOf counts the versions Badger holds of key, reading every one.
func versionsOf(t *testing.T, db *DB, key []byte) int {
	t.Helper()
	txn := db.bdb.NewTransactionAt(^uint64(0), false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{AllVersions: true, Prefix: key})
	defer it.Close()
	n := 0
	for it.Rewind(); it.Valid(); it.Next() {
		if string(it.Item().Key()) == string(key) {
			n++
		}
	}
	return n
}

func setValue(t *testing.T, db *DB, key []byte, value string) {
	t.Helper()
	if err := db.update(context.Background(), func(txn *tx) error { return txn.Set(key, []byte(value)) }); err != nil {
		t.Fatal(err)
	}
}

func getValue(txn *badger.Txn, key []byte) (string, error) {
	item, err := txn.Get(key)
	if err != nil {
		return "", err
	}
	v, err := item.ValueCopy(nil)
	return string(v), err
}

// compacted writes filler to db (opened with a small memTableSize) until
// every version of key written so far has been flushed to a table and
// compacted out of level 0 (both run in Badger's background): whatever
// compaction discards of key is gone then. Filler keys sort before key,
// so a level-0 table that spans key holds some of its versions.
func compacted(t *testing.T, db *DB, key []byte) {
	t.Helper()
	written := db.vers.committed.Load()
	filler := make([]byte, 64<<10)
	for i := 0; ; i++ {
		setValue(t, db, []byte(fmt.Sprintf("test-filler-%06d", i)), string(filler))
		flushed, inL0 := uint64(0), false
		for _, ti := range db.bdb.Tables() {
			flushed = max(flushed, ti.MaxVersion)
			if ti.Level == 0 && bytes.Compare(y.ParseKey(ti.Left), key) <= 0 && bytes.Compare(key, y.ParseKey(ti.Right)) <= 0 {
				inL0 = true
			}
		}
		if flushed >= written && !inL0 {
			return
		}
		if i == 20_000 {
			t.Fatal("Badger did not compact the key's tables")
		}
	}
}

// smallMemtables makes Badger flush a memtable every 8 MiB (the least
// that holds a batch above Badger's value threshold).
var smallMemtables = Options{NoSync: true, memTableSize: 8 << 20}

// TestVersionsDiscardOld: with the store's own versions (Badger in managed
// mode), compaction still drops the versions nobody can read any more: a
// key rewritten many times keeps one version, as Badger's own oracle
// would leave it. Without SetDiscardTs every version would stay forever.
func TestVersionsDiscardOld(t *testing.T) {
	db, _ := openTemp(t, smallMemtables)
	key := []byte("test-rewritten")
	for i := range 50 {
		setValue(t, db, key, fmt.Sprint(i))
	}
	if n := versionsOf(t, db, key); n != 50 {
		t.Fatalf("%d versions before compaction, want 50", n)
	}
	compacted(t, db, key)
	if n := versionsOf(t, db, key); n != 1 {
		t.Fatalf("%d versions after compaction, want 1", n)
	}
	if err := db.view(context.Background(), func(txn *tx) error {
		v, err := getValue(txn.b, key)
		if err == nil && v != "49" {
			err = fmt.Errorf("value %q, want the last one, 49", v)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// TestVersionsKeepWhatAReaderSees: a read snapshot still open when newer
// versions are written and compacted keeps reading the version it began
// on (what Badger's read watermark guaranteed, and versions.oldestRead
// now does).
func TestVersionsKeepWhatAReaderSees(t *testing.T) {
	db, _ := openTemp(t, smallMemtables)
	key := []byte("test-rewritten")
	setValue(t, db, key, "old")
	reader := db.vers.read()
	for i := range 50 {
		setValue(t, db, key, fmt.Sprint("new-", i))
	}
	compacted(t, db, key)
	v, err := getValue(reader, key)
	db.vers.done(reader)
	if err != nil || v != "old" {
		t.Fatalf("the open snapshot reads %q, %v; want old", v, err)
	}
	if n := versionsOf(t, db, key); n != 51 {
		t.Fatalf("%d versions kept under the snapshot, want 51 (compaction drops none above the oldest reader)", n)
	}
}

// TestVersionsOpenAStoreBadgerVersioned: a database whose versions Badger
// assigned (written before the store kept its own, or by Badger's own
// tools) opens with its versions in place, and every write after is
// newer than them: it is the value read, before and after a reopen.
func TestVersionsOpenAStoreBadgerVersioned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	bdb, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("test-key")
	for i := range 20 {
		if err := bdb.Update(func(txn *badger.Txn) error { return txn.Set(key, []byte(fmt.Sprint("badger-", i))) }); err != nil {
			t.Fatal(err)
		}
	}
	if err := bdb.Close(); err != nil {
		t.Fatal(err)
	}
	for _, opts := range []Options{{}, {NoSync: true}} {
		db, err := Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprint("store-", opts.NoSync)
		setValue(t, db, key, want)
		read := func(db *DB) {
			t.Helper()
			if err := db.view(context.Background(), func(txn *tx) error {
				v, err := getValue(txn.b, key)
				if err == nil && v != want {
					err = fmt.Errorf("read %q, want %q", v, want)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		read(db)
		db.Close()
		if db, err = Open(dir, opts); err != nil {
			t.Fatal(err)
		}
		read(db)
		db.Close()
	}
}
