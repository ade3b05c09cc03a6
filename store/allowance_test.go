package store

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

func TestAllowance(t *testing.T) {
	ctx := context.Background()
	day := time.Now()

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

// A reservation lives ReservationTTL on the monotonic clock. The gate bounds
// every free call well inside it, so a unit lapses only when its call is
// gone; a wall clock set forward must not lapse it early and grant it again
// while its call still runs (that call's commit would then be refused and
// the client served one call past its limit).
func TestReservationLapsesOnTheMonotonicClock(t *testing.T) {
	ctx := context.Background()
	clock := useFakeClock(t)
	day := clock.Now()
	db, _ := openTemp(t, Options{NoSync: true, ReservationTTL: time.Minute})
	a := db.Allowance()

	r, err := a.Reserve(ctx, "p", "c", day, 1)
	if err != nil {
		t.Fatal(err)
	}
	clock.Step(2 * time.Hour)
	if _, err := a.Reserve(ctx, "p", "c", day, 1); err != ErrExhausted {
		t.Fatalf("after the wall clock stepped 2h forward, the held unit was granted again (Reserve: %v)", err)
	}
	if err := a.Commit(ctx, r); err != nil {
		t.Fatalf("the call's commit after the step: %v", err)
	}

	// Time passing does lapse a reservation: its unit is granted again
	// and the late commit is refused.
	late, err := a.Reserve(ctx, "p", "c2", day, 1)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute + time.Second)
	again, err := a.Reserve(ctx, "p", "c2", day, 1)
	if err != nil {
		t.Fatalf("a lapsed unit was not granted again: %v", err)
	}
	if err := a.Commit(ctx, late); err != ErrNotReserved {
		t.Fatalf("commit of a lapsed reservation: %v, want ErrNotReserved", err)
	}
	if err := a.Commit(ctx, again); err != nil {
		t.Fatal(err)
	}
}
