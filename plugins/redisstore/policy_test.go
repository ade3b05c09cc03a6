package redisstore

import (
	"bytes"
	"context"
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
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica = servers.StartRedis(t, append([]string{"--replicaof", host, port}, replicaArgs...)...)
	pr := redis.NewClient(&redis.Options{Addr: primary.Addr})
	defer pr.Close()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(pr.Info(context.Background(), "replication").Val(), "state=online"); {
		if time.Now().After(deadline) {
			t.Fatal("replica never linked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return primary, replica
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
