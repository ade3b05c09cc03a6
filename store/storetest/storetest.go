// Package storetest is the contract suite of the store interfaces: every
// backend (the embedded Badger store, Redis, PostgreSQL) runs the same
// tests, unchanged, so each proves the same promises. The tests use real,
// short lifetimes (no fake clock: a distributed backend judges expiry by
// its server's clock) and compare instants to the millisecond, the
// precision every backend keeps.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// Gateway is a backend of the gateway's state.
type Gateway struct {
	Allowance store.Allowance
	Claims    store.Claims
	// ServerDay is set for a backend shared by several gateways that
	// counts a free call in the UTC day of its server's clock, whatever
	// day the gateway names (Redis): the day then changes at the server's
	// midnight, which a test cannot move.
	ServerDay bool
}

// NewGateway returns a fresh, empty backend whose allowance reservations
// lapse after ttl. It is called once per subtest.
type NewGateway func(t *testing.T, ttl time.Duration) Gateway

// lifetime is the short real lifetime of reservations and claims in the
// expiry tests: long enough that a loaded two-core machine answers well
// within it, short enough to wait for.
const lifetime = 400 * time.Millisecond

// near reports whether a and b are within a millisecond of each other.
func near(a, b time.Time) bool {
	d := a.Sub(b)
	return d > -time.Millisecond && d < time.Millisecond
}

