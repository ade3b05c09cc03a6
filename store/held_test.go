package store

import (
	"context"
	"errors"
	"fmt"
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
	t.Run("swap moves a note on once: the second swap from the same note loses", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims().(HeldClaims)
		c, _ := db.Claims().Claim(ctx, []string{"a", "b"}, time.Now().Add(time.Hour))
		if err := cl.Hold(ctx, c, "unknown"); err != nil {
			t.Fatal(err)
		}
		if err := cl.Swap(ctx, c, "other", "settled"); !errors.Is(err, ErrNoteChanged) {
			t.Fatalf("swap from a note it does not carry: %v", err)
		}
		if st, err := db.Claims().Lookup(ctx, "b"); err != nil || st.Settled || st.Note != "unknown" {
			t.Fatalf("a lost swap changed the claim: %+v %v", st, err)
		}
		if err := cl.Swap(ctx, c, "unknown", "settled"); err != nil {
			t.Fatal(err)
		}
		if err := cl.Swap(ctx, c, "settled", "delivered"); err != nil {
			t.Fatal(err)
		}
		if err := cl.Swap(ctx, c, "settled", "delivered again"); !errors.Is(err, ErrNoteChanged) {
			t.Fatalf("second swap from the same note: %v", err)
		}
		for _, k := range c.Keys {
			if st, err := db.Claims().Lookup(ctx, k); err != nil || !st.Settled || st.Note != "delivered" {
				t.Fatalf("%s: %+v %v", k, st, err)
			}
		}
		if err := cl.Swap(ctx, Claim{Keys: c.Keys, Token: strings.Repeat("0", 32)}, "delivered", "x"); !errors.Is(err, ErrClaimLost) {
			t.Fatalf("swap by another holder: %v", err)
		}
	})

	t.Run("of concurrent swaps from one note exactly one wins", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims().(HeldClaims)
		c, _ := db.Claims().Claim(ctx, []string{"k"}, time.Now().Add(time.Hour))
		if err := db.Claims().Settle(ctx, c, "settled", time.Time{}); err != nil {
			t.Fatal(err)
		}
		const n = 16
		errs := make(chan error, n)
		for i := range n {
			go func() { errs <- cl.Swap(ctx, c, "settled", fmt.Sprint("delivered ", i)) }()
		}
		won := 0
		for range n {
			switch err := <-errs; {
			case err == nil:
				won++
			case !errors.Is(err, ErrNoteChanged):
				t.Fatal(err)
			}
		}
		if won != 1 {
			t.Fatalf("%d swaps won", won)
		}
	})
}
