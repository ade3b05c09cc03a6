package store

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
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
	// Make it what layout 1 wrote: JSON records, no 'u' keys, version 1.
	err = db.update(ctx, func(txn *tx) error {
		if err := recordsToJSON(txn); err != nil {
			return err
		}
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
	checkLayoutVersion(t, db)
}

// TestLayout2Migrates: a database of key layout 2 (every record JSON) is
// marked layout 3 when opened, reads its JSON records as before, and takes
// binary ones beside them: pages mix both, and a JSON record's pending
// payment is settled like any other.
func TestLayout2Migrates(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	old := sampleVerification("3f1c2b9e-6f0a-4a7e-9d7c-2f7c1f1e8a11", "seller-7", at, "pass")
	old.Payment, old.Payer = PaymentPending, "0xpayer"
	if err := db.RecordVerification(ctx, old); err != nil {
		t.Fatal(err)
	}
	err = db.update(ctx, func(txn *tx) error {
		if err := recordsToJSON(txn); err != nil {
			return err
		}
		if err := txn.Set(keyLayoutVersion, []byte{2}); err != nil {
			return err
		}
		item, err := txn.Get(recordKey(old.ID))
		if err != nil {
			return err
		}
		return item.Value(func(b []byte) error {
			if b[0] != '{' {
				t.Fatalf("the downgraded record is not JSON: %q", b)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	db.Close()

	db, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	checkLayoutVersion(t, db)
	if got, err := db.Verification(ctx, old.ID); err != nil || !reflect.DeepEqual(got, old) {
		t.Fatalf("the JSON record reads %+v (%v), want %+v", got, err, old)
	}
	if err := db.SetPayment(ctx, old.ID, PaymentPaid); err != nil {
		t.Fatal(err)
	}
	fresh := sampleVerification("7a0c9d2e-1b3f-4c5d-8e6f-0a1b2c3d4e5f", "seller-7", at.Add(time.Second), "fail")
	if err := db.RecordVerification(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	old.Payment = PaymentPaid
	page, _, err := db.Verifications(ctx, "seller-7", "", 10)
	if err != nil || !reflect.DeepEqual(page, []Verification{fresh, old}) {
		t.Fatalf("page %+v (%v), want %+v and %+v", page, err, fresh, old)
	}
	if c, err := db.AgentCounts(ctx, "seller-7"); err != nil || c.Pass != 1 || c.Fail != 1 || c.Paid != 1 {
		t.Fatalf("counts %+v (%v), want 1 pass (paid) and 1 fail", c, err)
	}
}

// recordsToJSON rewrites every record as earlier layouts stored it.
func recordsToJSON(txn *tx) error {
	for _, tag := range []byte{tagRecord, tagAgent, tagAuthenticated} {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{tag}})
		type kv struct{ k, v []byte }
		var all []kv
		for it.Rewind(); it.Valid(); it.Next() {
			var v Verification
			if err := it.Item().Value(func(b []byte) error { return decodeRecord(b, &v) }); err != nil {
				it.Close()
				return err
			}
			j, err := json.Marshal(v)
			if err != nil {
				it.Close()
				return err
			}
			all = append(all, kv{it.Item().KeyCopy(nil), j})
		}
		it.Close()
		for _, e := range all {
			if err := txn.Set(e.k, e.v); err != nil {
				return err
			}
		}
	}
	return nil
}

func checkLayoutVersion(t *testing.T, db *DB) {
	t.Helper()
	err := db.view(context.Background(), func(txn *tx) error {
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
