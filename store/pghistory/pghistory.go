// Package pghistory keeps verifierd's verification history in PostgreSQL,
// so several verifierd instances share one history: exact per-agent counts,
// one record per verification id across all of them, and stable keyset
// paging for reputation pages while others append. It implements the same
// history contract as the embedded store (store/storetest proves both).
//
// Ids, agent ids and records are stored as bytea: PostgreSQL's text and
// jsonb refuse NUL characters, which a Go string (and so an agent id) may
// hold. Times are kept as Unix nanoseconds (bigint), as exact as the
// embedded store.
package pghistory

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/aovhq/aov/store"
)

// schemaVersion is the version of the tables below; a database at a newer
// version is refused, so a downgrade fails loudly.
const schemaVersion = 2

// migrationLock is the advisory lock key that serialises schema setup:
// two instances starting at once would otherwise race on the catalog
// ("tuple concurrently updated").
const migrationLock = 0x616f765f68697374 // "aov_hist"

// schemaVersionTable holds the schema's version, one row. It is written in
// the transaction that sets up or upgrades the schema, so a version read
// from it is never ahead of the tables.
const schemaVersionTable = `CREATE TABLE IF NOT EXISTS aov_schema_version (version integer NOT NULL)`

// schema creates the tables of an empty database, at schemaVersion.
var schema = append([]string{
	`CREATE TABLE IF NOT EXISTS aov_verifications (
		id       bytea  PRIMARY KEY,
		at_ns    bigint NOT NULL,
		agent_id bytea,
		record   bytea  NOT NULL
	)`,
	// Keyset paging, newest first, ties by id ascending (the embedded
	// store's order): one index for the global listing, one per agent.
	`CREATE INDEX IF NOT EXISTS aov_verifications_time ON aov_verifications (at_ns DESC, id)`,
	`CREATE INDEX IF NOT EXISTS aov_verifications_agent ON aov_verifications (agent_id, at_ns DESC, id) WHERE agent_id IS NOT NULL`,
	`CREATE TABLE IF NOT EXISTS aov_agent_counts (
		agent_id  bytea  PRIMARY KEY,
		pass      bigint NOT NULL,
		fail      bigint NOT NULL,
		auth_pass bigint NOT NULL,
		auth_fail bigint NOT NULL,
		paid      bigint NOT NULL,
		first_ns  bigint NOT NULL,
		last_ns   bigint NOT NULL
	)`,
	// Who owns an agent id: written once, never changed (owners.go).
	`CREATE TABLE IF NOT EXISTS aov_agent_owners (
		agent_id bytea PRIMARY KEY,
		owner    bytea NOT NULL
	)`,
}, schemaV2...)

// schemaV2 is what version 2 adds: the authenticated flag of each record,
// indexed, so a score of an owned agent reads only those rows (owners.go).
var schemaV2 = []string{
	`ALTER TABLE aov_verifications ADD COLUMN IF NOT EXISTS authenticated boolean NOT NULL DEFAULT false`,
	`CREATE INDEX IF NOT EXISTS aov_verifications_authenticated ON aov_verifications (agent_id, at_ns DESC, id) WHERE authenticated`,
}

// History is the verification history on one PostgreSQL database. It is
// safe for concurrent use.
type History struct {
	pool *pgxpool.Pool
}

// Options tune Open. The zero value is the default.
type Options struct {
	// Timeout bounds each step of Open that does no upgrade work
	// (connecting, setting up or checking the schema), so that a database
	// that does not answer fails the start instead of hanging it. Zero
	// means DefaultTimeout.
	Timeout time.Duration
	// UpgradeTimeout bounds an upgrade of the schema's data (its work
	// grows with the history: migrateAuthenticated) and the wait for
	// another instance's upgrade, so that a large history is upgraded
	// rather than rolled back at every start. Zero means
	// DefaultUpgradeTimeout.
	UpgradeTimeout time.Duration
	// Logger is told when an upgrade or the wait for one starts and ends.
	// Nil discards.
	Logger *slog.Logger
}

