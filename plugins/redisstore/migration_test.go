package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
)

// moduleClusterClient is a client on cl as the Caddy module makes it, with
// its default timeouts (module.go), whose slot map is read once and not
// again for the test's length: only a redirection makes it be read again.
func moduleClusterClient(t *testing.T, cl *servers.Cluster) *redis.ClusterClient {
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs, ClusterStateReloadInterval: time.Hour,
		DialTimeout: stallTimeout, ReadTimeout: stallTimeout, WriteTimeout: stallTimeout, MaxRetries: 2, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// A write MOVED to another primary is sent there in what is left of the
// store operation's one deadline (`timeout`, 1 s): an old primary slow to
// answer MOVED and a new one that stalls fail the claim as soon as the
// same claim sent to the stalled primary directly, within timeout + the
// undo's 0.5 s (README). (Before: the slot map's read and the redirected
// write each got a full timeout of their own, 2.4 s in all.)
func TestARedirectedWriteKeepsTheOperationsDeadline(t *testing.T) {
	ctx := context.Background()
	cl := servers.StartRedisClusterReplicated(t)
	masters := clusterNodes(t, ctx, cl)
	s, err := New(ctx, moduleClusterClient(t, cl), Options{Prefix: "mv", WaitReplicas: 1, WaitTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Minute)
	if _, err := s.Claims().Claim(ctx, []string{"a1"}, until); err != nil {
		t.Fatal(err)
	}
	from, to, slot := slotOwner(t, ctx, masters, "mv:{c}:a1")
	migrateSlot(t, ctx, from, to, slot)
	assignSlot(t, ctx, masters, to, slot)
	stalled := func(key string) time.Duration {
		t.Helper()
		start := time.Now()
		_, err := s.Claims().Claim(ctx, []string{key}, until)
		took := time.Since(start)
		to.Do(ctx, "client", "unpause")
		if err == nil {
			t.Fatalf("claim %s succeeded on a stalled primary", key)
		}
		t.Logf("claim %s: %v after %v", key, err, took)
		return took
	}
	// The old primary answers MOVED after 900 ms; the new one stalls writes.
	if err := to.Do(ctx, "client", "pause", 5000, "write").Err(); err != nil {
		t.Fatal(err)
	}
	if err := from.Do(ctx, "client", "pause", 900, "all").Err(); err != nil {
		t.Fatal(err)
	}
	took := stalled("k1")
	// The same stall of the primary the map already names.
	if _, err := s.Claims().Claim(ctx, []string{"k0"}, until); err != nil {
		t.Fatal(err)
	}
	if err := to.Do(ctx, "client", "pause", 5000, "write").Err(); err != nil {
		t.Fatal(err)
	}
	base := stalled("k2")
	const bound = stallTimeout + undoTimeout + 250*time.Millisecond
	if base > bound {
		t.Errorf("a claim on a stalled primary took %v, want at most timeout + 0.5 s (%v)", base, bound)
	}
	if took > bound || took-base > 250*time.Millisecond {
		t.Errorf("a claim MOVED to a stalled primary took %v, the same claim sent there directly %v: want one deadline (timeout 1 s) for the whole operation", took, base)
	}
}
