package store

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// TestLayout1Migrates: a database of key layout 1 (no authenticated
// index) gets the index built from its agents' records when opened, and
// is marked layout 2 afterwards; durable (the index written through the
// write-ahead log) and not.
func TestLayout1Migrates(t *testing.T) {
	for _, opts := range []Options{{NoSync: true}, {}} {
		t.Run(fmt.Sprintf("nosync=%v", opts.NoSync), func(t *testing.T) { testLayout1Migrates(t, opts) })
	}
}

func testLayout1Migrates(t *testing.T, opts Options) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")
	db, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	for i, auth := range []bool{true, false, true, false} {
		v := Verification{ID: string(rune('a' + i)), VerifiedAt: at.Add(time.Duration(i) * time.Second), AgentID: "seller-7",
			TaskID: "t", Result: "pass", Payment: PaymentFree, Authenticated: auth}
		if auth {
			v.Wallet = "0xowner"
		}
		if err := db.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	// Make it what layout 1 wrote: no 'u' keys, version 1.
	err = db.update(ctx, func(txn *tx) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tagAuthenticated}})
		var keys [][]byte
		for it.Rewind(); it.Valid(); it.Next() {
			keys = append(keys, it.Item().KeyCopy(nil))
		}
		it.Close()
		if len(keys) != 2 {
			t.Fatalf("%d index keys before the downgrade, want 2", len(keys))
		}
		for _, k := range keys {
			if err := txn.Delete(k); err != nil {
				return err
			}
		}
		return txn.Set(keyLayoutVersion, []byte{1})
	})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := db.AuthenticatedVerifications(ctx, "seller-7", "", 10); err != nil || len(got) != 0 {
		t.Fatalf("the downgraded index still lists %v (%v)", got, err)
	}
	db.Close()

	db, err = Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got, _, err := db.AuthenticatedVerifications(ctx, "seller-7", "", 10)
	if err != nil || len(got) != 2 || got[0].ID != "c" || got[1].ID != "a" || !got[0].Authenticated {
		t.Fatalf("after the migration: %+v, %v; want c and a", got, err)
	}
	err = db.view(ctx, func(txn *tx) error {
		item, err := txn.Get(keyLayoutVersion)
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error {
			if len(v) != 1 || v[0] != layoutVersion {
				t.Errorf("layout version %v after the migration, want %d", v, layoutVersion)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}
