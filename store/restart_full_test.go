package store

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
)

// TestOpenAfterCrashBelowReserve: a process dies with acknowledged claims
// in the store's log while the disk is below the reserve (the state the
// reserve keeps a full disk in), and starts again. The restart replays the
// log (its writes were acknowledged, so nothing may read the store before
// they are in it) and opens with every claim readable and writes refused
// (ErrDiskFull, Ping too), as a running store on that disk would be:
// reads and ungated routes go on. It once died of a nil-pointer panic in
// Open instead. Each process is a child, so that a fault in one cannot
// leave the tmpfs mounted or kill the test run.
func TestOpenAfterCrashBelowReserve(t *testing.T) {
	root := os.Getenv("STORE_RESTART_ROOT")
	claim := func(i int) string { return fmt.Sprintf("payment-%04d-%s", i, strings.Repeat("x", 200)) }
	const claims = 2000
	switch os.Getenv("STORE_RESTART_STAGE") {
	case "write":
		db, err := Open(filepath.Join(root, "db"), smallFiles)
		if err != nil {
			t.Fatal(err)
		}
		for i := range claims {
			if _, err := db.Claims().Claim(context.Background(), []string{claim(i)}, time.Now().Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		// Below the reserve, with room for the replay (admitReplay).
		leave := db.commits.space.reserve - 1<<20
		if s := os.Getenv("STORE_RESTART_LEAVE"); s != "" {
			fmt.Sscan(s, &leave)
		}
		servers.FillLeaving(t, filepath.Join(root, "filler"), leave)
		fmt.Println("WROTE") // and ends without Close: a crash
		return
	case "open":
		var logged bytes.Buffer
		opts := smallFiles
		opts.Logger = slog.New(slog.NewTextHandler(&logged, nil))
		db, err := Open(filepath.Join(root, "db"), opts)
		if err != nil {
			fmt.Printf("OPEN ERROR: %v\n", err)
			return
		}
		if !strings.Contains(logged.String(), "replayed the write-ahead log") {
			t.Errorf("Open replayed nothing; log:\n%s", logged.String())
		}
		for i := range claims {
			if _, err := db.Claims().Lookup(context.Background(), claim(i)); err != nil {
				t.Fatalf("claim %d after the restart: %v", i, err)
			}
		}
		if _, err := db.Claims().Claim(context.Background(), []string{"new"}, time.Now().Add(time.Hour)); !errors.Is(err, ErrDiskFull) {
			t.Errorf("a write below the reserve after the restart: %v, want ErrDiskFull", err)
		}
		if err := db.Ping(context.Background()); !errors.Is(err, ErrDiskFull) {
			t.Errorf("Ping below the reserve after the restart: %v, want ErrDiskFull", err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		fmt.Println("OPENED")
		return
	}

	run := func(t *testing.T, root string, env ...string) string {
		t.Helper()
		return crashAndRestart(t, "TestOpenAfterCrashBelowReserve", root, env...)
	}

	t.Run("opens", func(t *testing.T) {
		if out := run(t, servers.Tmpfs(t, "160m")); !strings.Contains(out, "OPENED") {
			t.Errorf("the restart on a disk below the reserve: %s", out)
		}
	})

	// With less free than the replay needs (its bytes twice, and once more
	// for their table, and a compaction), Open refuses before Badger is
	// opened, naming the directory, what the replay needs, the free space
	// and the reserve.
	t.Run("no room for the replay", func(t *testing.T) {
		root := servers.Tmpfs(t, "160m")
		out := run(t, root, "STORE_RESTART_LEAVE=262144")
		t.Log(out)
		for _, want := range []string{"OPEN ERROR", filepath.Join(root, "db"), "the acknowledged writes in the write-ahead log (0.", "MiB free; the disk has", "writes are refused below 49 MiB", "free space on it and start again"} {
			if !strings.Contains(out, want) {
				t.Errorf("the refusal of a replay without room %q lacks %q", out, want)
			}
		}
	})
}

// crashAndRestart runs the test name in a child process twice, on root
// (STORE_RESTART_ROOT) with env: first with STORE_RESTART_STAGE=write,
// which must print WROTE and end without closing the store (a crash),
// then with STORE_RESTART_STAGE=open, whose output it returns. A child
// that fails or dies (a SIGBUS) fails t.
func crashAndRestart(t *testing.T, name, root string, env ...string) string {
	t.Helper()
	env = append(env, "STORE_RESTART_ROOT="+root)
	out, err := servers.InChild(t, name, append(env, "STORE_RESTART_STAGE=write")...)
	if err != nil || !strings.Contains(out, "WROTE") {
		t.Fatalf("the writing process: %v\n%s", err, out)
	}
	out, err = servers.InChild(t, name, append(env, "STORE_RESTART_STAGE=open")...)
	if err != nil {
		t.Fatalf("the restart on a disk below the reserve failed (%v):\n%s", err, out)
	}
	return out
}

// TestOpenAfterCrashCountsBadgersMemtables: a process dies with a log that
// wrapped a moment ago (it holds little) and a memtable of Badger's nearly
// full (its *.mem log holds megabytes the store's log no longer does), on
// a disk below the reserve. Badger reloads the memtable as it opens and
// flushes it into a table through a memory map: with room for three times
// the log but not for that table, it once died of SIGBUS. Open counts the
// memtable logs and a compaction the flush may start: with less free it
// refuses, naming them; with more it opens, writes refused.
func TestOpenAfterCrashCountsBadgersMemtables(t *testing.T) {
	// A key of random hex, which Badger's compression cannot shrink.
	key := func(i, j int) string {
		var b strings.Builder
		for k := range 13 {
			fmt.Fprintf(&b, "%x", sha256.Sum256(fmt.Appendf(nil, "%d/%d/%d", i, j, k)))
		}
		return b.String()[:400]
	}
	// A small log, which wraps often: one wraps soon after the memtable
	// nearly filled.
	opts := smallFiles
	opts.walSize = 1 << 20
	root := os.Getenv("STORE_RESTART_ROOT")
	switch os.Getenv("STORE_RESTART_STAGE") {
	case "write":
		dir := filepath.Join(root, "db")
		db, err := Open(dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		until := time.Now().Add(time.Hour)
		for i := 0; ; i++ {
			keys := make([]string, 20)
			for j := range keys {
				keys[j] = key(i, j)
			}
			if _, err := db.Claims().Claim(context.Background(), keys, until); err != nil {
				t.Fatal(err)
			}
			mem := newestMemtable(t, dir)
			if db.commits.log.off-walHeaderSize < 256<<10 && mem > 5<<20 {
				break
			}
			if i > 100000 {
				t.Fatalf("the log never wrapped with the memtable nearly full: it holds %d bytes", mem)
			}
		}
		time.Sleep(2 * time.Second) // Badger's flushes and compactions end
		n, err := walReplayBytes(dir)
		if err != nil {
			t.Fatal(err)
		}
		leave := 3*n + 2<<20 // three times the log, and room besides
		if os.Getenv("STORE_RESTART_LEAVE") == "reserve" {
			leave = db.commits.space.reserve - 1<<20
		}
		servers.FillLeaving(t, filepath.Join(root, "filler"), leave)
		fmt.Println("WROTE")
		return
	case "open":
		db, err := Open(filepath.Join(root, "db"), opts)
		if err != nil {
			fmt.Printf("OPEN ERROR: %v\n", err)
			return
		}
		time.Sleep(time.Second) // Badger's flush of what it reloaded
		if err := db.Ping(context.Background()); !errors.Is(err, ErrDiskFull) {
			t.Errorf("Ping below the reserve after the restart: %v, want ErrDiskFull", err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		fmt.Println("OPENED")
		return
	}

	t.Run("no room for the flush", func(t *testing.T) {
		root := servers.Tmpfs(t, "400m")
		out := crashAndRestart(t, t.Name(), root)
		t.Log(out)
		for _, want := range []string{"OPEN ERROR", filepath.Join(root, "db"), "and in Badger's memtable logs (", "must be written into Badger's tables", "MiB free; the disk has"} {
			if !strings.Contains(out, want) {
				t.Errorf("the restart with room for three times the log, not for the memtables: %q lacks %q", out, want)
			}
		}
	})
	t.Run("room for the flush", func(t *testing.T) {
		root := servers.Tmpfs(t, "400m")
		if out := crashAndRestart(t, t.Name(), root, "STORE_RESTART_LEAVE=reserve"); !strings.Contains(out, "OPENED") {
			t.Errorf("the restart with room for the memtables' flush: %s", out)
		}
	})
}

// newestMemtable is what the memtable log Badger writes to (the newest
// *.mem in dir) holds: its allocated bytes.
func newestMemtable(t *testing.T, dir string) uint64 {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var newest os.DirEntry
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".mem") {
			newest = e // ReadDir sorts by name: the newest last
		}
	}
	if newest == nil {
		return 0
	}
	fi, err := newest.Info()
	if err != nil {
		t.Fatal(err)
	}
	return allocated(fi)
}

// TestOpenRefusesVolumeSmallerThanReserve: on a volume no larger than the
// reserve and the log, the store could never take a write; Open says so,
// naming the directory, the volume's size, its free space, the reserve and
// the smallest volume it takes, instead of every write being refused as if
// other files filled the disk.
func TestOpenRefusesVolumeSmallerThanReserve(t *testing.T) {
	dir := filepath.Join(servers.Tmpfs(t, "128m"), "db")
	db, err := Open(dir, Options{})
	if err == nil {
		db.Close()
		t.Fatal("a store opened on a 128 MiB volume, below its 160 MiB reserve")
	}
	t.Log(err)
	for _, want := range []string{dir, "volume holding the store is too small", "128 MiB in all that the store may use", "MiB free", "keeps 160 MiB free", "larger than 176 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open on a 128 MiB volume: %q lacks %q", err, want)
		}
	}
}

// TestSecondOpenOfAStoreInUseOnALowDiskReportsTheLock: a second Open of a
// store another handle holds (`verifierd copy-history` run while verifierd
// runs), on a disk below what a replay of the running store's log would
// take, is refused for Badger's directory lock, as on any disk, not for the
// disk space: the running store's log is live, no crash's to replay, and
// the callers' hints ("a verifierd still running on it holds it") rely on
// the lock refusal. The checks that read the files wait for the lock.
func TestSecondOpenOfAStoreInUseOnALowDiskReportsTheLock(t *testing.T) {
	servers.InChildOnTmpfs(t, "160m", func(t *testing.T, root string) {
		dir := filepath.Join(root, "db")
		db, err := Open(dir, smallFiles)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		until := time.Now().Add(time.Hour)
		for i := range 2000 {
			if _, err := db.Claims().Claim(context.Background(), []string{fmt.Sprintf("payment-%04d-%s", i, strings.Repeat("x", 200))}, until); err != nil {
				t.Fatal(err)
			}
		}
		servers.FillLeaving(t, filepath.Join(root, "filler"), 256<<10)
		second, err := Open(dir, smallFiles)
		if err == nil {
			second.Close()
			t.Fatal("a second Open of a store in use succeeded")
		}
		t.Log(err)
		if !strings.Contains(err.Error(), "Cannot acquire directory lock") || strings.Contains(err.Error(), "free") {
			t.Errorf("a second Open of a store in use, on a low disk: %q; want the directory-lock refusal", err)
		}
	})
}

// TestOpenOfANewStoreBelowReserveSaysWhatItNeeds: a first start on a
// volume large enough but with less than the reserve free. The new store's
// first write (its key-layout version) is refused, and Open says so as its
// other refusals do, naming the directory, what the write needs, the free
// space and the reserve, not with the bare "disk nearly full" error.
func TestOpenOfANewStoreBelowReserveSaysWhatItNeeds(t *testing.T) {
	root := servers.Tmpfs(t, "400m")
	servers.FillLeaving(t, filepath.Join(root, "filler"), 100<<20)
	dir := filepath.Join(root, "db")
	db, err := Open(dir, Options{})
	if err == nil {
		db.Close()
		t.Fatal("a new store opened with 100 MiB free, below its 160 MiB reserve")
	}
	t.Log(err)
	for _, want := range []string{dir, "key-layout version", "which takes 160.0 MiB free; the disk has 9", " MiB free (writes are refused below 160 MiB)", "free space on it and start again"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open of a new store below the reserve: %q lacks %q", err, want)
		}
	}
}

// TestOpenRefusesVolumeWhoseUsableSpaceIsSmallerThanReserve: a 200 MiB
// ext4 volume has some 182 MiB of blocks, but 5% of them are reserved for
// root and never counted free, as writes are judged: some 172 MiB are
// usable, less than the reserve and the log. Open refuses it as too small,
// as it does a smaller tmpfs, instead of opening a store that would
// refuse every write once its log has grown, blaming other files.
func TestOpenRefusesVolumeWhoseUsableSpaceIsSmallerThanReserve(t *testing.T) {
	dir := filepath.Join(servers.Ext4(t, "200M"), "db")
	db, err := Open(dir, Options{})
	if err == nil {
		db.Close()
		t.Fatal("a store opened on a 200 MiB ext4 volume, less than 176 MiB of it usable")
	}
	t.Log(err)
	for _, want := range []string{dir, "volume holding the store is too small", "in all that the store may use (blocks reserved for root not counted)", "larger than 176 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open on a 200 MiB ext4 volume: %q lacks %q", err, want)
		}
	}
}

