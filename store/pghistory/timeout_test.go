package pghistory

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aovhq/aov/internal/servers"
)

// serverTimeout sets a PostgreSQL timeout (statement_timeout or
// lock_timeout) of 300 ms on dsn's database, as hosted services and many
// operators do on the database or the role: every session that starts from
// now on has it.
func serverTimeout(t *testing.T, dsn, setting string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET "+setting+" = '300ms'"); err != nil {
		t.Fatal(err)
	}
}

// README: "an upgrade ... and an instance's wait for another's upgrade have
// an hour". A PostgreSQL with a statement_timeout or a lock_timeout (set on
// the database or role) cancels that wait at its timeout unless the
// migration lifts it. (Before: an instance starting while another set up or
// upgraded the schema was refused instead of waiting: pghistory set only
// idle_in_transaction_session_timeout.)
func TestOpenWaitsForAnUpgradeUnderServerTimeouts(t *testing.T) {
	for _, setting := range []string{"statement_timeout", "lock_timeout"} {
		t.Run(setting, func(t *testing.T) {
			srv := servers.StartPostgres(t)
			dsn := freshDB(t, srv)
			ctx := context.Background()
			serverTimeout(t, dsn, setting)
			// Another instance holds the migration lock for 1.5 s (setting up or
			// upgrading the schema).
			other, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Close(ctx)
			tx, err := other.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
				t.Fatal(err)
			}
			go func() { time.Sleep(1500 * time.Millisecond); tx.Rollback(ctx) }()
			h, err := Open(ctx, dsn, Options{})
			if err != nil {
				t.Fatalf("Open while another instance holds the migration lock for 1.5 s (%s 300ms): %v; README promises the wait an hour", setting, err)
			}
			h.Close()
		})
	}
}

// The upgrade itself has the hour too: its first step locks the history
// table, and waits for the records old builds are writing; a server
// timeout would cancel that wait (and the rewrite of a large history), and
// with it the upgrade, at every start.
func TestSchema1UpgradeUnderServerTimeouts(t *testing.T) {
	for _, setting := range []string{"statement_timeout", "lock_timeout"} {
		t.Run(setting, func(t *testing.T) {
			ctx := context.Background()
			dsn, conn := schema1DB(t)
			// An old build's record, in flight for 1.5 s.
			tx, err := conn.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO aov_verifications (id, at_ns, record) VALUES ('old', 1, '{}')`); err != nil {
				t.Fatal(err)
			}
			serverTimeout(t, dsn, setting)
			committed := make(chan error, 1)
			go func() { time.Sleep(1500 * time.Millisecond); committed <- tx.Commit(ctx) }()
			h, err := Open(ctx, dsn, Options{})
			if err != nil {
				t.Fatalf("an upgrade waiting 1.5 s for an old build's record (%s 300ms): %v; README promises an upgrade an hour", setting, err)
			}
			defer h.Close()
			// The upgrade went on once the server had the commit; conn is
			// free again only once Commit has read its answer.
			if err := <-committed; err != nil {
				t.Fatalf("the old build's commit: %v", err)
			}
			var v int
			if err := conn.QueryRow(ctx, `SELECT version FROM aov_schema_version`).Scan(&v); err != nil || v != schemaVersion {
				t.Fatalf("schema version %d (%v) after the upgrade", v, err)
			}
		})
	}
}
