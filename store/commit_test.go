package store

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// crashChildEnv, when set to a directory, makes
// TestAcknowledgedWritesSurviveKill the child that writes into it.
const crashChildEnv = "STORE_CRASH_CHILD_DIR"

// TestAcknowledgedWritesSurviveKill re-runs this test binary as a child that
// writes from many goroutines (history records, allowance reserve+commit,
// payment claims) and prints a line for each write only after the store
// acknowledged it. The parent kills the child with SIGKILL in mid-stream,
// reopens the database and finds every acknowledged write.
func TestAcknowledgedWritesSurviveKill(t *testing.T) {
	if dir := os.Getenv(crashChildEnv); dir != "" {
		crashChild(dir)
		return
	}
	dir := filepath.Join(t.TempDir(), "db")
	cmd, out := startChild(t, "TestAcknowledgedWritesSurviveKill", crashChildEnv, dir)
	acks := killAfterAcks(t, cmd, out, 300)

	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("reopening after the kill: %v", err)
	}
	defer db.Close()
	ctx := context.Background()
	commits := map[string]int{}
	for _, a := range acks {
		kind, id, _ := strings.Cut(a, " ")
		switch kind {
		case "record":
			if _, err := db.Verification(ctx, id); err != nil {
				t.Errorf("acknowledged verification %s is lost: %v", id, err)
			}
		case "claim":
			if _, err := db.Claims().Lookup(ctx, id); err != nil {
				t.Errorf("acknowledged claim %s is lost: %v", id, err)
			}
		case "commit":
			commits[id]++
		default:
			t.Fatalf("unknown acknowledgement %q", a)
		}
	}
	for client, n := range commits {
		rem, err := db.Allowance().Remaining(ctx, "verify", client, crashDay, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if used := 1000 - rem; used < n {
			t.Errorf("client %s: %d allowance units acknowledged as committed, %d survived", client, n, used)
		}
	}
	t.Logf("%d acknowledged writes, all found after SIGKILL", len(acks))
}

