package store

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestClaims(t *testing.T) {
	ctx := context.Background()

	t.Run("a claim is all or nothing", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims()
		until := time.Now().Add(time.Hour)
		if _, err := cl.Claim(ctx, []string{"nonce:0xabc:1"}, until); err != nil {
			t.Fatal(err)
		}
		_, err := cl.Claim(ctx, []string{"payload:ff", "nonce:0xabc:1"}, until)
		var ce *ClaimedError
		if !errors.As(err, &ce) || ce.Key != "nonce:0xabc:1" || ce.State.Settled || !errors.Is(err, ErrClaimed) {
			t.Fatalf("second claim overlapping one key = %v, want ClaimedError naming the held key", err)
		}
		if _, err := cl.Lookup(ctx, "payload:ff"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the free key of a refused claim was claimed anyway: %v", err)
		}
		if _, err := cl.Claim(ctx, []string{"payload:ff"}, until); err != nil {
			t.Fatalf("the free key is still claimable: %v", err)
		}
	})

	t.Run("of many concurrent claimers of one key exactly one wins", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims()
		var wins, losses atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				// Each claimer also has a key of its own, which must not
				// be left behind by the losers.
				_, err := cl.Claim(ctx, []string{"own:" + string(rune('A'+i)), "shared"}, time.Now().Add(time.Hour))
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, ErrClaimed):
					losses.Add(1)
				default:
					t.Error(err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if wins.Load() != 1 || losses.Load() != 49 {
			t.Fatalf("%d wins, %d losses; want 1 and 49", wins.Load(), losses.Load())
		}
		held := 0
		for i := range 50 {
			if _, err := cl.Lookup(ctx, "own:"+string(rune('A'+i))); err == nil {
				held++
			}
		}
		if held != 1 {
			t.Fatalf("%d own keys held, want only the winner's", held)
		}
	})

	t.Run("a claim expires at its until and the key can be claimed again", func(t *testing.T) {
		clock := useFakeClock(t)
		db, _ := openTemp(t, Options{})
		cl := db.Claims()
		first, err := cl.Claim(ctx, []string{"k"}, clock.Now().Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Minute - time.Nanosecond)
		if _, err := cl.Claim(ctx, []string{"k"}, clock.Now().Add(time.Minute)); !errors.Is(err, ErrClaimed) {
			t.Fatalf("just before expiry: %v, want ErrClaimed", err)
		}
		clock.Advance(time.Nanosecond)
		second, err := cl.Claim(ctx, []string{"k"}, clock.Now().Add(time.Minute))
		if err != nil {
			t.Fatalf("at expiry: %v", err)
		}
		for _, c := range []struct {
			desc string
			op   func() error
		}{
			{"the expired holder cannot release the new claim", func() error { return cl.Release(ctx, first) }},
			{"the expired holder cannot settle the new claim", func() error { return cl.Settle(ctx, first, "tx", time.Time{}) }},
		} {
			if err := c.op(); !errors.Is(err, ErrClaimLost) {
				t.Errorf("%s: %v, want ErrClaimLost", c.desc, err)
			}
		}
		if st, err := cl.Lookup(ctx, "k"); err != nil || st.Settled {
			t.Fatalf("the new claim was disturbed: %+v, %v", st, err)
		}
		if err := cl.Release(ctx, second); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("a settled claim cannot be released and keeps its note", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims()
		until := time.Now().Add(time.Minute)
		c, err := cl.Claim(ctx, []string{"a", "b"}, until)
		if err != nil {
			t.Fatal(err)
		}
		keep := until.Add(time.Hour)
		if err := cl.Settle(ctx, c, "0xtxhash", keep); err != nil {
			t.Fatal(err)
		}
		if err := cl.Release(ctx, c); !errors.Is(err, ErrClaimSettled) {
			t.Fatalf("Release of a settled claim = %v, want ErrClaimSettled", err)
		}
		st, err := cl.Lookup(ctx, "b")
		if err != nil || !st.Settled || st.Note != "0xtxhash" || !st.Until.Equal(keep.UTC().Truncate(0)) {
			t.Fatalf("Lookup = %+v, %v", st, err)
		}
		_, err = cl.Claim(ctx, []string{"b"}, until)
		var ce *ClaimedError
		if !errors.As(err, &ce) || !ce.State.Settled || ce.State.Note != "0xtxhash" {
			t.Fatalf("claiming a settled key = %v, want a ClaimedError saying settled", err)
		}
	})

	t.Run("a released claim frees every key", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims()
		until := time.Now().Add(time.Minute)
		c, _ := cl.Claim(ctx, []string{"x", "y"}, until)
		if err := cl.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Claim(ctx, []string{"y", "x"}, until); err != nil {
			t.Fatalf("keys of a released claim: %v", err)
		}
	})

	t.Run("bad claims are refused", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		cl := db.Claims()
		for _, c := range []struct {
			desc  string
			keys  []string
			until time.Time
		}{
			{"no keys", nil, time.Now().Add(time.Hour)},
			{"an empty key", []string{""}, time.Now().Add(time.Hour)},
			{"a key over the size cap", []string{strings.Repeat("k", MaxClaimKeyBytes+1)}, time.Now().Add(time.Hour)},
			{"an expiry in the past", []string{"k"}, time.Now().Add(-time.Second)},
		} {
			if _, err := cl.Claim(ctx, c.keys, c.until); err == nil || errors.Is(err, ErrClaimed) {
				t.Errorf("%s: %v, want a refusal", c.desc, err)
			}
		}
	})

	t.Run("a key named twice in one claim is claimed once", func(t *testing.T) {
		db, _ := openTemp(t, Options{})
		c, err := db.Claims().Claim(ctx, []string{"d", "d"}, time.Now().Add(time.Minute))
		if err != nil || len(c.Keys) != 1 {
			t.Fatalf("%+v, %v", c, err)
		}
	})

	t.Run("claims survive a restart", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "db")
		db, err := Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		db.Claims().Claim(ctx, []string{"persist"}, time.Now().Add(time.Hour))
		db.Close()
		db, err = Open(dir, Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Claims().Claim(ctx, []string{"persist"}, time.Now().Add(time.Hour)); !errors.Is(err, ErrClaimed) {
			t.Fatalf("after restart: %v, want ErrClaimed", err)
		}
	})
}
