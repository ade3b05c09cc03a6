package pghistory

import (
	"context"
	"testing"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store/storetest"
)

// BenchmarkPostgresHistory runs the history benchmarks of store/storetest
// on a local PostgreSQL with fsync and synchronous commit on, as
// BenchmarkBadgerHistory runs Badger with fsync.
func BenchmarkPostgresHistory(b *testing.B) {
	srv := servers.StartPostgres(b, "-c", "fsync=on", "-c", "synchronous_commit=on")
	ctx := context.Background()
	h, err := Open(ctx, srv.DSN, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	storetest.BenchmarkHistory(b, h)
}

// BenchmarkPostgresOwnedRead is storetest.BenchmarkOwnedRead on a fresh
// database (fsync off: the reads are what is measured).
func BenchmarkPostgresOwnedRead(b *testing.B) {
	srv := servers.StartPostgres(b)
	ctx := context.Background()
	h, err := Open(ctx, srv.DSN, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	storetest.BenchmarkOwnedRead(b, h, 10000)
}
