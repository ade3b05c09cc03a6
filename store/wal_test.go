package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// The replay tests below stand for a power loss at its worst for Badger:
// none of what Badger wrote unsynced since the log's last checkpoint
// reached the disk, only the log did. They take a copy of a closed
// database (its Badger files as durable as they get), open the original,
// write, then put the log as it stands over the copy's log and open the
// copy: what it holds comes from the replay alone.

// copyDir copies the regular files of src into a new directory.
func copyDir(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == "LOCK" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, e.Name()), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// lostBadger returns a copy of the closed database in dir and a function
// that puts the log of the live database in dir over the copy's, mangled
// by edit if it is not nil, and opens the copy.
func lostBadger(t *testing.T, dir string) (snapshot string, crash func(edit func([]byte) []byte) *DB) {
	t.Helper()
	snap := copyDir(t, dir)
	return snap, func(edit func([]byte) []byte) *DB {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, walFile))
		if err != nil {
			t.Fatal(err)
		}
		if edit != nil {
			b = edit(b)
		}
		if err := os.WriteFile(filepath.Join(snap, walFile), b, 0o600); err != nil {
			t.Fatal(err)
		}
		db, err := Open(snap, Options{})
		if err != nil {
			t.Fatalf("opening after the simulated crash: %v", err)
		}
		t.Cleanup(func() { db.Close() })
		return db
	}
}

func setKey(db *DB, key, value string) error {
	return db.update(context.Background(), func(txn *tx) error { return txn.Set([]byte(key), []byte(value)) })
}

