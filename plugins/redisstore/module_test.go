package redisstore

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/store"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, c := range []struct {
		desc, in string
		want     RedisStore
		err      string
	}{
		{"addresses as arguments", `redis 10.0.0.1:6379 10.0.0.2:6379`,
			RedisStore{Addresses: []string{"10.0.0.1:6379", "10.0.0.2:6379"}}, ""},
		{"every option", `redis {
			address 10.0.0.1:26379 10.0.0.2:26379
			master_name mymaster
			username gw
			password {env.REDIS_PASSWORD}
			sentinel_password s
			db 2
			prefix shop
			wait_replicas 1
			wait_timeout 50ms
			timeout 2s
			dial_timeout 500ms
		}`, RedisStore{Addresses: []string{"10.0.0.1:26379", "10.0.0.2:26379"}, MasterName: "mymaster", Username: "gw",
			Password: "{env.REDIS_PASSWORD}", SentinelPassword: "s", DB: 2, Prefix: "shop", WaitReplicas: 1,
			WaitTimeout: caddy.Duration(50 * time.Millisecond), Timeout: caddy.Duration(2 * time.Second),
			DialTimeout: caddy.Duration(500 * time.Millisecond)}, ""},
		{"cluster with one address", "redis 10.0.0.1:7000 {\n cluster\n}", RedisStore{Addresses: []string{"10.0.0.1:7000"}, Cluster: true}, ""},
		{"an unknown option", "redis {\n pool 3\n}", RedisStore{}, "unknown redis store option"},
		{"a negative wait", "redis {\n wait_replicas -1\n}", RedisStore{}, "non-negative"},
		{"a bad duration", "redis {\n wait_timeout soon\n}", RedisStore{}, "bad duration"},
		{"a missing value", "redis {\n prefix\n}", RedisStore{}, "argument"},
		{"an option given twice", "redis {\n prefix a\n prefix b\n}", RedisStore{}, "prefix given twice"},
		{"addresses given twice", "redis 10.0.0.1:6379 {\n address 10.0.0.2:6379\n address 10.0.0.3:6379\n}",
			RedisStore{Addresses: []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}}, ""},
	} {
		var got RedisStore
		err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(c.in))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want an error with %q", c.desc, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.desc, err)
			continue
		}
		if strings.Join(got.Addresses, ",") != strings.Join(c.want.Addresses, ",") {
			t.Errorf("%s: addresses %v, want %v", c.desc, got.Addresses, c.want.Addresses)
		}
		got.Addresses, c.want.Addresses = nil, nil
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.desc, got, c.want)
		}
	}
}

// A setting go-redis would read as another kind of server is refused at
// Provision, before any dial: master_name with cluster (a failover Cluster
// client) and a db on a Cluster (dropped: configs told apart only by db
// would share every key). (Before: both loaded.)
func TestProvisionRefusesMixedServerModes(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	for _, c := range []struct {
		desc string
		s    RedisStore
		want string
	}{
		{"master_name with cluster", RedisStore{Addresses: []string{"127.0.0.1:1"}, MasterName: "m", Cluster: true}, "cannot be used together"},
		{"db on a cluster node", RedisStore{Addresses: []string{"127.0.0.1:1"}, Cluster: true, DB: 2}, "database 0 only"},
		{"db on several addresses", RedisStore{Addresses: []string{"127.0.0.1:1", "127.0.0.1:2"}, DB: 1}, "database 0 only"},
		{"a negative db (JSON; go-redis would select database 0)", RedisStore{Addresses: []string{"127.0.0.1:1"}, DB: -1}, "non-negative"},
	} {
		if err := c.s.Provision(ctx); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Provision = %v, want an error with %q", c.desc, err, c.want)
		}
	}
	clients.Range(func(key, _ any) bool {
		t.Errorf("a refused provision left client %v in the pool", key)
		return true
	})
}

// TestClientSurvivesReload provisions the module twice on one server, as a
// config reload does (new config first, then the old one cleaned up): both
// share one client, the old config's cleanup leaves it open, the last one
// closes it.
func TestClientSurvivesReload(t *testing.T) {
	srv, _ := standalone(t)
	provision := func() *RedisStore {
		t.Helper()
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		t.Cleanup(cancel)
		s := &RedisStore{Addresses: []string{srv.Addr}, Prefix: "reload"}
		if err := s.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return s
	}
	old := provision()
	next := provision()
	if old.pooled != next.pooled {
		t.Fatal("a reload opened a second client")
	}
	ctx := context.Background()
	if _, err := old.Claims().Claim(ctx, []string{"k"}, time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	// A client the old config's Store kept for a node an ASK named is its
	// own: its cleanup closes it.
	ask, done, err := old.store.asks.get(old.pooled.rdb.(*redis.Client), srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	done()
	if err := old.Cleanup(); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, ask)
	if _, err := next.Claims().Claim(ctx, []string{"k"}, time.Now().Add(time.Minute)); !errors.Is(err, store.ErrClaimed) {
		t.Fatalf("after the old config's cleanup the new one sees %v, want the claim the old one made", err)
	}
	if err := next.Cleanup(); err != nil {
		t.Fatal(err)
	}
	// The client is closed in the background once no commit or release is
	// being retried (Store.AfterRetries): none is, so it closes at once.
	waitClosed(t, next.pooled.rdb)
}

// waitClosed fails t unless c is closed within a second.
func waitClosed(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	for deadline := time.Now().Add(time.Second); ; time.Sleep(time.Millisecond) {
		err := c.Ping(context.Background()).Err()
		if errors.Is(err, redis.ErrClosed) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a second after the cleanup the client answers %v, want ErrClosed", err)
		}
	}
}

func TestProvisionRefusesAnEvictingServer(t *testing.T) {
	srv, _ := standalone(t, "--maxmemory-policy", "volatile-lru")
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	s := &RedisStore{Addresses: []string{srv.Addr}}
	if err := s.Provision(ctx); err == nil || !strings.Contains(err.Error(), "noeviction") {
		t.Fatalf("Provision = %v, want a refusal", err)
	}
	clients.Range(func(key, _ any) bool {
		t.Errorf("a refused provision left client %v in the pool", key)
		return true
	})
}
