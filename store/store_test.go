package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// openTemp opens a real Badger store in a fresh temporary directory and
// closes it when the test ends.
func openTemp(t testing.TB, opts Options) (*DB, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "db")
	db, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	return db, dir
}

// fakeClock replaces the store's clocks for one test: the wall clock (now)
// and the monotonic one (elapsed), which Advance moves together and Step
// tells apart, as a wall-clock step does.
type fakeClock struct {
	mu   sync.Mutex
	t    time.Time
	mono time.Duration
}

func useFakeClock(t *testing.T) *fakeClock {
	t.Helper()
	c := &fakeClock{t: time.Now().UTC()}
	oldNow, oldElapsed := now, elapsed
	now, elapsed = c.Now, c.Elapsed
	t.Cleanup(func() { now, elapsed = oldNow, oldElapsed })
	return c
}

func (c *fakeClock) Elapsed() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

// Step sets the wall clock d ahead (or back) without time passing.
func (c *fakeClock) Step(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mono += d
	c.mu.Unlock()
}

func TestOpen(t *testing.T) {
	ctx := context.Background()

	t.Run("a second Open of the same directory fails while the first is open", func(t *testing.T) {
		_, dir := openTemp(t, Options{})
		if db2, err := Open(dir, Options{}); err == nil {
			db2.Close()
			t.Fatal("second Open of a locked directory succeeded")
		}
	})

	t.Run("operations on a closed store report ErrClosed", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		if err := db.Ping(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Ping after Close = %v, want ErrClosed", err)
		}
		err := db.RecordVerification(ctx, sampleVerification("v1", "a", time.Now(), "pass"))
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("RecordVerification after Close = %v, want ErrClosed", err)
		}
		if _, err := db.Allowance().Reserve(ctx, "p", "c", time.Now(), 1); !errors.Is(err, ErrClosed) {
			t.Fatalf("Reserve after Close = %v, want ErrClosed", err)
		}
	})

	t.Run("concurrent Close calls close Badger once", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := db.Close(); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
		if err := db.Ping(ctx); !errors.Is(err, ErrClosed) {
			t.Fatalf("Ping = %v, want ErrClosed", err)
		}
	})

	t.Run("a store written with an unknown key layout is refused", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "db")
		bdb, err := badger.Open(badger.DefaultOptions(dir).WithLogger(nil))
		if err != nil {
			t.Fatal(err)
		}
		if err := bdb.Update(func(txn *badger.Txn) error { return txn.Set(keyLayoutVersion, []byte{99}) }); err != nil {
			t.Fatal(err)
		}
		bdb.Close()
		if db, err := Open(dir, Options{}); err == nil {
			db.Close()
			t.Fatal("Open accepted layout version 99")
		}
	})

	t.Run("Open creates the directory with owner-only permissions", func(t *testing.T) {
		_, dir := openTemp(t, Options{})
		fi, err := os.Stat(dir)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o700 {
			t.Fatalf("mode %v, want 0700", fi.Mode().Perm())
		}
	})

	t.Run("an in-memory store works without a directory", func(t *testing.T) {
		db, err := Open("", Options{InMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if err := db.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

func TestShared(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")

	a, err := Shared(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// A differently spelled path to the same directory gets the same
	// database: this is what a config reload does.
	b, err := Shared(filepath.Join(dir, "..", "db"), Options{})
	if err != nil {
		t.Fatalf("second Shared of the same directory: %v", err)
	}
	if err := a.RecordVerification(ctx, sampleVerification("v1", "agent", time.Now(), "pass")); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil { // a second Close of one handle must not release b's reference
		t.Fatal(err)
	}
	if _, err := b.Verification(ctx, "v1"); err != nil {
		t.Fatalf("the other handle lost the database when the first closed: %v", err)
	}
	if err := b.Destruct(); err != nil {
		t.Fatal(err)
	}
	if err := b.Ping(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping after the last reference closed = %v, want ErrClosed", err)
	}
	// The directory is unlocked again.
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open after the last shared handle closed: %v", err)
	}
	db.Close()
}
