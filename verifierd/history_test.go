package main

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store/pghistory"
	"github.com/aovhq/aov/store/storetest"
)

func TestOpenHistory(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	if _, err := openHistory(ctx, config{history: "mysql://x"}, log); err == nil || !strings.Contains(err.Error(), "postgres://") {
		t.Fatalf("a non-PostgreSQL -history = %v, want a refusal", err)
	}
	h, err := openHistory(ctx, config{dataDir: t.TempDir()}, log)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()

	srv := servers.StartPostgres(t)
	h, err = openHistory(ctx, config{history: srv.DSN}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, ok := h.(*pghistory.History); !ok {
		t.Fatalf("-history postgres:// opened %T", h)
	}
	if err := h.RecordVerification(ctx, storetest.Sample("v1", "agent", time.Now(), "pass")); err != nil {
		t.Fatal(err)
	}
	if c, err := h.AgentCounts(ctx, "agent"); err != nil || c.Pass != 1 {
		t.Fatalf("counts %+v, %v", c, err)
	}
}
