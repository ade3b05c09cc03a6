package caddymodule

import (
	"testing"

	"github.com/aovhq/aov/x402"
)

// registryGate is a provisioned gate as the registry sees it: route, MCP
// tool, public_base_url (as checked) and one offer paying payTo.
func registryGate(route, tool, base, payTo string) *Gate {
	return &Gate{Route: route, MCPTool: tool, base: base, Description: route + " " + tool + " " + base,
		bazaar: map[string]any{"info": map[string]any{}},
		offers: []x402.PaymentRequirements{{Scheme: "exact", Network: "eip155:8453", Asset: "0xa", PayTo: payTo, Amount: "10000"}}}
}

// The facilitator's registry holds every live gate, not one per route: the
// MCP tools of one endpoint (one x402 per priced tool, all named "POST
// /mcp") and the same route on several sites are each listed as their own
// gate describes them, or not at all when the origin cannot tell which.
func TestDiscoveryRegistryListsEachGateOfARoute(t *testing.T) {
	t.Run("every tool of one endpoint", func(t *testing.T) {
		reg := &registry{gates: map[*Gate]uint64{}}
		reg.add(registryGate("POST /mcp", "alpha", "", "0x1"))
		reg.add(registryGate("POST /mcp", "beta", "", "0x2"))
		for _, tool := range []string{"alpha", "beta"} {
			if l, ok := reg.listing("https://a.example", "/mcp", tool); !ok || l.Ambiguous || l.Tool != tool {
				t.Errorf("tool %s: listing = %+v, %v; want its own gate's", tool, l, ok)
			}
		}
		if _, ok := reg.listing("https://a.example", "/mcp", "gamma"); ok {
			t.Errorf("a tool no gate prices is listed as the operator's")
		}
	})
	t.Run("the same route on two sites with public_base_url", func(t *testing.T) {
		reg := &registry{gates: map[*Gate]uint64{}}
		reg.add(registryGate("GET /thing/{id}", "", "https://a.example", "0xa"))
		reg.add(registryGate("GET /thing/{id}", "", "https://b.example", "0xb"))
		for origin, pay := range map[string]string{"https://a.example": "0xa", "https://b.example": "0xb"} {
			l, ok := reg.listing(origin, "/thing/1", "")
			if !ok || l.Ambiguous || l.Resource != origin+"/thing/:id" || l.Accepts[0].PayTo != pay {
				t.Errorf("origin %s: listing = %+v, %v; want its own site's gate, paying %s", origin, l, ok, pay)
			}
		}
	})
	t.Run("the same route on two sites without public_base_url", func(t *testing.T) {
		reg := &registry{gates: map[*Gate]uint64{}}
		reg.add(registryGate("GET /thing/{id}", "", "", "0xa"))
		reg.add(registryGate("GET /thing/{id}", "", "", "0xb"))
		if l, ok := reg.listing("https://a.example", "/thing/1", ""); !ok || !l.Ambiguous {
			t.Errorf("listing = %+v, %v; want the operator's, but not which site's", l, ok)
		}
	})
	t.Run("a reload: the new gate, once the old is gone", func(t *testing.T) {
		reg := &registry{gates: map[*Gate]uint64{}}
		old := registryGate("GET /thing/{id}", "", "", "0xold")
		reg.add(old)
		reg.add(registryGate("GET /thing/{id}", "", "", "0xnew"))
		reg.remove(old)
		if l, ok := reg.listing("https://a.example", "/thing/1", ""); !ok || l.Ambiguous || l.Accepts[0].PayTo != "0xnew" {
			t.Errorf("listing = %+v, %v; want the new gate's", l, ok)
		}
	})
	t.Run("two configs' gates that agree", func(t *testing.T) {
		reg := &registry{gates: map[*Gate]uint64{}}
		reg.add(registryGate("GET /thing/{id}", "", "", "0xa"))
		reg.add(registryGate("GET /thing/{id}", "", "", "0xa"))
		if l, ok := reg.listing("https://a.example", "/thing/1", ""); !ok || l.Ambiguous {
			t.Errorf("listing = %+v, %v; want the one description", l, ok)
		}
	})
}

// routeMatches decides as Caddy's path matcher does which URLs are a
// route's: the decoded path, in any letter case, cleaned of dot segments
// and doubled slashes, a trailing slash the same route; a {name} is one
// non-empty segment. An encoded slash is inside its segment: /thing/a%2Fb
// is one id, as the gate of route /thing/* answers it. A URL is the
// route's when either reading makes it so: split then decoded (an encoded
// slash inside an id) or decoded then cleaned, as Caddy's matcher reads
// /other/..%2Fthing%2Fb as /thing/b. (Before: the path was decoded before
// it was split, so %2F was a segment boundary and /thing/a%2Fb was not the
// route's; then it was split before it was decoded, and
// /other/..%2Fthing%2Fb was not.)
func TestDiscoveryRouteMatchesAsCaddysPathMatcher(t *testing.T) {
	for _, c := range []struct {
		route, path string
		want        bool
	}{
		{"/thing/{id}", "/thing/b", true},
		{"/thing/{id}", "/THING/b", true},
		{"/thing/{id}", "/%74hing/c", true},
		{"/thing/{id}", "/%54HING/c", true},
		{"/thing/{id}", "/thing/d/", true},
		{"/thing/{id}", "//thing//d", true},
		{"/thing/{id}", "/other/../thing/d", true},
		{"/Thing/{id}", "/thing/:id", true},
		{"/thing/{id}", "/thing/", false},
		{"/thing/{id}", "/thing", false},
		{"/thing/{id}", "/thing/a/b", false},
		{"/thing/{id}", "/things/a", false},
		{"/thing/{id}", "/thing/%zz", false},
		{"/thing/{id}", "/thing/a%2Fb", true},
		{"/thing/{id}", "/THING/a%2fb", true},
		{"/thing/{id}", "/thing/a%2F", true},
		{"/thing/{id}/x", "/thing/a%2Fx", true}, // decoded: /thing/a/x, as Caddy's matcher reads it
		{"/thing/{id}/x", "/thing/a%2Fy", false},
		{"/thing/{id}", "/other/%2e%2e/thing/d", true},
		{"/thing/{id}", "/other/..%2Fthing%2Fb", true},
		{"/thing/{id}", "/other%2F..%2Fthing/b", true},
		{"/thing/{id}", "/x/..%2F..%2Fthing/b", true},
		{"/thing/{id}", "/other/..%2Fthings%2Fb", false},
		{"/", "/", true},
		{"/mcp", "/MCP", true},
	} {
		if got := routeMatches(c.route, c.path); got != c.want {
			t.Errorf("routeMatches(%q, %q) = %v; want %v", c.route, c.path, got, c.want)
		}
	}
}
