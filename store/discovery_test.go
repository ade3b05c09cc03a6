package store_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/storetest"
)

func badgerDiscovery(t *testing.T, l store.DiscoveryLimits) store.Discovery {
	db, err := store.Open(filepath.Join(t.TempDir(), "db"), store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db.Discovery(l)
}

func TestBadgerDiscoveryContract(t *testing.T) { storetest.TestDiscovery(t, badgerDiscovery) }

func TestBadgerDiscoveryTrust(t *testing.T) { storetest.TestDiscoveryTrust(t, badgerDiscovery) }

// TestDiscoverySurvivesReopen: the list is on disk, not in the process.
func TestDiscoverySurvivesReopen(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "db")
	db, err := store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e := store.DiscoveryEntry{Resource: "https://a.example/x", Type: "http", Item: json.RawMessage(`{"description":"x"}`),
		Accepts: []store.DiscoveryAccept{{Scheme: "exact", Network: "eip155:1337", Raw: json.RawMessage(`{"scheme":"exact"}`)}}}
	if err := db.Discovery(store.DiscoveryLimits{}).Record(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db, err = store.Open(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p, err := db.Discovery(store.DiscoveryLimits{}).List(ctx, store.DiscoveryQuery{Limit: 10})
	if err != nil || p.Total != 1 || p.Entries[0].Resource != e.Resource || string(p.Entries[0].Item) != string(e.Item) {
		t.Fatalf("after reopening: %+v, %v; want the recorded entry", p, err)
	}
}

// BenchmarkBadgerDiscovery is the embedded baseline of
// BenchmarkRedisDiscovery (plugins/redisstore), with fsync.
func BenchmarkBadgerDiscovery(b *testing.B) {
	db, err := store.Open(filepath.Join(b.TempDir(), "db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	storetest.BenchmarkDiscovery(b, db.Discovery(store.DiscoveryLimits{}))
}