// TestAllowance runs the store.Allowance contract against newGW.
func TestAllowance(t *testing.T, newGW NewGateway) {
	ctx := context.Background()
	day := time.Now()

	t.Run("never exceeds the limit under concurrency", func(t *testing.T) {
		al := newGW(t, time.Minute).Allowance
		const limit, callers = 10, 100
		var ok, exhausted atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := al.Reserve(ctx, "verify", "198.51.100.7", day, limit)
				switch {
				case err == nil:
					ok.Add(1)
					if err := al.Commit(ctx, r); err != nil {
						t.Errorf("Commit: %v", err)
					}
				case errors.Is(err, store.ErrExhausted):
					exhausted.Add(1)
					if r.Remaining != 0 {
						t.Errorf("exhausted reservation reports %d remaining", r.Remaining)
					}
				default:
					t.Errorf("Reserve: %v", err)
				}
			}()
		}
		close(start)
		wg.Wait()
		if ok.Load() != limit || exhausted.Load() != callers-limit {
			t.Fatalf("%d reserved, %d exhausted; want exactly %d and %d", ok.Load(), exhausted.Load(), limit, callers-limit)
		}
		if rem, err := al.Remaining(ctx, "verify", "198.51.100.7", day, limit); err != nil || rem != 0 {
			t.Fatalf("Remaining = %d, %v; want 0", rem, err)
		}
	})

	t.Run("only committed calls count: a released unit comes back", func(t *testing.T) {
		al := newGW(t, time.Minute).Allowance
		r1, err := al.Reserve(ctx, "p", "c", day, 2)
		if err != nil || r1.Remaining != 1 {
			t.Fatalf("first Reserve: remaining %d, %v", r1.Remaining, err)
		}
		r2, err := al.Reserve(ctx, "p", "c", day, 2)
		if err != nil || r2.Remaining != 0 {
			t.Fatalf("second Reserve: remaining %d, %v", r2.Remaining, err)
		}
		if _, err := al.Reserve(ctx, "p", "c", day, 2); !errors.Is(err, store.ErrExhausted) {
			t.Fatalf("third Reserve while two are pending = %v, want ErrExhausted", err)
		}
		if rem, _ := al.Remaining(ctx, "p", "c", day, 2); rem != 0 {
			t.Fatalf("pending units count as taken: %d remaining, want 0", rem)
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
		al := newGW(t, time.Minute).Allowance
		r, err := al.Reserve(ctx, "p", "c", day, 5)
		if err != nil {
			t.Fatal(err)
		}
		if err := al.Commit(ctx, r); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			desc string
			op   func(context.Context, store.Reservation) error
		}{
			{"a second commit counts nothing", al.Commit},
			{"a release after commit gives nothing back", al.Release},
		} {
			if err := c.op(ctx, r); !errors.Is(err, store.ErrNotReserved) {
				t.Errorf("%s: %v, want ErrNotReserved", c.desc, err)
			}
		}
		if rem, _ := al.Remaining(ctx, "p", "c", day, 5); rem != 4 {
			t.Fatalf("%d remaining, want 4", rem)
		}
		for _, bad := range []store.Reservation{
			{Pool: "p", Client: "c", Day: r.Day, ID: "zz"},
			{Pool: "p", Client: "c", Day: "yesterday", ID: r.ID},
			{Pool: "p", Client: "other", Day: r.Day, ID: r.ID},
			{},
		} {
			if err := al.Commit(ctx, bad); !errors.Is(err, store.ErrNotReserved) {
				t.Errorf("forged reservation %+v: %v, want ErrNotReserved", bad, err)
			}
		}
	})

	t.Run("a reservation never committed or released lapses after its TTL", func(t *testing.T) {
		al := newGW(t, lifetime).Allowance
		before := time.Now()
		r, err := al.Reserve(ctx, "p", "c", day, 1)
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		// The backend's clock may be another machine's: allow the
		// millisecond precision plus the call's own duration.
		if r.Expires.Before(before.Add(lifetime-time.Millisecond)) || r.Expires.After(after.Add(lifetime+time.Millisecond)) {
			t.Fatalf("Expires %v, want now+%v (called between %v and %v)", r.Expires, lifetime, before, after)
		}
		if _, err := al.Reserve(ctx, "p", "c", day, 1); !errors.Is(err, store.ErrExhausted) {
			t.Fatalf("before the TTL: %v, want ErrExhausted", err)
		}
		time.Sleep(time.Until(r.Expires) + 5*time.Millisecond)
		r2, err := al.Reserve(ctx, "p", "c", day, 1)
		if err != nil {
			t.Fatalf("after the TTL the unit should be free again: %v", err)
		}
		if err := al.Commit(ctx, r); !errors.Is(err, store.ErrNotReserved) {
			t.Fatalf("commit of the lapsed reservation = %v, want ErrNotReserved (it must not count)", err)
		}
		if err := al.Commit(ctx, r2); err != nil {
			t.Fatal(err)
		}
		if rem, _ := al.Remaining(ctx, "p", "c", day, 1); rem != 0 {
			t.Fatalf("%d remaining, want 0", rem)
		}
	})

	t.Run("a lapsed reservation cannot be released either", func(t *testing.T) {
		al := newGW(t, lifetime).Allowance
		r, err := al.Reserve(ctx, "p", "c", day, 2)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(r.Expires) + 5*time.Millisecond)
		if err := al.Release(ctx, r); !errors.Is(err, store.ErrNotReserved) {
			t.Fatalf("release of a lapsed reservation = %v, want ErrNotReserved", err)
		}
		if rem, _ := al.Remaining(ctx, "p", "c", day, 2); rem != 2 {
			t.Fatalf("%d remaining, want 2", rem)
		}
	})

	t.Run("each UTC day, pool and client has its own count", func(t *testing.T) {
		gw := newGW(t, time.Minute)
		al := gw.Allowance
		d := time.Date(2026, 11, 29, 23, 59, 59, 0, time.UTC)
		before := time.Now().UTC().Format(time.DateOnly)
		r, err := al.Reserve(ctx, "p", "c", d, 1)
		after := time.Now().UTC().Format(time.DateOnly)
		if err != nil {
			t.Fatal(err)
		}
		nextDayFresh := true
		switch {
		case !gw.ServerDay && r.Day != d.Format(time.DateOnly):
			t.Errorf("counted in day %s, want %s", r.Day, d.Format(time.DateOnly))
		case gw.ServerDay && r.Day != before && r.Day != after:
			t.Errorf("counted in day %s, want the server's day %s", r.Day, after)
		case gw.ServerDay:
			// The day the caller names is a guess: the server's
			// day is used up whatever it says.
			nextDayFresh = false
		}
		if err := al.Commit(ctx, r); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			desc         string
			pool, client string
			day          time.Time
			exhausted    bool
		}{
			{"the same client, pool and UTC day is exhausted", "p", "c", d, true},
			{"an instant in another time zone on the same UTC day is the same day", "p", "c", d.In(time.FixedZone("x", 5*3600)), true},
			{"the next UTC day starts afresh (unless the server's clock says otherwise)", "p", "c", d.Add(time.Second), !nextDayFresh},
			{"another client has its own allowance", "p", "c2", d, false},
			{"another pool has its own allowance", "p2", "c", d, false},
			{"pool and client cannot be confused by concatenation", "pc", "", d, false},
			{"a client spelling a key separator is its own client", "p", "c:", d, false},
		} {
			_, err := al.Reserve(ctx, c.pool, c.client, c.day, 1)
			if got := errors.Is(err, store.ErrExhausted); got != c.exhausted {
				t.Errorf("%s: exhausted %v (%v), want %v", c.desc, got, err, c.exhausted)
			}
		}
	})

	t.Run("a limit of zero is always exhausted", func(t *testing.T) {
		al := newGW(t, time.Minute).Allowance
		if _, err := al.Reserve(ctx, "p", "c", day, 0); !errors.Is(err, store.ErrExhausted) {
			t.Fatalf("%v, want ErrExhausted", err)
		}
	})
}

