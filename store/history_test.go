package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func sampleVerification(id, agent string, at time.Time, result string) Verification {
	return Verification{
		ID: id, VerifiedAt: at, AgentID: agent, TaskID: "task-" + id, Result: result,
		OutputHash: strings.Repeat("a", 64), SchemaHash: strings.Repeat("b", 64),
		RulesHash: strings.Repeat("c", 64), RequestHash: strings.Repeat("d", 64),
		Payment: PaymentFree,
	}
}

func TestRecordVerification(t *testing.T) {
	ctx := context.Background()
	base := time.Date(2026, 11, 29, 21, 0, 0, 0, time.UTC)

	t.Run("a record without a payment kind is recorded as unknown", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		v := sampleVerification("p", "agent", base, "pass")
		v.Payment = ""
		if err := db.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
		got, _ := db.Verification(ctx, "p")
		if got.Payment != PaymentUnknown {
			t.Fatalf("payment %q, want unknown", got.Payment)
		}
	})
}

func TestVerificationsPaging(t *testing.T) {
	ctx := context.Background()
	db, _ := openTemp(t, Options{NoSync: true})
	base := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	// Recorded out of time order on purpose, with two records at the same
	// instant (ordered by id) and another agent interleaved.
	order := []int{3, 0, 7, 1, 9, 4, 2, 8, 6, 5}
	for _, i := range order {
		at := base.Add(time.Duration(i) * time.Second)
		if i == 8 {
			at = base.Add(9 * time.Second)
		}
		if err := db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("a%02d", i), "alpha", at, "pass")); err != nil {
			t.Fatal(err)
		}
		if err := db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("b%02d", i), "alphabet", at, "fail")); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.RecordVerification(ctx, sampleVerification("anon", "", base.Add(time.Hour), "pass")); err != nil {
		t.Fatal(err)
	}
	// Newest first; a08 and a09 share an instant and come in id order.
	wantAlpha := []string{"a08", "a09", "a07", "a06", "a05", "a04", "a03", "a02", "a01", "a00"}

	pageAll := func(agent string, limit int) ([]string, int) {
		t.Helper()
		var ids []string
		cursor, pages := "", 0
		for {
			vs, next, err := db.Verifications(ctx, agent, cursor, limit)
			if err != nil {
				t.Fatal(err)
			}
			pages++
			for _, v := range vs {
				ids = append(ids, v.ID)
			}
			if next == "" {
				return ids, pages
			}
			if len(vs) != limit {
				t.Fatalf("a page of %d with a next cursor, want full pages of %d", len(vs), limit)
			}
			cursor = next
		}
	}

	for _, c := range []struct {
		desc      string
		agent     string
		limit     int
		want      []string
		wantPages int
	}{
		{"one agent's records come newest first, not mixed with an agent whose id extends it", "alpha", 3, wantAlpha, 4},
		{"a limit that divides the total ends without an empty page", "alpha", 5, wantAlpha, 2},
		{"a limit above the total is one page", "alpha", 50, wantAlpha, 1},
		{"an unknown agent has no records", "nobody", 10, nil, 1},
	} {
		got, pages := pageAll(c.agent, c.limit)
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("%s:\n got %v\nwant %v", c.desc, got, c.want)
		}
		if pages != c.wantPages {
			t.Errorf("%s: %d pages, want %d", c.desc, pages, c.wantPages)
		}
	}

	t.Run("the global listing holds every record, anonymous ones included, newest first", func(t *testing.T) {
		got, _ := pageAll("", 7)
		if len(got) != 21 || got[0] != "anon" {
			t.Fatalf("global listing %v", got)
		}
	})

	t.Run("a cursor stays valid while newer records arrive", func(t *testing.T) {
		first, next, err := db.Verifications(ctx, "alpha", "", 4)
		if err != nil || len(first) != 4 {
			t.Fatal(err)
		}
		if err := db.RecordVerification(ctx, sampleVerification("a-new", "alpha", base.Add(time.Minute), "pass")); err != nil {
			t.Fatal(err)
		}
		rest, _, err := db.Verifications(ctx, "alpha", next, 50)
		if err != nil {
			t.Fatal(err)
		}
		if len(rest) != 6 || rest[0].ID != "a05" {
			t.Fatalf("after the cursor: %d records starting %q, want 6 starting a05", len(rest), rest[0].ID)
		}
	})

	t.Run("limits are clamped", func(t *testing.T) {
		for i := range MaxPageSize + 5 {
			db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("m%03d", i), "many", base.Add(time.Duration(i)), "pass"))
		}
		for _, c := range []struct {
			desc  string
			limit int
			want  int
		}{
			{"zero means the default page size", 0, DefaultPageSize},
			{"negative means the default page size", -3, DefaultPageSize},
			{"over the maximum means the maximum", 1000, MaxPageSize},
		} {
			vs, _, err := db.Verifications(ctx, "many", "", c.limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(vs) != c.want {
				t.Errorf("%s: %d records, want %d", c.desc, len(vs), c.want)
			}
		}
	})

	t.Run("a cursor the store did not hand out is refused", func(t *testing.T) {
		for _, cur := range []string{"!!!", "AAAA", "not base64 at all"} {
			if _, _, err := db.Verifications(ctx, "alpha", cur, 5); !errors.Is(err, ErrBadCursor) {
				t.Errorf("cursor %q: %v, want ErrBadCursor", cur, err)
			}
		}
	})
}

func TestHistorySurvivesRestart(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	for i := range 5 {
		if err := db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("r%d", i), "agent", at.Add(time.Duration(i)), "pass")); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	vs, _, err := db.Verifications(ctx, "agent", "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(vs) != 5 || vs[0].ID != "r4" {
		t.Fatalf("after restart: %d records, first %q", len(vs), vs[0].ID)
	}
	c, err := db.AgentCounts(ctx, "agent")
	if err != nil || c.Pass != 5 {
		t.Fatalf("counts after restart %+v, %v", c, err)
	}
}

// FuzzVerificationsCursor: the cursor comes from clients (reputation
// paging); any string must give records or ErrBadCursor, never a panic.
func FuzzVerificationsCursor(f *testing.F) {
	db, err := Open("", Options{InMemory: true})
	if err != nil {
		f.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	for i := range 3 {
		db.RecordVerification(ctx, sampleVerification(fmt.Sprintf("f%d", i), "agent", time.Now(), "pass"))
	}
	_, next, _ := db.Verifications(ctx, "agent", "", 1)
	f.Add(next, "agent", 1)
	f.Add("", "", 0)
	f.Add("AAAAAAAAAAAA", "x", 5)
	f.Add("////", "agent", -1)
	f.Fuzz(func(t *testing.T, cursor, agent string, limit int) {
		vs, _, err := db.Verifications(ctx, agent, cursor, limit)
		if err != nil && !errors.Is(err, ErrBadCursor) {
			t.Fatalf("unexpected error %v", err)
		}
		if len(vs) > MaxPageSize {
			t.Fatalf("%d records over the page cap", len(vs))
		}
	})
}
