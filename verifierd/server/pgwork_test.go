package server_test

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/pghistory"
	"github.com/aovhq/aov/verifierd/server"
)

// pgWork is a fixture whose history is PostgreSQL, with a connection of
// its own to load records and read statistics, and a way to learn how
// many index entries of aov_verifications the fixture's calls have read.
type pgWork struct {
	*fixture
	h    *pghistory.History
	conn *pgx.Conn
}

func newPGWork(t *testing.T, m *score.Method) *pgWork {
	t.Helper()
	ctx := context.Background()
	dsn := servers.StartPostgres(t).DSN
	h, err := pghistory.Open(ctx, dsn, pghistory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	f := newFixture(t, fixtureOpts{noSync: true, score: m, history: func(*store.DB) server.History { return h }})
	return &pgWork{fixture: f, h: h, conn: conn}
}

// bulkUndelivered writes n pending and unpaid records of agent straight
// into aov_verifications (as n paid calls whose settlement never completed
// leave them; through RecordVerification it would take minutes), the
// newest at newest and each next one a millisecond older, with ids
// agent-0, agent-1, …
func (p *pgWork) bulkUndelivered(t *testing.T, agent string, n int, newest time.Time) {
	t.Helper()
	rows := make([][]any, 0, n)
	for i := range n {
		v := store.Verification{ID: fmt.Sprintf("%s-%d", agent, i), VerifiedAt: newest.Add(-time.Duration(i) * time.Millisecond),
			AgentID: agent, TaskID: "t", Result: "pass", OutputHash: "o", SchemaHash: "s", RulesHash: "r", RequestHash: "q"}
		undelivered(i, &v)
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, []any{[]byte(v.ID), v.VerifiedAt.UnixNano(), []byte(agent), b, false})
	}
	ctx := context.Background()
	if _, err := p.conn.CopyFrom(ctx, pgx.Identifier{"aov_verifications"},
		[]string{"id", "at_ns", "agent_id", "record", "authenticated"}, pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.conn.Exec(ctx, "ANALYZE aov_verifications"); err != nil {
		t.Fatal(err)
	}
}

// indexReads is how many index entries the scans of aov_verifications'
// indexes have read (pg_stat_user_indexes.idx_tup_read): a count of the
// work PostgreSQL did, not of the time it took.
func (p *pgWork) indexReads(t *testing.T) int64 {
	t.Helper()
	ctx := context.Background()
	if _, err := p.conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	var n int64
	if err := p.conn.QueryRow(ctx,
		`SELECT coalesce(sum(idx_tup_read), 0)::bigint FROM pg_stat_user_indexes WHERE relname = 'aov_verifications'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// readsOf is how many index entries call made PostgreSQL read. A backend
// reports its statistics every so often, and all of them when it exits,
// so the history's connections are closed after call (the fixture's
// history is of no use after it) and their backends waited for; whatever
// else they read since before is counted too, so the count is never
// less than call's.
func (p *pgWork) readsOf(t *testing.T, call func()) int64 {
	t.Helper()
	before := p.indexReads(t)
	call()
	p.h.Close()
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); ; {
		var others int
		if err := p.conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`).Scan(&others); err != nil {
			t.Fatal(err)
		}
		if others == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the history's backends still running", others)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return p.indexReads(t) - before
}

// One score of an agent with more records than its read limit makes
// PostgreSQL read about as many index entries as records: each page of
// the read starts at its cursor. Before, each page scanned the agent's
// index from its newest record, so one default score read its 20,000
// records as about 2 million index entries, and anyone who leaves that
// many undelivered calls under an id made every score of it cost that.
func TestPGScoreReadIsLinear(t *testing.T) {
	p := newPGWork(t, score.Default())
	limit := score.Default().ReadLimit()
	p.bulkUndelivered(t, "seller-flood", limit+10, time.Now().Add(-time.Minute))
	read := p.readsOf(t, func() {
		w := p.do(http.MethodGet, "/score/seller-flood", nil, viaGateway)
		if w.Code != http.StatusOK {
			t.Fatalf("score: %d %s", w.Code, w.Body)
		}
		if win := decode(t, w)["inputs"].(map[string]any)["window"].(map[string]any); win["truncated"] != true {
			t.Fatalf("window %v: want truncated at the read limit", win)
		}
	})
	t.Logf("one score read %d index entries for a read limit of %d records", read, limit)
	if read > int64(3*limit) {
		t.Fatalf("one score read %d index entries (%.0f× its read limit of %d): want O(read limit)", read, float64(read)/float64(limit), limit)
	}
}

// A free reputation page behind a cursor deep in an agent's history reads
// the page, not the history above the cursor. A client may build any
// cursor of the right shape (eight bytes of Unix nanoseconds, then an
// id); before, one page of one record 40,000 records deep read 40,000
// index entries.
func TestPGReputationDeepCursorReadsOnlyItsPage(t *testing.T) {
	p := newPGWork(t, score.Default())
	const n, depth = 50000, 40000
	newest := time.Now().Add(-time.Minute).UTC().Truncate(time.Microsecond)
	p.bulkUndelivered(t, "seller-deep", n, newest)
	at := newest.Add(-depth * time.Millisecond)
	cursor := base64.RawURLEncoding.EncodeToString(append(binary.BigEndian.AppendUint64(nil, uint64(at.UnixNano())), fmt.Sprintf("seller-deep-%d", depth)...))
	read := p.readsOf(t, func() {
		w := p.do(http.MethodGet, "/reputation/seller-deep?limit=1&cursor="+cursor, nil, nil)
		if w.Code != http.StatusOK {
			t.Fatalf("reputation: %d %s", w.Code, w.Body)
		}
		vs := decode(t, w)["verifications"].([]any)
		if want := fmt.Sprintf("seller-deep-%d", depth+1); len(vs) != 1 || vs[0].(map[string]any)["verification_id"] != want {
			t.Fatalf("page after the cursor: %v: want %s", vs, want)
		}
	})
	t.Logf("one page of one record %d deep read %d index entries", depth, read)
	if read > 10 {
		t.Fatalf("one reputation page of one record %d deep read %d index entries: want O(limit)", depth, read)
	}
}
