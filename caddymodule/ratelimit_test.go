package caddymodule

import (
	"context"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// refusalZone is a refusal budget of events per window, named after the
// test so that no other test shares it, and dropped when the test ends.
func refusalZone(t testing.TB, events int, window time.Duration) *rateZone {
	t.Helper()
	z, key, err := loadZone(&RateLimit{Events: events, Window: caddy.Duration(window), Zone: t.Name()}, zoneRefusals)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rateZones.Delete(key) })
	return z
}
func TestClientAddrIsTheResolvedIPAndAnIPv6Slash64(t *testing.T) {
	for _, tc := range []struct{ desc, ip, want string }{
		{"an IPv4 client is its address", "203.0.113.7", "203.0.113.7"},
		{"an IPv6 client is its /64", "2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"},
		{"two addresses of one /64 are one client", "2001:db8:1:2:ffff::9", "2001:db8:1:2::/64"},
		{"an IPv4-mapped IPv6 address is the IPv4 client", "::ffff:203.0.113.7", "203.0.113.7"},
		{"an uncompressed IPv6 address is its canonical /64", "2001:0db8:0001:0002:0000:0000:0000:0001", "2001:db8:1:2::/64"},
		{"an address with a zone is kept as it is", "fe80::1%eth0", "fe80::1%eth0"},
		{"what is not an address is kept as it is", "not-an-ip", "not-an-ip"},
		{"without a resolved client IP, the peer's address without its port", "", "192.0.2.1"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", nil)
			r.RemoteAddr = "192.0.2.1:1234" // the peer: not the client when Caddy resolved one
			r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: tc.ip}))
			if got := clientAddr(r); got != tc.want {
				t.Errorf("clientAddr = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestClientPrefixIsTheClientsWiderNetwork(t *testing.T) {
	for _, tc := range []struct{ desc, client, want string }{
		{"an IPv6 client (a /64) is in its /48", "2001:db8:1:2::/64", "2001:db8:1::/48"},
		{"an IPv4 client is in its /24", "203.0.113.7", "203.0.113.0/24"},
		{"an IPv4-mapped address is in its IPv4 /24", "::ffff:203.0.113.7", "203.0.113.0/24"},
		{"an address with a zone is in the /48 of the address", "fe80::1%eth0", "fe80::/48"},
		{"what is not an address is its own prefix", "not-an-ip", "not-an-ip"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			if got := clientPrefix(tc.client); got != tc.want {
				t.Errorf("clientPrefix(%q) = %q, want %q", tc.client, got, tc.want)
			}
		})
	}
}

func TestRateZoneTightensWhenItsTableIsFull(t *testing.T) {
	z := refusalZone(t, 2, time.Minute)
	for i := range maxRateClients {
		z.note(fmt.Sprintf("2001:db8:0:%x::/64", i))
	}
	// A new client finds the table full (no bucket has refilled): it shares
	// the budget of its /48 with the other newcomers of it instead of going
	// unlimited; newcomers from elsewhere have budgets of their own.
	z.note("2001:db8:7:1::/64")
	z.note("2001:db8:7:2::/64")
	if z.wait("2001:db8:7:3::/64", false) == 0 {
		t.Fatal("a newcomer past the table's size is not limited by its prefix")
	}
	if z.wait("198.51.100.7", false) != 0 || z.wait("2001:db8:1:1::/64", false) != 0 {
		t.Error("a newcomer from another prefix is limited")
	}
	if z.wait("2001:db8:0:1::/64", false) != 0 {
		t.Error("a tracked client with budget left is limited")
	}
}

func TestRateZoneCreditIsBoundedByTheBudget(t *testing.T) {
	z := refusalZone(t, 2, time.Minute)
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now = func() time.Time { return t0 }
	t.Cleanup(func() { now = time.Now })
	z.credit("unknown") // no budget yet: nothing to give back, nothing created
	if tracks(z, &z.clients, "unknown") || tracks(z, &z.prefixes, "unknown") {
		t.Fatal("a credit created a budget")
	}
	z.note("c")
	z.note("c")
	if z.wait("c", false) == 0 {
		t.Fatal("two refusals of two did not limit")
	}
	z.credit("c")
	if z.wait("c", false) != 0 {
		t.Fatal("a credit did not give one refusal back")
	}
	// A full budget takes no more credit: three credits, then two
	// refusals, limit again.
	z.credit("c")
	z.credit("c")
	z.credit("c")
	z.note("c")
	z.note("c")
	if z.wait("c", false) == 0 {
		t.Fatal("credits were saved up beyond the budget")
	}
}
