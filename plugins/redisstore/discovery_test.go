package redisstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

func discoveryBackend(rdb redis.UniversalClient) storetest.NewDiscovery {
	return func(t *testing.T, l store.DiscoveryLimits) store.Discovery {
		s, err := New(context.Background(), rdb, Options{Prefix: fmt.Sprintf("t%d", prefixes.Add(1))})
		if err != nil {
			t.Fatal(err)
		}
		return s.Discovery(l)
	}
}

func TestDiscoveryContractStandalone(t *testing.T) {
	_, rdb := standalone(t)
	storetest.TestDiscovery(t, discoveryBackend(rdb))
}

func TestDiscoveryContractCluster(t *testing.T) {
	storetest.TestDiscovery(t, discoveryBackend(cluster(t)))
}

// BenchmarkRedisDiscovery runs the discovery benchmarks of store/storetest
// on a local Redis (AOF with fsync every second); the Badger baseline is
// BenchmarkBadgerDiscovery in package store.
func BenchmarkRedisDiscovery(b *testing.B) {
	srv := servers.StartRedis(b, "--appendonly", "yes", "--appendfsync", "everysec")
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rdb.Close()
	s, err := New(context.Background(), rdb, Options{Prefix: "benchd"})
	if err != nil {
		b.Fatal(err)
	}
	storetest.BenchmarkDiscovery(b, s.Discovery(store.DiscoveryLimits{}))
}
