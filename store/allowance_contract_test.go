package store_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

// TestBadgerAllowanceFlushContract runs the Allowance contract on the
// embedded store with batched flushing on: the weaker durability changes
// nothing a running process can observe.
func TestBadgerAllowanceFlushContract(t *testing.T) {
	storetest.TestAllowance(t, func(t *testing.T, ttl time.Duration) storetest.Gateway {
		db, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{NoSync: true, ReservationTTL: ttl, AllowanceFlush: 10 * time.Millisecond, AllowanceFlushUnits: 3})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return storetest.Gateway{Allowance: db.Allowance(), Claims: db.Claims()}
	})
}
