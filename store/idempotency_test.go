package store_test

import (
	"path/filepath"
	"testing"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

func TestBadgerPaymentIDsContract(t *testing.T) {
	storetest.TestPaymentIDs(t, func(t *testing.T) store.PaymentIDs {
		db, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db.PaymentIDs()
	})
}

// BenchmarkBadgerPaymentIDs: Badger with fsync (the default), against its
// own claim in the same run.
func BenchmarkBadgerPaymentIDs(b *testing.B) {
	db, err := store.Open(filepath.Join(b.TempDir(), "db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	storetest.BenchmarkPaymentIDs(b, db.PaymentIDs(), db.Claims())
}
