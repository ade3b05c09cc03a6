package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
)

// smallFiles are Badger files small enough that a 160 MiB tmpfs holds the
// store's reserve (about 50 MiB) three times over.
var smallFiles = Options{memTableSize: 8 << 20, valueLogFileSize: 1 << 20}

// TestDiskFullRefusesWrites: the disk holding the store fills while it
// takes claims. Badger writes through memory-mapped files whose pages are
// allocated only when first written, so a write on a full disk would be a
// SIGBUS that kills the process. The store refuses writes while less than
// its reserve is free: each refused write is ErrDiskFull, reads go on,
// Close works, and once space is freed writes resume by themselves; every
// acknowledged claim is there after a reopen.
func TestDiskFullRefusesWrites(t *testing.T) {
	servers.InChildOnTmpfs(t, "160m", diskFullChild)
}

func diskFullChild(t *testing.T, root string) {
	ctx := context.Background()
	dir := filepath.Join(root, "db")
	for _, noSync := range []bool{false, true} {
		opts := smallFiles
		opts.NoSync = noSync
		db, err := Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		reserve := db.commits.space.reserve
		filler := filepath.Join(root, "filler")
		// Less free than the reserve, more than what Badger's flush of
		// what it holds needs: the state the reserve keeps a disk in.
		servers.FillLeaving(t, filler, reserve/2)
		time.Sleep(spaceRecheck) // space taken by others is seen within it
		until := time.Now().Add(time.Hour)
		name := func(i int) string {
			return fmt.Sprintf("nosync=%v payment-%06d-%s", noSync, i, strings.Repeat("x", 200))
		}
		n := 0
		for ; n < 100000; n++ {
			if _, err = db.Claims().Claim(ctx, []string{name(n)}, until); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrDiskFull) {
			t.Fatalf("nosync=%v: after %d claims on a full disk: %v, want ErrDiskFull", noSync, n, err)
		}
		if n > 0 {
			t.Fatalf("nosync=%v: %d claims taken with less than the reserve free", noSync, n)
		}
		if _, err := db.Claims().Claim(ctx, []string{name(n)}, until); !errors.Is(err, ErrDiskFull) {
			t.Fatalf("second refused write: %v", err)
		}
		if _, ok := getKey(t, db, string(keyLayoutVersion)); !ok {
			t.Fatal("read while writes are refused: the layout version is missing")
		}
		if err := db.Ping(ctx); !errors.Is(err, ErrDiskFull) {
			t.Fatalf("health check while writes are refused: %v, want ErrDiskFull", err)
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		time.Sleep(spaceRecheck + 10*time.Millisecond)
		if _, err := db.Claims().Claim(ctx, []string{name(n)}, until); err != nil {
			t.Fatalf("nosync=%v: write once space was freed: %v", noSync, err)
		}
		// Now fill while writing: the store itself runs the disk down.
		servers.FillLeaving(t, filler, reserve+4<<20)
		acked := 1
		for ; acked < 200000; acked++ {
			if _, err = db.Claims().Claim(ctx, []string{name(n + acked)}, until); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrDiskFull) {
			t.Fatalf("nosync=%v: after %d claims filling the disk: %v, want ErrDiskFull", noSync, acked, err)
		}
		if err := db.Close(); err != nil {
			t.Fatalf("close on a full disk: %v", err)
		}
		if err := os.Remove(filler); err != nil {
			t.Fatal(err)
		}
		db, err = Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		for i := range acked {
			if _, err := db.Claims().Claim(ctx, []string{name(n + i)}, until); !errors.Is(err, ErrClaimed) {
				t.Fatalf("nosync=%v: acknowledged claim %d of %d after reopening: %v", noSync, i, acked, err)
			}
		}
		t.Logf("nosync=%v: reserve %d MiB; %d claims acknowledged before the disk was full", noSync, reserve>>20, acked)
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
