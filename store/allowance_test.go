package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"
)

func TestAllowance(t *testing.T) {
	ctx := context.Background()
	day := time.Now()

	t.Run("only committed calls count: a released unit comes back", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		al := db.Allowance()
		r1, err := al.Reserve(ctx, "p", "c", day, 2)
		if err != nil || r1.Remaining != 1 {
			t.Fatalf("first Reserve: remaining %d, %v", r1.Remaining, err)
		}
		r2, err := al.Reserve(ctx, "p", "c", day, 2)
		if err != nil || r2.Remaining != 0 {
			t.Fatalf("second Reserve: remaining %d, %v", r2.Remaining, err)
		}
		if _, err := al.Reserve(ctx, "p", "c", day, 2); !errors.Is(err, ErrExhausted) {
			t.Fatalf("third Reserve while two are pending = %v, want ErrExhausted", err)
		}
		if err := al.Release(ctx, r2); err != nil {
			t.Fatal(err)
		}
		if err := al.Commit(ctx, r1); err != nil {
			t.Fatal(err)
		}
		if rem, _ := al.Remaining(ctx, "p", "c", day, 2); rem != 1 {
			t.Fatalf("after one commit and one release: %d remaining, want 1", rem)
		}
	})

	t.Run("a reservation is committed or released once", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		al := db.Allowance()
		r, _ := al.Reserve(ctx, "p", "c", day, 5)
		if err := al.Commit(ctx, r); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			desc string
			op   func(context.Context, Reservation) error
		}{
			{"a second commit counts nothing", al.Commit},
			{"a release after commit gives nothing back", al.Release},
		} {
			if err := c.op(ctx, r); !errors.Is(err, ErrNotReserved) {
				t.Errorf("%s: %v, want ErrNotReserved", c.desc, err)
			}
		}
		if rem, _ := al.Remaining(ctx, "p", "c", day, 5); rem != 4 {
			t.Fatalf("%d remaining, want 4", rem)
		}
		for _, bad := range []Reservation{
			{Pool: "p", Client: "c", Day: r.Day, ID: "zz"},
			{Pool: "p", Client: "c", Day: "yesterday", ID: r.ID},
			{},
		} {
			if err := al.Commit(ctx, bad); !errors.Is(err, ErrNotReserved) {
				t.Errorf("forged reservation %+v: %v, want ErrNotReserved", bad, err)
			}
		}
	})

	t.Run("a reservation never committed or released lapses after its TTL", func(t *testing.T) {
		clock := useFakeClock(t)
		db, _ := openTemp(t, Options{ReservationTTL: time.Minute})
		al := db.Allowance()
		r, err := al.Reserve(ctx, "p", "c", clock.Now(), 1)
		if err != nil {
			t.Fatal(err)
		}
		if !r.Expires.Equal(clock.Now().Add(time.Minute)) {
			t.Fatalf("Expires %v, want now+1m", r.Expires)
		}
		clock.Advance(59 * time.Second)
		if _, err := al.Reserve(ctx, "p", "c", clock.Now(), 1); !errors.Is(err, ErrExhausted) {
			t.Fatalf("before the TTL: %v, want ErrExhausted", err)
		}
		clock.Advance(2 * time.Second)
		r2, err := al.Reserve(ctx, "p", "c", clock.Now(), 1)
		if err != nil {
			t.Fatalf("after the TTL the unit should be free again: %v", err)
		}
		if err := al.Commit(ctx, r); !errors.Is(err, ErrNotReserved) {
			t.Fatalf("commit of the lapsed reservation = %v, want ErrNotReserved (it must not count)", err)
		}
		if err := al.Commit(ctx, r2); err != nil {
			t.Fatal(err)
		}
		if rem, _ := al.Remaining(ctx, "p", "c", clock.Now(), 1); rem != 0 {
			t.Fatalf("%d remaining, want 0", rem)
		}
	})

	t.Run("each UTC day, pool and client has its own count", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		al := db.Allowance()
		// A fixed past date works: records outlive their day by the
		// real clock, whatever day the test runs on.
		d := time.Date(2026, 11, 29, 23, 59, 59, 0, time.UTC)
		r, err := al.Reserve(ctx, "p", "c", d, 1)
		if err != nil {
			t.Fatal(err)
		}
		al.Commit(ctx, r)
		for _, c := range []struct {
			desc         string
			pool, client string
			day          time.Time
			exhausted    bool
		}{
			{"the same client, pool and UTC day is exhausted", "p", "c", d, true},
			{"an instant in another time zone on the same UTC day is the same day", "p", "c", d.In(time.FixedZone("x", 5*3600)), true},
			{"the next UTC day starts afresh", "p", "c", d.Add(time.Second), false},
			{"another client has its own allowance", "p", "c2", d, false},
			{"another pool has its own allowance", "p2", "c", d, false},
			{"pool and client cannot be confused by concatenation", "pc", "", d, false},
		} {
			_, err := al.Reserve(ctx, c.pool, c.client, c.day, 1)
			if got := errors.Is(err, ErrExhausted); got != c.exhausted {
				t.Errorf("%s: exhausted %v (%v), want %v", c.desc, got, err, c.exhausted)
			}
		}
	})

	t.Run("a limit of zero is always exhausted", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		if _, err := db.Allowance().Reserve(ctx, "p", "c", day, 0); !errors.Is(err, ErrExhausted) {
			t.Fatalf("%v, want ErrExhausted", err)
		}
	})

	t.Run("committed units survive a restart", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "db")
		db, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			r, err := db.Allowance().Reserve(ctx, "p", "c", day, 5)
			if err != nil {
				t.Fatal(err)
			}
			db.Allowance().Commit(ctx, r)
		}
		db.Close()
		db, err = Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if rem, _ := db.Allowance().Remaining(ctx, "p", "c", day, 5); rem != 2 {
			t.Fatalf("after restart %d remaining, want 2", rem)
		}
	})
}