// TestStaleLogNotReplayedAfterNoSyncRun: a durable store is killed with
// records in its write-ahead log (Badger has them too: a kill loses no
// page cache), runs a while NoSync (Caddy's no_sync, verifierd -no-sync),
// and is opened durable again. The log must not outlive the NoSync run:
// replayed then, its old records would set the newer allowance counts
// back, and the clients would get those free calls a second time.
func TestStaleLogNotReplayedAfterNoSyncRun(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "db")
	cmd, out := startChild(t, "TestAcknowledgedWritesSurviveKill", crashChildEnv, dir)
	killAfterAcks(t, cmd, out, 300)
	if n := liveLogRecords(t, dir); n == 0 {
		t.Fatal("the kill left no record in the log: the test proves nothing")
	}

	ctx := context.Background()
	clients := []string{"c1", "c4", "c7", "c10"} // crashChild's allowance writers
	db, err := Open(dir, Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{}
	for _, c := range clients {
		for range 5 {
			r, err := db.Allowance().Reserve(ctx, "verify", c, crashDay, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if err := db.Allowance().Commit(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if want[c], err = db.Allowance().Remaining(ctx, "verify", c, crashDay, 1000); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range clients {
		rem, err := db.Allowance().Remaining(ctx, "verify", c, crashDay, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if rem != want[c] {
			t.Errorf("client %s: %d units remaining after the durable reopen, %d when the NoSync run ended: the stale log was replayed over newer counts", c, rem, want[c])
		}
	}
}

// liveLogRecords counts the records of the current epoch in dir's log.
func liveLogRecords(t *testing.T, dir string) int {
	t.Helper()
	f, err := os.Open(filepath.Join(dir, walFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	h := make([]byte, 20)
	n, _ := f.ReadAt(h, 0)
	epoch, ok := decodeWALHeader(h[:n])
	if !ok {
		return 0
	}
	records := 0
	if _, err := scanWAL(f, st.Size(), epoch, func([]byte) error { records++; return nil }); err != nil {
		t.Fatal(err)
	}
	return records
}

var crashDay = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

// crashChild writes until it is killed, printing each acknowledged write.
func crashChild(dir string) {
	db, err := Open(dir, Options{})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	ctx := context.Background()
	var mu sync.Mutex
	ack := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf("ack "+format+"\n", a...)
	}
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			for i := 0; ; i++ {
				switch g % 3 {
				case 0:
					id := fmt.Sprintf("%02d%06d-0000-4000-8000-000000000000", g, i)
					if db.RecordVerification(ctx, sampleVerification(id, "agent", time.Now(), "pass")) == nil {
						ack("record %s", id)
					}
				case 1:
					client := fmt.Sprintf("c%d", g)
					r, err := db.Allowance().Reserve(ctx, "verify", client, crashDay, 1000)
					if err == nil && db.Allowance().Commit(ctx, r) == nil {
						ack("commit %s", client)
					}
				case 2:
					key := fmt.Sprintf("nonce:%d:%d", g, i)
					if _, err := db.Claims().Claim(ctx, []string{key}, time.Now().Add(time.Hour)); err == nil {
						ack("claim %s", key)
					}
				}
			}
		})
	}
	wg.Wait()
}

// TestGroupCommitKeepsEachCallsOutcome runs many transactions at once on
// one key, some of which fail: the failures write nothing, every success is
// counted exactly once, and each fn saw the writes of those before it.
func TestGroupCommitKeepsEachCallsOutcome(t *testing.T) {
	db, _ := openTemp(t, Options{NoSync: true})
	ctx := context.Background()
	key := []byte("test/counter")
	errOdd := errors.New("odd")
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, failed := 0, 0
	for i := range 200 {
		wg.Go(func() {
			err := db.update(ctx, func(txn *tx) error {
				if err := growCounter(txn, key); err != nil {
					return err
				}
				if i%2 == 1 {
					return errOdd // after a write: the write must not survive
				}
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, errOdd):
				failed++
			default:
				t.Errorf("unexpected error %v", err)
			}
		})
	}
	wg.Wait()
	var n int
	db.view(ctx, func(txn *tx) error {
		item, err := txn.Get(key)
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error { n = len(v); return nil })
	})
	if ok != 100 || failed != 100 || n != ok {
		t.Fatalf("%d succeeded, %d failed, counter %d; want 100, 100, 100", ok, failed, n)
	}
}

// growCounter makes the value at key one byte longer: a read-modify-write
// whose final length counts the transactions that committed it.
func growCounter(txn *tx, key []byte) error {
	n := 0
	if item, err := txn.Get(key); err == nil {
		item.Value(func(v []byte) error { n = len(v); return nil })
	} else if !errors.Is(err, badger.ErrKeyNotFound) {
		return err
	}
	return txn.Set(key, make([]byte, n+1))
}

// TestGroupCommitSurvivesAPanic: a transaction that panics fails alone; the
// committer goes on serving the others.
func TestGroupCommitSurvivesAPanic(t *testing.T) {
	db, _ := openTemp(t, Options{NoSync: true})
	ctx := context.Background()
	err := db.update(ctx, func(*tx) error { panic("boom") })
	if err == nil || !strings.Contains(err.Error(), "panicked") {
		t.Fatalf("panicking transaction: err = %v", err)
	}
	if err := db.update(ctx, func(txn *tx) error { return txn.Set([]byte("test/after"), nil) }); err != nil {
		t.Fatalf("the next transaction: %v", err)
	}
}

// TestGroupCommitRefusesAfterClose: a write after Close is ErrClosed, not a
// hang.
func TestGroupCommitRefusesAfterClose(t *testing.T) {
	db, _ := openTemp(t, Options{NoSync: true})
	db.Close()
	if err := db.update(context.Background(), func(*tx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("err = %v, want ErrClosed", err)
	}
}

// TestGroupCommitCancelledWhileQueued: a writer whose context ends while
// it waits behind a commit in progress returns the context's error and its
// fn never runs; the writers after it are still served.
func TestGroupCommitCancelledWhileQueued(t *testing.T) {
	db, _ := openTemp(t, Options{NoSync: true})
	release := make(chan struct{})
	started := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- db.update(context.Background(), func(txn *tx) error {
			select {
			case <-started:
			default:
				close(started)
			}
			<-release // the commit in progress
			return txn.Set([]byte("test/first"), nil)
		})
	}()
	<-started
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{}, 1)
	cancelled := make(chan error, 1)
	go func() {
		cancelled <- db.update(ctx, func(*tx) error { ran <- struct{}{}; return nil })
	}()
	waitQueued(t, db, 1)
	later := make(chan error, 1)
	go func() {
		later <- db.update(context.Background(), func(txn *tx) error { return txn.Set([]byte("test/later"), nil) })
	}()
	waitQueued(t, db, 2) // the later one behind the one cancelled
	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled writer: err = %v", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first writer: %v", err)
	}
	if err := <-later; err != nil {
		t.Fatalf("later writer: %v", err)
	}
	select {
	case <-ran:
		t.Fatal("the cancelled writer's transaction ran")
	default:
	}
}

// waitQueued waits until n writers are queued behind the commit in
// progress: a test that means a writer to be queued when it acts waits for
// it rather than sleeping, which on a loaded machine may end first.
// It may be called from a goroutine other than the test's: it reports a
// timeout with Errorf and returns.
func waitQueued(t *testing.T, db *DB, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		db.commits.mu.Lock()
		got := len(db.commits.queue)
		db.commits.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d writers queued, want %d", got, n)
			return
		}
	}
}

