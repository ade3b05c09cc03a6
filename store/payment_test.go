package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A paid call is recorded pending and counts only once its settlement is
// reported paid; an unpaid one never counts; the outcome is set once.
func TestSettlementOutcomeOfAPendingVerification(t *testing.T) {
	ctx := context.Background()
	db, _ := openTemp(t, Options{})
	at := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	rec := func(id, payment string) {
		t.Helper()
		if err := db.RecordVerification(ctx, Verification{ID: id, VerifiedAt: at, AgentID: "agent-p", TaskID: "t", Result: "pass", Payment: payment}); err != nil {
			t.Fatal(err)
		}
	}
	counts := func() Counts {
		t.Helper()
		c, err := db.AgentCounts(ctx, "agent-p")
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	rec("free-1", PaymentFree)
	rec("paid-1", PaymentPending)
	rec("paid-2", PaymentPending)
	if c := counts(); c.Pass != 1 || c.Paid != 0 {
		t.Fatalf("pending records counted: %+v", c)
	}
	if err := db.SetPayment(ctx, "paid-1", PaymentPaid); err != nil {
		t.Fatal(err)
	}
	if err := db.SetPayment(ctx, "paid-2", PaymentUnpaid); err != nil {
		t.Fatal(err)
	}
	if c := counts(); c.Pass != 2 || c.Paid != 1 {
		t.Fatalf("after the outcomes: %+v, want 2 passes, 1 paid", c)
	}
	for _, tc := range []struct {
		id, payment string
		want        error
	}{
		{"paid-1", PaymentUnpaid, ErrPaymentFinal},
		{"paid-2", PaymentPaid, ErrPaymentFinal},
		{"free-1", PaymentPaid, ErrPaymentFinal},
		{"nope", PaymentPaid, ErrNotFound},
	} {
		if err := db.SetPayment(ctx, tc.id, tc.payment); !errors.Is(err, tc.want) {
			t.Errorf("SetPayment(%s, %s) = %v, want %v", tc.id, tc.payment, err, tc.want)
		}
	}
	if err := db.SetPayment(ctx, "paid-1", PaymentFree); err == nil {
		t.Error("an outcome other than paid or unpaid was accepted")
	}
	if c := counts(); c.Pass != 2 || c.Paid != 1 {
		t.Fatalf("refused reports changed the counts: %+v", c)
	}
	recs, _, err := db.Verifications(ctx, "agent-p", "", MaxPageSize)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, v := range recs {
		got[v.ID] = v.Payment
		if v.Counted() != (v.Payment != PaymentUnpaid) {
			t.Errorf("%s (%s): Counted %v", v.ID, v.Payment, v.Counted())
		}
	}
	if got["paid-1"] != PaymentPaid || got["paid-2"] != PaymentUnpaid || got["free-1"] != PaymentFree {
		t.Fatalf("history %v", got)
	}
}
