package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// rawClaim is the value stored under claim key k, as Badger holds it.
func rawClaim(t *testing.T, db *DB, k string) []byte {
	t.Helper()
	var v []byte
	if err := db.view(context.Background(), func(txn *tx) error {
		item, err := txn.Get(claimKey(k))
		if err != nil {
			return err
		}
		v, err = item.ValueCopy(nil)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

// A claim's note (a paid call's record, kilobytes) is stored once, under
// its first key; its other keys point there. Every key still reports the
// note, the compare-and-swap still sees a note changed meanwhile, and Held
// lists the claim once. Before, the note was stored (encoded, written,
// copied out by the swap) once per key.
func TestClaimNoteIsStoredOnce(t *testing.T) {
	ctx := context.Background()
	db, _ := openTemp(t, Options{})
	hc := db.Claims().(HeldClaims)
	note := `{"record":"` + strings.Repeat("x", 4096) + `"}`
	c, err := hc.ClaimHeld(ctx, []string{"first", "second", "third"}, time.Now().Add(time.Hour), time.Minute, func(Claim) (string, error) { return note, nil })
	if err != nil {
		t.Fatal(err)
	}
	stored := len(rawClaim(t, db, "first")) + len(rawClaim(t, db, "second")) + len(rawClaim(t, db, "third"))
	if stored > len(note)+3*25+2*len("first") {
		t.Fatalf("a %d-byte note on three keys took %d bytes: stored more than once", len(note), stored)
	}
	for _, k := range c.Keys {
		if st, err := db.Claims().Lookup(ctx, k); err != nil || st.Note != note {
			t.Fatalf("Lookup(%q) = %.40q, %v; want the note", k, st.Note, err)
		}
	}
	if _, err := db.Claims().Claim(ctx, []string{"third"}, time.Now().Add(time.Hour)); err == nil {
		t.Fatal("a key of a live claim was claimed again")
	} else if ce := (*ClaimedError)(nil); !errors.As(err, &ce) || ce.State.Note != note {
		t.Fatalf("claiming its last key: %v; want the claim with its note", err)
	}
	listed := 0
	hc.Held(ctx, func(_ string, st ClaimState) bool { listed++; return st.Note == note })
	if listed != 1 {
		t.Fatalf("Held listed the claim %d times, want once", listed)
	}
	if err := hc.Swap(ctx, c, note+" ", "0xtx"); !errors.Is(err, ErrNoteChanged) {
		t.Fatalf("Swap from another note = %v, want ErrNoteChanged", err)
	}
	if err := hc.Swap(ctx, c, note, "0xtx"); err != nil {
		t.Fatal(err)
	}
	for _, k := range c.Keys {
		if st, err := db.Claims().Lookup(ctx, k); err != nil || !st.Settled || st.Note != "0xtx" {
			t.Fatalf("Lookup(%q) after the swap = %+v, %v", k, st, err)
		}
	}
	if err := db.Claims().Release(ctx, c); !errors.Is(err, ErrClaimSettled) {
		t.Fatalf("Release of the settled claim = %v", err)
	}
}

// A claim written before notes were stored once (the note under every
// key, layout 3) is read, swapped and listed as before after an upgrade.
func TestClaimWithANoteOnEveryKeyIsRead(t *testing.T) {
	ctx := context.Background()
	db, dir := openTemp(t, Options{})
	until := time.Now().Add(time.Hour)
	c := Claim{Keys: []string{"a", "b"}, Token: "000102030405060708090a0b0c0d0e0f", Until: until}
	rec := claimRecord{until: until.UnixNano(), note: `{"old":true}`}
	for i := range rec.token {
		rec.token[i] = byte(i)
	}
	if err := db.update(ctx, func(txn *tx) error {
		for _, k := range c.Keys { // as the version before wrote it
			if err := putClaim(txn, k, rec); err != nil {
				return err
			}
		}
		return txn.Set(keyLayoutVersion, []byte{3})
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	db, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	checkLayoutVersion(t, db)
	hc := db.Claims().(HeldClaims)
	if st, err := db.Claims().Lookup(ctx, "b"); err != nil || st.Note != rec.note {
		t.Fatalf("Lookup = %+v, %v", st, err)
	}
	listed := 0
	hc.Held(ctx, func(string, ClaimState) bool { listed++; return true })
	if listed != 1 {
		t.Fatalf("Held listed %d, want 1", listed)
	}
	if err := hc.Swap(ctx, c, `{"other":true}`, "0xtx"); !errors.Is(err, ErrNoteChanged) {
		t.Fatalf("Swap from another note = %v", err)
	}
	if err := hc.Swap(ctx, c, rec.note, "0xtx"); err != nil {
		t.Fatal(err)
	}
	if st, err := db.Claims().Lookup(ctx, "b"); err != nil || !st.Settled || st.Note != "0xtx" {
		t.Fatalf("Lookup after the swap = %+v, %v", st, err)
	}
}