// Defaults of Options.
const (
	DefaultTimeout        = 30 * time.Second
	DefaultUpgradeTimeout = time.Hour
)

// Open connects to dsn (postgres://…), sets up or checks the schema under
// an advisory lock (so instances starting together migrate once) and
// returns the history. ctx cancels it; opts bound its steps.
func Open(ctx context.Context, dsn string, opts Options) (*History, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.UpgradeTimeout <= 0 {
		opts.UpgradeTimeout = DefaultUpgradeTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("history: parsing the PostgreSQL address: %w", err)
	}
	sessionDefault(cfg.ConnConfig.RuntimeParams, "idle_in_transaction_session_timeout", idleInTransactionTimeout)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("history: connecting to PostgreSQL: %w", err)
	}
	h := &History{pool: pool}
	if err := h.migrate(ctx, opts); err != nil {
		pool.Close()
		return nil, err
	}
	return h, nil
}

// idleInTransactionTimeout is the idle_in_transaction_session_timeout of
// the pool's sessions: how long the server keeps a transaction of ours
// open while it waits for the next statement. A record holds its agent's
// counts row from its INSERT to its COMMIT, two round trips apart
// (RecordVerification), and a verifierd that vanishes between them (host
// crash, partition: the server sees no FIN) would otherwise leave that
// lock held until the server's TCP keepalive notices, over two hours by
// default, while every other instance's record of the agent waits on it
// to its deadline. Our own gap there is one clock read, and the gaps
// inside SetPayments' transaction are as short, so 5 s ends only
// sessions whose client is gone or stalled that long; and it is a third
// of the answer deadline Caddyfile.example's gateway gives (15 s;
// upstream_timeout is 30 s by default), so a record queued behind such a
// lock still answers in time. A session the server ends this way is rolled back:
// its COMMIT fails, or is looked up and found aborted (commit).
//
// The client's side needs nothing more: every call runs under a context
// that bounds it, a lock wait included, and Go's dialer keeps TCP
// keepalive on.
const idleInTransactionTimeout = "5s"

// sessionDefault sets the server setting name to value for the pool's
// sessions, unless the operator's address sets it already, as a parameter
// of its own or in options (-c name=…). A setting sent at connection
// start outranks postgresql.conf and ALTER ROLE, so the address is where
// an operator changes it.
func sessionDefault(params map[string]string, name, value string) {
	if _, ok := params[name]; ok || strings.Contains(params["options"], name) {
		return
	}
	params[name] = value
}

