package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// AuthenticatedHistory is a history backend with the authenticated index
// that scores of owned agents read.
type AuthenticatedHistory interface {
	History
	AuthenticatedVerifications(ctx context.Context, agentID, cursor string, limit int) ([]store.Verification, string, error)
}

// NewAuthenticatedHistory returns two handles on one fresh, empty history,
// like NewHistory.
type NewAuthenticatedHistory func(t *testing.T) (a, b AuthenticatedHistory)

// TestAuthenticatedIndex runs the authenticated index's contract against
// newH: it lists exactly an agent's authenticated records, as
// Verifications does all of them (order, paging, cursors, settlements).
func TestAuthenticatedIndex(t *testing.T, newH NewAuthenticatedHistory) {
	ctx := context.Background()
	base := time.Date(2026, 11, 29, 21, 0, 0, 123456789, time.UTC)
	record := func(t *testing.T, h History, id, agent string, at time.Time, auth bool, payment string) store.Verification {
		t.Helper()
		v := Sample(id, agent, at, "pass")
		if auth {
			v.Wallet, v.Authenticated = "0xowner", true
		}
		if payment != "" {
			v.Payment = payment
		}
		if err := h.RecordVerification(ctx, v); err != nil {
			t.Fatal(err)
		}
		got, err := h.Verification(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	all := func(t *testing.T, h AuthenticatedHistory, agent string, limit int) []store.Verification {
		t.Helper()
		var out []store.Verification
		cursor := ""
		for range 1000 {
			page, next, err := h.AuthenticatedVerifications(ctx, agent, cursor, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > limit {
				t.Fatalf("a page of %d records, limit %d", len(page), limit)
			}
			out = append(out, page...)
			if next == "" {
				return out
			}
			cursor = next
		}
		t.Fatal("paging does not end")
		return nil
	}

	t.Run("only the agent's authenticated records, newest first, ties by id, on every instance", func(t *testing.T) {
		h, other := newH(t)
		var want []store.Verification
		for i := range 30 {
			at := base.Add(-time.Duration(i/2) * time.Second) // pairs share a time
			if i%3 == 0 {
				want = append(want, record(t, h, fmt.Sprintf("auth-%02d", i), "seller-7", at, true, ""))
			} else {
				record(t, h, fmt.Sprintf("label-%02d", i), "seller-7", at, false, "")
			}
			record(t, h, fmt.Sprintf("other-%02d", i), "seller-8", at, true, "")
		}
		// The same agent id in another letter case is another agent.
		record(t, h, "case", "Seller-7", base, true, "")
		for _, limit := range []int{1, 3, 100} {
			got := all(t, other, "seller-7", limit)
			if len(got) != len(want) {
				t.Fatalf("limit %d: %d records, want the %d authenticated ones", limit, len(got), len(want))
			}
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("limit %d, record %d: %+v\nwant %+v", limit, i, got[i], want[i])
				}
			}
		}
		// The full history lists the same records in the same order.
		var full []store.Verification
		cursor := ""
		for {
			page, next, err := h.Verifications(ctx, "seller-7", cursor, store.MaxPageSize)
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range page {
				if v.Authenticated {
					full = append(full, v)
				}
			}
			if cursor = next; next == "" {
				break
			}
		}
		if fmt.Sprint(full) != fmt.Sprint(want) {
			t.Fatalf("the full history's authenticated records differ from the index:\n%v\n%v", full, want)
		}
	})

	t.Run("an agent without authenticated records, and none, list nothing", func(t *testing.T) {
		h, _ := newH(t)
		record(t, h, "label", "seller-7", base, false, "")
		for _, agent := range []string{"seller-7", "unknown", ""} {
			if got, next, err := h.AuthenticatedVerifications(ctx, agent, "", 10); err != nil || len(got) != 0 || next != "" {
				t.Fatalf("%q: %v, %q, %v; want nothing", agent, got, next, err)
			}
		}
	})

	t.Run("a cursor stays valid while records are added, and a bad one is refused", func(t *testing.T) {
		h, other := newH(t)
		for i := range 4 {
			record(t, h, fmt.Sprintf("a%d", i), "seller-7", base.Add(-time.Duration(i)*time.Minute), true, "")
		}
		page, next, err := h.AuthenticatedVerifications(ctx, "seller-7", "", 2)
		if err != nil || len(page) != 2 || next == "" {
			t.Fatalf("first page: %d records, %q, %v", len(page), next, err)
		}
		record(t, other, "newer", "seller-7", base.Add(time.Hour), true, "")
		record(t, other, "label", "seller-7", base.Add(-90*time.Second), false, "")
		rest, last, err := other.AuthenticatedVerifications(ctx, "seller-7", next, 10)
		if err != nil || last != "" || len(rest) != 2 || rest[0].ID != "a2" || rest[1].ID != "a3" {
			t.Fatalf("second page: %v, %q, %v; want a2 and a3", rest, last, err)
		}
		for _, bad := range []string{"!", "AAAA", next + "\n", "AAAAAAAAAAAA\r"} {
			if _, _, err := h.AuthenticatedVerifications(ctx, "seller-7", bad, 10); !errors.Is(err, store.ErrBadCursor) {
				t.Errorf("cursor %q: %v, want ErrBadCursor", bad, err)
			}
		}
	})

	t.Run("a settlement outcome reaches the index copy", func(t *testing.T) {
		h, other := newH(t)
		record(t, h, "p", "seller-7", base, true, store.PaymentPending)
		if err := other.SetPayment(ctx, "p", store.PaymentPaid); err != nil {
			t.Fatal(err)
		}
		got, _, err := h.AuthenticatedVerifications(ctx, "seller-7", "", 10)
		if err != nil || len(got) != 1 || got[0].Payment != store.PaymentPaid || !got[0].Counted() {
			t.Fatalf("after settlement: %+v, %v; want the one record, paid", got, err)
		}
	})
}

// BenchmarkOwnedRead is what a score of an owned agent reads: its owner's
// 100 authenticated records under labels others recorded under its id
// (foreign, newest first), read through the authenticated index, against
// the full history paged and filtered (the read before the index) in the
// same run. h must be empty.
func BenchmarkOwnedRead(b *testing.B, h AuthenticatedHistory, foreign int) {
	ctx := context.Background()
	base := time.Now().UTC()
	for i := range foreign + 100 {
		v := Sample(fmt.Sprintf("r-%06d", i), "owned-7", base.Add(-time.Duration(i)*time.Second), "pass")
		if i >= foreign {
			v.Wallet, v.Authenticated = "0xowner", true
		}
		if err := h.RecordVerification(ctx, v); err != nil {
			b.Fatal(err)
		}
	}
	read := func(b *testing.B, page func(ctx context.Context, agentID, cursor string, limit int) ([]store.Verification, string, error)) {
		b.ReportAllocs()
		for b.Loop() {
			n, cursor := 0, ""
			for {
				vs, next, err := page(ctx, "owned-7", cursor, store.MaxPageSize)
				if err != nil {
					b.Fatal(err)
				}
				for _, v := range vs {
					if v.Authenticated {
						n++
					}
				}
				if cursor = next; next == "" {
					break
				}
			}
			if n != 100 {
				b.Fatalf("%d authenticated records, want 100", n)
			}
		}
	}
	b.Run("full-history", func(b *testing.B) { read(b, h.Verifications) })
	b.Run("authenticated-index", func(b *testing.B) { read(b, h.AuthenticatedVerifications) })
}
