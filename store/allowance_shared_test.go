package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// countOnDisk reads the committed count of client's day straight from
// Badger, past the in-memory counts.
func countOnDisk(t *testing.T, db *DB, client string) int {
	t.Helper()
	k, _ := dayOf("verify", client, crashDay)
	var n int
	err := db.view(context.Background(), func(txn *tx) error {
		item, err := txn.Get(k.key())
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		return item.Value(func(b []byte) error {
			n, _, err = decodeAllowance(b)
			return err
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestSharedHandlesCommitAsTheyAsk: handles from Shared on one folder
// count in the same client-days, but each commits as its own options say.
// The first opener (in Caddy, a wallet_auth with the default store) does
// not make a later handle's batched counts durable one by one, nor the
// other way round; handles asking alike share one flusher (one loss
// bound), and each one's Close writes what it batched.
func TestSharedHandlesCommitAsTheyAsk(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	durable, err := Shared(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer durable.Close()
	batchOpts := Options{AllowanceFlush: time.Hour, AllowanceFlushUnits: 1000}
	batched, err := Shared(dir, batchOpts)
	if err != nil {
		t.Fatal(err)
	}
	again, err := Shared(dir, batchOpts)
	if err != nil {
		t.Fatal(err)
	}
	if again.allow != batched.allow {
		t.Fatal("two handles asking for the same batching got two flushers (two loss bounds)")
	}
	if durable.allow == batched.allow {
		t.Fatal("the durable and the batched handle share one way of committing")
	}

	commitUnits(t, batched.Allowance(), "b", 3)
	commitUnits(t, again.Allowance(), "b", 2)
	if n := countOnDisk(t, durable, "b"); n != 0 {
		t.Fatalf("%d batched units on disk before any flush (interval 1 h), want 0: the handle committed durably", n)
	}
	commitUnits(t, durable.Allowance(), "d", 4)
	if n := countOnDisk(t, durable, "d"); n != 4 {
		t.Fatalf("%d of 4 durable units on disk, want 4", n)
	}

	// One count per client-day, whichever handle asks.
	for _, h := range []*DB{durable, batched} {
		rem, err := h.Allowance().Remaining(context.Background(), "verify", "b", crashDay, 10)
		if err != nil {
			t.Fatal(err)
		}
		if rem != 5 {
			t.Fatalf("remaining %d of 10 after 5 batched commits, want 5", rem)
		}
	}
	// A durable commit on a batched client-day writes the whole count.
	commitUnits(t, durable.Allowance(), "b", 1)
	if n := countOnDisk(t, durable, "b"); n != 6 {
		t.Fatalf("%d units of b on disk after a durable commit, want all 6", n)
	}
	commitUnits(t, batched.Allowance(), "b", 1)

	// The first of the two batched handles to close leaves the flusher to
	// the other; the last one writes everything it batched while the
	// database stays open.
	if err := batched.Close(); err != nil {
		t.Fatal(err)
	}
	if n := countOnDisk(t, durable, "b"); n != 6 {
		t.Fatalf("%d units of b on disk after one of two batched handles closed, want 6 (the flush is the last one's)", n)
	}
	commitUnits(t, again.Allowance(), "b", 1)
	if err := again.Close(); err != nil {
		t.Fatal(err)
	}
	if n := countOnDisk(t, durable, "b"); n != 8 {
		t.Fatalf("%d of 8 units of b on disk after the batched handles closed, want 8", n)
	}
	if err := again.Allowance().Commit(context.Background(), Reservation{Pool: "verify", Client: "b", Day: "2026-11-29", ID: formatReservationID(1)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("commit on a closed batched handle: %v, want ErrClosed", err)
	}
}

// TestSharedBatchedReopensDurable: a config reload that turns batching off
// (a new handle asking for durable counts while the old batched one is
// still open) commits durably at once; the old handle's counts are
// written when it closes.
func TestSharedBatchedReopensDurable(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	old, err := Shared(dir, Options{AllowanceFlush: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	commitUnits(t, old.Allowance(), "c", 2)
	reloaded, err := Shared(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	commitUnits(t, reloaded.Allowance(), "c", 1)
	if n := countOnDisk(t, reloaded, "c"); n != 3 {
		t.Fatalf("%d units on disk after the reloaded handle's durable commit, want 3", n)
	}
	commitUnits(t, old.Allowance(), "c", 1)
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if n := countOnDisk(t, reloaded, "c"); n != 4 {
		t.Fatalf("%d of 4 units on disk after the old handle closed, want 4", n)
	}
	if err := reloaded.Close(); err != nil {
		t.Fatal(err)
	}
}
