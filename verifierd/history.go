package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/pghistory"
	"github.com/aovhq/aov/verifierd/server"
)

// history is a verification history verifierd can close on shutdown.
type history interface {
	server.History
	Close() error
}

// openHistory opens the history -history names (PostgreSQL, shared by
// several verifierd), or the embedded Badger database in -data.
//
// On PostgreSQL it refuses to start while the Badger history in -data
// holds an agent owner or a record the shared history lacks: that is the
// history this verifierd kept before it was moved, and starting without it
// would forget who owns each agent id, so that the first wallet to bind a
// name would take it. copyHistory (verifierd copy-history) copies them.
func openHistory(ctx context.Context, c config, log *slog.Logger) (history, error) {
	if c.history == "" {
		return store.Open(c.dataDir, store.Options{NoSync: c.noSync, Logger: log})
	}
	pg, err := openShared(ctx, c, log)
	if err != nil {
		return nil, err
	}
	missing, err := compareHistories(ctx, c, pg, false, log)
	if err == nil && missing.Missing() {
		err = fmt.Errorf("the Badger history in -data %s holds %d agent owners and %d verifications the PostgreSQL history lacks: stop every verifierd using -data, run `verifierd copy-history` with the same -data and -history, then start again", c.dataDir, missing.Owners, missing.Records)
		if missing.Conflicts > 0 {
			err = conflictError(c, missing)
		}
	}
	if err != nil {
		pg.Close()
		return nil, err
	}
	return pg, nil
}

// openShared opens the PostgreSQL history -history names.
func openShared(ctx context.Context, c config, log *slog.Logger) (*pghistory.History, error) {
	if !strings.HasPrefix(c.history, "postgres://") && !strings.HasPrefix(c.history, "postgresql://") {
		return nil, errors.New("-history must be a postgres:// address")
	}
	// Bounded by pghistory's defaults: a database that does not answer
	// fails the start, a large history's upgrade does not.
	return pghistory.Open(ctx, c.history, pghistory.Options{Logger: log})
}

// compareHistories copies into pg (write) or counts (not write) what the
// Badger history in -data holds and pg lacks. A -data without a history is
// not created: there is nothing in it.
func compareHistories(ctx context.Context, c config, pg *pghistory.History, write bool, log *slog.Logger) (pghistory.Copied, error) {
	ok, err := store.Exists(c.dataDir)
	if err != nil || !ok {
		return pghistory.Copied{}, err
	}
	db, err := store.Open(c.dataDir, store.Options{NoSync: c.noSync, Logger: log})
	if err != nil {
		return pghistory.Copied{}, fmt.Errorf("reading the Badger history in -data (a verifierd still running on it holds it): %w", err)
	}
	defer db.Close()
	if write {
		return pg.CopyFrom(ctx, db, true)
	}
	log.Info("checking that the PostgreSQL history holds the Badger history in -data", "data", c.dataDir)
	start := time.Now()
	missing, err := pg.CopyFrom(ctx, db, false)
	log.Info("checked the Badger history in -data", "data", c.dataDir, "took", time.Since(start).String(),
		"missing_owners", missing.Owners, "missing_records", missing.Records, "conflicts", missing.Conflicts, "conflicting_records", missing.Skipped)
	return missing, err
}

// conflictError refuses agent ids -data and PostgreSQL give to two owners,
// naming the first of them (Go-quoted: an agent id may hold any byte),
// since nothing else lists the owners in -data.
func conflictError(c config, missing pghistory.Copied) error {
	names := make([]string, len(missing.ConflictIDs))
	for i, id := range missing.ConflictIDs {
		names[i] = quoteAgentID(id)
	}
	list := strings.Join(names, ", ")
	if more := missing.Conflicts - len(names); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	return fmt.Errorf("%d agent ids have one owner in the Badger history in -data %s and another in the PostgreSQL history: %s; "+
		"an owner is never overwritten, and the %d records -data holds of these ids are not copied: "+
		"to keep the owner in -data, delete the agent id's row of aov_agent_owners (a bare Solana address has none: it is its key holder's account there; insert the row naming the owner in -data) and run `verifierd copy-history` again; to keep PostgreSQL's, start without that -data",
		missing.Conflicts, c.dataDir, list, missing.Skipped)
}

// maxQuotedAgentID bounds the bytes of one agent id a message shows.
const maxQuotedAgentID = 100

// quoteAgentID is id as a Go string literal, cut after maxQuotedAgentID
// bytes (marked by "…" after the quote).
func quoteAgentID(id string) string {
	if len(id) > maxQuotedAgentID {
		return strconv.Quote(id[:maxQuotedAgentID]) + "…"
	}
	return strconv.Quote(id)
}

// copyHistory is `verifierd copy-history [flags]`: with the flags (and
// environment) of the verifierd it prepares, it copies the Badger history
// in -data into the PostgreSQL history -history names, agent owners first,
// leaving what PostgreSQL has as it is, and reports how much it copied. It
// is run once when a verifierd moves to PostgreSQL, with that verifierd
// stopped; running it again copies only what is still missing.
func copyHistory(ctx context.Context, args []string, stderr io.Writer) error {
	c, log, err := parseConfig(args, stderr)
	if err != nil || log == nil {
		return err
	}
	if c.history == "" {
		return errors.New("copy-history needs -history postgres://…")
	}
	if ok, err := store.Exists(c.dataDir); err != nil || !ok {
		if err == nil {
			err = fmt.Errorf("-data %s holds no Badger history", c.dataDir)
		}
		return err
	}
	pg, err := openShared(ctx, c, log)
	if err != nil {
		return err
	}
	defer pg.Close()
	copied, err := compareHistories(ctx, c, pg, true, log)
	log.Info("copy-history: copied the Badger history into PostgreSQL", "data", c.dataDir, "owners", copied.Owners, "records", copied.Records,
		"conflicts", copied.Conflicts, "skipped_records", copied.Skipped)
	if err == nil && copied.Conflicts > 0 {
		err = conflictError(c, copied)
	}
	return err
}
