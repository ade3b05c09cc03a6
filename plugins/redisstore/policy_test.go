package redisstore

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
)

// withReplica starts a primary (noeviction, AOF on) and one replica with
// the extra arguments, and waits until the primary lists it online.
func withReplica(t *testing.T, replicaArgs ...string) (primary, replica *servers.Redis) {
	t.Helper()
	primary = servers.StartRedis(t, "--appendonly", "yes")
	return primary, addReplica(t, primary, 1, replicaArgs...)
}

// addReplica starts a replica of primary with the extra arguments, and
// waits until the primary lists n replicas online.
func addReplica(t *testing.T, primary *servers.Redis, n int, replicaArgs ...string) *servers.Redis {
	t.Helper()
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica := servers.StartRedis(t, append([]string{"--replicaof", host, port}, replicaArgs...)...)
	pr := redis.NewClient(&redis.Options{Addr: primary.Addr})
	defer pr.Close()
	for deadline := time.Now().Add(10 * time.Second); strings.Count(pr.Info(context.Background(), "replication").Val(), "state=online") < n; {
		if time.Now().After(deadline) {
			t.Fatal("replica never linked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return replica
}

func newLogged(t *testing.T, rdb redis.UniversalClient) (*Store, string, error) {
	t.Helper()
	var buf bytes.Buffer
	st, err := New(context.Background(), rdb, Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))})
	return st, buf.String(), err
}

// TestStartupChecksReplicas: the replicas a failover would promote are
// checked at start too, through the primary's list of its replicas (also
// behind a Sentinel): one whose maxmemory-policy evicts is refused, since
// once promoted it would evict live claims; one without AOF, or one that
// cannot be reached at the address it announces, is a warning.
func TestStartupChecksReplicas(t *testing.T) {
	t.Run("an evicting replica is refused", func(t *testing.T) {
		primary, replica := withReplica(t, "--appendonly", "yes", "--maxmemory-policy", "volatile-lru")
		rdb := redis.NewClient(&redis.Options{Addr: primary.Addr})
		defer rdb.Close()
		if _, _, err := newLogged(t, rdb); err == nil || !strings.Contains(err.Error(), "noeviction") || !strings.Contains(err.Error(), replica.Addr) {
			t.Fatalf("New = %v, want a refusal naming the replica %s", err, replica.Addr)
		}
	})
	t.Run("an evicting replica behind a Sentinel is refused", func(t *testing.T) {
		primary, replica := withReplica(t, "--appendonly", "yes", "--maxmemory-policy", "allkeys-lru")
		s := servers.StartSentinel(t, primary, "aov", 5*time.Second)
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		defer cancel()
		m := &RedisStore{Addresses: []string{s.Addr}, MasterName: "aov"}
		err := m.Provision(ctx)
		if err == nil || !strings.Contains(err.Error(), "noeviction") || !strings.Contains(err.Error(), replica.Addr) {
			t.Fatalf("Provision through the Sentinel = %v, want a refusal naming the replica %s", err, replica.Addr)
		}
	})
	t.Run("a replica without AOF is a warning", func(t *testing.T) {
		primary, replica := withReplica(t) // servers.StartRedis: appendonly no
		rdb := redis.NewClient(&redis.Options{Addr: primary.Addr})
		defer rdb.Close()
		_, log, err := newLogged(t, rdb)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(log, "level=WARN") || !strings.Contains(log, "appendonly") || !strings.Contains(log, replica.Addr) {
			t.Fatalf("log %q, want a warning about appendonly on %s", log, replica.Addr)
		}
		if strings.Contains(log, primary.Addr) {
			t.Errorf("log %q warns about the primary, which has AOF on", log)
		}
	})
	t.Run("an unreachable replica is a warning", func(t *testing.T) {
		dead := strconv.Itoa(servers.FreePort(t, false))
		primary, _ := withReplica(t, "--appendonly", "yes", "--replica-announce-port", dead)
		rdb := redis.NewClient(&redis.Options{Addr: primary.Addr})
		defer rdb.Close()
		_, log, err := newLogged(t, rdb)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(log, "level=WARN") || !strings.Contains(log, "127.0.0.1:"+dead) || !strings.Contains(log, "not checked") {
			t.Fatalf("log %q, want a warning that replica 127.0.0.1:%s was not checked", log, dead)
		}
	})
}

