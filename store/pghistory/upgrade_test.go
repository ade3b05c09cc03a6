package pghistory

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

// TestOpenWaitsForAnUpgrade: an instance that starts while another one
// upgrades the schema (which holds the migration lock for as long as the
// upgrade of a large history takes) waits for it past the bound of an
// ordinary open, instead of failing its start; the wait has a bound of
// its own.
func TestOpenWaitsForAnUpgrade(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	lock := func() {
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(migrationLock)); err != nil {
			t.Fatal(err)
		}
	}
	lock()
	_, err = Open(ctx, dsn, Options{UpgradeTimeout: 500 * time.Millisecond})
	if err == nil || !strings.Contains(err.Error(), "waiting for another instance's schema upgrade") {
		t.Fatalf("a wait past UpgradeTimeout = %v, want its own error", err)
	}
	unlocked := make(chan error, 1)
	go func() {
		time.Sleep(3 * time.Second)
		_, err := conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, int64(migrationLock))
		unlocked <- err
	}()
	var logs bytes.Buffer
	h, err := Open(ctx, dsn, Options{Timeout: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("an instance starting during another's upgrade: %v", err)
	}
	h.Close()
	if err := <-unlocked; err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "waiting for it") || !strings.Contains(logs.String(), "done with the schema") {
		t.Fatalf("the wait was not logged:\n%s", logs.String())
	}
}

