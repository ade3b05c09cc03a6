package pghistory

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
)

// bulkLoad writes n records of agent straight into aov_verifications (a
// history that size would take minutes through RecordVerification), the
// newest at newest and each next one a millisecond older; every other one,
// from the first, is authenticated. It returns the (Unix ns, id) of each.
func bulkLoad(t *testing.T, conn *pgx.Conn, agent string, n int, newest time.Time) (at []int64, ids []string) {
	t.Helper()
	rows := make([][]any, 0, n)
	for i := range n {
		v := store.Verification{ID: fmt.Sprintf("%s-%06d", agent, i), VerifiedAt: newest.Add(-time.Duration(i) * time.Millisecond),
			AgentID: agent, TaskID: "t", Result: "pass", OutputHash: "o", SchemaHash: "s", RulesHash: "r", RequestHash: "q",
			Authenticated: i%2 == 0}
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, []any{[]byte(v.ID), v.VerifiedAt.UnixNano(), []byte(agent), b, v.Authenticated})
		at, ids = append(at, v.VerifiedAt.UnixNano()), append(ids, v.ID)
	}
	ctx := context.Background()
	if _, err := conn.CopyFrom(ctx, pgx.Identifier{"aov_verifications"},
		[]string{"id", "at_ns", "agent_id", "record", "authenticated"}, pgx.CopyFromRows(rows)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "ANALYZE aov_verifications"); err != nil {
		t.Fatal(err)
	}
	return at, ids
}

// indexReads is how many index entries the scans of each index of
// aov_verifications have read so far (pg_stat_user_indexes.idx_tup_read),
// by index name. A backend reports its statistics only every so often;
// each of h's idle connections is told to report at once first.
func indexReads(t *testing.T, h *History, conn *pgx.Conn) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	for _, c := range h.pool.AcquireAllIdle(ctx) {
		_, err := c.Exec(ctx, `SELECT pg_stat_force_next_flush()`)
		c.Release()
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		t.Fatal(err)
	}
	rows, err := conn.Query(ctx, `SELECT indexrelname::text, idx_tup_read FROM pg_stat_user_indexes WHERE relname = 'aov_verifications'`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv struct {
		name string
		n    int64
	}, err error) {
		err = r.Scan(&kv.name, &kv.n)
		return kv, err
	})
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int64{}
	for _, kv := range out {
		m[kv.name] = kv.n
	}
	return m
}

// Each page starts where its cursor points: PostgreSQL bounds the scan of
// the index it pages on with the cursor's time, so a page reads what it
// returns and the records it shares that time with, however deep the
// cursor. Before, the cursor sat in an OR that no index scan could start
// from, so every page read the index from the newest record down to the
// cursor: paging through a history cost its length squared over twice the
// page size, and one page of one record behind a cursor a client built
// (a reputation cursor is theirs to send) read as deep as it pointed.
func TestPageReadsFromTheCursor(t *testing.T) {
	const n = 20000
	srv := servers.StartPostgres(t)
	dsn := freshDB(t, srv)
	h := open(t, dsn)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(ctx) })
	newest := time.Now().Add(-time.Minute)
	at, ids := bulkLoad(t, conn, "a", n, newest)
	// Another agent's older records make the agent's indexes the ones to
	// page it on, and the listing of all records longer.
	bulkLoad(t, conn, "b", 2*n, newest.Add(-n*time.Millisecond))

	type lister func(ctx context.Context, agentID, cursor string, limit int) ([]store.Verification, string, error)
	all := func(ctx context.Context, _, cursor string, limit int) ([]store.Verification, string, error) {
		return h.Verifications(ctx, "", cursor, limit)
	}
	for _, c := range []struct {
		index string
		list  lister
		step  int // ids[i+step] follows ids[i]
		whole int // records in the whole listing
	}{
		{"aov_verifications_time", all, 1, 3 * n},
		{"aov_verifications_agent", h.Verifications, 1, n},
		{"aov_verifications_authenticated", h.AuthenticatedVerifications, 2, n / 2},
	} {
		t.Run(c.index, func(t *testing.T) {
			t.Run("one record behind a deep cursor", func(t *testing.T) {
				depth := n * 8 / 10
				before := indexReads(t, h, conn)
				vs, _, err := c.list(ctx, "a", makeCursor(at[depth], []byte(ids[depth])), 1)
				if err != nil || len(vs) != 1 || vs[0].ID != ids[depth+c.step] {
					t.Fatalf("page after %s: %v, %v: want %s", ids[depth], vs, err, ids[depth+c.step])
				}
				if read := indexReads(t, h, conn)[c.index] - before[c.index]; read < 1 || read > 4 {
					t.Fatalf("one record %d deep read %d entries of %s: want the cursor's record, the page and the one that says another follows", depth, read, c.index)
				}
			})
			t.Run("the whole history, page by page", func(t *testing.T) {
				before := indexReads(t, h, conn)
				got, pages, cursor := 0, 0, ""
				for {
					vs, next, err := c.list(ctx, "a", cursor, store.MaxPageSize)
					if err != nil {
						t.Fatal(err)
					}
					got, pages = got+len(vs), pages+1
					if cursor = next; cursor == "" {
						break
					}
				}
				read := indexReads(t, h, conn)[c.index] - before[c.index]
				t.Logf("%d records in %d pages read %d entries of %s", got, pages, read, c.index)
				// A page reads its records, the cursor's and one more, and
				// the planner may probe the index's ends; near the oldest
				// end it may read the few rows left whole and sort them.
				// Before, the whole listing read 10 to 300 times its length.
				if got != c.whole || read > int64(2*got) {
					t.Fatalf("%d records in %d pages read %d entries of %s: want all %d, reading at most twice as many", got, pages, read, c.index, c.whole)
				}
			})
		})
	}
}