// migrate sets up or checks the schema. A database already at
// schemaVersion, the usual case, is only read: its version, with no lock
// on the migration or on any table, so that a start never waits for live
// writes nor makes them wait (schema statements, even ones that change
// nothing, lock the history table, and a lock taken behind a live
// SetPayments closes a cycle with it). The version needs no lock to be
// read: it is written in the transaction that makes the schema it names.
//
// Any other database is set up or upgraded in one transaction under the
// migration lock, each step under its own bound (Options): a step that
// waits for or does upgrade work gets UpgradeTimeout, any other Timeout.
// The transaction may stay open far longer than Timeout while it waits or
// upgrades; the server does not end it (idleInTransactionTimeout counts
// only the time between statements).
func (h *History) migrate(ctx context.Context, opts Options) error {
	step := func(long bool) (context.Context, context.CancelFunc) {
		if long {
			return context.WithTimeout(ctx, opts.UpgradeTimeout)
		}
		return context.WithTimeout(ctx, opts.Timeout)
	}
	sctx, cancel := step(false)
	v, err := readVersion(sctx, h.pool)
	cancel()
	switch {
	case err != nil:
		return err
	case v == schemaVersion:
		return nil
	case v > schemaVersion:
		return newerSchema(v)
	}
	sctx, cancel = step(false)
	conn, err := h.pool.Acquire(sctx)
	cancel()
	if err != nil {
		return fmt.Errorf("history: connecting to PostgreSQL: %w", err)
	}
	// Released inside a transaction (every return before the COMMIT),
	// the connection is closed by the pool and the server rolls the
	// transaction back: no ROLLBACK that could wait on a stalled server.
	defer conn.Release()
	sctx, cancel = step(false)
	tx, err := conn.Begin(sctx)
	cancel()
	if err != nil {
		return fmt.Errorf("history: setting up the schema: %w", err)
	}
	// A statement_timeout or lock_timeout the operator set on the database
	// or role would cut the wait for another instance's upgrade, and the
	// upgrade itself (its table lock, its rewrite), long before their hour:
	// an instance would then fail every start, and a large history never
	// be upgraded. Only opts bound them, here; the pool's other sessions
	// keep the server's settings.
	sctx, cancel = step(false)
	_, err = tx.Exec(sctx, `SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0`)
	cancel()
	if err != nil {
		return fmt.Errorf("history: setting up the schema: %w", err)
	}
	if err := lockMigration(ctx, tx, step, opts.Logger); err != nil {
		return err
	}
	// Again under the lock: another instance may have done it meanwhile.
	sctx, cancel = step(false)
	defer cancel()
	if _, err := tx.Exec(sctx, schemaVersionTable); err != nil {
		return fmt.Errorf("history: setting up the schema: %w", err)
	}
	if v, err = readVersion(sctx, tx); err != nil {
		return err
	}
	switch {
	case v == 0:
		for _, stmt := range schema {
			if _, err := tx.Exec(sctx, stmt); err != nil {
				return fmt.Errorf("history: setting up the schema: %w", err)
			}
		}
		if _, err := tx.Exec(sctx, `INSERT INTO aov_schema_version VALUES ($1)`, schemaVersion); err != nil {
			return fmt.Errorf("history: setting up the schema: %w", err)
		}
	case v == 1:
		uctx, cancel := step(true)
		defer cancel()
		if err := migrateAuthenticated(uctx, tx, opts.Logger); err != nil {
			return err
		}
	case v != schemaVersion:
		return newerSchema(v)
	}
	cctx, cancel := step(false)
	defer cancel()
	if err := tx.Commit(cctx); err != nil {
		return fmt.Errorf("history: setting up the schema: %w", err)
	}
	return nil
}

// readVersion reads the schema's version: 0 when there is none yet (an
// empty database).
func readVersion(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (int, error) {
	var v int
	err := q.QueryRow(ctx, `SELECT version FROM aov_schema_version`).Scan(&v)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); errors.Is(err, pgx.ErrNoRows) || ok && pgErr.Code == "42P01" { // undefined_table
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("history: reading the schema version: %w", err)
	}
	return v, nil
}

func newerSchema(v int) error {
	return fmt.Errorf("history: the database has schema version %d; this build reads version %d", v, schemaVersion)
}

// lockMigration takes the migration lock in tx. A lock another instance
// holds is waited for under UpgradeTimeout, and logged: that instance may
// be upgrading a large history.
func lockMigration(ctx context.Context, tx pgx.Tx, step func(bool) (context.Context, context.CancelFunc), log *slog.Logger) error {
	sctx, cancel := step(false)
	defer cancel()
	var got bool
	if err := tx.QueryRow(sctx, `SELECT pg_try_advisory_xact_lock($1)`, int64(migrationLock)).Scan(&got); err != nil {
		return fmt.Errorf("history: taking the migration lock: %w", err)
	}
	if got {
		return nil
	}
	log.Info("history: another instance is setting up or upgrading the schema; waiting for it")
	start := time.Now()
	uctx, cancel := step(true)
	defer cancel()
	if _, err := tx.Exec(uctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
		return fmt.Errorf("history: waiting for another instance's schema upgrade: %w", err)
	}
	log.Info("history: the other instance is done with the schema", "waited", time.Since(start).String())
	return nil
}

// Close closes the connection pool.
func (h *History) Close() error { h.pool.Close(); return nil }

// Ping reports whether the database answers.
func (h *History) Ping(ctx context.Context) error { return h.pool.Ping(ctx) }

