package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
)

// TestSentinelFailover runs the module against a primary, a replica and a
// Sentinel, with wait_replicas 1: every acknowledged claim is on the
// replica, so when the primary dies and the replica is promoted no
// acknowledged claim is lost, writes fail (503) meanwhile, and resume by
// themselves.
func TestSentinelFailover(t *testing.T) {
	ctx := context.Background()
	primary := servers.StartRedis(t)
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica := servers.StartRedis(t, "--replicaof", host, port)
	rr := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer rr.Close()
	pr := redis.NewClient(&redis.Options{Addr: primary.Addr})
	defer pr.Close()
	// Linked on the replica's side and online on the primary's: only an
	// online replica acknowledges a WAIT.
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(rr.Info(ctx, "replication").Val(), "master_link_status:up") ||
		!strings.Contains(pr.Info(ctx, "replication").Val(), "state=online"); {
		if time.Now().After(deadline) {
			t.Fatal("replica never linked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	sentinel := servers.StartSentinel(t, primary, "aov", 500*time.Millisecond)

	cctx, cancel := caddy.NewContext(caddy.Context{Context: ctx})
	defer cancel()
	m := &RedisStore{Addresses: []string{sentinel.Addr}, MasterName: "aov", WaitReplicas: 1,
		WaitTimeout: caddy.Duration(time.Second), Timeout: caddy.Duration(2 * time.Second),
		DialTimeout: caddy.Duration(200 * time.Millisecond), Prefix: "sent"}
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; {
		if err = m.Provision(cctx); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Provision through the Sentinel: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	defer m.Cleanup()

	var acked []string
	for i := range 50 {
		k := "before-" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if _, err := m.Claims().Claim(ctx, []string{k}, time.Now().Add(time.Hour)); err != nil {
			t.Fatalf("claim %d: %v", i, err)
		}
		acked = append(acked, k)
	}
	primary.Stop()

	// Writes fail closed while the primary is down, and after the
	// promotion too: the new primary has no replica to acknowledge them
	// until the old one comes back (Sentinel turns it into a replica).
	failed := 0
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(rr.Info(ctx, "replication").Val(), "role:master") {
		if time.Now().After(deadline) {
			t.Fatal("the replica was never promoted")
		}
		_, err := m.Claims().Claim(ctx, []string{"during"}, time.Now().Add(time.Hour))
		if err == nil || errors.Is(err, store.ErrClaimed) {
			t.Fatalf("a write with the primary down: %v, want a failure", err)
		}
		failed++
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := m.Claims().Claim(ctx, []string{"unreplicated"}, time.Now().Add(time.Hour)); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("a write on the promoted primary with no replica: %v, want ErrNotReplicated", err)
	}
	primary.Start()
	for i := 0; ; i++ {
		// A fresh key each time: a write that was not acknowledged may
		// still be on the primary (its claim blocks that key until it
		// expires; nothing was granted on it).
		_, err := m.Claims().Claim(ctx, []string{fmt.Sprintf("after-%d", i)}, time.Now().Add(time.Hour))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("writes never resumed once a replica was back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if failed == 0 {
		t.Fatal("no write failed while the primary was down")
	}
	for _, k := range acked {
		if _, err := m.Claims().Claim(ctx, []string{k}, time.Now().Add(time.Hour)); !errors.Is(err, store.ErrClaimed) {
			t.Fatalf("acknowledged claim %q after the failover: %v, want ErrClaimed (lost)", k, err)
		}
	}
	t.Logf("%d writes failed during the failover", failed)
}
