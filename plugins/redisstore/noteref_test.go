package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/store"
)

// noteStore is a Store on rdb with a prefix of the test's own.
func noteStore(t *testing.T, rdb redis.UniversalClient) (*Store, claims) {
	t.Helper()
	s, err := New(context.Background(), rdb, Options{Prefix: "note" + strings.ReplaceAll(t.Name(), "/", "-")})
	if err != nil {
		t.Fatal(err)
	}
	return s, s.Claims().(claims)
}

// noNoteOn fails unless key k of s (as the caller names it) carries no
// note of its own and refers to the claim's first key: the claim's note
// is stored once.
func noNoteOn(t *testing.T, rdb redis.UniversalClient, s *Store, k, first string) {
	t.Helper()
	ctx := context.Background()
	if n, err := rdb.HExists(ctx, s.claimPrefix+k, "n").Result(); err != nil || n {
		t.Fatalf("key %q carries a note of its own (%v): the note is stored once per key", k, err)
	}
	if r := rdb.HGet(ctx, s.claimPrefix+k, "r").Val(); r != s.claimPrefix+first {
		t.Fatalf("key %q refers to %q, want its first key %q", k, r, s.claimPrefix+first)
	}
}

// A claim's note (a paid call's record, up to a held answer of a MiB) is
// stored once, under its first key; its other keys refer to it. Every key
// still reports the note (through Lookup and through a ClaimedError, also
// when the claimer names a key the ref points to, which its script did not
// declare), the compare-and-swap still sees a note changed meanwhile, and
// Held lists the claim once. Before, the note was written under every key:
// an EVM claim (two keys) held two copies.
func testNoteStoredOnce(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	s, cl := noteStore(t, rdb)
	note := `{"record":"` + strings.Repeat("x", 64<<10) + `"}`
	until := time.Now().Add(time.Hour)
	c, err := cl.ClaimHeld(ctx, []string{"first", "second"}, until, time.Minute, func(store.Claim) (string, error) { return note, nil })
	if err != nil {
		t.Fatal(err)
	}
	noNoteOn(t, rdb, s, "second", "first")
	if used := rdb.MemoryUsage(ctx, s.claimPrefix+"second").Val(); used > 1024 {
		t.Fatalf("the second key of a claim with a %d-byte note takes %d bytes: it holds a copy", len(note), used)
	}
	if used := rdb.MemoryUsage(ctx, s.claimPrefix+"first").Val(); used < int64(len(note)) {
		t.Fatalf("the first key takes %d bytes, less than its %d-byte note", used, len(note))
	}
	for _, k := range c.Keys {
		if st, err := cl.Lookup(ctx, k); err != nil || st.Note != note || st.Settled || st.Attempt != store.AttemptRunning {
			t.Fatalf("Lookup(%q) = %.60q, settled %v, attempt %v, %v; want the note, unsettled, attempt running", k, st.Note, st.Settled, st.Attempt, err)
		}
	}
	for _, keys := range [][]string{{"second"}, {"other", "second"}, {"first", "second"}} {
		_, err := cl.Claim(ctx, keys, until)
		var ce *store.ClaimedError
		if !errors.As(err, &ce) || ce.State.Note != note || ce.State.Attempt != store.AttemptRunning {
			t.Fatalf("claiming %q again: %v; want a ClaimedError with the note", keys, err)
		}
		if ce.Key != keys[0] && !(keys[0] == "other" && ce.Key == "second") {
			t.Fatalf("claiming %q again: the ClaimedError names %q", keys, ce.Key)
		}
	}
	if _, err := cl.Lookup(ctx, "other"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the free key of a refused claim was claimed: %v", err)
	}
	listed := 0
	cl.Held(ctx, func(k string, st store.ClaimState) bool { listed++; return k == "first" && st.Note == note })
	if listed != 1 {
		t.Fatalf("Held listed the claim %d times, want once", listed)
	}
	if err := cl.Swap(ctx, c, note+" ", "0xtx"); !errors.Is(err, store.ErrNoteChanged) {
		t.Fatalf("Swap from another note = %v, want ErrNoteChanged", err)
	}
	if err := cl.Swap(ctx, c, note, "0xtx"); err != nil {
		t.Fatal(err)
	}
	noNoteOn(t, rdb, s, "second", "first")
	for _, k := range c.Keys {
		if st, err := cl.Lookup(ctx, k); err != nil || !st.Settled || st.Note != "0xtx" {
			t.Fatalf("Lookup(%q) after the swap = %+v, %v", k, st, err)
		}
	}
	if err := cl.Release(ctx, c); !errors.Is(err, store.ErrClaimSettled) {
		t.Fatalf("Release of the settled claim = %v", err)
	}

	// Hold and Settle write the note once too.
	h, err := cl.Claim(ctx, []string{"h1", "h2", "h3"}, until)
	if err != nil {
		t.Fatal(err)
	}
	noNoteOn(t, rdb, s, "h3", "h1")
	if err := cl.Hold(ctx, h, note); err != nil {
		t.Fatal(err)
	}
	noNoteOn(t, rdb, s, "h2", "h1")
	if st, err := cl.Lookup(ctx, "h3"); err != nil || st.Note != note {
		t.Fatalf("Lookup of a held claim's last key = %.60q, %v", st.Note, err)
	}
	if err := cl.Settle(ctx, h, "settled", until.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	noNoteOn(t, rdb, s, "h2", "h1")
	if st, err := cl.Lookup(ctx, "h2"); err != nil || !st.Settled || st.Note != "settled" || !st.Until.After(until) {
		t.Fatalf("Lookup of a settled claim's second key = %+v, %v", st, err)
	}
}

func TestNoteStoredOnceStandalone(t *testing.T) {
	_, rdb := standalone(t)
	testNoteStoredOnce(t, rdb)
}

func TestNoteStoredOnceCluster(t *testing.T) {
	testNoteStoredOnce(t, cluster(t))
}

// A ref is a key's name, never a note: a key whose ref names a claim that
// is gone, or another claim, or a key that is itself a ref, reports its
// claim with no note, never the ref's target, nor that target's note. And a
// claim one of whose keys refers elsewhere is not its holder's: it cannot
// be settled, held, swapped or released. (Only a fault writes such a
// record: the store writes a claim's keys in one script, and they lapse
// together.)
func TestRefWithoutItsNoteIsNeverServed(t *testing.T) {
	ctx := context.Background()
	_, rdb := standalone(t)
	s, cl := noteStore(t, rdb)
	until := time.Now().Add(time.Hour)
	const token = "0123456789abcdef0123456789abcdef"
	put := func(k string, fields ...any) {
		t.Helper()
		k = s.claimPrefix + k
		rdb.Del(ctx, k)
		if err := rdb.HSet(ctx, k, append([]any{"s", "0", "t", token, "u", until.UnixMilli()}, fields...)...).Err(); err != nil {
			t.Fatal(err)
		}
		rdb.PExpireAt(ctx, k, until)
	}
	put("other", "n", "another claim's note", "s", "1")
	rdb.HSet(ctx, s.claimPrefix+"other", "t", strings.Repeat("ff", 16))
	put("chained", "r", s.claimPrefix+"other")
	for _, c := range []struct{ desc, ref string }{
		{"a ref to a key that is gone", s.claimPrefix + "gone"},
		{"a ref to another claim's key", s.claimPrefix + "other"},
		{"a ref to a ref", s.claimPrefix + "chained"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			put("ref", "r", c.ref)
			st, err := cl.Lookup(ctx, "ref")
			if err != nil || st.Note != "" || st.Settled {
				t.Fatalf("Lookup = %+v, %v; want the unsettled claim with no note", st, err)
			}
			_, err = cl.Claim(ctx, []string{"fresh", "ref"}, until)
			var ce *store.ClaimedError
			if !errors.As(err, &ce) || ce.Key != "ref" || ce.State.Note != "" || ce.State.Settled {
				t.Fatalf("claiming it again: %v (%+v); want a ClaimedError with no note", err, ce)
			}
			own := store.Claim{Keys: []string{"ref"}, Token: token, Until: until}
			if err := cl.Settle(ctx, own, "0xtx", time.Time{}); !errors.Is(err, store.ErrClaimLost) {
				t.Fatalf("Settle through a stray ref = %v, want ErrClaimLost", err)
			}
			if err := cl.Hold(ctx, own, "held"); !errors.Is(err, store.ErrClaimLost) {
				t.Fatalf("Hold through a stray ref = %v, want ErrClaimLost", err)
			}
			if err := cl.Swap(ctx, own, "", "0xtx"); !errors.Is(err, store.ErrClaimLost) {
				t.Fatalf("Swap through a stray ref = %v, want ErrClaimLost", err)
			}
			if err := cl.Release(ctx, own); !errors.Is(err, store.ErrClaimLost) {
				t.Fatalf("Release through a stray ref = %v, want ErrClaimLost", err)
			}
		})
	}
	t.Run("a ref outside the store's claims", func(t *testing.T) {
		put("ref", "r", "elsewhere")
		if st, err := cl.Lookup(ctx, "ref"); err == nil {
			t.Fatalf("Lookup = %+v; want a corrupt record refused", st)
		}
	})
}

