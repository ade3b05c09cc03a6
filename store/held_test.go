package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestHeldClaims(t *testing.T) {
	ctx := context.Background()
	var _ HeldClaims = claims{}

	t.Run("a note held with an unsettled claim is reported to a second claimer and listed once per claim", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims().(HeldClaims)
		c, err := db.Claims().Claim(ctx, []string{"a", "b"}, time.Now().Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Hold(ctx, c, `{"held":true}`); err != nil {
			t.Fatal(err)
		}
		_, err = db.Claims().Claim(ctx, []string{"b"}, time.Now().Add(time.Hour))
		var ce *ClaimedError
		if !errors.As(err, &ce) || ce.State.Settled || ce.State.Note != `{"held":true}` {
			t.Fatalf("second claim: %v", err)
		}
		var n int
		if err := cl.Held(ctx, func(key string, st ClaimState) bool {
			n++
			if (key != "a" && key != "b") || st.Note != `{"held":true}` {
				t.Errorf("listed %q %+v", key, st)
			}
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Fatalf("listed %d times, want once", n)
		}
	})

	t.Run("settled, released and plain claims are not listed; a settled claim cannot be held", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims().(HeldClaims)
		until := time.Now().Add(time.Hour)
		settled, _ := db.Claims().Claim(ctx, []string{"s"}, until)
		released, _ := db.Claims().Claim(ctx, []string{"r"}, until)
		if _, err := db.Claims().Claim(ctx, []string{"plain"}, until); err != nil {
			t.Fatal(err)
		}
		for _, c := range []Claim{settled, released} {
			if err := cl.Hold(ctx, c, "note"); err != nil {
				t.Fatal(err)
			}
		}
		if err := db.Claims().Settle(ctx, settled, "note", time.Time{}); err != nil {
			t.Fatal(err)
		}
		if err := db.Claims().Release(ctx, released); err != nil {
			t.Fatal(err)
		}
		if err := cl.Hold(ctx, settled, "again"); !errors.Is(err, ErrClaimSettled) {
			t.Fatalf("hold of a settled claim: %v", err)
		}
		if err := cl.Held(ctx, func(key string, _ ClaimState) bool {
			t.Errorf("listed %q", key)
			return true
		}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a note over the bound is refused and changes nothing", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims().(HeldClaims)
		c, _ := db.Claims().Claim(ctx, []string{"k"}, time.Now().Add(time.Hour))
		if err := cl.Hold(ctx, c, strings.Repeat("x", MaxHoldNoteBytes+1)); err == nil {
			t.Fatal("accepted")
		}
		if st, err := db.Claims().Lookup(ctx, "k"); err != nil || st.Note != "" {
			t.Fatalf("lookup %+v %v", st, err)
		}
	})
}
