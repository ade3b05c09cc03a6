package redisstore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store/storetest"
)

// BenchmarkRedisGateway runs the gateway benchmarks of store/storetest on
// a local Redis (AOF with fsync every second, the recommended setting),
// with and without WAIT for one replica. The Badger baseline is
// BenchmarkBadgerGateway in package store.
func BenchmarkRedisGateway(b *testing.B) {
	ctx := context.Background()
	primary := servers.StartRedis(b, "--appendonly", "yes", "--appendfsync", "everysec")
	rdb := redis.NewClient(&redis.Options{Addr: primary.Addr, PoolSize: 128})
	defer rdb.Close()
	b.Run("standalone", func(b *testing.B) {
		s, err := New(ctx, rdb, Options{Prefix: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		storetest.BenchmarkGateway(b, storetest.Gateway{Allowance: s.Allowance(), Claims: s.Claims()})
	})
	b.Run("wait1", func(b *testing.B) {
		host, port, _ := strings.Cut(primary.Addr, ":")
		replica := servers.StartRedis(b, "--replicaof", host, port)
		rr := redis.NewClient(&redis.Options{Addr: replica.Addr})
		defer rr.Close()
		for deadline := time.Now().Add(10 * time.Second); ; {
			if info := rr.Info(ctx, "replication").Val(); strings.Contains(info, "master_link_status:up") {
				break
			}
			if time.Now().After(deadline) {
				b.Fatal("replica never linked")
			}
			time.Sleep(20 * time.Millisecond)
		}
		s, err := New(ctx, rdb, Options{Prefix: "benchw", WaitReplicas: 1, WaitTimeout: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		storetest.BenchmarkGateway(b, storetest.Gateway{Allowance: s.Allowance(), Claims: s.Claims()})
	})
}