// TestOpenOnATmpfsWithoutSizeLimit: a tmpfs mounted with size=0 has no
// size limit but memory, and statfs reports 0 blocks, 0 free for it. The
// store cannot judge its free space there: it opens without the reserve,
// takes writes, and warns that the reserve is not kept, instead of
// refusing it as a volume "too small: 0 MiB" (or, before that check,
// refusing every write as if the disk were full).
func TestOpenOnATmpfsWithoutSizeLimit(t *testing.T) {
	root := servers.Tmpfs(t, "0")
	var st syscall.Statfs_t
	if err := syscall.Statfs(root, &st); err != nil {
		t.Fatal(err)
	}
	if st.Blocks != 0 {
		t.Fatalf("a tmpfs of size=0 reports %d blocks; the test needs one that reports none", st.Blocks)
	}
	var logged bytes.Buffer
	db, err := Open(filepath.Join(root, "db"), Options{Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if err != nil {
		t.Fatalf("Open on a tmpfs without a size limit: %v", err)
	}
	defer db.Close()
	if _, err := db.Claims().Claim(context.Background(), []string{"payment"}, time.Now().Add(time.Hour)); err != nil {
		t.Errorf("a write on a tmpfs without a size limit: %v", err)
	}
	if err := db.Ping(context.Background()); err != nil {
		t.Errorf("Ping on a tmpfs without a size limit: %v", err)
	}
	if !strings.Contains(logged.String(), "the free-space reserve is not kept") {
		t.Errorf("Open did not warn that the reserve is not kept; log:\n%s", logged.String())
	}
}

// TestReplayNeedOfAFullLogIsWhatTheREADMESays: the README tells an
// operator how much free space a restart's replay of a full 16 MiB log
// needs. For a log of free-allowance counts, the commonest write of a
// gateway, it is three times the entries' bytes as admitReplay counts
// them (key, value and spaceEntryOverhead each), more than three times
// the log, whose encoding of a small entry is shorter. It once said some
// 48 MiB where the store asks some 62. The log here is 1 MiB, filled as
// far as it goes, and the need scaled to 16 MiB.
func TestReplayNeedOfAFullLogIsWhatTheREADMESays(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`some (\d+)\s+MiB\s+for\s+a\s+full\s+16\s+MiB\s+log\s+of\s+free-allowance\s+counts`).FindSubmatch(readme)
	if m == nil {
		t.Fatal("README does not say what the replay of a full 16 MiB log of free-allowance counts needs")
	}
	said, _ := strconv.ParseFloat(string(m[1]), 64)

	const size = 1 << 20
	dir := filepath.Join(servers.Tmpfs(t, "400m"), "db")
	db, err := Open(dir, Options{walSize: size})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	for i := 0; db.commits.log.off < size-4<<10; i++ {
		r, err := db.Allowance().Reserve(ctx, "free", fmt.Sprintf("10.0.%d.%d", i/256%256, i%256), time.Now(), 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Allowance().Commit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	n, err := walReplayBytes(dir)
	if err != nil {
		t.Fatal(err)
	}
	logged := float64(db.commits.log.off - walHeaderSize)
	need := 3 * float64(n) * (walMinSize / logged) / (1 << 20)
	t.Logf("the log holds %.0f KiB, the replay counts %.0f KiB: a full 16 MiB log needs %.1f MiB; README says %v MiB", logged/1024, float64(n)/1024, need, said)
	if need < said*0.95 || need > said*1.05 {
		t.Errorf("a full 16 MiB log of free-allowance counts needs %.1f MiB free for its replay; README says some %v MiB", need, said)
	}
}