// TestClaims runs the store.Claims contract against newGW.
func TestClaims(t *testing.T, newGW NewGateway) {
	ctx := context.Background()

	t.Run("a claim is all or nothing", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		until := time.Now().Add(time.Hour)
		if _, err := cl.Claim(ctx, []string{"nonce:0xabc:1"}, until); err != nil {
			t.Fatal(err)
		}
		_, err := cl.Claim(ctx, []string{"payload:ff", "nonce:0xabc:1"}, until)
		var ce *store.ClaimedError
		if !errors.As(err, &ce) || ce.Key != "nonce:0xabc:1" || ce.State.Settled || !errors.Is(err, store.ErrClaimed) {
			t.Fatalf("second claim overlapping one key = %v, want ClaimedError naming the held key", err)
		}
		if !near(ce.State.Until, until) {
			t.Fatalf("ClaimedError until %v, want %v", ce.State.Until, until)
		}
		if _, err := cl.Lookup(ctx, "payload:ff"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("the free key of a refused claim was claimed anyway: %v", err)
		}
		if _, err := cl.Claim(ctx, []string{"payload:ff"}, until); err != nil {
			t.Fatalf("the free key is still claimable: %v", err)
		}
	})

	t.Run("of many concurrent claimers of one key exactly one wins", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		var wins, losses atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := cl.Claim(ctx, []string{fmt.Sprintf("own:%d", i), "shared"}, time.Now().Add(time.Hour))
				switch {
				case err == nil:
					wins.Add(1)
				case errors.Is(err, store.ErrClaimed):
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
			if _, err := cl.Lookup(ctx, fmt.Sprintf("own:%d", i)); err == nil {
				held++
			}
		}
		if held != 1 {
			t.Fatalf("%d own keys held, want only the winner's", held)
		}
	})

	t.Run("a claim expires at its until and the key can be claimed again", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		until := time.Now().Add(lifetime)
		first, err := cl.Claim(ctx, []string{"k"}, until)
		if err != nil {
			t.Fatal(err)
		}
		if st, err := cl.Lookup(ctx, "k"); err != nil || st.Settled || !near(st.Until, until) {
			t.Fatalf("Lookup = %+v, %v; want pending until %v", st, err, until)
		}
		if _, err := cl.Claim(ctx, []string{"k"}, time.Now().Add(time.Minute)); !errors.Is(err, store.ErrClaimed) {
			t.Fatalf("before expiry: %v, want ErrClaimed", err)
		}
		time.Sleep(time.Until(until) + 5*time.Millisecond)
		if _, err := cl.Lookup(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Lookup after expiry: %v, want ErrNotFound", err)
		}
		second, err := cl.Claim(ctx, []string{"k"}, time.Now().Add(time.Minute))
		if err != nil {
			t.Fatalf("after expiry: %v", err)
		}
		for _, c := range []struct {
			desc string
			op   func() error
		}{
			{"the expired holder cannot release the new claim", func() error { return cl.Release(ctx, first) }},
			{"the expired holder cannot settle the new claim", func() error { return cl.Settle(ctx, first, "tx", time.Time{}) }},
		} {
			if err := c.op(); !errors.Is(err, store.ErrClaimLost) {
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

	t.Run("an expired claim cannot be settled", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		c, err := cl.Claim(ctx, []string{"late"}, time.Now().Add(lifetime))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Until(c.Until) + 5*time.Millisecond)
		if err := cl.Settle(ctx, c, "tx", time.Now().Add(time.Hour)); !errors.Is(err, store.ErrClaimLost) {
			t.Fatalf("Settle after expiry: %v, want ErrClaimLost", err)
		}
	})

	t.Run("a settled claim cannot be released and keeps its note", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		until := time.Now().Add(time.Minute)
		c, err := cl.Claim(ctx, []string{"a", "b"}, until)
		if err != nil {
			t.Fatal(err)
		}
		keep := until.Add(time.Hour)
		if err := cl.Settle(ctx, c, "0xtxhash", keep); err != nil {
			t.Fatal(err)
		}
		if err := cl.Release(ctx, c); !errors.Is(err, store.ErrClaimSettled) {
			t.Fatalf("Release of a settled claim = %v, want ErrClaimSettled", err)
		}
		st, err := cl.Lookup(ctx, "b")
		if err != nil || !st.Settled || st.Note != "0xtxhash" || !near(st.Until, keep) {
			t.Fatalf("Lookup = %+v, %v; want settled, noted, until %v", st, err, keep)
		}
		_, err = cl.Claim(ctx, []string{"b"}, until)
		var ce *store.ClaimedError
		if !errors.As(err, &ce) || !ce.State.Settled || ce.State.Note != "0xtxhash" {
			t.Fatalf("claiming a settled key = %v, want a ClaimedError saying settled", err)
		}
	})

	t.Run("settling with no keep-until keeps the claim's own expiry", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		until := time.Now().Add(lifetime)
		c, err := cl.Claim(ctx, []string{"s"}, until)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Settle(ctx, c, "paid", time.Time{}); err != nil {
			t.Fatal(err)
		}
		if st, err := cl.Lookup(ctx, "s"); err != nil || !st.Settled || !near(st.Until, until) {
			t.Fatalf("Lookup = %+v, %v", st, err)
		}
		time.Sleep(time.Until(until) + 5*time.Millisecond)
		if _, err := cl.Lookup(ctx, "s"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("after its until a settled claim lapses: %v, want ErrNotFound", err)
		}
	})

	t.Run("a released claim frees every key", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		until := time.Now().Add(time.Minute)
		c, err := cl.Claim(ctx, []string{"x", "y"}, until)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Release(ctx, c); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Claim(ctx, []string{"y", "x"}, until); err != nil {
			t.Fatalf("keys of a released claim: %v", err)
		}
	})

	t.Run("a forged token settles and releases nothing", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		c, err := cl.Claim(ctx, []string{"f"}, time.Now().Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		for _, forged := range []store.Claim{
			{Keys: c.Keys, Token: strings.Repeat("0", 32), Until: c.Until},
			{Keys: c.Keys, Token: "not hex", Until: c.Until},
			{Keys: nil, Token: c.Token, Until: c.Until},
		} {
			if err := cl.Settle(ctx, forged, "tx", time.Time{}); !errors.Is(err, store.ErrClaimLost) {
				t.Errorf("Settle with %+v: %v, want ErrClaimLost", forged, err)
			}
			if err := cl.Release(ctx, forged); !errors.Is(err, store.ErrClaimLost) {
				t.Errorf("Release with %+v: %v, want ErrClaimLost", forged, err)
			}
		}
		if st, err := cl.Lookup(ctx, "f"); err != nil || st.Settled {
			t.Fatalf("the claim was disturbed: %+v, %v", st, err)
		}
	})

	t.Run("bad claims are refused", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		for _, c := range []struct {
			desc  string
			keys  []string
			until time.Time
		}{
			{"no keys", nil, time.Now().Add(time.Hour)},
			{"an empty key", []string{""}, time.Now().Add(time.Hour)},
			{"a key over the size cap", []string{strings.Repeat("k", store.MaxClaimKeyBytes+1)}, time.Now().Add(time.Hour)},
			{"an expiry in the past", []string{"k"}, time.Now().Add(-time.Second)},
		} {
			if _, err := cl.Claim(ctx, c.keys, c.until); err == nil || errors.Is(err, store.ErrClaimed) {
				t.Errorf("%s: %v, want a refusal", c.desc, err)
			}
		}
		if _, err := cl.Lookup(ctx, "k"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused claim left a key: %v", err)
		}
	})

	t.Run("a held claim is claimed with its note in one write, listed, and moved on by Swap", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		hc, ok := cl.(store.HeldClaims)
		if !ok {
			t.Skip("the backend keeps no held records")
		}
		until := time.Now().Add(time.Hour)
		var asked store.Claim
		c, err := hc.ClaimHeld(ctx, []string{"h1", "h2"}, until, time.Minute, func(c store.Claim) (string, error) {
			asked = c
			return "record of " + c.Token, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if asked.Token != c.Token || !slices.Equal(asked.Keys, c.Keys) || !slices.Equal(c.Keys, []string{"h1", "h2"}) {
			t.Fatalf("the note was made for %+v, the claim is %+v", asked, c)
		}
		want := "record of " + c.Token
		for _, k := range c.Keys {
			if st, err := cl.Lookup(ctx, k); err != nil || st.Settled || st.Note != want || !near(st.Until, until) {
				t.Fatalf("%s: %+v, %v; want pending with the note until %v", k, st, err, until)
			}
		}
		var ce *store.ClaimedError
		if _, err := cl.Claim(ctx, []string{"h2"}, until); !errors.As(err, &ce) || ce.State.Note != want {
			t.Fatalf("a second claim = %v, want a ClaimedError carrying the note", err)
		}
		var listed []string
		list := func() {
			listed = nil
			if err := hc.Held(ctx, func(key string, st store.ClaimState) bool {
				listed = append(listed, key+"="+st.Note)
				return true
			}); err != nil {
				t.Fatal(err)
			}
		}
		if list(); !slices.Equal(listed, []string{"h1=" + want}) {
			t.Fatalf("held %v, want the claim once with its note", listed)
		}
		// The record moves on by compare-and-swap, as the gateway moves it.
		if err := hc.Swap(ctx, c, "another note", "settled"); !errors.Is(err, store.ErrNoteChanged) {
			t.Fatalf("Swap from a note the claim does not carry = %v, want ErrNoteChanged", err)
		}
		if err := hc.Swap(ctx, c, want, "settled"); err != nil {
			t.Fatal(err)
		}
		if st, err := cl.Lookup(ctx, "h2"); err != nil || !st.Settled || st.Note != "settled" {
			t.Fatalf("after Swap %+v, %v; want settled with the new note", st, err)
		}
		if list(); len(listed) != 0 {
			t.Fatalf("a settled claim is still listed: %v", listed)
		}
		if s1, s2 := hc.Session(), hc.Session(); s1 != s2 {
			t.Fatalf("the session changed while the store is open: %q, %q", s1, s2)
		}
	})

	t.Run("a shared store judges a held claim's attempt span by its own clock", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		hc, ok := cl.(store.HeldClaims)
		if !ok {
			t.Skip("the backend keeps no held records")
		}
		until := time.Now().Add(time.Hour)
		note := func(store.Claim) (string, error) { return "record", nil }
		if _, err := hc.ClaimHeld(ctx, []string{"a1", "a2"}, until, time.Hour, note); err != nil {
			t.Fatal(err)
		}
		if _, err := hc.ClaimHeld(ctx, []string{"o1"}, until, time.Millisecond, note); err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Claim(ctx, []string{"plain"}, until); err != nil {
			t.Fatal(err)
		}
		if hc.Session() != "" {
			// One process: it knows its own requests, and keeps no span.
			for _, k := range []string{"a1", "o1", "plain"} {
				if st, err := cl.Lookup(ctx, k); err != nil || st.Attempt != store.AttemptUnknown {
					t.Fatalf("%s: %+v, %v; want no attempt state from a store with a Session", k, st, err)
				}
			}
			return
		}
		for _, k := range []string{"a1", "a2"} {
			if st, err := cl.Lookup(ctx, k); err != nil || st.Attempt != store.AttemptRunning {
				t.Fatalf("%s within its span: %+v, %v; want AttemptRunning", k, st, err)
			}
		}
		var ce *store.ClaimedError
		if _, err := cl.Claim(ctx, []string{"a2"}, until); !errors.As(err, &ce) || ce.State.Attempt != store.AttemptRunning {
			t.Fatalf("a second claim within the span = %v, want a ClaimedError with AttemptRunning", err)
		}
		if st, err := cl.Lookup(ctx, "plain"); err != nil || st.Attempt != store.AttemptUnknown {
			t.Fatalf("a claim written without a span: %+v, %v; want AttemptUnknown", st, err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			st, err := cl.Lookup(ctx, "o1")
			if err != nil {
				t.Fatal(err)
			}
			if st.Attempt == store.AttemptOver {
				break
			}
			if st.Attempt != store.AttemptRunning || time.Now().After(deadline) {
				t.Fatalf("a 1 ms span: %+v; want AttemptRunning, then AttemptOver", st)
			}
		}
		states := map[string]store.AttemptState{}
		if err := hc.Held(ctx, func(key string, st store.ClaimState) bool {
			states[key] = st.Attempt
			return true
		}); err != nil {
			t.Fatal(err)
		}
		if states["a1"] != store.AttemptRunning || states["o1"] != store.AttemptOver {
			t.Fatalf("Held reports %v; want a1 running, o1 over", states)
		}
	})

	t.Run("a held claim whose note cannot be made, or is too large, claims nothing", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		hc, ok := cl.(store.HeldClaims)
		if !ok {
			t.Skip("the backend keeps no held records")
		}
		until := time.Now().Add(time.Hour)
		bad := errors.New("no note")
		if _, err := hc.ClaimHeld(ctx, []string{"n1"}, until, time.Minute, func(store.Claim) (string, error) { return "", bad }); !errors.Is(err, bad) {
			t.Fatalf("ClaimHeld = %v, want the note's error", err)
		}
		if _, err := hc.ClaimHeld(ctx, []string{"n1"}, until, time.Minute, func(store.Claim) (string, error) {
			return strings.Repeat("x", store.MaxHoldNoteBytes+1), nil
		}); err == nil {
			t.Fatal("a note over MaxHoldNoteBytes was taken")
		}
		if _, err := cl.Lookup(ctx, "n1"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused held claim left a key: %v", err)
		}
	})

	t.Run("a record is a settled claim in one write, kept by a shorter second record, renewed by a longer one, replacing a pending claim", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		until := time.Now().Add(time.Hour)
		if err := cl.Record(ctx, "paid:a", "paid", until); err != nil {
			t.Fatal(err)
		}
		st, err := cl.Lookup(ctx, "paid:a")
		if err != nil || !st.Settled || st.Note != "paid" || !near(st.Until, until) {
			t.Fatalf("recorded claim %+v, %v; want settled, noted, until %v", st, err, until)
		}
		// A second record that would end sooner changes nothing (a retry
		// of the first is one).
		for _, sooner := range []time.Time{until, until.Add(-time.Minute)} {
			if err := cl.Record(ctx, "paid:a", "other", sooner); err != nil {
				t.Fatal(err)
			}
			if st2, err := cl.Lookup(ctx, "paid:a"); err != nil || st2 != st {
				t.Fatalf("after a record until %v: %+v, %v; want %+v", sooner, st2, err, st)
			}
		}
		// One that lasts longer renews it (a wallet that paid again).
		later := until.Add(time.Hour)
		if err := cl.Record(ctx, "paid:a", "paid", later); err != nil {
			t.Fatal(err)
		}
		if st2, err := cl.Lookup(ctx, "paid:a"); err != nil || !st2.Settled || st2.Note != "paid" || !near(st2.Until, later) {
			t.Fatalf("after a longer record %+v, %v; want settled until %v", st2, err, later)
		}
		st, _ = cl.Lookup(ctx, "paid:a")
		var ce *store.ClaimedError
		if _, err := cl.Claim(ctx, []string{"paid:a"}, until); !errors.As(err, &ce) || !ce.State.Settled {
			t.Fatalf("claiming a recorded key = %v, want a ClaimedError, settled", err)
		}
		// A pending claim on the key is replaced; its holder has lost it.
		pending, err := cl.Claim(ctx, []string{"paid:b"}, time.Now().Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.Record(ctx, "paid:b", "paid", until); err != nil {
			t.Fatal(err)
		}
		if st, err := cl.Lookup(ctx, "paid:b"); err != nil || !st.Settled || !near(st.Until, until) {
			t.Fatalf("a record over a pending claim: %+v, %v", st, err)
		}
		if err := cl.Release(ctx, pending); !errors.Is(err, store.ErrClaimLost) {
			t.Fatalf("releasing the replaced claim = %v, want ErrClaimLost", err)
		}
		if err := cl.Settle(ctx, pending, "x", time.Time{}); !errors.Is(err, store.ErrClaimLost) {
			t.Fatalf("settling the replaced claim = %v, want ErrClaimLost", err)
		}
		// Refused like a claim: nothing written.
		for _, c := range []struct {
			desc, key string
			until     time.Time
		}{
			{"an empty key", "", until},
			{"a key over the size cap", strings.Repeat("k", store.MaxClaimKeyBytes+1), until},
			{"an expiry in the past", "paid:c", time.Now().Add(-time.Second)},
		} {
			if err := cl.Record(ctx, c.key, "paid", c.until); err == nil {
				t.Errorf("%s: recorded", c.desc)
			}
		}
		if _, err := cl.Lookup(ctx, "paid:c"); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("a refused record left a key: %v", err)
		}
	})

	t.Run("an expired record can be recorded again", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		if err := cl.Record(ctx, "paid:e", "paid", time.Now().Add(lifetime)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(lifetime + 50*time.Millisecond)
		until := time.Now().Add(time.Hour)
		if err := cl.Record(ctx, "paid:e", "paid", until); err != nil {
			t.Fatal(err)
		}
		if st, err := cl.Lookup(ctx, "paid:e"); err != nil || !st.Settled || !near(st.Until, until) {
			t.Fatalf("%+v, %v; want a new record until %v", st, err, until)
		}
	})

	t.Run("a key named twice in one claim is claimed once", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		c, err := cl.Claim(ctx, []string{"d", "d"}, time.Now().Add(time.Minute))
		if err != nil || len(c.Keys) != 1 {
			t.Fatalf("%+v, %v", c, err)
		}
	})

	t.Run("keys may hold any bytes, hash-tag braces and NUL included", func(t *testing.T) {
		cl := newGW(t, time.Minute).Claims
		keys := []string{"{x}", "a\x00b", "{", "}{"}
		c, err := cl.Claim(ctx, keys, time.Now().Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if _, err := cl.Lookup(ctx, k); err != nil {
				t.Errorf("Lookup %q: %v", k, err)
			}
		}
		if _, err := cl.Lookup(ctx, "a"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("a prefix of a NUL key: %v, want ErrNotFound", err)
		}
		if err := cl.Settle(ctx, c, "n", time.Time{}); err != nil {
			t.Fatal(err)
		}
	})
}