// record inserts a verification and counts it in one statement: the counts
// change only when the insert did (a duplicate id inserts nothing), and
// both commit together. A record that does not count ($11 false: pending
// or unpaid) leaves its agent's counts alone, first and last included, as
// the embedded store's Counts.Add does; SetPayments counts it if it is
// reported paid. It also returns the id of its transaction, which tells
// whether a COMMIT whose answer was lost is still in progress (commit).
const record = `WITH ins AS (
	INSERT INTO aov_verifications (id, at_ns, agent_id, record, authenticated) VALUES ($1, $2, $3, $4, $10)
	ON CONFLICT (id) DO NOTHING
	RETURNING agent_id
), cnt AS (
	INSERT INTO aov_agent_counts AS c (agent_id, pass, fail, auth_pass, auth_fail, paid, first_ns, last_ns)
	SELECT agent_id, $5, $6, $7, $8, $9, $2, $2 FROM ins WHERE agent_id IS NOT NULL AND $11
	ON CONFLICT (agent_id) DO UPDATE SET
		pass = c.pass + EXCLUDED.pass, fail = c.fail + EXCLUDED.fail,
		auth_pass = c.auth_pass + EXCLUDED.auth_pass, auth_fail = c.auth_fail + EXCLUDED.auth_fail,
		paid = c.paid + EXCLUDED.paid,
		first_ns = LEAST(c.first_ns, EXCLUDED.first_ns), last_ns = GREATEST(c.last_ns, EXCLUDED.last_ns)
)
SELECT count(*), pg_current_xact_id()::text FROM ins`

// RecordVerification appends v and updates its agent's counts atomically;
// a second record with the same id, from any instance, is refused with
// store.ErrDuplicate and changes nothing.
//
// It keeps the embedded store's promise about the caller's deadline
// (verifierd's: when the gateway stops waiting for the answer): an error
// means nothing was recorded, so verifierd may answer that it was not. The
// deadline holds until the COMMIT is sent, and the insert runs in an
// explicit transaction, so a deadline that passes before then leaves
// nothing behind (the transaction is never committed). In autocommit the
// statement's own commit would race the deadline, and a reply that
// arrived late would have hidden a record that counts. Once the COMMIT is
// sent its outcome is awaited, bounded by commitTimeout rather than by the
// caller, as the embedded store awaits a group commit it has taken.
func (h *History) RecordVerification(ctx context.Context, v store.Verification) error {
	args, err := recordArgs(v)
	if err != nil {
		return err
	}
	// The caller's deadline holds at the last instant before the write,
	// even in a process resumed before the context's timer fired.
	if err := store.ContextEnded(ctx, time.Now()); err != nil {
		return err
	}
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("history: recording verification: %w", err)
	}
	// A connection released inside a transaction (every return before
	// the COMMIT below) is closed by the pool, and the server rolls the
	// transaction back.
	defer conn.Release()
	var n int
	var xid string
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(record, args...).QueryRow(func(row pgx.Row) error { return row.Scan(&n, &xid) })
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return fmt.Errorf("history: recording verification: %w", err)
	}
	if n == 0 {
		return store.ErrDuplicate
	}
	if err := store.ContextEnded(ctx, time.Now()); err != nil {
		return err
	}
	return h.commit(ctx, conn, xid, v.ID)
}

// recordArgs checks and normalises v (store.Verification.Prepare) and
// returns the arguments of the record statement that records it.
func recordArgs(v store.Verification) ([]any, error) {
	if err := v.Prepare(); err != nil {
		return nil, err
	}
	val, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding verification: %w", err)
	}
	var one store.Counts
	one.Add(v)
	var agent []byte
	if v.AgentID != "" {
		agent = []byte(v.AgentID)
	}
	return []any{[]byte(v.ID), v.VerifiedAt.UnixNano(), agent, val,
		one.Pass, one.Fail, one.AuthenticatedPass, one.AuthenticatedFail, one.Paid, v.Authenticated, v.Counted()}, nil
}

// commitTimeout bounds the wait for a COMMIT's answer, and then again the
// lookup of its outcome when that answer was lost.
const commitTimeout = 10 * time.Second

// errCommitUnknown is a COMMIT whose outcome could not be learnt: the
// server did not answer it, nor the lookup afterwards.
var errCommitUnknown = errors.New("history: the database did not say whether the record was committed")