// A claim written before notes were stored once (the note under every
// key, as the build before wrote it) is read, listed, swapped and settled
// after an upgrade; the swap leaves its note on the first key alone. A key
// that carries a note and a ref (an older gateway held or settled a claim
// a newer one wrote, during an upgrade against the README's advice) is
// read through the ref: the older gateway wrote the same note on the
// first key.
func TestClaimWithANoteOnEveryKeyIsRead(t *testing.T) {
	ctx := context.Background()
	_, rdb := standalone(t)
	s, cl := noteStore(t, rdb)
	until := time.Now().Add(time.Hour)
	c := store.Claim{Keys: []string{"a", "b"}, Token: "000102030405060708090a0b0c0d0e0f", Until: until}
	const note = `{"old":true}`
	attempt := time.Now().Add(time.Minute).UnixMilli()
	for _, k := range c.Keys { // as the build before wrote it (claimHeldScript)
		k = s.claimPrefix + k
		rdb.HSet(ctx, k, "s", "0", "t", c.Token, "u", until.UnixMilli(), "n", note, "a", attempt)
		rdb.PExpireAt(ctx, k, until)
	}
	rdb.ZAdd(ctx, s.heldIndex, redis.Z{Score: float64(until.UnixMilli()), Member: "a"})
	for _, k := range c.Keys {
		if st, err := cl.Lookup(ctx, k); err != nil || st.Note != note || st.Attempt != store.AttemptRunning {
			t.Fatalf("Lookup(%q) = %+v, %v", k, st, err)
		}
	}
	var ce *store.ClaimedError
	if _, err := cl.Claim(ctx, []string{"new", "b"}, until); !errors.As(err, &ce) || ce.State.Note != note {
		t.Fatalf("claiming its second key: %v; want a ClaimedError with the note", err)
	}
	listed := 0
	cl.Held(ctx, func(k string, st store.ClaimState) bool { listed++; return st.Note == note })
	if listed != 1 {
		t.Fatalf("Held listed %d, want 1", listed)
	}
	rdb.HSet(ctx, s.claimPrefix+"b", "n", `{"other":true}`)
	if err := cl.Swap(ctx, c, note, "0xtx"); !errors.Is(err, store.ErrNoteChanged) {
		t.Fatalf("Swap of a claim whose second key's note changed = %v, want ErrNoteChanged", err)
	}
	rdb.HSet(ctx, s.claimPrefix+"b", "n", note)
	if err := cl.Swap(ctx, c, note, "0xtx"); err != nil {
		t.Fatal(err)
	}
	noNoteOn(t, rdb, s, "b", "a")
	if st, err := cl.Lookup(ctx, "b"); err != nil || !st.Settled || st.Note != "0xtx" {
		t.Fatalf("Lookup after the swap = %+v, %v", st, err)
	}

	rdb.HSet(ctx, s.claimPrefix+"a", "n", "written by an older gateway")
	rdb.HSet(ctx, s.claimPrefix+"b", "n", "written by an older gateway")
	if st, err := cl.Lookup(ctx, "b"); err != nil || st.Note != "written by an older gateway" {
		t.Fatalf("Lookup of a ref that also carries a note = %+v, %v", st, err)
	}
}
