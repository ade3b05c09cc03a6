package server_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/score"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/pghistory"
	"github.com/aovhq/aov/verifierd/server"
)

// countingHistory is a real history (Badger or PostgreSQL) that counts the
// pages and records read from it, so a test can see what a score costs.
type countingHistory struct {
	server.History
	pages, rows atomic.Int64
}

func (c *countingHistory) Verifications(ctx context.Context, agent, cursor string, limit int) ([]store.Verification, string, error) {
	return c.count(c.History.Verifications(ctx, agent, cursor, limit))
}

func (c *countingHistory) AuthenticatedVerifications(ctx context.Context, agent, cursor string, limit int) ([]store.Verification, string, error) {
	return c.count(c.History.AuthenticatedVerifications(ctx, agent, cursor, limit))
}

func (c *countingHistory) count(vs []store.Verification, next string, err error) ([]store.Verification, string, error) {
	c.pages.Add(1)
	c.rows.Add(int64(len(vs)))
	return vs, next, err
}

// withHistories runs test against a fixture whose history is each real
// backend in turn, Badger and PostgreSQL, behind a countingHistory, with
// the score method m.
func withHistories(t *testing.T, m *score.Method, test func(t *testing.T, f *fixture, c *countingHistory)) {
	for _, backend := range []string{"badger", "postgres"} {
		t.Run(backend, func(t *testing.T) {
			c := &countingHistory{}
			o := fixtureOpts{noSync: true, score: m, history: func(db *store.DB) server.History {
				c.History = db
				return c
			}}
			if backend == "postgres" {
				h, err := pghistory.Open(context.Background(), servers.StartPostgres(t).DSN, pghistory.Options{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { h.Close() })
				o.history = func(*store.DB) server.History {
					c.History = h
					return c
				}
			}
			test(t, newFixture(t, o), c)
		})
	}
}

// recordRun writes n records of agent straight into the history, the
// newest at newest and each next one a millisecond older, as n calls the
// gateway forwarded would have left them; edit sets the i-th one's payment
// and proof.
func recordRun(t *testing.T, h server.History, agent string, n int, newest time.Time, edit func(i int, v *store.Verification)) {
	t.Helper()
	for i := range n {
		v := store.Verification{ID: fmt.Sprintf("%s-%d-%d", agent, newest.UnixNano(), i), VerifiedAt: newest.Add(-time.Duration(i) * time.Millisecond),
			AgentID: agent, TaskID: "t", Result: "pass", OutputHash: "o", SchemaHash: "s", RulesHash: "r", RequestHash: "q", Payment: store.PaymentFree}
		edit(i, &v)
		if err := h.RecordVerification(context.Background(), v); err != nil {
			t.Fatal(err)
		}
	}
}

// undelivered makes every other record a paid call still pending and the
// rest paid calls reported unpaid: neither is evidence, and anyone can
// leave either under an id.
func undelivered(i int, v *store.Verification) {
	v.Payment = store.PaymentPending
	if i%2 == 1 {
		v.Payment = store.PaymentUnpaid
	}
}

// scoreWindow is a score's inputs.window, read after the score call, with
// what the call read from the history.
func scoreWindow(t *testing.T, f *fixture, c *countingHistory, agent string) (win map[string]any, pages, rows int64) {
	t.Helper()
	c.pages.Store(0)
	c.rows.Store(0)
	w := f.do(http.MethodGet, "/score/"+agent, nil, viaGateway)
	if w.Code != http.StatusOK {
		t.Fatalf("score: %d %s", w.Code, w.Body)
	}
	return decode(t, w)["inputs"].(map[string]any)["window"].(map[string]any), c.pages.Load(), c.rows.Load()
}

// A score reads at most twice max_records records of an id, evidence or
// not, and stops at the first record past the horizon, whether it counts
// or not: what it costs is bounded by the method's configuration, not by
// the pending and unpaid calls anyone can leave under an id. Before, a
// record that did not count never stopped the read, so 30,000 unpaid
// records cost every score of the id 301 pages.
func TestScoreReadIsBounded(t *testing.T) {
	const maxRecords = 100 // read bound: 200 records, two pages
	m, err := score.New(score.Config{MaxRecords: maxRecords})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	withHistories(t, m, func(t *testing.T, f *fixture, c *countingHistory) {
		t.Run("undelivered records newer than the evidence stop the read at the bound, and the window says it is truncated", func(t *testing.T) {
			recordRun(t, c.History, "seller-9", 1, now.Add(-2*time.Hour), func(int, *store.Verification) {})
			recordRun(t, c.History, "seller-9", 1000, now.Add(-time.Hour), undelivered)
			win, pages, rows := scoreWindow(t, f, c, "seller-9")
			// One record past the bound tells that records remain.
			if rows > 2*maxRecords+1 || pages > 2*maxRecords/store.MaxPageSize+1 || win["records"] != 0.0 || win["truncated"] != true {
				t.Fatalf("read %d pages (%d records); window %v: want at most 3 pages of 201 records, no evidence, truncated", pages, rows, win)
			}
		})
		t.Run("undelivered records past the horizon stop the read", func(t *testing.T) {
			recordRun(t, c.History, "seller-10", 1, now.Add(-time.Hour), func(int, *store.Verification) {})
			recordRun(t, c.History, "seller-10", 500, now.Add(-400*24*time.Hour), undelivered)
			win, pages, rows := scoreWindow(t, f, c, "seller-10")
			if pages != 1 || win["records"] != 1.0 || win["truncated"] != false {
				t.Fatalf("read %d pages (%d records); window %v: want one page, the one piece of evidence, not truncated", pages, rows, win)
			}
		})
		t.Run("a history that ends at the bound is read whole: every piece of evidence counts, nothing is truncated", func(t *testing.T) {
			recordRun(t, c.History, "seller-11", maxRecords, now.Add(-2*time.Hour), func(int, *store.Verification) {})
			recordRun(t, c.History, "seller-11", maxRecords, now.Add(-time.Hour), undelivered)
			win, _, rows := scoreWindow(t, f, c, "seller-11")
			if rows != 2*maxRecords || win["records"] != float64(maxRecords) || win["truncated"] != false {
				t.Fatalf("read %d records; window %v: want all %d, %d pieces of evidence, not truncated", rows, win, 2*maxRecords, maxRecords)
			}
		})
		t.Run("an owned id's score reads only its owner's records, whatever others leave under it", func(t *testing.T) {
			agent := "eip155:1:" + wallet
			recordRun(t, c.History, agent, 80, now.Add(-2*time.Hour), func(_ int, v *store.Verification) {
				v.Wallet, v.Authenticated = wallet, true
			})
			recordRun(t, c.History, agent, 500, now.Add(-time.Hour), func(int, *store.Verification) {})
			recordRun(t, c.History, agent, 500, now.Add(-time.Minute), undelivered)
			win, pages, rows := scoreWindow(t, f, c, agent)
			if pages != 1 || rows != 80 || win["records"] != 80.0 || win["truncated"] != false {
				t.Fatalf("read %d pages (%d records); window %v: want the owner's 80 records in one page, all evidence", pages, rows, win)
			}
		})
	})
}