// unfiredDeadline is a context whose deadline has passed but whose timer
// has not fired: what a process resumed after a stall sees until its timer
// goroutine runs.
type unfiredDeadline struct {
	context.Context
	at time.Time
}

func (c unfiredDeadline) Deadline() (time.Time, bool) { return c.at, true }

// TestGroupCommitDeadlinePassed: a write whose context's deadline has passed
// when a leader takes it is not made, whether it leads its own group or
// waits behind one, and whether or not the context's timer has fired yet:
// verifierd's deadline (when the gateway stops waiting) must hold at the
// last instant before the write.
func TestGroupCommitDeadlinePassed(t *testing.T) {
	db, _ := openTemp(t, Options{NoSync: true})
	past := time.Now().Add(-time.Millisecond)
	expired, cancel := context.WithDeadline(context.Background(), past)
	defer cancel()
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		queued bool
	}{
		{"leading, timer fired", expired, false},
		{"leading, timer not fired", unfiredDeadline{context.Background(), past}, false},
		{"queued, timer not fired", unfiredDeadline{context.Background(), past}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := []byte("test/deadline/" + tc.name)
			release := make(chan struct{})
			first := make(chan error, 1)
			if tc.queued {
				started := make(chan struct{})
				go func() {
					first <- db.update(context.Background(), func(txn *tx) error {
						close(started)
						<-release
						return nil
					})
				}()
				<-started
				go func() {
					waitQueued(t, db, 1) // queued behind the commit in progress
					close(release)
				}()
			} else {
				close(release)
				first <- nil
			}
			err := db.update(tc.ctx, func(txn *tx) error { return txn.Set(key, nil) })
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want the deadline", err)
			}
			if err := <-first; err != nil {
				t.Fatal(err)
			}
			db.view(context.Background(), func(txn *tx) error {
				if _, err := txn.Get(key); !errors.Is(err, badger.ErrKeyNotFound) {
					t.Fatalf("the write was made: %v", err)
				}
				return nil
			})
		})
	}
}

// startChild runs test name of this binary again as a child process, with
// env set to dir (the child's cue to do its part), and returns it and its
// standard output.
func startChild(t *testing.T, name, env, dir string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, out
}

// killAfterAcks reads the child's "ack <what>" lines from out, SIGKILLs it
// after the n-th (no deferred Close, no flush: what it already printed is
// still read from the pipe), and returns every acknowledged <what>,
// including those printed before the kill took effect.
func killAfterAcks(t *testing.T, cmd *exec.Cmd, out io.Reader, n int) []string {
	t.Helper()
	var acks []string
	killed := false
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		a, ok := strings.CutPrefix(sc.Text(), "ack ")
		if !ok {
			continue
		}
		acks = append(acks, a)
		if len(acks) == n && !killed {
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	cmd.Wait()
	if !killed {
		t.Fatalf("the child ended before it was killed, after %d acknowledgements", len(acks))
	}
	return acks
}

// TestGroupCommitTakesTheWritersAnsweredTogether: writers answered by one
// group that come straight back share the next group, instead of the
// first one back committing alone while the others queue behind it (the
// yield in committer.lead). One processor makes the order of goroutines
// what the scheduler gives, which is nearly always the same: the test asks
// for most trials, where without the yield no trial shares the group.
func TestGroupCommitTakesTheWritersAnsweredTogether(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	db, _ := openTemp(t, Options{NoSync: true})
	const trials, writers = 20, 3
	shared := 0
	for trial := range trials {
		release := make(chan struct{})
		held := make(chan struct{})
		first := make(chan error, 1)
		go func() {
			first <- db.update(context.Background(), func(*tx) error {
				close(held)
				<-release // the group in progress while the writers queue
				return nil
			})
		}()
		<-held
		var second [writers]*tx
		errs := make(chan error, writers)
		for i := range writers {
			go func() {
				key := []byte(fmt.Sprintf("test/%d/%d", trial, i))
				if err := db.update(context.Background(), func(txn *tx) error { return txn.Set(key, nil) }); err != nil {
					errs <- err
					return
				}
				// Straight back, as a client answered with the others.
				errs <- db.update(context.Background(), func(txn *tx) error {
					second[i] = txn
					return txn.Set(key, []byte("again"))
				})
			}()
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			db.commits.mu.Lock()
			n := len(db.commits.queue)
			db.commits.mu.Unlock()
			if n == writers {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d writers queued, want %d", n, writers)
			}
			time.Sleep(time.Millisecond)
		}
		close(release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		for range writers {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		if second[0] == second[1] && second[1] == second[2] {
			shared++
		}
	}
	if shared < trials*3/4 {
		t.Fatalf("the writers answered together shared their next group in %d of %d trials", shared, trials)
	}
}
