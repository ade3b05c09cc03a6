package store

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestDiscoveryListKeepsACorruptEntrysPlace: an entry whose meta or body
// is gone (removed here with a raw delete, the only way to cause it) still
// takes its place in the list, given back without an item for the
// facilitator to skip: the pages at offset 0 and 2 are the list once, in
// order, and a listing does not fail over one entry.
func TestDiscoveryListKeepsACorruptEntrysPlace(t *testing.T) {
	ctx := context.Background()
	for _, kind := range []byte{'m', 'b'} {
		t.Run(string(kind), func(t *testing.T) {
			db, _ := openTemp(t, Options{})
			d := db.Discovery(DiscoveryLimits{})
			for _, r := range []string{"r0", "r1", "r2", "r3"} {
				e := DiscoveryEntry{Resource: r, Type: "http", Item: json.RawMessage(`{"resource":"` + r + `"}`),
					Accepts: []DiscoveryAccept{{Scheme: "exact", Network: "n", Asset: "a", PayTo: "p", Raw: json.RawMessage(`{}`)}}}
				if err := d.Record(ctx, e); err != nil {
					t.Fatal(err)
				}
				time.Sleep(2 * time.Millisecond) // distinct last-seen times: r3 is listed first
			}
			if err := db.update(ctx, func(txn *tx) error { return txn.Delete(discoveryKey(kind, "r2")) }); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, off := range []int{0, 2} {
				p, err := d.List(ctx, DiscoveryQuery{Offset: off, Limit: 2})
				if err != nil {
					t.Fatalf("List at %d: %v", off, err)
				}
				if p.Total != 4 || len(p.Entries) != 2 {
					t.Fatalf("List at %d: total %d, %d entries; want 4 and 2", off, p.Total, len(p.Entries))
				}
				for _, e := range p.Entries {
					if e.Resource == "r2" && e.Item != nil {
						t.Errorf("the corrupt entry came back with an item: %s", e.Item)
					}
					got = append(got, e.Resource)
				}
			}
			if strings.Join(got, ",") != "r3,r2,r1,r0" {
				t.Fatalf("pages at 0 and 2 list %v; want r3,r2,r1,r0", got)
			}
		})
	}
}