// TestStalledReplicasDoNotStopTheStart: a replica that accepts
// connections and never answers (a hung process, a half-dead VM) is a
// warning like an unreachable one, whatever the store's timeout and
// however many there are: the replicas are checked at once, within
// replicaCheckBound together, on top of the primary's own
// primaryCheckBound, so the store starts within the sum. (Before: every
// check shared one 5 s deadline and the replicas were asked one after
// the other, each for up to timeout; with timeout 5s one such replica,
// or with the default 1 s five of them, used it up, and the marker write
// on the healthy primary then failed: the config was refused.) A
// stalled primary still refuses the start, within the same bound.
func TestStalledReplicasDoNotStopTheStart(t *testing.T) {
	bound := primaryCheckBound + replicaCheckBound + 500*time.Millisecond // slack for a loaded machine
	// The primary lists each replica at the port it announces, where
	// stalledListener (a fault) accepts and never answers.
	stalledReplicas := func(t *testing.T, n int) (primary *servers.Redis, stalled []string) {
		primary = servers.StartRedis(t, "--appendonly", "yes")
		for i := range n {
			addr := stalledListener(t)
			_, port, _ := strings.Cut(addr, ":")
			addReplica(t, primary, i+1, "--appendonly", "yes", "--replica-announce-port", port)
			stalled = append(stalled, addr)
		}
		return primary, stalled
	}
	start := func(t *testing.T, addr string, timeout time.Duration) (*RedisStore, time.Duration, error) {
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		t.Cleanup(cancel)
		m := &RedisStore{Addresses: []string{addr}, Timeout: caddy.Duration(timeout)}
		begin := time.Now()
		err := m.Provision(ctx)
		return m, time.Since(begin), err
	}
	for _, c := range []struct {
		replicas int
		timeout  time.Duration
	}{{1, 0}, {1, 5 * time.Second}, {6, 0}, {6, 5 * time.Second}} {
		t.Run(fmt.Sprintf("%d stalled, timeout %v", c.replicas, c.timeout), func(t *testing.T) {
			primary, stalled := stalledReplicas(t, c.replicas)
			m, took, err := start(t, primary.Addr, c.timeout)
			t.Logf("Provision took %v", took.Round(10*time.Millisecond))
			if err != nil {
				t.Fatalf("Provision with a healthy primary and %d stalled replicas = %v; want a start with warnings", c.replicas, err)
			}
			defer m.Cleanup()
			if took > bound {
				t.Errorf("Provision took %v, want at most %v", took, bound)
			}
			// The same checks on the module's own client, logged: each
			// stalled replica is named as not checked.
			var buf bytes.Buffer
			if _, err := New(context.Background(), m.pooled.rdb, Options{Logger: slog.New(slog.NewTextHandler(&buf, nil))}); err != nil {
				t.Fatal(err)
			}
			for _, addr := range stalled {
				if !strings.Contains(buf.String(), "replica="+addr) || !strings.Contains(buf.String(), "not checked") {
					t.Errorf("log %q, want a warning that replica %s was not checked", buf.String(), addr)
				}
			}
		})
	}
	for _, timeout := range []time.Duration{0, 5 * time.Second} {
		t.Run(fmt.Sprintf("stalled primary, timeout %v", timeout), func(t *testing.T) {
			srv := servers.StartRedis(t, "--appendonly", "yes")
			srv.Pause()
			_, took, err := start(t, srv.Addr, timeout)
			t.Logf("Provision took %v: %v", took.Round(10*time.Millisecond), err)
			if err == nil {
				t.Fatal("Provision on a stalled primary succeeded")
			}
			if took > bound {
				t.Errorf("Provision on a stalled primary took %v, want at most %v", took, bound)
			}
		})
	}
}
