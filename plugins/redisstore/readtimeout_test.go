package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
)

// A Store "works on its own too" (package doc), on any client. One that
// waits for replicas sends each write's WAIT on the write's connection,
// and the WAIT and its answer must fit within the client's read timeout
// (which bounds the whole operation: Store.bounded). New refuses a client
// whose read timeout is shorter than WaitTimeout + 0.5 s, naming both;
// one at that bound gets the whole WaitTimeout for each WAIT.
// (Before: New took a 100 ms read timeout with the default 100 ms
// WaitTimeout without a word, and every claim then failed with "no time
// left to wait for replicas" though the replica acknowledged in about a
// millisecond; a read timeout a little longer cut each WAIT short.)
func TestNewRefusesAReadTimeoutShorterThanItsWait(t *testing.T) {
	ctx := context.Background()
	primary := servers.StartRedis(t)
	host, port, _ := strings.Cut(primary.Addr, ":")
	servers.StartRedis(t, "--replicaof", host, port)
	client := func(read time.Duration) *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: primary.Addr, ReadTimeout: read, MaxRetries: 2, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	for _, read := range []time.Duration{100 * time.Millisecond, 599 * time.Millisecond} {
		_, err := New(ctx, client(read), Options{Prefix: "rt", WaitReplicas: 1})
		if err == nil || !strings.Contains(err.Error(), read.String()) || !strings.Contains(err.Error(), "100ms") {
			t.Errorf("New on a client with a %v read timeout and WaitTimeout 100ms = %v, want a refusal naming both", read, err)
		}
	}
	// Without WaitReplicas no WAIT is sent: any read timeout will do.
	if _, err := New(ctx, client(100*time.Millisecond), Options{Prefix: "rt"}); err != nil {
		t.Errorf("New with no WaitReplicas on a 100 ms read timeout = %v", err)
	}

	// At the bound, a healthy replica acknowledges the claim.
	rdb := client(time.Second + 500*time.Millisecond)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if rdb.Set(ctx, "probe", "1", 0).Err() == nil && rdb.Wait(ctx, 1, 100).Val() >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica never connected")
		}
	}
	s, err := New(ctx, rdb, Options{Prefix: "rt", WaitReplicas: 1, WaitTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claims().Claim(ctx, []string{"k1"}, time.Now().Add(time.Minute)); err != nil {
		t.Errorf("claim with a healthy replica and a read timeout of WaitTimeout + 0.5 s = %v, want claimed", err)
	}
	// Asking for more replicas than there are, the WAIT runs its whole
	// WaitTimeout before the write is refused.
	const wait = 300 * time.Millisecond
	s2, err := New(ctx, client(wait+500*time.Millisecond), Options{Prefix: "rt", WaitReplicas: 2, WaitTimeout: wait})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = s2.Claims().Claim(ctx, []string{"k2"}, time.Now().Add(time.Minute))
	if took := time.Since(start); !errors.Is(err, ErrNotReplicated) || took < wait {
		t.Errorf("claim waiting for 2 replicas of 1 = %v after %v, want ErrNotReplicated after the whole %v", err, took, wait)
	}
}

// The module checks its settings by the same rule: an explicit timeout
// shorter than wait_timeout + 0.5 s with wait_replicas is refused, naming
// both; with no timeout set, it defaults to 1 s or wait_timeout + 0.5 s,
// whichever is longer.
func TestProvisionRefusesATimeoutShorterThanItsWait(t *testing.T) {
	srv, _ := standalone(t)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	m := &RedisStore{Addresses: []string{srv.Addr}, WaitReplicas: 1,
		WaitTimeout: caddy.Duration(time.Second), Timeout: caddy.Duration(1200 * time.Millisecond)}
	if err := m.Provision(ctx); err == nil || !strings.Contains(err.Error(), "1.2s") || !strings.Contains(err.Error(), "1s") {
		t.Fatalf("Provision with timeout 1.2s and wait_timeout 1s = %v, want a refusal naming both", err)
	}
	clients.Range(func(key, _ any) bool {
		t.Errorf("a refused provision left client %v in the pool", key)
		return true
	})
	m = &RedisStore{Addresses: []string{srv.Addr}, WaitReplicas: 1, WaitTimeout: caddy.Duration(time.Second)}
	if err := m.Provision(ctx); err != nil {
		t.Fatalf("Provision with wait_timeout 1s and no timeout = %v", err)
	}
	defer m.Cleanup()
	if got := readTimeout(m.pooled.rdb); got != 1500*time.Millisecond {
		t.Errorf("default timeout with wait_timeout 1s = %v, want 1.5s", got)
	}
}
