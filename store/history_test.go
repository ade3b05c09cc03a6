package store

import (
	"context"
	"errors"
	"fmt"
	"os"
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

// TestSetPaymentsIsOneCommit: a batch of outcomes is one commit of the
// store, one record in its write-ahead log (one synced write), however
// many outcomes it holds; the outcomes it refuses leave the rest recorded.
func TestSetPaymentsIsOneCommit(t *testing.T) {
	ctx := context.Background()
	db, dir := openTemp(t, Options{})
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	var outs []PaymentOutcome
	for i := range 16 {
		v := sampleVerification(fmt.Sprintf("p-%02d", i), "agent-b", at, "pass")
		v.Payment = PaymentPending
		if err := db.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
		outs = append(outs, PaymentOutcome{ID: v.ID, Payment: PaymentPaid})
	}
	outs = append(outs, PaymentOutcome{ID: "unknown", Payment: PaymentPaid})
	logged := func() int {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(dir, walFile))
		if err != nil {
			t.Fatal(err)
		}
		return len(walRecords(t, b))
	}
	before := logged()
	errs, err := db.SetPayments(ctx, outs)
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if i == 16 {
			if !errors.Is(err, ErrNotFound) {
				t.Errorf("the unknown id: %v, want ErrNotFound", err)
			}
		} else if err != nil {
			t.Errorf("outcome %d: %v", i, err)
		}
	}
	if n := logged() - before; n != 1 {
		t.Errorf("the batch took %d records of the log, want 1", n)
	}
	if c, err := db.AgentCounts(ctx, "agent-b"); err != nil || c.Paid != 16 {
		t.Errorf("counts %+v, %v; want 16 paid", c, err)
	}
}
