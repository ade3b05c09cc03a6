package pghistory

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aovhq/aov/store"
)

// maxOwner bounds an owner address, as the embedded store does.
const maxOwner = 128

// BindAgent makes wallet the owner of agentID unless it already has one
// and returns the owner afterwards; of concurrent first binders on any
// instances exactly one wins and the others get its address. verifierd
// uses it (when the history offers it) before it counts a verification of
// an agent id that is not itself a wallet as authenticated.
func (h *History) BindAgent(ctx context.Context, agentID, wallet string) (string, error) {
	if agentID == "" || len(agentID) > store.MaxAgentIDBytes {
		return "", fmt.Errorf("store: agent id must be 1..%d bytes", store.MaxAgentIDBytes)
	}
	if wallet == "" || len(wallet) > maxOwner {
		return "", fmt.Errorf("store: owner address must be 1..%d bytes", maxOwner)
	}
	var owner []byte
	err := h.pool.QueryRow(ctx, `INSERT INTO aov_agent_owners (agent_id, owner) VALUES ($1, $2)
		ON CONFLICT (agent_id) DO NOTHING RETURNING owner`, []byte(agentID), []byte(wallet)).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		// Someone bound it first. Its row may have committed after this
		// statement's snapshot, so read it in a new statement.
		o, err := h.AgentOwner(ctx, agentID)
		if err == nil && o == "" {
			err = errors.New("store: agent owner vanished")
		}
		return o, err
	}
	if err != nil {
		return "", fmt.Errorf("history: binding agent owner: %w", err)
	}
	return string(owner), nil
}

// AgentOwner returns agentID's owner, or "" when nobody bound it.
func (h *History) AgentOwner(ctx context.Context, agentID string) (string, error) {
	if len(agentID) > store.MaxAgentIDBytes {
		return "", nil
	}
	var owner []byte
	err := h.pool.QueryRow(ctx, `SELECT owner FROM aov_agent_owners WHERE agent_id = $1`, []byte(agentID)).Scan(&owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("history: reading agent owner: %w", err)
	}
	return string(owner), nil
}

// AuthenticatedVerifications pages through agentID's authenticated
// verifications newest first, as the embedded store does: the rows of the
// partial index aov_verifications_authenticated only, so a score of an
// owned agent never reads the labels others recorded under its id.
func (h *History) AuthenticatedVerifications(ctx context.Context, agentID, cursor string, limit int) ([]store.Verification, string, error) {
	if agentID == "" { // records without an agent are never authenticated
		if cursor != "" {
			if _, _, err := parseCursor(cursor); err != nil {
				return nil, "", err
			}
		}
		return nil, "", nil
	}
	return h.page(ctx, agentID, true, cursor, limit)
}

// recordAuthenticated defines aov_record_authenticated(agent_id, record):
// whether a record without the authenticated column's value (one of
// version 1, or one a version 1 build writes) says it is authenticated.
// It is the one definition of the flag's reading: the upgrade flags the
// records already there with it, and the trigger of flagOldBuildRecords
// the ones old builds write afterwards.
//
// The record is Go's JSON of a store.Verification, which writes
// "authenticated":true only when it is set; whitespace is allowed all the
// same. It is read as a regular expression over the record in
// PostgreSQL's escape encoding (ASCII only, so it reads the same on any
// server encoding, and a NUL the record holds is harmless); inside a JSON
// string every quote is escaped, so a quote, the name and a quote with
// nothing between them occur only as a key, and Verification has no
// nested objects. The position test keeps the regular expression off the
// records that do not name the flag at all, most of them. A record with no
// agent is never authenticated. The function is one SQL expression,
// which PostgreSQL inlines into the upgrade's UPDATE; the pattern is an
// escape string (E-prefixed), read the same whatever
// standard_conforming_strings says.
const recordAuthenticated = `CREATE OR REPLACE FUNCTION aov_record_authenticated(agent_id bytea, record bytea) RETURNS boolean
	LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
	SELECT agent_id IS NOT NULL AND position('"authenticated"'::bytea IN record) > 0
		AND encode(record, 'escape') ~ E'"authenticated"\\s*:\\s*true'
$$`

// flagOldBuildRecords flags, as they are inserted, the records of
// instances of the version 1 build still running after the upgrade: they
// do not know the column, which would keep its default (false), so their
// authenticated records would be counted but never read as the owner's.
// It runs only on records that arrive unflagged; ours flag themselves.
var flagOldBuildRecords = []string{
	`CREATE OR REPLACE FUNCTION aov_flag_authenticated() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		NEW.authenticated := aov_record_authenticated(NEW.agent_id, NEW.record);
		RETURN NEW;
	END
	$$`,
	`DROP TRIGGER IF EXISTS aov_verifications_flag ON aov_verifications`,
	`CREATE TRIGGER aov_verifications_flag BEFORE INSERT ON aov_verifications
		FOR EACH ROW WHEN (NOT NEW.authenticated) EXECUTE FUNCTION aov_flag_authenticated()`,
}

// migrateAuthenticated brings a version 1 database to version 2: it adds
// the authenticated column (schemaV2), sets it on every authenticated
// record, read from the record itself (recordAuthenticated), has records
// that old builds write from now on flagged the same way
// (flagOldBuildRecords), then sets the version. It runs inside the
// migration's transaction, so it happens once and entirely or not at all.
//
// It first locks the history table outright, before any other statement
// touches it: a weaker lock taken first and strengthened later would wait
// for live writes while holding what they wait for (a lock cycle, which
// PostgreSQL breaks by failing one side). Old builds' writes wait for the
// upgrade's end.
//
// The flagging is one statement computed in the database: it reads every
// record once and moves none of them to the client. Measured on a
// vacuumed history with one record in ten authenticated, it takes 1.1 to
// 1.4 s per 100,000 records, most of it writing the flagged rows;
// decoding the records in Go took 1.7 to 2.4 s (2.8 s in production, so
// that 1,500,000 could not be upgraded within an ordinary open's 30 s),
// and batches committed separately far longer.
func migrateAuthenticated(ctx context.Context, tx pgx.Tx, log *slog.Logger) error {
	log.Info("history: upgrading to schema version 2: flagging the authenticated records; this reads every record once")
	start := time.Now()
	stmts := append([]string{`LOCK TABLE aov_verifications IN ACCESS EXCLUSIVE MODE`}, schemaV2...)
	stmts = append(append(stmts, recordAuthenticated), flagOldBuildRecords...)
	for _, stmt := range stmts {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("history: migrating to schema version 2: %w", err)
		}
	}
	tag, err := tx.Exec(ctx, `UPDATE aov_verifications SET authenticated = true
		WHERE NOT authenticated AND aov_record_authenticated(agent_id, record)`)
	if err != nil {
		return fmt.Errorf("history: migrating to schema version 2: %w", err)
	}
	if _, err := tx.Exec(ctx, `UPDATE aov_schema_version SET version = $1`, schemaVersion); err != nil {
		return fmt.Errorf("history: migrating to schema version 2: %w", err)
	}
	log.Info("history: upgraded to schema version 2", "authenticated_records", tag.RowsAffected(), "took", time.Since(start).String())
	return nil
}
