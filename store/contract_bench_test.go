package store_test

import (
	"path/filepath"
	"testing"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

// The embedded baselines of the Redis and PostgreSQL benchmarks
// (plugins/redisstore, store/pghistory): the same operations on Badger,
// with fsync (the default) and without.
func BenchmarkBadgerGateway(b *testing.B) {
	for _, c := range []struct {
		name string
		opts store.Options
	}{{"fsync", store.Options{}}, {"nosync", store.Options{NoSync: true}}} {
		b.Run(c.name, func(b *testing.B) {
			db, err := store.Open(filepath.Join(b.TempDir(), "db"), c.opts)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			storetest.BenchmarkGateway(b, storetest.Gateway{Allowance: db.Allowance(), Claims: db.Claims()})
		})
	}
}

func BenchmarkBadgerHistory(b *testing.B) {
	db, err := store.Open(filepath.Join(b.TempDir(), "db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	storetest.BenchmarkHistory(b, db)
}

func BenchmarkBadgerOwnedRead(b *testing.B) {
	db, err := store.Open(filepath.Join(b.TempDir(), "db"), store.Options{NoSync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	storetest.BenchmarkOwnedRead(b, db, 10000)
}