// lookupCommit reads, for a transaction id ($1) and the record id it
// inserted ($2): whether the id is past every id the server has handed
// out (after a crash that lost the WAL naming it, before another
// transaction takes it: no transaction has it, and pg_xact_status would
// fail with "is in the future"), its status otherwise, whether it is
// visible to this statement's snapshot, and whether the record's row is
// there.
const lookupCommit = `SELECT f, CASE WHEN NOT f THEN pg_xact_status($1::xid8) END,
	pg_visible_in_snapshot($1::xid8, s), EXISTS (SELECT 1 FROM aov_verifications WHERE id = $2)
	FROM (SELECT pg_current_snapshot() AS s) AS snap,
	LATERAL (SELECT $1::xid8 >= pg_snapshot_xmax(s) AS f) AS fut`

// commit commits the transaction open on conn, whose id is xid and which
// inserted the record id, and returns nil only if it committed. A COMMIT
// the server answered with an error was rolled back. One whose answer did
// not come (the connection dropped, or commitTimeout passed) may have
// committed or not: the server is asked on another connection, waiting
// while the transaction is still in progress, so that the answer is known
// rather than guessed.
//
// The answer is the record itself: its row, by primary key, is there only
// if our transaction committed (the insert inserted it, and a record is
// never deleted). The transaction's id only says whether to wait for it.
// Its status alone (pg_xact_status) is not the answer: an id is durable
// only once a commit made it so, and after a crash (or a failover to an
// asynchronous standby) that lost the WAL naming our transaction the
// server hands the same id to another one, such as another instance's
// record, which then commits; until one does, the id is in the future,
// and no transaction has it. A committed id whose row is missing is
// believed only once the id is visible in the snapshot that looked for the
// row: PostgreSQL marks a transaction committed a moment before it shows
// its rows to new snapshots.
// It wraps no context error: the caller's deadline is not why it failed.
func (h *History) commit(ctx context.Context, conn *pgxpool.Conn, xid, id string) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	_, err := conn.Exec(cctx, `COMMIT`)
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*pgconn.PgError](err); ok {
		return fmt.Errorf("history: committing verification: %w", err)
	}
	conn.Conn().Close(cctx) // the conn's state is unknown; do not reuse it
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	defer cancel()
	for {
		var status *string
		var future, visible, found bool
		serr := h.pool.QueryRow(lctx, lookupCommit, xid, []byte(id)).Scan(&future, &status, &visible, &found)
		switch {
		case serr != nil:
		case found:
			return nil
		case future, status != nil && (*status == "aborted" || *status == "committed" && visible):
			return fmt.Errorf("history: committing verification: rolled back (the COMMIT's answer was lost: %v)", err.Error())
		}
		select {
		case <-lctx.Done():
			return fmt.Errorf("%w (commit: %v; lookup: %v)", errCommitUnknown, err.Error(), serr)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// AgentCounts returns agentID's totals (zero for an agent never seen).
func (h *History) AgentCounts(ctx context.Context, agentID string) (store.Counts, error) {
	var c store.Counts
	var first, last int64
	err := h.pool.QueryRow(ctx, `SELECT pass, fail, auth_pass, auth_fail, paid, first_ns, last_ns
		FROM aov_agent_counts WHERE agent_id = $1`, []byte(agentID)).
		Scan(&c.Pass, &c.Fail, &c.AuthenticatedPass, &c.AuthenticatedFail, &c.Paid, &first, &last)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Counts{}, nil
	}
	if err != nil {
		return c, fmt.Errorf("history: reading counts: %w", err)
	}
	c.First, c.Last = time.Unix(0, first).UTC(), time.Unix(0, last).UTC()
	return c, nil
}

// Verification returns the record with the given id, or store.ErrNotFound.
func (h *History) Verification(ctx context.Context, id string) (store.Verification, error) {
	var b []byte
	err := h.pool.QueryRow(ctx, `SELECT record FROM aov_verifications WHERE id = $1`, []byte(id)).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Verification{}, store.ErrNotFound
	}
	var v store.Verification
	if err == nil {
		err = json.Unmarshal(b, &v)
	}
	if err != nil {
		return v, fmt.Errorf("history: reading verification: %w", err)
	}
	return v, nil
}

