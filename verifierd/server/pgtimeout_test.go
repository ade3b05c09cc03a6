package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/pghistory"
	"github.com/aovhq/aov/verifierd/server"
)

// A record that PostgreSQL cancels for a statement_timeout set on the
// database or role (here while it waits for its agent's counts row, which
// another session holds) is the store's 503 upstream_unavailable with
// Retry-After, as any store failure, and is not recorded: the history
// store leaves the server's statement_timeout to ordinary statements.
func TestRecordCancelledByStatementTimeoutAnswers503(t *testing.T) {
	pg := servers.StartPostgres(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pg.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, `ALTER DATABASE postgres SET statement_timeout = '300ms'`); err != nil {
		t.Fatal(err)
	}
	h, err := pghistory.Open(ctx, pg.DSN, pghistory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	f := newFixture(t, fixtureOpts{history: func(*store.DB) server.History { return h }})
	hdr := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free"}
	if w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), hdr); w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT 1 FROM aov_agent_counts WHERE agent_id = 'seller-7' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), hdr)
	// Well before the record's own 10 s bound: the server cancelled it.
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("answered after %v: the statement_timeout did not cancel the record", took)
	}
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), `"code":"upstream_unavailable"`) {
		t.Fatalf("a record cancelled by statement_timeout: %d Retry-After %q %s, want 503 upstream_unavailable with Retry-After", w.Code, w.Header().Get("Retry-After"), w.Body)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if c, err := h.AgentCounts(ctx, "seller-7"); err != nil || c.Total() != 1 {
		t.Fatalf("after the cancelled record the agent counts %+v (%v), want the one answered", c, err)
	}
}
