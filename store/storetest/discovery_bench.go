package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/aovhq/aov/store"
)

// BenchmarkDiscovery measures the discovery list on d (which must be empty,
// with the default limits): recording a known resource (what every
// settlement of a listed route costs), recording new resources on a full
// list (each evicts), and listing the first page of 100 of a full list,
// one caller each. An entry has a 2 KiB item, the size of a route's bazaar
// extension. The unfiltered list reads only its page; a filtered one reads
// every entry's identity.
func BenchmarkDiscovery(b *testing.B, d store.Discovery) {
	ctx := context.Background()
	item := json.RawMessage(`{"pad":"` + strings.Repeat("x", 2<<10) + `"}`)
	mk := func(r string) store.DiscoveryEntry { return discEntry(r, "http", string(item)) }
	for i := range store.DefaultDiscoveryEntries {
		if err := d.Record(ctx, mk(fmt.Sprintf("https://a.example/r/%d", i))); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("record_known", func(b *testing.B) {
		parallel(b, 1, func(int) error { return d.Record(ctx, mk("https://a.example/r/7")) })
	})
	b.Run("record_new_evicting", func(b *testing.B) {
		parallel(b, 1, func(i int) error { return d.Record(ctx, mk(fmt.Sprintf("https://b.example/%d/%d", b.N, i))) })
	})
	for name, q := range map[string]store.DiscoveryQuery{
		"list_page_100_of_1000":            {Limit: 100},
		"list_page_100_of_1000_by_network": {Limit: 100, Network: "eip155:1337", Type: "http"},
	} {
		b.Run(name, func(b *testing.B) {
			parallel(b, 1, func(int) error {
				p, err := d.List(ctx, q)
				if err == nil && (len(p.Entries) != 100 || p.Total != store.DefaultDiscoveryEntries) {
					err = fmt.Errorf("page of %d of %d", len(p.Entries), p.Total)
				}
				return err
			})
		})
	}
}
