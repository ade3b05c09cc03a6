package pghistory

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

// TestOpenAtTheCurrentSchemaTakesNoTableLock: an instance that starts (or
// a copy-history that opens the history) while another instance is in the
// middle of a record starts at once. Schema statements would lock the
// history table against the live write, and their lock, taken behind it,
// would hold up every other write and close a cycle with SetPayments
// (which PostgreSQL breaks by failing one side).
func TestOpenAtTheCurrentSchemaTakesNoTableLock(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	ctx := context.Background()
	live := open(t, dsn)
	tx, err := live.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	args, err := recordArgs(storetest.Sample("live-1", "seller-7", time.Now(), "pass"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, record, args...); err != nil {
		t.Fatal(err)
	}
	h, err := Open(ctx, dsn, Options{Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("an instance starting while another records: %v", err)
	}
	h.Close()
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("the live record after another instance started: %v", err)
	}
}

// badgerSource is a Badger history holding vs (a real store, as
// copy-history reads it).
func badgerSource(t *testing.T, vs ...store.Verification) *store.DB {
	t.Helper()
	b, err := store.Open(t.TempDir(), store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	for _, v := range vs {
		if err := b.RecordVerification(context.Background(), v); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// lockCounts locks agent's counts row in tx, as a record or a settlement
// of one of its verifications does.
func lockCounts(ctx context.Context, tx pgx.Tx, agent string) error {
	_, err := tx.Exec(ctx, `UPDATE aov_agent_counts SET pass = pass WHERE agent_id = $1`, []byte(agent))
	return err
}

// waitForLockWait returns once some session of h's database waits for a
// lock.
func waitForLockWait(t *testing.T, h *History) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int
		if err := h.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
	t.Fatal("nobody waited for a lock")
}

// copyWhileLocked copies src into copier while tx holds first's counts
// row; once the copy waits for it, tx locks second's and commits. It
// returns the copy's and tx's outcomes.
func copyWhileLocked(t *testing.T, copier, live *History, tx pgx.Tx, src Source, first, second string) (Copied, error, error) {
	ctx := context.Background()
	if err := lockCounts(ctx, tx, first); err != nil {
		t.Fatal(err)
	}
	type result struct {
		c   Copied
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := copier.CopyFrom(ctx, src, true)
		done <- result{c, err}
	}()
	waitForLockWait(t, live)
	txErr := lockCounts(ctx, tx, second)
	if txErr == nil {
		txErr = tx.Commit(ctx)
	}
	r := <-done
	return r.c, r.err, txErr
}

// TestCopyLocksCountsInAgentOrder: a copy step locks its agents' counts
// rows in agent id order, as SetPayments does, whatever the order of the
// records it copies (the source's, newest first), so a live settlement
// of the same agents never waits on it in a cycle. The settlement here is
// a transaction that holds agent-a's row and then takes agent-b's, as a
// SetPayments of both does, paused between the two so that the copy runs
// in the middle (SetPayments itself cannot be paused there); it is the one
// PostgreSQL would fail in a cycle (its deadlock_timeout is the shortest).
func TestCopyLocksCountsInAgentOrder(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	ctx := context.Background()
	live, copier := open(t, dsn), open(t, dsn)
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, agent := range []string{"agent-a", "agent-b"} {
		if err := live.RecordVerification(ctx, storetest.Sample("live-"+agent, agent, at, "pass")); err != nil {
			t.Fatal(err)
		}
	}
	// Newest first: agent-b's record comes first in the source's order.
	src := badgerSource(t, storetest.Sample("old-a", "agent-a", at.Add(-2*time.Hour), "pass"),
		storetest.Sample("old-b", "agent-b", at.Add(-time.Hour), "pass"))
	tx, err := live.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '10ms'`); err != nil {
		t.Fatal(err)
	}
	c, copyErr, liveErr := copyWhileLocked(t, copier, live, tx, src, "agent-a", "agent-b")
	if liveErr != nil || copyErr != nil || c.Records != 2 {
		t.Fatalf("a settlement of agent-a and agent-b while a copy step counts them: %v; copy: %+v, %v", liveErr, c, copyErr)
	}
}

// TestCopyStepRetriesADeadlock: a copy step PostgreSQL fails to break a
// cycle (or a serialization failure) is run again, a bounded number of
// times, and counts once. The other side of the cycle is a transaction
// that locks counts rows out of agent order, which no writer of ours
// does: it stands for a writer this build does not control.
func TestCopyStepRetriesADeadlock(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	ctx := context.Background()
	live, copier := open(t, dsn), open(t, dsn)
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, agent := range []string{"agent-a", "agent-z"} {
		if err := live.RecordVerification(ctx, storetest.Sample("live-"+agent, agent, at, "pass")); err != nil {
			t.Fatal(err)
		}
	}
	// agent-a's record first in either order: the source's and agent ids'.
	src := badgerSource(t, storetest.Sample("old-a", "agent-a", at.Add(-time.Hour), "pass"),
		storetest.Sample("old-z", "agent-z", at.Add(-2*time.Hour), "pass"))
	tx, err := live.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	// The copy's session finds the cycle first and is failed.
	if _, err := tx.Exec(ctx, `SET LOCAL deadlock_timeout = '30s'`); err != nil {
		t.Fatal(err)
	}
	c, copyErr, liveErr := copyWhileLocked(t, copier, live, tx, src, "agent-z", "agent-a")
	if liveErr != nil {
		t.Fatal(liveErr)
	}
	if copyErr != nil || c.Records != 2 {
		t.Fatalf("a copy step failed by a deadlock: %+v, %v", c, copyErr)
	}
	for _, agent := range []string{"agent-a", "agent-z"} {
		if got, err := live.AgentCounts(ctx, agent); err != nil || got.Pass != 2 {
			t.Fatalf("%s after the retried copy: %+v (%v), want 2 passes", agent, got, err)
		}
	}
}

// TestRetryStepIsBounded: a step failed by a lock cycle again and again is
// given up after stepAttempts attempts, with that failure; any other
// failure is not retried. The failures are made up: PostgreSQL cannot be
// made to fail one step five times in a row on demand.
func TestRetryStepIsBounded(t *testing.T) {
	for _, tc := range []struct {
		code string
		want int
	}{{"40P01", stepAttempts}, {"40001", stepAttempts}, {"23505", 1}} {
		n := 0
		err := retryStep(context.Background(), func(context.Context) error {
			n++
			return &pgconn.PgError{Code: tc.code}
		})
		if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != tc.code || n != tc.want {
			t.Errorf("SQLSTATE %s: %d attempts, %v; want %d attempts and the failure", tc.code, n, err, tc.want)
		}
	}
}
