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

func testHeld(t *testing.T, rdb redis.UniversalClient) {
	ctx := context.Background()
	s, err := New(ctx, rdb, Options{Prefix: "held" + strings.ReplaceAll(t.Name(), "/", "-")})
	if err != nil {
		t.Fatal(err)
	}
	cl := s.Claims().(claims)
	held := func() map[string]string {
		t.Helper()
		got := map[string]string{}
		if err := cl.Held(ctx, func(k string, st store.ClaimState) bool { got[k] = st.Note; return true }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	a, _ := cl.Claim(ctx, []string{"a1", "a2"}, time.Now().Add(time.Minute))
	b, _ := cl.Claim(ctx, []string{"b1"}, time.Now().Add(400*time.Millisecond))
	c, _ := cl.Claim(ctx, []string{"c1"}, time.Now().Add(time.Minute))
	for _, x := range []store.Claim{a, b, c} {
		if err := cl.Hold(ctx, x, "held:"+x.Keys[0]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.Claim(ctx, []string{"plain"}, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := held(); len(got) != 3 || got["a1"] != "held:a1" || got["b1"] != "held:b1" {
		t.Fatalf("held %v, want a1, b1, c1 with their notes", got)
	}
	if st, err := cl.Lookup(ctx, "a2"); err != nil || st.Settled || st.Note != "held:a1" {
		t.Fatalf("every key of a held claim reports its note: %+v, %v", st, err)
	}
	if err := cl.Settle(ctx, a, "0xtx", time.Time{}); err != nil {
		t.Fatal(err)
	}
	if err := cl.Hold(ctx, a, "again"); !errors.Is(err, store.ErrClaimSettled) {
		t.Fatalf("Hold of a settled claim = %v, want ErrClaimSettled", err)
	}
	if err := cl.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	// Settle and Release take a claim off the index themselves: it lists
	// only records that still need resolving, not every claim since the
	// background pass last pruned it.
	d, err := cl.ClaimHeld(ctx, []string{"d1"}, time.Now().Add(time.Minute), time.Minute, func(store.Claim) (string, error) { return "record", nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Swap(ctx, d, "record", "0xtx"); err != nil {
		t.Fatal(err)
	}
	e, err := cl.ClaimHeld(ctx, []string{"e1"}, time.Now().Add(time.Minute), time.Minute, func(store.Claim) (string, error) { return "record", nil })
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.Release(ctx, e); err != nil {
		t.Fatal(err)
	}
	if got, err := rdb.ZRange(ctx, s.heldIndex, 0, -1).Result(); err != nil || len(got) != 1 || got[0] != "b1" {
		t.Fatalf("the index holds %v (%v) after a1 settled, c1 released, d1 swapped to settled and e1 released; want b1 alone", got, err)
	}
	time.Sleep(time.Until(b.Until) + 5*time.Millisecond)
	if err := cl.Hold(ctx, b, "late"); !errors.Is(err, store.ErrClaimLost) {
		t.Fatalf("Hold of a lapsed claim = %v, want ErrClaimLost", err)
	}
	if got := held(); len(got) != 0 {
		t.Fatalf("after settle, release and lapse: held %v, want none", got)
	}
	if err := cl.Hold(ctx, c, strings.Repeat("x", store.MaxHoldNoteBytes+1)); err == nil {
		t.Fatal("a note over the bound was accepted")
	}
}

func TestHeldStandalone(t *testing.T) {
	_, rdb := standalone(t)
	testHeld(t, rdb)
}

func TestHeldCluster(t *testing.T) {
	testHeld(t, cluster(t))
}
