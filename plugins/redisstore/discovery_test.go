package redisstore

import (
	"context"
	"fmt"
	"slices"
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

func TestDiscoveryTrustStandalone(t *testing.T) {
	_, rdb := standalone(t)
	storetest.TestDiscoveryTrust(t, discoveryBackend(rdb))
}

func TestDiscoveryTrustCluster(t *testing.T) {
	storetest.TestDiscoveryTrust(t, discoveryBackend(cluster(t)))
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

// TestDiscoveryRecordIsSafeToRunTwice: the record script run again with the
// same arguments (go-redis resends after a dropped connection) leaves one
// entry with one way to pay.
func TestDiscoveryRecordIsSafeToRunTwice(t *testing.T) {
	ctx := context.Background()
	_, rdb := standalone(t)
	s, err := New(ctx, rdb, Options{Prefix: "twiced"})
	if err != nil {
		t.Fatal(err)
	}
	d := s.Discovery(store.DiscoveryLimits{}).(discovery)
	for _, replace := range []string{"0", "1"} {
		res := "https://a.example/x" + replace
		args := []any{10, 60000, store.MaxDiscoveryAccepts, res, "http", "bazaar", `{}`, 0, replace, "exact\x00n\x00a\x00p", `{"amount":"1"}`}
		for range 2 {
			if _, err := d.s.write(ctx, discoveryRecordScript, d.keys, args...); err != nil {
				t.Fatal(err)
			}
		}
		p, err := d.List(ctx, store.DiscoveryQuery{Limit: 10})
		if err != nil {
			t.Fatal(err)
		}
		// Entries come newest first, and the two may share a millisecond:
		// find this one by its resource.
		i := slices.IndexFunc(p.Entries, func(e store.DiscoveryEntry) bool { return e.Resource == res })
		if i < 0 || len(p.Entries[i].Accepts) != 1 || string(p.Entries[i].Accepts[0].Raw) != `{"amount":"1"}` {
			t.Fatalf("after running the record (replace %s) twice: %+v", replace, p)
		}
	}
}

// TestDiscoveryListKeepsACorruptEntrysPlace: an entry whose way to pay
// lost its identity (its hash field deleted by hand) does not fail the
// listing: it is given back in its place with no item, for the reader to
// skip, and the other entries are listed.
func TestDiscoveryListKeepsACorruptEntrysPlace(t *testing.T) {
	ctx := context.Background()
	_, rdb := standalone(t)
	s, err := New(ctx, rdb, Options{Prefix: "corrupt"})
	if err != nil {
		t.Fatal(err)
	}
	d := s.Discovery(store.DiscoveryLimits{}).(discovery)
	for _, r := range []string{"r0", "r1"} {
		e := store.DiscoveryEntry{Resource: r, Type: "http", Item: []byte(`{"resource":"` + r + `"}`),
			Accepts: []store.DiscoveryAccept{{Scheme: "exact", Network: "n", Asset: "a", PayTo: "p", Raw: []byte(`{}`)}}}
		if err := d.Record(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.HDel(ctx, d.keys[1], "r0\x00k1").Err(); err != nil {
		t.Fatal(err)
	}
	p, err := d.List(ctx, store.DiscoveryQuery{Limit: 10})
	if err != nil || p.Total != 2 || len(p.Entries) != 2 {
		t.Fatalf("List = %+v, %v; want both entries' places", p, err)
	}
	for _, e := range p.Entries {
		if corrupt := e.Item == nil; corrupt != (e.Resource == "r0") {
			t.Errorf("entry %s: item %s; want none for r0 only", e.Resource, e.Item)
		}
	}
}
