package x402

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

func catalogPayload(u string, bazaar map[string]any) PaymentPayload {
	p := PaymentPayload{X402Version: 2, Resource: &Resource{URL: u}}
	if bazaar != nil {
		p.Extensions = map[string]any{"bazaar": bazaar}
	}
	return p
}

var catalogReq = PaymentRequirements{Scheme: SchemeExact, Network: NetworkDevnet, Amount: "10000", Asset: "0x1", PayTo: "0x2"}

// TestDiscoveryCatalogBoundsAndRefuses: the list never grows past its
// bound (the resource paid for longest ago goes), lists only absolute
// http(s) or mcp URLs, and takes a routeTemplate only when it is a plain
// path.
func TestDiscoveryCatalogBoundsAndRefuses(t *testing.T) {
	c := &discoveryCatalog{max: 3}
	t0 := time.Unix(1_800_000_000, 0)
	for i := range 5 {
		c.record(catalogPayload(fmt.Sprintf("https://a.example/r/%d", i), nil), catalogReq, t0.Add(time.Duration(i)*time.Second))
	}
	for _, u := range []string{"", "/relative", "javascript:alert(1)", "ftp://a.example/x", "https://"} {
		c.record(catalogPayload(u, nil), catalogReq, t0.Add(time.Hour))
	}
	c.record(PaymentPayload{X402Version: 2}, catalogReq, t0.Add(time.Hour))
	list, err := c.list(url.Values{})
	if err != nil {
		t.Fatal(err)
	}
	if list.Pagination.Total != 3 || list.Items[0].Resource != "https://a.example/r/4" || list.Items[2].Resource != "https://a.example/r/2" {
		t.Fatalf("list %+v, want r/4, r/3, r/2", list)
	}

	for tmpl, want := range map[string]string{
		"/score/:agent_id":     "https://b.example/score/:agent_id",
		"//evil.example/x":     "https://b.example/score/a",
		"/x/../admin":          "https://b.example/score/a",
		"https://evil.example": "https://b.example/score/a",
	} {
		c := &discoveryCatalog{max: 3}
		c.record(catalogPayload("https://b.example/score/a", map[string]any{"routeTemplate": tmpl}), catalogReq, t0)
		if l, _ := c.list(url.Values{}); len(l.Items) != 1 || l.Items[0].Resource != want {
			t.Errorf("routeTemplate %q: %+v, want %s", tmpl, l.Items, want)
		}
	}

	t.Run("the same resource paid again is one item with its ways to pay merged", func(t *testing.T) {
		c := &discoveryCatalog{max: 3}
		other := catalogReq
		other.Network = NetworkBase
		c.record(catalogPayload("https://a.example/x", nil), catalogReq, t0)
		c.record(catalogPayload("https://a.example/x", nil), catalogReq, t0.Add(time.Second))
		c.record(catalogPayload("https://a.example/x", nil), other, t0.Add(2*time.Second))
		l, _ := c.list(url.Values{})
		if len(l.Items) != 1 || len(l.Items[0].Accepts) != 2 {
			t.Fatalf("%+v", l.Items)
		}
	})
}

// FuzzDiscoveryQuery: any query string is a page within bounds or a 400,
// never a panic.
func FuzzDiscoveryQuery(f *testing.F) {
	for _, s := range []string{"", "limit=1&offset=1", "limit=0", "offset=-1", "type=mcp&payTo=0x2", "limit=1&limit=2", "limit=%zz"} {
		f.Add(s)
	}
	c := &discoveryCatalog{max: 4}
	for i := range 4 {
		c.record(catalogPayload(fmt.Sprintf("https://a.example/%d", i), nil), catalogReq, time.Unix(int64(i), 0))
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := url.ParseQuery(s)
		if err != nil {
			return
		}
		l, e := c.list(q)
		if e != nil {
			if e.Status != 400 {
				t.Fatalf("%q: %+v", s, e)
			}
			return
		}
		if l.Pagination.Limit < 1 || l.Pagination.Limit > MaxDiscoveryLimit || len(l.Items) > l.Pagination.Limit || l.Pagination.Total > 4 {
			t.Fatalf("%q: %+v", s, l.Pagination)
		}
	})
}

// BenchmarkDiscoveryRecord is the cost a verify or settle pays for the
// list: a known resource (the steady state) against a full list that
// evicts on every new one.
func BenchmarkDiscoveryRecord(b *testing.B) {
	p := catalogPayload("https://a.example/score/a", map[string]any{"routeTemplate": "/score/:agent_id"})
	b.Run("known", func(b *testing.B) {
		c := &discoveryCatalog{max: MaxDiscoveryResources}
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			c.record(p, catalogReq, time.Unix(int64(i), 0))
		}
	})
	b.Run("new_evicting", func(b *testing.B) {
		c := &discoveryCatalog{max: MaxDiscoveryResources}
		urls := make([]string, 4096)
		for i := range urls {
			urls[i] = fmt.Sprintf("https://a.example/r/%d", i)
		}
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			c.record(catalogPayload(urls[i%len(urls)], nil), catalogReq, time.Unix(int64(i), 0))
		}
	})
}

// TestDiscoveryCatalogBoundsEntrySize: a request may be 1 MiB; an entry
// keeps neither an oversized way to pay nor an oversized extension.
func TestDiscoveryCatalogBoundsEntrySize(t *testing.T) {
	c := &discoveryCatalog{max: 3}
	big := catalogReq
	big.Extra = map[string]any{"pad": strings.Repeat("x", 8<<10)}
	c.record(catalogPayload("https://a.example/big", nil), big, time.Unix(1, 0))
	c.record(catalogPayload("https://a.example/ext", map[string]any{"info": strings.Repeat("x", 64<<10)}), catalogReq, time.Unix(2, 0))
	l, _ := c.list(url.Values{})
	if len(l.Items) != 1 || l.Items[0].Resource != "https://a.example/ext" || l.Items[0].Extensions != nil {
		t.Fatalf("%+v", l.Items)
	}
}