// getKey returns key's value, or "" and false when there is none.
func getKey(t *testing.T, db *DB, key string) (string, bool) {
	t.Helper()
	var v []byte
	err := db.view(context.Background(), func(txn *tx) error {
		item, err := txn.Get([]byte(key))
		if err != nil {
			return err
		}
		v, err = item.ValueCopy(nil)
		return err
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(v), true
}

// openClosed opens a durable database in a new directory, runs setup on it
// and closes it.
func openClosed(t *testing.T, opts Options, setup func(db *DB)) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "db")
	db, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	setup(db)
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestWALReplayRestoresWhatBadgerLost: every acknowledged write comes back
// from the log alone, in commit order (a key written by several groups
// ends with the last value), deletes included, TTL entries with their
// expiry, and none of the writes of transactions that failed in a group
// (whose group ran again on a fresh record).
func TestWALReplayRestoresWhatBadgerLost(t *testing.T) {
	ctx := context.Background()
	dir := openClosed(t, Options{}, func(db *DB) {
		if err := setKey(db, "test/before", "kept"); err != nil {
			t.Fatal(err)
		}
		if err := setKey(db, "test/deleted", "x"); err != nil {
			t.Fatal(err)
		}
	})
	_, crash := lostBadger(t, dir)
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	for i := range 5 {
		if err := setKey(db, "test/overwritten", fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.update(ctx, func(txn *tx) error { return txn.Delete([]byte("test/deleted")) }); err != nil {
		t.Fatal(err)
	}
	expires := uint64(time.Now().Add(time.Hour).Unix())
	err = db.update(ctx, func(txn *tx) error {
		e := badger.NewEntry([]byte("test/ttl"), []byte("t"))
		e.ExpiresAt = expires
		return txn.SetEntry(e)
	})
	if err != nil {
		t.Fatal(err)
	}
	// Concurrent groups with failures, as in
	// TestGroupCommitKeepsEachCallsOutcome: the counter's length counts
	// the successes only.
	key := []byte("test/counter")
	errOdd := errors.New("odd")
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Go(func() {
			err := db.update(ctx, func(txn *tx) error {
				if err := growCounter(txn, key); err != nil {
					return err
				}
				if i%2 == 1 {
					// A key only failures write: none may be replayed.
					if err := txn.Set([]byte(fmt.Sprintf("test/failed/%d", i)), nil); err != nil {
						return err
					}
					return errOdd
				}
				return nil
			})
			if err != nil && !errors.Is(err, errOdd) {
				t.Error(err)
			}
		})
	}
	// And many writers on keys of their own, in order each.
	for g := range 8 {
		wg.Go(func() {
			for i := range 30 {
				if err := setKey(db, fmt.Sprintf("test/g%d", g), fmt.Sprintf("%03d", i)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if v, _ := getKey(t, db, "test/counter"); len(v) != 50 {
		t.Fatalf("the counter has length %d, want 50 (the successful transactions)", len(v))
	}

	got := crash(nil)
	if v, ok := getKey(t, got, "test/before"); v != "kept" || !ok {
		t.Errorf("test/before = %q, %v: a write of the durable state before is lost", v, ok)
	}
	if v, _ := getKey(t, got, "test/overwritten"); v != "v4" {
		t.Errorf("test/overwritten = %q after replay, want the last value v4", v)
	}
	if v, ok := getKey(t, got, "test/deleted"); ok {
		t.Errorf("test/deleted = %q after replay, want it deleted", v)
	}
	if v, _ := getKey(t, got, "test/counter"); len(v) != 50 {
		t.Errorf("the counter has length %d after replay, want 50 (the successful transactions)", len(v))
	}
	for i := 1; i < 100; i += 2 {
		if _, ok := getKey(t, got, fmt.Sprintf("test/failed/%d", i)); ok {
			t.Errorf("test/failed/%d, written by a transaction that failed, is there after replay", i)
		}
	}
	for g := range 8 {
		if v, _ := getKey(t, got, fmt.Sprintf("test/g%d", g)); v != "029" {
			t.Errorf("test/g%d = %q after replay, want 029", g, v)
		}
	}
	err = got.view(ctx, func(txn *tx) error {
		item, err := txn.Get([]byte("test/ttl"))
		if err != nil {
			return err
		}
		if item.ExpiresAt() != expires {
			t.Errorf("the TTL entry expires at %d after replay, want %d", item.ExpiresAt(), expires)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("the TTL entry after replay: %v", err)
	}
}

// TestWALReplayThroughTheAPI: history records, payment claims and
// allowance counts acknowledged through the public API come back from the
// log alone.
func TestWALReplayThroughTheAPI(t *testing.T) {
	ctx := context.Background()
	dir := openClosed(t, Options{}, func(*DB) {})
	_, crash := lostBadger(t, dir)
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	at := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	for i := range 20 {
		if err := db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("%08d-0000-4000-8000-000000000000", i), "agent", at.Add(time.Duration(i)*time.Second), "pass")); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Claims().Claim(ctx, []string{fmt.Sprintf("nonce:%d", i)}, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		r, err := db.Allowance().Reserve(ctx, "verify", "client", crashDay, 10)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Allowance().Commit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	got := crash(nil)
	if c, err := got.AgentCounts(ctx, "agent"); err != nil || c.Pass != 20 {
		t.Errorf("agent counts %+v, %v after replay; want 20 records", c, err)
	}
	for i := range 20 {
		if _, err := got.Verification(ctx, fmt.Sprintf("%08d-0000-4000-8000-000000000000", i)); err != nil {
			t.Errorf("record %d after replay: %v", i, err)
		}
		if _, err := got.Claims().Claim(ctx, []string{fmt.Sprintf("nonce:%d", i)}, time.Now().Add(time.Hour)); !errors.Is(err, ErrClaimed) {
			t.Errorf("claim %d after replay: claiming again gives %v, want ErrClaimed", i, err)
		}
	}
	if rem, err := got.Allowance().Remaining(ctx, "verify", "client", crashDay, 10); err != nil || rem != 7 {
		t.Errorf("allowance remaining %d, %v after replay; want 7", rem, err)
	}
}

// walRecords returns the offsets of the current epoch's records in a log
// file image.
func walRecords(t *testing.T, b []byte) []int64 {
	t.Helper()
	epoch, ok := decodeWALHeader(b)
	if !ok {
		t.Fatal("the log's header does not decode")
	}
	var offs []int64
	off := int64(walHeaderSize)
	_, err := scanWAL(bytes.NewReader(b), int64(len(b)), epoch, func(p []byte) error {
		offs = append(offs, off)
		off += walRecordHeader + int64(len(p))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return offs
}

// TestWALReplayStopsAtABadRecord: a record that is torn (short, or with a
// bad CRC) ends the log: the records before it are replayed, it and every
// record after it are not.
func TestWALReplayStopsAtABadRecord(t *testing.T) {
	for _, c := range []struct {
		name string
		// edit mangles the log, whose records are offs (one per key
		// test/0..test/4, in order), and returns the first key lost.
		edit func(b []byte, offs []int64) ([]byte, int)
	}{
		{"torn tail", func(b []byte, offs []int64) ([]byte, int) {
			// The last record's second half never reached the disk.
			end := offs[4] + (int64(len(b))-offs[4])/2
			for i := offs[4] + walRecordHeader + 4; i < end && i < int64(len(b)); i++ {
				b[i] = 0
			}
			return b, 4
		}},
		{"file ends inside the last record", func(b []byte, offs []int64) ([]byte, int) {
			return b[:offs[4]+walRecordHeader+2], 4
		}},
		{"bad CRC in the middle", func(b []byte, offs []int64) ([]byte, int) {
			b[offs[2]+walRecordHeader+3] ^= 0x40
			return b, 2
		}},
		{"length past the end", func(b []byte, offs []int64) ([]byte, int) {
			binary.LittleEndian.PutUint32(b[offs[3]:], uint32(len(b)))
			return b, 3
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := openClosed(t, Options{}, func(*DB) {})
			_, crash := lostBadger(t, dir)
			db, err := Open(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			for i := range 5 {
				if err := setKey(db, fmt.Sprintf("test/%d", i), strings.Repeat("v", 100)); err != nil {
					t.Fatal(err)
				}
			}
			var lost int
			got := crash(func(b []byte) []byte {
				offs := walRecords(t, b)
				if len(offs) != 5 {
					t.Fatalf("%d records in the log, want 5", len(offs))
				}
				b, lost = c.edit(b, offs)
				return b
			})
			for i := range 5 {
				_, ok := getKey(t, got, fmt.Sprintf("test/%d", i))
				if want := i < lost; ok != want {
					t.Errorf("test/%d present = %v after replay, want %v", i, ok, want)
				}
			}
			// The replayed database takes writes, and a clean reopen
			// replays nothing stale.
			if err := setKey(got, "test/after", "a"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWALStaleRecordsAfterACheckpoint: after the log wraps, the records of
// the epoch before still follow the new ones in the file. They must not be
// replayed: here each stale record would set the key back to an older
// value.
func TestWALStaleRecordsAfterACheckpoint(t *testing.T) {
	opts := Options{walSize: 64 << 10}
	dir := openClosed(t, opts, func(*DB) {})
	_, crash := lostBadger(t, dir)
	db, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	start := db.commits.log.epoch
	var last string
	for i := 0; db.commits.log.epoch < start+2; i++ {
		last = fmt.Sprintf("%06d", i) // one size for every record: the stale ones line up
		if err := setKey(db, "test/key", last); err != nil {
			t.Fatal(err)
		}
	}
	// A few more, so that the new epoch has records of its own and the
	// next record in the file is a stale one.
	for i := range 3 {
		last = fmt.Sprintf("n%05d", i)
		if err := setKey(db, "test/key", last); err != nil {
			t.Fatal(err)
		}
	}
	got := crash(nil)
	if v, _ := getKey(t, got, "test/key"); v != last {
		t.Fatalf("test/key = %q after replay, want the last value %q", v, last)
	}
}

// TestWALCorruptHeaderStartsAfresh: a header that fails its CRC is a crash
// during a checkpoint's header write, which only starts once Badger's own
// files are durable (syncBadger before the header): nothing needs
// replaying, and the records left in the file (of any epoch) must never be.
// Here the database's Badger state is the one of the checkpoint (the copy
// taken while it was closed), so every acknowledged write is there.
func TestWALCorruptHeaderStartsAfresh(t *testing.T) {
	dir := openClosed(t, Options{}, func(db *DB) {
		// More than one chunk of records: the reset must not leave any.
		for i := range 15 {
			if err := setKey(db, "test/key", fmt.Sprintf("v%02d", i)+strings.Repeat(".", 100<<10)); err != nil {
				t.Fatal(err)
			}
		}
	})
	// Close checkpointed: the file still holds the five records, under
	// the previous epoch. Tear the header that the checkpoint wrote.
	path := filepath.Join(dir, walFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[9] ^= 1
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("opening with a torn header: %v", err)
	}
	if v, _ := getKey(t, db, "test/key"); !strings.HasPrefix(v, "v14.") {
		t.Errorf("test/key = %.10q..., want v14...", v)
	}
	if db.commits.log.epoch != 1 || !db.commits.log.reset {
		t.Errorf("epoch %d, reset %v after a torn header, want 1, true", db.commits.log.epoch, db.commits.log.reset)
	}
	// The reset cut the old records off: were any kept, the epochs that
	// follow (1, like the first one they were written under, and on)
	// could come to read them. Only the new header and zeros are left.
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(b)) <= walChunk || st.Size() != walChunk {
		t.Errorf("the log was %d bytes and is %d after the reset, want %d", len(b), st.Size(), walChunk)
	}
	if n, err := scanWAL(db.commits.log.f, st.Size(), 1, func([]byte) error { return errors.New("a stale record was read") }); err != nil || n != walHeaderSize {
		t.Errorf("scanning the reset log: end %d, %v", n, err)
	}
	if err := setKey(db, "test/key", "after"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if v, _ := getKey(t, db, "test/key"); v != "after" {
		t.Errorf("test/key = %q after a reopen, want after", v)
	}
}

// TestWALRecoversAfterBadgerRefusesALoggedGroup: when Badger's commit
// fails after the group's record is durable in the log, the group gets the
// error, and the next write first makes Badger and the log agree as a
// reopen would: the refused group is applied again from its record (it
// may be in Badger in part), the log starts afresh, and the write is made.
// Reads go on meanwhile. The failure is Badger's own refusal to commit a
// discarded transaction.
func TestWALRecoversAfterBadgerRefusesALoggedGroup(t *testing.T) {
	ctx := context.Background()
	db, dir := openTemp(t, Options{})
	if err := setKey(db, "test/before", "b"); err != nil {
		t.Fatal(err)
	}
	err := db.update(ctx, func(txn *tx) error {
		if err := txn.Set([]byte("test/logged"), []byte("l")); err != nil {
			return err
		}
		txn.b.Discard() // Badger will refuse to commit it
		return nil
	})
	if err == nil || errors.Is(err, ErrWritesHalted) {
		t.Fatalf("the failed group got %v, want Badger's error", err)
	}
	if v, ok := getKey(t, db, "test/before"); !ok || v != "b" {
		t.Fatalf("reading after the failure: %q, %v", v, ok)
	}
	if _, ok := getKey(t, db, "test/logged"); ok {
		t.Fatal("the refused group is visible before the recovery")
	}
	if err := setKey(db, "test/later", "x"); err != nil {
		t.Fatalf("a later write: %v", err)
	}
	if _, ok := getKey(t, db, "test/logged"); !ok {
		t.Error("the refused group was not applied again by the recovery")
	}
	if !db.commits.log.empty() && db.commits.log.epoch < 2 {
		t.Error("the recovery did not start the log afresh")
	}
	db.Close()
	db, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, k := range []string{"test/before", "test/logged", "test/later"} {
		if _, ok := getKey(t, db, k); !ok {
			t.Errorf("%s is missing after a reopen", k)
		}
	}
}

// TestWALHaltedWhileTheLogFails: a log whose writes keep failing (here
// its record descriptor is closed under the store: a fake, for a disk that
// keeps refusing) fails every write, none of which reaches Badger; the
// recovery is tried at most once per retryBroken, and meanwhile writes
// get ErrWritesHalted. After a reopen the failed groups are not there and
// writes work.
func TestWALHaltedWhileTheLogFails(t *testing.T) {
	db, dir := openTemp(t, Options{})
	if !db.commits.log.direct() {
		t.Skip("records share the header's descriptor where the file system refuses direct I/O")
	}
	db.commits.log.recf.Close()
	if err := setKey(db, "test/unlogged", "u"); err == nil || errors.Is(err, ErrWritesHalted) {
		t.Fatalf("the group whose log write failed got %v, want the write's error", err)
	}
	// The first write after the failure tries to recover, which works
	// (the header has its own descriptor), and fails in the log again.
	if err := setKey(db, "test/second", "x"); err == nil || errors.Is(err, ErrWritesHalted) {
		t.Fatalf("the write that tried to recover got %v, want the log's error", err)
	}
	if err := setKey(db, "test/later", "x"); !errors.Is(err, ErrWritesHalted) {
		t.Fatalf("a write within a second of the last try got %v, want ErrWritesHalted", err)
	}
	for _, k := range []string{"test/unlogged", "test/second", "test/later"} {
		if _, ok := getKey(t, db, k); ok {
			t.Fatalf("%s, whose write failed, is in Badger", k)
		}
	}
	db.Close()
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, ok := getKey(t, db, "test/unlogged"); ok {
		t.Error("a group whose log write failed is there after the reopen")
	}
	if err := setKey(db, "test/later", "x"); err != nil {
		t.Fatalf("writing after the reopen: %v", err)
	}
}

// TestWALNotWithNoSync: NoSync and InMemory keep no log.
func TestWALNotWithNoSync(t *testing.T) {
	db, dir := openTemp(t, Options{NoSync: true})
	if err := setKey(db, "test/k", "v"); err != nil {
		t.Fatal(err)
	}
	if db.commits.log != nil {
		t.Error("a NoSync store has a log")
	}
	if _, err := os.Stat(filepath.Join(dir, walFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a NoSync store wrote %s: %v", walFile, err)
	}
	mem, err := Open("", Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	if mem.commits.log != nil {
		t.Error("an in-memory store has a log")
	}
}

// walKillChildEnv, when set to a directory, makes
// TestWALWrapsUnderLoadAndSurvivesKill the child that writes into it.
const walKillChildEnv = "STORE_WAL_KILL_CHILD_DIR"

// walKillSize is the child's log capacity: small, so that the log wraps
// many times while the child writes.
const walKillSize = 128 << 10

// TestWALWrapsUnderLoadAndSurvivesKill: a child writes history records and
// payment claims from many goroutines through a log small enough to wrap
// again and again, printing each write once the store acknowledged it; the
// parent SIGKILLs it in mid-stream, checks from the log's epoch that it
// wrapped several times, reopens the database and finds every
// acknowledged write.
func TestWALWrapsUnderLoadAndSurvivesKill(t *testing.T) {
	if dir := os.Getenv(walKillChildEnv); dir != "" {
		walKillChild(dir)
		return
	}
	dir := filepath.Join(t.TempDir(), "db")
	cmd, out := startChild(t, "TestWALWrapsUnderLoadAndSurvivesKill", walKillChildEnv, dir)
	acks := killAfterAcks(t, cmd, out, 3000)
	// Epoch 1 is the log's first (its creation's checkpoint); each wrap
	// is one more.
	h := make([]byte, 20)
	f, err := os.Open(filepath.Join(dir, walFile))
	if err != nil {
		t.Fatal(err)
	}
	f.ReadAt(h, 0)
	f.Close()
	epoch, ok := decodeWALHeader(h)
	if !ok || epoch < 4 {
		t.Fatalf("the log is at epoch %d (header ok: %v): it did not wrap at least three times", epoch, ok)
	}
	db, err := Open(dir, Options{walSize: walKillSize})
	if err != nil {
		t.Fatalf("reopening after the kill: %v", err)
	}
	defer db.Close()
	ctx := context.Background()
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
		default:
			t.Fatalf("unknown acknowledgement %q", a)
		}
	}
	t.Logf("%d acknowledged writes over %d wraps of the log, all found after SIGKILL", len(acks), epoch-1)
}

func walKillChild(dir string) {
	db, err := Open(dir, Options{walSize: walKillSize})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	ctx := context.Background()
	var mu sync.Mutex
	ack := func(line string) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Println("ack", line)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ; i++ {
				if g%2 == 0 {
					id := fmt.Sprintf("%02d%06d-0000-4000-8000-000000000000", g, i)
					if db.RecordVerification(ctx, sampleVerification(id, fmt.Sprintf("agent-%d", g), time.Now(), "pass")) == nil {
						ack("record " + id)
					}
				} else {
					key := fmt.Sprintf("nonce:%d:%d", g, i)
					if _, err := db.Claims().Claim(ctx, []string{key}, time.Now().Add(time.Hour)); err == nil {
						ack("claim " + key)
					}
				}
			}
		})
	}
	wg.Wait()
}

// FuzzWALPayload: the payload decoder takes any bytes without panicking,
// and what it decodes encodes back to the same ops.
func FuzzWALPayload(f *testing.F) {
	var r walRecord
	r.reset()
	r.set([]byte("k"), []byte("value"), 1767225600, 0)
	r.delete([]byte("gone"))
	r.set([]byte("x"), nil, 0, 7)
	f.Add(r.buf[walRecordHeader:])
	f.Add([]byte{walDelete, 0})
	f.Add([]byte{walSet, 1, 'k', 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, payload []byte) {
		var ops []walOp
		if err := decodeWALPayload(payload, func(op walOp) error { ops = append(ops, op); return nil }); err != nil {
			if !errors.Is(err, errWALCorrupt) {
				t.Fatalf("decoding: %v, want errWALCorrupt", err)
			}
			return
		}
		var again walRecord
		again.reset()
		for _, op := range ops {
			if len(op.key) == 0 || (op.kind != walSet && op.kind != walDelete) {
				t.Fatalf("decoded op %+v", op)
			}
			if op.kind == walSet {
				again.set(op.key, op.value, op.expiresAt, op.meta)
			} else {
				again.delete(op.key)
			}
		}
		var ops2 []walOp
		if err := decodeWALPayload(again.buf[walRecordHeader:], func(op walOp) error { ops2 = append(ops2, op); return nil }); err != nil {
			t.Fatalf("re-encoded payload does not decode: %v", err)
		}
		if fmt.Sprint(ops) != fmt.Sprint(ops2) {
			t.Fatalf("ops %v re-encode to %v", ops, ops2)
		}
	})
}

// FuzzWALScan: reading a log file of any content stops cleanly, returns
// only records whose CRC holds under the header's epoch, back to back
// from walHeaderSize, and ends inside the file.
func FuzzWALScan(f *testing.F) {
	img := make([]byte, walHeaderSize)
	copy(img, encodeWALHeader(3))
	var r walRecord
	r.reset()
	r.set([]byte("k"), []byte("v"), 0, 0)
	r.seal(3)
	img = append(img, r.buf...)
	f.Add(img[walHeaderSize:], uint64(3))
	f.Add(img[walHeaderSize:], uint64(2))
	f.Add([]byte{}, uint64(0))
	f.Fuzz(func(t *testing.T, body []byte, epoch uint64) {
		file := append(make([]byte, walHeaderSize), body...)
		copy(file, encodeWALHeader(epoch))
		off := int64(walHeaderSize)
		end, err := scanWAL(bytes.NewReader(file), int64(len(file)), epoch, func(p []byte) error {
			h := file[off : off+walRecordHeader]
			if int(binary.LittleEndian.Uint32(h)) != len(p) || recordCRC(epoch, p) != binary.LittleEndian.Uint32(h[4:]) ||
				!bytes.Equal(file[off+walRecordHeader:off+walRecordHeader+int64(len(p))], p) {
				t.Fatalf("record at %d is not what the file holds", off)
			}
			off += walRecordHeader + int64(len(p))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if end != off || end > int64(len(file)) {
			t.Fatalf("scan ended at %d, after records up to %d in a file of %d bytes", end, off, len(file))
		}
	})
}

// TestWALGrowsForARecordBiggerThanTheLog: a group bigger than the whole log
// (a large saved answer in a small log) grows the log to hold it, and is
// replayed like any other.
func TestWALGrowsForARecordBiggerThanTheLog(t *testing.T) {
	opts := Options{walSize: 64 << 10}
	dir := openClosed(t, opts, func(*DB) {})
	snap, _ := lostBadger(t, dir)
	db, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	big := strings.Repeat("a", 3*walChunk/2)
	if err := setKey(db, "test/big", big); err != nil {
		t.Fatal(err)
	}
	if db.commits.log.size < int64(len(big)) {
		t.Fatalf("the log's capacity is %d, below the %d bytes of its record", db.commits.log.size, len(big))
	}
	b, err := os.ReadFile(filepath.Join(dir, walFile))
	if err != nil {
		t.Fatal(err)
	}
	// The log goes on after it (a checkpoint first: the big record
	// filled it).
	if err := setKey(db, "test/after", "x"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(snap, walFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Open(snap, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer got.Close()
	if v, _ := getKey(t, got, "test/big"); v != big {
		t.Errorf("the big value has %d bytes after replay, want %d", len(v), len(big))
	}
}

// TestWALCloseLeavesNothingToReplay: Close makes Badger durable and
// empties the log, so a clean reopen replays nothing (and loses nothing).
func TestWALCloseLeavesNothingToReplay(t *testing.T) {
	dir := openClosed(t, Options{}, func(db *DB) {
		if err := setKey(db, "test/k", "v"); err != nil {
			t.Fatal(err)
		}
	})
	b, err := os.ReadFile(filepath.Join(dir, walFile))
	if err != nil {
		t.Fatal(err)
	}
	if offs := walRecords(t, b); len(offs) != 0 {
		t.Fatalf("%d records to replay after a clean close, want 0", len(offs))
	}
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if v, _ := getKey(t, db, "test/k"); v != "v" {
		t.Fatalf("test/k = %q after a clean reopen, want v", v)
	}
}

// TestWALCheckpointSyncsBadgerWhenItHoldsRecords: a checkpoint that drops
// records syncs Badger first (they are in Badger alone afterwards); one
// of a log with no record has nothing to make durable and skips the sync.
func TestWALCheckpointSyncsBadgerWhenItHoldsRecords(t *testing.T) {
	dir := t.TempDir()
	syncs := 0
	count := func() error { syncs++; return nil }
	var replayed [][]byte
	apply := func(p []byte) error { replayed = append(replayed, bytes.Clone(p)); return nil }
	w, _, err := openWAL(dir, walMinSize, true, count, apply)
	if err != nil {
		t.Fatal(err)
	}
	if syncs != 0 {
		t.Errorf("creating the log synced Badger %d times, want 0", syncs)
	}
	w.rec.reset()
	w.rec.set([]byte("k"), []byte("v"), 0, 0)
	if err := w.append(&w.rec); err != nil {
		t.Fatal(err)
	}
	w.close()
	// A crash: the reopen replays the record, then checkpoints.
	w, n, err := openWAL(dir, walMinSize, true, count, apply)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if n != 1 || len(replayed) != 1 || syncs != 1 {
		t.Fatalf("reopen: %d replayed, %d synced; want 1, 1", n, syncs)
	}
	if err := decodeWALPayload(replayed[0], func(op walOp) error {
		if op.kind != walSet || string(op.key) != "k" || string(op.value) != "v" {
			t.Errorf("replayed %+v", op)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !w.empty() {
		t.Error("the log holds records after the checkpoint")
	}
	if err := w.checkpoint(); err != nil || syncs != 1 {
		t.Errorf("checkpoint of an empty log: %v, %d syncs; want no sync", err, syncs)
	}
}

// TestWALOpenFailedReplayClosesTheLog: a replay whose record Badger
// refuses makes openWAL return that error with the log's file closed. Its
// cleanup once called close on the nil *wal it returned: a nil-pointer
// panic in Open instead of the error.
func TestWALOpenFailedReplayClosesTheLog(t *testing.T) {
	dir := t.TempDir()
	none := func() error { return nil }
	w, _, err := openWAL(dir, walMinSize, true, none, nil)
	if err != nil {
		t.Fatal(err)
	}
	w.rec.reset()
	w.rec.set([]byte("k"), []byte("v"), 0, 0)
	if err := w.append(&w.rec); err != nil {
		t.Fatal(err)
	}
	w.close()
	refused := errors.New("refused")
	w, _, err = openWAL(dir, walMinSize, true, none, func([]byte) error { return refused })
	if !errors.Is(err, refused) || w != nil {
		t.Fatalf("openWAL with a replay refused: %v, %v; want nil and the refusal", w, err)
	}
}
