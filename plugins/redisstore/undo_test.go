package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
)

// lostReply returns a Store whose client reaches srv through a proxy that
// drops one reply on demand, with go-redis's resends off (as when they are
// exhausted), and the proxy.
func lostReply(t *testing.T, srv *servers.Redis, opts Options) (*Store, *servers.ReplyDrop) {
	t.Helper()
	p := servers.StartReplyDrop(t, srv.Addr)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	s, err := New(context.Background(), rdb, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s, p
}

// A claim whose script ran but whose answer was lost is reported as an
// error (the gateway answers 503: nothing was charged, retry): the retry
// with the same payment, or the same nonce, must find the keys free, not
// "in flight" until the claim lapses.
func TestClaimWithALostReplyLeavesNothingHeld(t *testing.T) {
	ctx := context.Background()
	s, p := lostReply(t, servers.StartRedis(t), Options{Prefix: "lr"})
	cl := s.Claims()
	// Loads the script, so the armed reply is the claim's own.
	if _, err := cl.Claim(ctx, []string{"warm"}, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	keys := []string{"x402/auth/base/usdc/0xpayer/0xnonce", "x402/payload/ff"}
	p.Armed.Store(true)
	if _, err := cl.Claim(ctx, keys, time.Now().Add(time.Hour)); err == nil {
		t.Fatal("a claim whose reply was lost reported success")
	}
	if p.Drops.Load() != 1 {
		t.Fatalf("%d replies dropped, want 1", p.Drops.Load())
	}
	for _, k := range keys {
		if st, err := cl.Lookup(ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("key %s still held after the failed claim: %+v, %v", k, st, err)
		}
	}
	if _, err := cl.Claim(ctx, keys, time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("the retry with the same payment: %v", err)
	}
}

// The same for a free-allowance unit: a reservation whose answer was lost
// gives its unit back at once, not after the reservation's TTL.
func TestReserveWithALostReplyLeavesNothingTaken(t *testing.T) {
	ctx := context.Background()
	s, p := lostReply(t, servers.StartRedis(t), Options{Prefix: "lr"})
	al := s.Allowance()
	day := time.Now()
	if _, err := al.Reserve(ctx, "verify", "warm", day, 3); err != nil {
		t.Fatal(err)
	}
	p.Armed.Store(true)
	if _, err := al.Reserve(ctx, "verify", "ip:1.2.3.4", day, 3); err == nil {
		t.Fatal("a reservation whose reply was lost reported success")
	}
	if p.Drops.Load() != 1 {
		t.Fatalf("%d replies dropped, want 1", p.Drops.Load())
	}
	if rem, err := al.Remaining(ctx, "verify", "ip:1.2.3.4", day, 3); err != nil || rem != 3 {
		t.Fatalf("remaining %d (%v) after the failed reservation, want 3", rem, err)
	}
}

// With wait_replicas and no replica acknowledging, a claim or reservation
// is on the primary but reported as not replicated: it is undone too.
func TestNotReplicatedWritesAreUndone(t *testing.T) {
	ctx := context.Background()
	_, rdb := standalone(t)
	s, err := New(ctx, rdb, Options{Prefix: "nr", WaitReplicas: 1, WaitTimeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{"siwx/nonce/abc"}
	if _, err := s.Claims().Claim(ctx, keys, time.Now().Add(time.Hour)); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("claim = %v, want ErrNotReplicated", err)
	}
	if st, err := s.Claims().Lookup(ctx, keys[0]); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the unacknowledged claim is still held: %+v, %v", st, err)
	}
	day := time.Now()
	if _, err := s.Allowance().Reserve(ctx, "verify", "ip:1.2.3.4", day, 3); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("reserve = %v, want ErrNotReplicated", err)
	}
	if rem, err := s.Allowance().Remaining(ctx, "verify", "ip:1.2.3.4", day, 3); err != nil || rem != 3 {
		t.Fatalf("remaining %d (%v) after the unacknowledged reservation, want 3", rem, err)
	}
}
