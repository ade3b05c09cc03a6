package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"

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
func openHistory(ctx context.Context, c config, log *slog.Logger) (history, error) {
	switch {
	case c.history == "":
		return store.Open(c.dataDir, store.Options{NoSync: c.noSync, Logger: log})
	case strings.HasPrefix(c.history, "postgres://"), strings.HasPrefix(c.history, "postgresql://"):
		// Bounded by pghistory's defaults: a database that does not
		// answer fails the start, a large history's upgrade does not.
		return pghistory.Open(ctx, c.history, pghistory.Options{Logger: log})
	}
	return nil, errors.New("-history must be a postgres:// address")
}
