package pghistory

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store/storetest"
)

var databases atomic.Int64

// freshDB creates an empty database on srv and returns its address.
func freshDB(t *testing.T, srv *servers.Postgres) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	name := fmt.Sprintf("t%d", databases.Add(1))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	return strings.Replace(srv.DSN, "/postgres?", "/"+name+"?", 1)
}

func open(t *testing.T, dsn string) *History {
	t.Helper()
	h, err := Open(context.Background(), dsn, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

func TestHistoryContract(t *testing.T) {
	srv := servers.StartPostgres(t)
	storetest.TestHistory(t, func(t *testing.T) (storetest.History, storetest.History) {
		dsn := freshDB(t, srv)
		return open(t, dsn), open(t, dsn) // two instances: two pools
	})
}

func TestAuthenticatedIndexContract(t *testing.T) {
	srv := servers.StartPostgres(t)
	storetest.TestAuthenticatedIndex(t, func(t *testing.T) (storetest.AuthenticatedHistory, storetest.AuthenticatedHistory) {
		dsn := freshDB(t, srv)
		return open(t, dsn), open(t, dsn)
	})
}

// TestConcurrentMigrations starts eight instances on one empty database at
// once: the advisory lock lets them all set up the schema without a
// catalog conflict, and they share one history.
func TestConcurrentMigrations(t *testing.T) {
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	ctx := context.Background()
	hs := make([]*History, 8)
	errs := make([]error, 8)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			hs[i], errs[i] = Open(ctx, dsn, Options{})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("instance %d: %v", i, err)
		}
		defer hs[i].Close()
	}
	if err := hs[0].RecordVerification(ctx, storetest.Sample("m1", "agent", timeBase, "pass")); err != nil {
		t.Fatal(err)
	}
	if c, err := hs[7].AgentCounts(ctx, "agent"); err != nil || c.Pass != 1 {
		t.Fatalf("another instance sees counts %+v, %v", c, err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM aov_schema_version").Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d schema version rows (%v), want 1", n, err)
	}
	if _, err := conn.Exec(ctx, "UPDATE aov_schema_version SET version = 99"); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, dsn, Options{}); err == nil || !strings.Contains(err.Error(), "version 99") {
		t.Fatalf("Open of a newer schema = %v, want a refusal", err)
	}
}

var timeBase = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