// schema1DB is a fresh database with the version 1 schema, as a deployed
// database has it, and a connection to it (closed when the test ends).
func schema1DB(t *testing.T) (dsn string, conn *pgx.Conn) {
	t.Helper()
	ctx := context.Background()
	dsn = freshDB(t, servers.StartPostgres(t))
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	for _, s := range schemaV1 {
		if _, err := conn.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	return dsn, conn
}

// schemaV1 is the version 1 schema, as a deployed database has it.
var schemaV1 = []string{
	`CREATE TABLE aov_schema_version (version integer NOT NULL)`,
	`INSERT INTO aov_schema_version VALUES (1)`,
	`CREATE TABLE aov_verifications (id bytea PRIMARY KEY, at_ns bigint NOT NULL, agent_id bytea, record bytea NOT NULL)`,
	`CREATE INDEX aov_verifications_time ON aov_verifications (at_ns DESC, id)`,
	`CREATE INDEX aov_verifications_agent ON aov_verifications (agent_id, at_ns DESC, id) WHERE agent_id IS NOT NULL`,
	`CREATE TABLE aov_agent_counts (agent_id bytea PRIMARY KEY, pass bigint NOT NULL, fail bigint NOT NULL, auth_pass bigint NOT NULL,
		auth_fail bigint NOT NULL, paid bigint NOT NULL, first_ns bigint NOT NULL, last_ns bigint NOT NULL)`,
	`CREATE TABLE aov_agent_owners (agent_id bytea PRIMARY KEY, owner bytea NOT NULL)`,
}

// TestSchema1UpgradeScales: the upgrade of a version 1 history is bound
// by UpgradeTimeout, not by the bound of an ordinary open: AOV_UPGRADE_ROWS
// records (default 100,000; one authenticated in ten, records as
// verifierd writes them) take longer to upgrade than the ordinary bound
// this test gives (half a second, as 30 s is to 1,500,000 records), and
// the open succeeds with every flag as the record says. It logs the time
// per 100,000 records.
func TestSchema1UpgradeScales(t *testing.T) {
	rows := 100000
	if s := os.Getenv("AOV_UPGRADE_ROWS"); s != "" {
		rows, _ = strconv.Atoi(s)
	}
	const bound = 500 * time.Millisecond
	ctx := context.Background()
	dsn, conn := schema1DB(t)
	at := time.Date(2026, 11, 29, 22, 6, 45, 0, time.UTC)
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"aov_verifications"}, []string{"id", "at_ns", "agent_id", "record"},
		pgx.CopyFromFunc(func() func() ([]any, error) {
			i := 0
			return func() ([]any, error) {
				if i == rows {
					return nil, nil
				}
				i++
				v := storetest.Sample(fmt.Sprint("v-", i), fmt.Sprint("agent-", i%1000), at.Add(time.Duration(i)), "pass")
				v.Wallet, v.Authenticated = "0x2222222222222222222222222222222222222222", i%10 == 0
				b, err := json.Marshal(v)
				return []any{[]byte(v.ID), v.VerifiedAt.UnixNano(), []byte(v.AgentID), b}, err
			}
		}())); err != nil {
		t.Fatal(err)
	}
	// A deployed history has been vacuumed: its pages are not new.
	if _, err := conn.Exec(ctx, `VACUUM ANALYZE aov_verifications`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	h, err := Open(ctx, dsn, Options{Timeout: bound})
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	per := took * 100000 / time.Duration(rows)
	t.Logf("upgraded %d records in %v: %v per 100,000", rows, took, per)
	var n int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM aov_verifications WHERE authenticated`).Scan(&n); err != nil || n != rows/10 {
		t.Fatalf("%d records flagged (%v), want %d", n, err, rows/10)
	}
	if took < bound {
		t.Logf("the upgrade took less than the ordinary bound (%v): this run did not show that it is not bound by it", bound)
	}
}

// TestSchema1UpgradeReadsTheFlag: the upgrade flags exactly the records
// that say they are authenticated, whatever else they hold: the flag's
// own words in an agent id or a task id, NUL, bytes that are not UTF-8.
func TestSchema1UpgradeReadsTheFlag(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	ctx := context.Background()
	h := open(t, dsn)
	at := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)
	agents := []string{"seller-7", `x","authenticated":true,"y":"`, "nul\x00\"authenticated\":true", "\xff\xfe", `"authenticated" : true`}
	want := map[string]bool{}
	for i, agent := range agents {
		for j, auth := range []bool{true, false} {
			v := storetest.Sample(fmt.Sprint("v", i, j), agent, at.Add(time.Duration(i*2+j)*time.Second), "pass")
			v.Authenticated, v.Wallet, v.TaskID = auth, "0xowner", `"authenticated":true`
			if err := h.RecordVerification(ctx, v); err != nil {
				t.Fatal(err)
			}
			want[v.ID] = auth
		}
	}
	if _, err := h.pool.Exec(ctx, `UPDATE aov_verifications SET authenticated = false`); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pool.Exec(ctx, `UPDATE aov_schema_version SET version = 1`); err != nil {
		t.Fatal(err)
	}
	open(t, dsn)
	rows, err := h.pool.Query(ctx, `SELECT id, record, authenticated FROM aov_verifications`)
	if err != nil {
		t.Fatal(err)
	}
	n, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (int, error) {
		var id, b []byte
		var flag bool
		if err := r.Scan(&id, &b, &flag); err != nil {
			return 0, err
		}
		var v store.Verification
		if err := json.Unmarshal(b, &v); err != nil {
			return 0, err
		}
		if flag != want[string(id)] || flag != v.Authenticated {
			t.Errorf("record %q (agent %q) flagged %v, want %v", id, v.AgentID, flag, want[string(id)])
		}
		return 1, nil
	})
	if err != nil || len(n) != len(want) {
		t.Fatalf("%d records read (%v), want %d", len(n), err, len(want))
	}
}

// recordV1 is the record statement of the schema 1 build, which does not
// know the authenticated column.
const recordV1 = `WITH ins AS (
	INSERT INTO aov_verifications (id, at_ns, agent_id, record) VALUES ($1, $2, $3, $4)
	ON CONFLICT (id) DO NOTHING
	RETURNING agent_id
), cnt AS (
	INSERT INTO aov_agent_counts AS c (agent_id, pass, fail, auth_pass, auth_fail, paid, first_ns, last_ns)
	SELECT agent_id, $5, $6, $7, $8, $9, $2, $2 FROM ins WHERE agent_id IS NOT NULL
	ON CONFLICT (agent_id) DO UPDATE SET
		pass = c.pass + EXCLUDED.pass, fail = c.fail + EXCLUDED.fail,
		auth_pass = c.auth_pass + EXCLUDED.auth_pass, auth_fail = c.auth_fail + EXCLUDED.auth_fail,
		paid = c.paid + EXCLUDED.paid,
		first_ns = LEAST(c.first_ns, EXCLUDED.first_ns), last_ns = GREATEST(c.last_ns, EXCLUDED.last_ns)
)
SELECT count(*) FROM ins`

// TestSchema1InstancesWriteFlaggedRecordsAfterTheUpgrade: an instance of
// the schema 1 build that keeps running after another one upgraded the
// database writes records without the authenticated column; each is
// flagged as its record says, as the upgrade flagged the ones before it,
// so the counts and the authenticated index agree.
func TestSchema1InstancesWriteFlaggedRecordsAfterTheUpgrade(t *testing.T) {
	ctx := context.Background()
	dsn, old := schema1DB(t)
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	want := map[string]bool{}
	write := func(id, agent string, auth bool) {
		v := storetest.Sample(id, agent, at, "pass")
		v.Authenticated, v.Wallet = auth, "0x1111111111111111111111111111111111111111"
		if err := v.Prepare(); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var one store.Counts
		one.Add(v)
		if _, err := old.Exec(ctx, recordV1, []byte(v.ID), v.VerifiedAt.UnixNano(), []byte(v.AgentID), b,
			one.Pass, one.Fail, one.AuthenticatedPass, one.AuthenticatedFail, one.Paid); err != nil {
			t.Fatal(err)
		}
		want[id] = auth
	}
	write("before-upgrade", "seller-7", true)
	h := open(t, dsn) // a new build starts and upgrades
	write("after-upgrade", "seller-7", true)
	write("after-upgrade-label", "seller-7", false)
	write("after-upgrade-named", `x","authenticated":true,"y":"`, false)
	c, err := h.AgentCounts(ctx, "seller-7")
	if err != nil {
		t.Fatal(err)
	}
	auth, _, err := h.AuthenticatedVerifications(ctx, "seller-7", "", 100)
	if err != nil {
		t.Fatal(err)
	}
	if int64(len(auth)) != c.AuthenticatedPass || len(auth) != 2 {
		t.Fatalf("counts say %d authenticated passes, the authenticated index holds %d (%+v), want 2", c.AuthenticatedPass, len(auth), auth)
	}
	rows, err := h.pool.Query(ctx, `SELECT id, authenticated FROM aov_verifications`)
	if err != nil {
		t.Fatal(err)
	}
	var id []byte
	var flag bool
	if _, err := pgx.ForEachRow(rows, []any{&id, &flag}, func() error {
		if flag != want[string(id)] {
			t.Errorf("record %q flagged %v, want %v", id, flag, want[string(id)])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