// Verifications pages through the history newest first (ties by id), as
// the embedded store does: agentID's records, or every record when agentID
// is "". The cursor is the (time, id) of the last record served, so a page
// never repeats or skips a record older than it while others append.
func (h *History) Verifications(ctx context.Context, agentID, cursor string, limit int) ([]store.Verification, string, error) {
	return h.page(ctx, agentID, false, cursor, limit)
}

// page is Verifications, of agentID's authenticated records only when
// authenticated is set (AuthenticatedVerifications).
func (h *History) page(ctx context.Context, agentID string, authenticated bool, cursor string, limit int) ([]store.Verification, string, error) {
	if limit <= 0 {
		limit = store.DefaultPageSize
	}
	limit = min(limit, store.MaxPageSize)
	// Each variant is its own query text, so the planner sees which index
	// serves it: aov_verifications_time, aov_verifications_agent, or the
	// partial aov_verifications_authenticated.
	var conds []string
	args := []any{limit + 1} // one more row tells whether another page follows
	if agentID != "" {
		args = append(args, []byte(agentID))
		conds = append(conds, fmt.Sprintf(`agent_id = $%d`, len(args)))
	}
	if authenticated {
		conds = append(conds, `authenticated`)
	}
	if cursor != "" {
		afterAt, afterID, err := parseCursor(cursor)
		if err != nil {
			return nil, "", err
		}
		// The page starts after the cursor's (time, id) in the order
		// below. "at_ns <=" is what bounds the index scan, so a page reads
		// only its rows and those that share the cursor's time; the rest
		// drops those ties at or before the cursor's id. A row comparison
		// cannot bound an order descending in one column and ascending in
		// the other, and a cursor inside an OR bounds nothing: every page
		// read the index from the newest row down to it.
		args = append(args, afterAt, afterID)
		n := len(args)
		conds = append(conds, fmt.Sprintf(`at_ns <= $%d AND (at_ns < $%d OR id > $%d)`, n-1, n-1, n))
	}
	q := `SELECT at_ns, id, record FROM aov_verifications`
	if len(conds) > 0 {
		q += ` WHERE ` + strings.Join(conds, ` AND `)
	}
	q += ` ORDER BY at_ns DESC, id LIMIT $1`
	rows, err := h.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("history: paging: %w", err)
	}
	defer rows.Close()
	out := make([]store.Verification, 0, min(limit, 16))
	var next string
	var lastAt int64
	var lastID, id, b []byte
	for rows.Next() {
		var at int64
		if err := rows.Scan(&at, &id, &b); err != nil {
			return nil, "", fmt.Errorf("history: paging: %w", err)
		}
		if len(out) == limit {
			next = makeCursor(lastAt, lastID)
			break
		}
		var v store.Verification
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, "", fmt.Errorf("history: decoding verification: %w", err)
		}
		out = append(out, v)
		lastAt, lastID = at, append(lastID[:0], id...)
	}
	if err := rows.Err(); err != nil {
		return nil, "", fmt.Errorf("history: paging: %w", err)
	}
	return out, next, nil
}

// A paging cursor is the (time, id) of the last record served: eight bytes
// of Unix nanoseconds, then the id, in unpadded URL-safe base64. It comes
// back from the client, so parseCursor accepts nothing else.
func makeCursor(at int64, id []byte) string {
	return base64.RawURLEncoding.EncodeToString(append(binary.BigEndian.AppendUint64(nil, uint64(at)), id...))
}

func parseCursor(s string) (at int64, id []byte, err error) {
	// The decoder skips \r and \n even in strict mode; refusing them keeps
	// one spelling per cursor.
	b, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || strings.ContainsAny(s, "\r\n") || len(b) < 9 || len(b) > 8+200 {
		return 0, nil, store.ErrBadCursor
	}
	return int64(binary.BigEndian.Uint64(b)), b[8:], nil
}
