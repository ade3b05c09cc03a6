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
