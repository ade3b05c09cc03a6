package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/pghistory"
	"github.com/aovhq/aov/verifierd/server"
)

// pgFixture is the fixture with its history in a real PostgreSQL reached
// through servers.PGFault (a fake that delays or loses an answer on cue),
// and the same history opened directly, to read what was recorded.
func pgFixture(t *testing.T) (*fixture, *servers.PGFault, *pghistory.History) {
	t.Helper()
	srv := servers.StartPostgres(t)
	proxy := servers.StartPGFault(t, srv)
	ctx := context.Background()
	open := func(dsn string) *pghistory.History {
		h, err := pghistory.Open(ctx, dsn, pghistory.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		return h
	}
	h := open(proxy.DSN)
	f := newFixture(t, fixtureOpts{history: func(*store.DB) server.History { return h }})
	return f, proxy, open(srv.DSN)
}

// A verification whose PostgreSQL write answers after the gateway's
// answer-by time is answered as Badger answers it: refused ("finished
// after the gateway's answer-by time; not recorded") only if nothing was
// recorded. Before, the write committed on its own while its answer was
// late, and the refused verification counted for the agent.
func TestNoRecordWhenPostgresAnswersAfterTheGateway(t *testing.T) {
	f, proxy, direct := pgFixture(t)
	ctx := context.Background()
	hdr := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free"}
	// Warms the pool (the fault is the record's own traffic) and counts
	// one.
	if w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), hdr); w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	proxy.Arm("", servers.DelayAnswer, 3*time.Second)
	hdr["X-Aov-Answer-By"] = strconv.FormatInt(time.Now().Add(time.Second).UnixMilli(), 10)
	w := f.do(http.MethodPost, "/verify/schema", invoice("129.5", ""), hdr)
	if proxy.Hits.Load() != 1 {
		t.Fatalf("status %d: the write's answer was never delayed", w.Code)
	}
	var e map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &e); w.Code != http.StatusServiceUnavailable || err != nil || e["code"] != "upstream_unavailable" || e["charged"] != false {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if c, err := direct.AgentCounts(ctx, "seller-7"); err != nil || c.Total() != 1 {
		t.Fatalf("after a refused verification the agent counts %+v (%v), want the one answered", c, err)
	}
	if vs, _, err := direct.Verifications(ctx, "", "", 10); err != nil || len(vs) != 1 {
		t.Fatalf("%d records (%v), want the one answered", len(vs), err)
	}
}
