package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
)

// README ("What each failure costs", a Cluster slot moves): a write the old
// primary refuses with MOVED, or ASK while the slot's keys are moving, is
// sent to the primary it names. A slot that moved A→B since the client read
// its map and is now moving B→C: the write goes to A (MOVED B), then to B,
// which answers ASK C, and then to C, where it runs, once. With and without
// wait_replicas the same claim succeeds. (Before: with wait_replicas the
// store returned that ASK as the write's error, a 503, while go-redis,
// without it, followed both redirections.)
func TestAMovedThenAskIsFollowed(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	masters := clusterNodes(t, ctx, cl)
	s := moduleStore(t, ctx, cl, Options{Prefix: "mv", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	s0 := moduleStore(t, ctx, cl, Options{Prefix: "mv"})
	until := time.Now().Add(time.Minute)
	// Each client reads its slot map now, before the moves.
	if _, err := s.Claims().Claim(ctx, []string{"a1"}, until); err != nil {
		t.Fatal(err)
	}
	if _, err := s0.Claims().Claim(ctx, []string{"a0"}, until); err != nil {
		t.Fatal(err)
	}
	a, b, slot := slotOwner(t, ctx, masters, "mv:{c}:a1")
	c := masters[0]
	for _, m := range masters {
		if m != a && m != b {
			c = m
		}
	}
	// A→B done (the clients' maps still say A), then B→C under way.
	migrateSlot(t, ctx, a, b, slot)
	assignSlot(t, ctx, masters, b, slot)
	migrateSlot(t, ctx, b, c, slot)

	if _, err := s.Claims().Claim(ctx, []string{"k1"}, until); err != nil {
		t.Errorf("with wait_replicas 1: claim after MOVED then ASK = %v, want claimed", err)
	}
	if _, err := s0.Claims().Claim(ctx, []string{"k0"}, until); err != nil {
		t.Errorf("without wait_replicas: claim after MOVED then ASK = %v, want claimed", err)
	}
	// The claims ran on C alone: A and B refused them before running
	// anything, and hold no key of the slot.
	for _, n := range []struct {
		name string
		want int64
	}{{"A", 0}, {"B", 0}, {"C", 4}} {
		m := map[string]*redis.Client{"A": a, "B": b, "C": c}[n.name]
		if got, err := m.ClusterCountKeysInSlot(ctx, slot).Result(); err != nil || got != n.want {
			t.Errorf("%s holds %d keys of the slot (%v), want %d", n.name, got, err, n.want)
		}
	}
}

// After an ASK nothing more is followed: a node the ASK named that
// answers MOVED in turn (here one not told it imports the slot) ends the
// write with that answer, a 503 with nothing claimed, and the claim runs
// nowhere.
func TestNothingIsFollowedAfterAnAsk(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	masters := clusterNodes(t, ctx, cl)
	s := moduleStore(t, ctx, cl, Options{Prefix: "mv", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	until := time.Now().Add(time.Minute)
	if _, err := s.Claims().Claim(ctx, []string{"a1"}, until); err != nil {
		t.Fatal(err)
	}
	a, b, slot := slotOwner(t, ctx, masters, "mv:{c}:a1")
	if err := a.Do(ctx, "cluster", "setslot", slot, "migrating", nodeID(t, ctx, b)).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := s.Claims().Claim(ctx, []string{"k1"}, until)
	if _, moved := redis.IsMovedError(errors.Unwrap(err)); !moved {
		t.Errorf("claim ASKed to a node that answers MOVED = %v, want that MOVED", err)
	}
	for _, m := range []*redis.Client{a, b} {
		if got := m.ClusterCountKeysInSlot(ctx, slot).Val(); got != map[*redis.Client]int64{a: 1, b: 0}[m] {
			t.Errorf("%s holds %d keys of the slot, want only the claim made before", m.Options().Addr, got)
		}
	}
}

// README ("What each failure costs", a Cluster slot moves): while a slot's
// keys are moving, a write of several keys runs only on a node holding them
// all. The old primary refuses it (TRYAGAIN) when it holds some of them but
// not all; when it holds none it answers ASK, and the new primary refuses
// it when any of them is missing there, even keys that exist nowhere yet
// (a new claim of two keys), and runs it when it holds them all. Each
// refusal comes before anything runs: nothing is claimed or settled.
// (Before: README said only a write of keys the new primary holds some but
// not all of was refused, though a new two-key claim is refused for the
// whole move.)
func TestAMultiKeyWriteDuringAMoveRunsOnlyWhereAllItsKeysAre(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	masters := clusterNodes(t, ctx, cl)
	s := moduleStore(t, ctx, cl, Options{Prefix: "mv", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	until := time.Now().Add(time.Minute)
	plain, err := s.Claims().Claim(ctx, []string{"s1"}, until)
	if err != nil {
		t.Fatal(err)
	}
	hold := func(store.Claim) (string, error) { return "record", nil }
	held, err := s.Claims().(store.HeldClaims).ClaimHeld(ctx, []string{"h1"}, until, time.Minute, hold)
	if err != nil {
		t.Fatal(err)
	}
	from, to, slot := slotOwner(t, ctx, masters, "mv:{c}:s1")
	// The move under way: the held claim and the index of held claims
	// are on the new primary, the plain claim still on the old one.
	if err := to.Do(ctx, "cluster", "setslot", slot, "importing", nodeID(t, ctx, from)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := from.Do(ctx, "cluster", "setslot", slot, "migrating", nodeID(t, ctx, to)).Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(to.Options().Addr, ":")
	if err := from.Do(ctx, "migrate", host, port, "", 0, 5000, "keys", "mv:{c}:h1", s.heldIndex).Err(); err != nil {
		t.Fatal(err)
	}

	// The old primary holds s1 but not the index: refused there.
	if err := s.Claims().Settle(ctx, plain, "tx", time.Time{}); !redis.HasErrorPrefix(err, "TRYAGAIN") {
		t.Errorf("settling a claim whose key the old primary holds, its index not = %v, want TRYAGAIN", err)
	}
	// Two keys that exist nowhere: ASK, then refused by the new primary.
	if _, err := s.Claims().Claim(ctx, []string{"q1", "q2"}, until); !redis.HasErrorPrefix(err, "TRYAGAIN") {
		t.Errorf("a two-key claim of new keys during a move = %v, want TRYAGAIN", err)
	}
	for _, k := range []string{"q1", "q2"} {
		if _, err := s.Claims().Lookup(ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("%s after a refused claim = %v, want not found (nothing claimed)", k, err)
		}
	}
	// Every key of the held claim's settlement is on the new primary.
	if err := s.Claims().Settle(ctx, held, "tx", time.Time{}); err != nil {
		t.Errorf("settling a claim whose keys all moved, during the move = %v, want settled", err)
	}
	if st, err := s.Claims().Lookup(ctx, "s1"); err != nil || st.Settled {
		t.Errorf("the claim whose settlement was refused = %+v, %v, want held unsettled", st, err)
	}
}
