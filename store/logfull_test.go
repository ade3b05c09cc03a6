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

// TestStoreRecoversAfterALogWriteFails: a write to the store's log fails
// (here for real: the log's next chunk does not fit on a full tmpfs). The
// group whose write failed gets the error, and the store takes writes
// again by itself once the log can be written, without a restart that
// verifierd's /health would never ask for. The recovery empties the log
// at a new epoch after syncing Badger, so a later crash replays only what
// came after it: a claim released after the recovery stays released
// after the replay.
func TestStoreRecoversAfterALogWriteFails(t *testing.T) {
	if root := os.Getenv("STORE_LOGFULL_ROOT"); root != "" {
		logFullChild(t, root)
		return
	}
	root := servers.Tmpfs(t, "160m")
	out, err := servers.InChild(t, "TestStoreRecoversAfterALogWriteFails", "STORE_LOGFULL_ROOT="+root)
	if err != nil {
		t.Fatalf("the writing process failed (%v):\n%s", err, out)
	}
	var acked int
	if i := strings.Index(out, "ACKED "); i < 0 {
		t.Fatalf("no count from the child:\n%s", out)
	} else {
		fmt.Sscan(out[i+len("ACKED "):], &acked)
	}
	// The child ended without closing the store, as a crash does: this
	// Open replays the log.
	db, err := Open(filepath.Join(root, "db"), smallFiles)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	until := time.Now().Add(time.Hour)
	for i := range acked {
		if _, err := db.Claims().Claim(ctx, []string{logFullName(i)}, until); !errors.Is(err, ErrClaimed) {
			t.Fatalf("acknowledged claim %d of %d after the replay: %v", i, acked, err)
		}
	}
	if _, err := db.Claims().Claim(ctx, []string{"released"}, until); err != nil {
		t.Fatalf("a claim released after the recovery is back after the replay: %v", err)
	}
}

func logFullName(i int) string { return fmt.Sprintf("payment-%06d-%s", i, strings.Repeat("x", 200)) }

func logFullChild(t *testing.T, root string) {
	ctx := context.Background()
	db, err := Open(filepath.Join(root, "db"), smallFiles)
	if err != nil {
		t.Fatal(err)
	}
	// The guard is turned down to nothing so that the disk fills under
	// the log itself: what another process taking the last space does.
	db.commits.space.reserve = 0
	until := time.Now().Add(time.Hour)
	released, err := db.Claims().Claim(ctx, []string{"released"}, until)
	if err != nil {
		t.Fatal(err)
	}
	// Up to the end of the log's allocated chunk: the next record needs
	// another, which a full disk refuses.
	log, n := db.commits.log, 0
	for ; log.filled-log.off > 4096; n++ {
		if _, err := db.Claims().Claim(ctx, []string{logFullName(n)}, until); err != nil {
			t.Fatal(err)
		}
	}
	filler := filepath.Join(root, "filler")
	servers.FillLeaving(t, filler, 256<<10)
	time.Sleep(spaceRecheck)
	for ; ; n++ {
		if _, err = db.Claims().Claim(ctx, []string{logFullName(n)}, until); err != nil {
			break
		}
	}
	if errors.Is(err, ErrDiskFull) || errors.Is(err, ErrWritesHalted) {
		t.Fatalf("the group whose log write failed got %v, want the log's error", err)
	}
	t.Logf("claim %d: %v", n, err)
	if _, err := db.Claims().Lookup(ctx, logFullName(0)); err != nil {
		t.Fatalf("read after the failure: %v", err)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	time.Sleep(spaceRecheck)
	// The failed claim's outcome is unknown to its caller: it is not
	// counted, and not asked for again.
	n++
	if _, err := db.Claims().Claim(ctx, []string{logFullName(n)}, until); err != nil {
		t.Fatalf("a write once the log could be written again: %v", err)
	}
	if err := db.Claims().Release(ctx, released); err != nil {
		t.Fatal(err)
	}
	// Claims 0..n-2 and n are acknowledged; n-1 failed. Renumber the one
	// after the failure so the parent counts a contiguous run.
	if _, err := db.Claims().Claim(ctx, []string{logFullName(n - 1)}, until); err != nil && !errors.Is(err, ErrClaimed) {
		t.Fatal(err)
	}
	fmt.Printf("ACKED %d\n", n+1)
	// No Close: the parent opens the store as after a crash.
}
