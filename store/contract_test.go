package store_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

// newBadger is the embedded backend of the contract suite: a real Badger
// database in a fresh folder per subtest.
func newBadger(t *testing.T, ttl time.Duration) storetest.Gateway {
	db, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{NoSync: true, ReservationTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return storetest.Gateway{Allowance: db.Allowance(), Claims: db.Claims()}
}

func TestBadgerAllowanceContract(t *testing.T) { storetest.TestAllowance(t, newBadger) }
func TestBadgerClaimsContract(t *testing.T)    { storetest.TestClaims(t, newBadger) }

func TestBadgerHistoryContract(t *testing.T) {
	storetest.TestHistory(t, func(t *testing.T) (storetest.History, storetest.History) {
		db, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db, db
	})
}

func TestBadgerAuthenticatedIndexContract(t *testing.T) {
	storetest.TestAuthenticatedIndex(t, func(t *testing.T) (storetest.AuthenticatedHistory, storetest.AuthenticatedHistory) {
		db, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{NoSync: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		return db, db
	})
}
