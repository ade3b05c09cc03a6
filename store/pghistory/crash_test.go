package pghistory

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

// crashRestart stops the PostgreSQL server behind dsn the way a crash does
// (SIGQUIT to the postmaster: immediate shutdown, WAL still in buffers is
// lost) and starts it again on the same data folder and port, with the same
// arguments. It returns once the server accepts connections again.
func crashRestart(t *testing.T, dsn string) {
	t.Helper()
	ctx := context.Background()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	var dataDir string
	if err := c.QueryRow(ctx, "SHOW data_directory").Scan(&dataDir); err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	pidFile, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.SplitN(string(pidFile), "\n", 2)[0])
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	syscall.Kill(pid, syscall.SIGQUIT)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
			break
		}
		if b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); strings.Contains(string(b), ") Z") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("postgres did not stop")
		}
	}
	os.Remove(filepath.Join(dataDir, "postmaster.pid"))
	cmd := exec.Command(args[0], args[1:]...)
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := pgx.Connect(ctx, dsn); err == nil {
			c.Close(ctx)
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("postgres did not come back")
		}
	}
}

// A verifierd whose PostgreSQL crashes after the record's INSERT and before
// its COMMIT is answered looks the transaction up by its id
// (pg_xact_status). The id is not durable: the crash loses the WAL that
// named it, and after recovery PostgreSQL hands the same transaction id to
// the next transaction, here another verifierd's record. The lookup then
// reads "committed" about another transaction. (Before: RecordVerification
// answered recorded (nil), while the record was not in the history.) The
// lookup confirms the record itself.
func TestCommitLookupSurvivesXidReuseAfterCrash(t *testing.T) {
	h, dsn, conn, xid, v := recordUpToCommitThenCrash(t)
	h2 := open(t, dsn) // verifierd B
	ctx := context.Background()
	// Verifierd B records a verification of its own after the restart.
	for i := 0; ; i++ {
		err := h2.RecordVerification(ctx, storetest.Sample("b-record", "agent-b", timeBase, "pass"))
		if err == nil {
			break
		}
		if i > 50 {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A now sends its COMMIT (production code from here on).
	cerr := h.commit(ctx, conn, xid, v.ID)
	_, verr := h2.Verification(ctx, v.ID)
	t.Logf("xid %s; commit answered %v; the record read back: %v", xid, cerr, verr)
	if cerr == nil && errors.Is(verr, store.ErrNotFound) {
		t.Fatalf("RecordVerification would answer recorded (commit returned nil), yet the record %q is not in the history", v.ID)
	}
	if errors.Is(cerr, errCommitUnknown) {
		t.Fatalf("commit answered %v; the record's absence is known", cerr)
	}
}

// The same crash with no transaction after it: the lost id is past every
// id the server has handed out, and pg_xact_status fails on it ("is in the
// future"). No transaction has that id, so the record was not committed,
// and that is known at once. (Before: the lookup's one statement failed
// with pg_xact_status, the missing row was never read, and the record
// waited commitTimeout to be answered errCommitUnknown, "may have been
// recorded".)
func TestCommitLookupAfterCrashBeforeTheIdIsReused(t *testing.T) {
	h, _, conn, xid, v := recordUpToCommitThenCrash(t)
	ctx := context.Background()
	start := time.Now()
	cerr := h.commit(ctx, conn, xid, v.ID)
	took := time.Since(start)
	_, verr := h.Verification(ctx, v.ID)
	t.Logf("xid %s; commit answered %v after %v; read back: %v", xid, cerr, took, verr)
	if !errors.Is(verr, store.ErrNotFound) {
		t.Fatalf("the record is there after all: %v", verr)
	}
	if cerr == nil || errors.Is(cerr, errCommitUnknown) || !strings.Contains(cerr.Error(), "rolled back") {
		t.Errorf("commit answered %v after %v; want rolled back: the record's transaction no longer exists", cerr, took)
	}
}

// recordUpToCommitThenCrash opens a history on a fresh database of a
// PostgreSQL server whose WAL writer waits 10 s (so the crash's window is
// certain; at the default 200 ms it is the last 200 ms of writes before a
// crash), records one verification, then sends a second one exactly as
// RecordVerification does up to its COMMIT, and crashes and restarts the
// server. It returns the history, the database, the connection the COMMIT
// is to go on, the record's transaction id and the record.
func recordUpToCommitThenCrash(t *testing.T) (*History, string, *pgxpool.Conn, string, store.Verification) {
	srv := servers.StartPostgres(t, "-c", "wal_writer_delay=10000ms", "-c", "synchronous_commit=on")
	dsn := freshDB(t, srv)
	h := open(t, dsn) // verifierd A
	ctx := context.Background()
	if err := h.RecordVerification(ctx, storetest.Sample("warm", "agent-a", timeBase, "pass")); err != nil {
		t.Fatal(err)
	}
	v := storetest.Sample("lost-record", "agent-a", timeBase.Add(time.Second), "pass")
	args, err := recordArgs(v)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Release)
	var n int
	var xid string
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(record, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&n, &xid) })
	if err := conn.SendBatch(ctx, b).Close(); err != nil || n != 1 {
		t.Fatal(err, n)
	}
	crashRestart(t, dsn) // before the COMMIT reaches it
	return h, dsn, conn, xid, v
}
