package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// commitUnits reserves and commits n units of client, failing the test on
// any error.
func commitUnits(t *testing.T, al Allowance, client string, n int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		r, err := al.Reserve(ctx, "verify", client, crashDay, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if err := al.Commit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
}

// usedOnDisk reopens the database in dir and reports the units on disk for
// client: read against a limit no test reaches (the kill test's child
// commits against 1<<30 too), so the count is never clipped.
func usedOnDisk(t *testing.T, dir, client string) int {
	t.Helper()
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const limit = 1 << 30
	rem, err := db.Allowance().Remaining(context.Background(), "verify", client, crashDay, limit)
	if err != nil {
		t.Fatal(err)
	}
	return limit - rem
}

// TestAllowanceFlushLossBound crashes a store in batched mode (the flusher
// stopped without writing, Badger then closed as a kill leaves it) and
// counts what survived: exactly the units of the flushes the unit bound
// forced, so a crash lost fewer than AllowanceFlushUnits units, and never
// more units than were committed.
func TestAllowanceFlushLossBound(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	const bound = 10
	// The interval never fires: only the unit bound flushes.
	db, err := Open(dir, Options{AllowanceFlush: time.Hour, AllowanceFlushUnits: bound})
	if err != nil {
		t.Fatal(err)
	}
	commitUnits(t, db.Allowance(), "c", 25)
	db.allow.crash()
	db.Close()
	// Commits 11 and 21 each waited for a flush of the 10 before them.
	if used := usedOnDisk(t, dir, "c"); used != 20 {
		t.Fatalf("%d of 25 committed units survived the crash, want the 20 the bound of %d forced to disk", used, bound)
	}
}

// TestAllowanceFlushCloseWritesEverything: a clean Close loses nothing.
func TestAllowanceFlushCloseWritesEverything(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	db, err := Open(dir, Options{AllowanceFlush: time.Hour, AllowanceFlushUnits: 1000})
	if err != nil {
		t.Fatal(err)
	}
	commitUnits(t, db.Allowance(), "c", 7)
	db.Close()
	if used := usedOnDisk(t, dir, "c"); used != 7 {
		t.Fatalf("%d of 7 units after a clean close, want 7", used)
	}
	// A commit after Close is refused, never acknowledged unwritten.
	if err := db.Allowance().Commit(context.Background(), Reservation{Pool: "verify", Client: "c", Day: "2026-11-29", ID: formatReservationID(1)}); !errors.Is(err, ErrClosed) {
		t.Fatalf("commit after close: %v, want ErrClosed", err)
	}
}

// TestAllowanceFlushInterval: without a Close or the unit bound, a commit
// reaches the disk by the interval's flush.
func TestAllowanceFlushInterval(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "db"), Options{AllowanceFlush: 20 * time.Millisecond, AllowanceFlushUnits: 1000})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	commitUnits(t, db.Allowance(), "c", 3)
	deadline := time.Now().Add(20 * time.Second) // a bound for a stuck flusher, not a speed test
	for {
		onDisk := countOnDisk(t, db, "c")
		if onDisk == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s the disk holds %d of 3 committed units", onDisk)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAllowanceFlushFailureRefusesCommits: when the flush a commit waits for
// fails, the commit is refused with the error instead of waiting forever
// or being acknowledged past the bound.
func TestAllowanceFlushFailureRefusesCommits(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "db"), Options{AllowanceFlush: time.Hour, AllowanceFlushUnits: 2})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	al := db.Allowance()
	commitUnits(t, al, "c", 2)
	r, err := al.Reserve(ctx, "verify", "c", crashDay, 1000)
	if err != nil {
		t.Fatal(err)
	}
	// The fault: Badger goes away under the store (a disk the store can
	// no longer write), so the forced flush fails.
	if err := db.bdb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := al.Commit(ctx, r); err == nil {
		t.Fatal("a commit past the bound was acknowledged although its flush failed")
	}
	db.allow.crash()
}

// TestAllowanceFlushConcurrent: many goroutines commit on a few clients in
// batched mode; after a clean close every acknowledged unit is on disk and
// no unit is counted twice.
func TestAllowanceFlushConcurrent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	db, err := Open(dir, Options{NoSync: true, AllowanceFlush: time.Millisecond, AllowanceFlushUnits: 5})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() { commitUnits(t, db.Allowance(), fmt.Sprint("c", g%4), 50) })
	}
	wg.Wait()
	db.Close()
	for c := range 4 {
		if used := usedOnDisk(t, dir, fmt.Sprint("c", c)); used != 200 {
			t.Errorf("client c%d: %d units on disk, want 200", c, used)
		}
	}
}

