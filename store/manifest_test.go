package store

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// TestOpenRefusesDataWithoutManifest: Badger's MANIFEST lists the tables
// that hold the data; without it Badger opens an empty database over them,
// and every claim, id binding, allowance count and nonce is gone (replays
// accepted, agent names taken over). A directory that holds Badger's data
// files or the store's log but no MANIFEST, whether the manifest was lost
// between runs or removed under a running store, is refused by Open and
// Exists with an error naming the directory and saying how to restore;
// nothing in it is changed.
func TestOpenRefusesDataWithoutManifest(t *testing.T) {
	ctx := context.Background()
	const alice, mallory = "0xaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "0xbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	prepare := func(t *testing.T, opts Options, removeWhileOpen bool) string {
		dir := filepath.Join(t.TempDir(), "db")
		db, err := Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		if o, err := db.BindAgent(ctx, "seller-7", alice); err != nil || o != alice {
			t.Fatal(o, err)
		}
		until := time.Now().Add(time.Hour)
		if _, err := db.Claims().Claim(ctx, []string{"payment-1"}, until); err != nil {
			t.Fatal(err)
		}
		if removeWhileOpen {
			if err := os.Remove(filepath.Join(dir, badger.ManifestFilename)); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		if !removeWhileOpen {
			if err := os.Remove(filepath.Join(dir, badger.ManifestFilename)); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	for _, c := range []struct {
		name   string
		opts   Options
		during bool
	}{
		{"removed between runs", Options{}, false},
		{"removed while open", Options{}, true},
		{"removed between runs, no_sync", Options{NoSync: true}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := prepare(t, c.opts, c.during)
			before, _ := os.ReadDir(dir)
			ok, err := Exists(dir)
			if ok || err == nil || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "backup") {
				t.Errorf("Exists = %v, %v; want an error naming the directory and the restore", ok, err)
			}
			db, err := Open(dir, c.opts)
			if err == nil {
				o, _ := db.BindAgent(ctx, "seller-7", mallory)
				db.Close()
				t.Fatalf("Open succeeded on a store without its manifest (seller-7 now bound to %s)", o)
			}
			if !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "backup") {
				t.Errorf("Open's error %q should name the directory and say how to restore", err)
			}
			after, _ := os.ReadDir(dir)
			if len(after) != len(before) {
				t.Errorf("the refused Open changed the directory: %d entries, then %d", len(before), len(after))
			}
		})
	}
	t.Run("a new or empty directory still opens", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "db")
		if ok, err := Exists(dir); ok || err != nil {
			t.Fatalf("Exists of a missing directory: %v, %v", ok, err)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if ok, err := Exists(dir); ok || err != nil {
			t.Fatalf("Exists of an empty directory: %v, %v", ok, err)
		}
		db, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		db.Close()
		if ok, err := Exists(dir); !ok || err != nil {
			t.Fatalf("Exists of a store: %v, %v", ok, err)
		}
	})
}