// TestAllowanceEvictsCleanDays: past maxCleanPerShard client-days in one
// shard, the clean ones are dropped from memory, and their counts read back
// from disk.
func TestAllowanceEvictsCleanDays(t *testing.T) {
	db, err := Open(filepath.Join(t.TempDir(), "db"), Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a := db.allow
	target := &a.shards[0]
	var clients []string
	for i := 0; len(clients) < maxCleanPerShard+10; i++ {
		c := strconv.Itoa(i)
		if k, _ := dayOf("verify", c, crashDay); a.shard(k) == target {
			clients = append(clients, c)
		}
	}
	ctx := context.Background()
	for _, c := range clients {
		r, err := a.Reserve(ctx, "verify", c, crashDay, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Commit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	target.mu.Lock()
	held := len(target.days)
	target.mu.Unlock()
	if held >= len(clients) {
		t.Fatalf("the shard holds all %d client-days, want the clean ones dropped past %d", held, maxCleanPerShard)
	}
	for _, c := range clients {
		if _, err := a.Reserve(ctx, "verify", c, crashDay, 1); !errors.Is(err, ErrExhausted) {
			t.Fatalf("client %s after eviction: %v, want ErrExhausted (its used unit is on disk)", c, err)
		}
	}
}

// flushChildEnv, when set to a directory, makes TestAllowanceFlushSurvivesKill
// the child that commits into it.
const flushChildEnv = "STORE_FLUSH_CHILD_DIR"

// killBound is the AllowanceFlushUnits of the child.
const killBound = 40

// TestAllowanceFlushSurvivesKill kills (SIGKILL) a child committing from many
// goroutines in batched mode and checks the bound on what it lost: the
// units it acknowledged and the disk lacks are at most AllowanceFlushUnits,
// and the disk never holds more than it committed.
func TestAllowanceFlushSurvivesKill(t *testing.T) {
	if dir := os.Getenv(flushChildEnv); dir != "" {
		flushChild(dir)
		return
	}
	dir := filepath.Join(t.TempDir(), "db")
	cmd, out := startChild(t, "TestAllowanceFlushSurvivesKill", flushChildEnv, dir)
	acked := killAfterAcks(t, cmd, out, 2000)
	acks := map[string]int{}
	for _, client := range acked {
		acks[client]++
	}
	lost := 0
	for client, n := range acks {
		used := usedOnDisk(t, dir, client)
		// A commit can be on disk before its line was printed: one per
		// goroutine of the client.
		if used > n+flushGoroutines/flushClients {
			t.Errorf("client %s: %d units on disk, only %d (+%d in flight) committed", client, used, n, flushGoroutines/flushClients)
		}
		lost += max(0, n-used)
	}
	if lost > killBound {
		t.Fatalf("the kill lost %d acknowledged units, more than the bound of %d", lost, killBound)
	}
	t.Logf("%d acknowledged units, %d lost by the kill (bound %d)", len(acked), lost, killBound)
}

const flushGoroutines, flushClients = 12, 4

func flushChild(dir string) {
	db, err := Open(dir, Options{AllowanceFlush: 50 * time.Millisecond, AllowanceFlushUnits: killBound})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	ctx := context.Background()
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := range flushGoroutines {
		client := fmt.Sprint("c", g%flushClients)
		wg.Go(func() {
			for {
				r, err := db.Allowance().Reserve(ctx, "verify", client, crashDay, 1<<30)
				if err == nil && db.Allowance().Commit(ctx, r) == nil {
					mu.Lock()
					fmt.Println("ack", client)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
}

// crash stops the flusher without writing what it holds, as a killed
// process would. The fault the loss-bound tests cause.
func (a *allowances) crash() {
	if a.every <= 0 {
		return
	}
	a.closeOnce.Do(func() {
		a.fmu.Lock()
		a.closing = true
		a.flushed.Broadcast()
		a.fmu.Unlock()
		close(a.stop)
		<-a.stopped
	})
}
