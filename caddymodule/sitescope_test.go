package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// The discovery documents (/.well-known/x402, /llms.txt, /openapi.json)
// describe the site that answers them: a Caddy process serving several
// sites must not publish one site's paid routes, pay-to addresses and
// prices on another's origin.

// siteGet GETs path from the Caddy at base as addressed to host, and fails
// the test unless it answers 200.
func siteGet(t *testing.T, base, host, path string) []byte {
	t.Helper()
	resp := getWith(t, base+path, host, nil)
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s%s: %d %s", host, path, resp.StatusCode, b)
	}
	return b
}

// siteManifest is /.well-known/x402 as host's site serves it.
func siteManifest(t *testing.T, base, host string) discoveryDoc {
	t.Helper()
	var doc discoveryDoc
	if err := json.Unmarshal(siteGet(t, base, host, "/.well-known/x402"), &doc); err != nil {
		t.Fatalf("%s/.well-known/x402: %v", host, err)
	}
	return doc
}

// paidSiteGate is a gate for route ("GET /path") at price paying to pay.
func paidSiteGate(fac, price, pay, route, desc string) string {
	return fmt.Sprintf(`x402 {
			accept devnet %s %s
			description %q
			route %q
			facilitator http {
				url %s
			}
			store badger {data}/gate
		}`, price, pay, desc, route, fac)
}

// Two sites on one port (one Caddy server, routes told apart by their host
// matchers): the public site's documents list its route and nothing of the
// internal site, which has no discovery of its own.
func TestDiscoveryListsOnlyTheAnsweringSitesRoutes(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	internalPayTo := "0x90F79bf6EB2c4f870365E785982E1f101E93b906"
	base := startCaddy(t, fmt.Sprintf(`http://public.test:{port} {
	route /pub {
		%[2]s
		reverse_proxy %[1]s
	}
	x402_discovery /.well-known/x402
	aov_docs
}
http://internal.test:{port} {
	route /internal-admin/* {
		%[3]s
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"),
		paidSiteGate(fac, "$0.02", payTo.Hex(), "GET /pub", "public"),
		paidSiteGate(fac, "$5", internalPayTo, "GET /internal-admin/export", "INTERNAL: bulk export of customer records")))

	for _, p := range []string{"/.well-known/x402", "/llms.txt", "/openapi.json"} {
		body := string(siteGet(t, base, "public.test", p))
		if !strings.Contains(body, "/pub") {
			t.Errorf("public.test%s does not list its own route:\n%s", p, body)
		}
		for _, leak := range []string{"internal-admin", "bulk export of customer records", internalPayTo} {
			if strings.Contains(strings.ToLower(body), strings.ToLower(leak)) {
				t.Errorf("public.test%s publishes the internal site's %q", p, leak)
			}
		}
	}
}

// Two sites on one port name the same route at different prices and pay-to
// addresses: each site's documents give its own.
func TestDiscoverySameRouteOnTwoSitesShowsEachSitesPrice(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	otherPayTo := "0x90F79bf6EB2c4f870365E785982E1f101E93b906"
	site := func(host, price, pay string) string {
		return fmt.Sprintf(`http://%s:{port} {
	route /pub {
		%s
		reverse_proxy %s
	}
	x402_discovery /.well-known/x402
	aov_docs
}
`, host, paidSiteGate(fac, price, pay, "GET /pub", host), strings.TrimPrefix(up.URL, "http://"))
	}
	base := startCaddy(t, site("a.test", "$0.02", payTo.Hex())+site("b.test", "$0.07", otherPayTo))

	for _, c := range []struct{ host, amount, pay string }{
		{"a.test", "20000", payTo.Hex()},
		{"b.test", "70000", otherPayTo},
	} {
		doc := siteManifest(t, base, c.host)
		if len(doc.Items) != 1 || doc.Items[0].Accepts[0].Amount != c.amount || !strings.EqualFold(doc.Items[0].Accepts[0].PayTo, c.pay) || doc.Items[0].Metadata.Description != c.host {
			t.Errorf("%s/.well-known/x402 items = %+v, want one at %s to %s", c.host, doc.Items, c.amount, c.pay)
		}
		var api map[string]any
		if err := json.Unmarshal(siteGet(t, base, c.host, "/openapi.json"), &api); err != nil {
			t.Fatal(err)
		}
		price := docsPaymentInfo(t, api, "/pub", "get")["price"].(map[string]any)
		if price["amount"] != c.amount || !strings.EqualFold(price["payTo"].(string), c.pay) {
			t.Errorf("%s/openapi.json price = %v, want %s to %s", c.host, price, c.amount, c.pay)
		}
	}
}

// Sites on two ports are two Caddy servers: each lists its own routes.
func TestDiscoverySitesOnTwoPortsAreSeparate(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	port2 := freePort(t)
	site := func(port, route string) string {
		return fmt.Sprintf(`:%s {
	route /%s {
		%s
		reverse_proxy %s
	}
	x402_discovery /.well-known/x402
}
`, port, route, paidSiteGate(fac, "$0.02", payTo.Hex(), "GET /"+route, route), strings.TrimPrefix(up.URL, "http://"))
	}
	base := startCaddy(t, site("{port}", "one")+site(fmt.Sprint(port2), "two"))
	base2 := fmt.Sprintf("http://127.0.0.1:%d", port2)
	if got := siteManifest(t, base, "").Resources; fmt.Sprint(got) != "[GET /one]" {
		t.Errorf("first port lists %v, want [GET /one]", got)
	}
	if got := siteManifest(t, base2, "").Resources; fmt.Sprint(got) != "[GET /two]" {
		t.Errorf("second port lists %v, want [GET /two]", got)
	}
}

// A gate reached through a named route (`invoke`) belongs to the site that
// invokes it; a catch-all site on the same port is not part of a site whose
// host matched first.
func TestDiscoveryFollowsInvokeAndStopsAtTheMatchingSite(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	upHost := strings.TrimPrefix(up.URL, "http://")
	base := startCaddy(t, fmt.Sprintf(`&(paid) {
	%[2]s
	reverse_proxy %[1]s
}
http://a.test:{port} {
	route /named {
		invoke paid
	}
	x402_discovery /.well-known/x402
}
:{port} {
	route /other {
		%[3]s
		reverse_proxy %[1]s
	}
	x402_discovery /.well-known/x402
}
`, upHost, paidSiteGate(fac, "$0.04", payTo.Hex(), "GET /named", "named"), paidSiteGate(fac, "$0.03", payTo.Hex(), "GET /other", "other")))
	if got := siteManifest(t, base, "a.test").Resources; fmt.Sprint(got) != "[GET /named]" {
		t.Errorf("a.test lists %v, want [GET /named]", got)
	}
	if got := siteManifest(t, base, "elsewhere.test").Resources; fmt.Sprint(got) != "[GET /other]" {
		t.Errorf("the catch-all site lists %v, want [GET /other]", got)
	}
}

// A hand-written JSON config: gates as top-level handlers without a host
// matcher are every host's routes, a route for one host (terminal) that
// host's alone.
func TestDiscoveryJSONConfigHostRoutes(t *testing.T) {
	_, fac := sharedDevnet(t)
	port := freePort(t)
	gate := func(route, price string) string {
		return fmt.Sprintf(`{"handler":"x402","accepts":[{"network":"devnet","price":%q,"pay_to":%q}],"route":%q,
			"facilitator":{"type":"http","url":%q},"store":{"type":"badger","path":%q}}`,
			price, payTo.Hex(), route, fac, t.TempDir())
	}
	cfg := fmt.Sprintf(`{"admin":{"disabled":true},"logging":{"logs":{"default":{"writer":{"output":"discard"}}}},
	"storage":{"module":"file_system","root":%q},
	"apps":{"http":{"servers":{"s":{"listen":[":%d"],"automatic_https":{"disable":true},"routes":[
		{"match":[{"host":["b.test"]}],"terminal":true,"handle":[{"handler":"subroute","routes":[
			{"match":[{"path":["/b"]}],"handle":[%s,{"handler":"static_response","body":"b"}]},
			{"match":[{"path":["/.well-known/x402"]}],"handle":[{"handler":"x402_discovery"}]}
		]}]},
		{"match":[{"path":["/a"]}],"handle":[%s,{"handler":"static_response","body":"a"}]},
		{"match":[{"path":["/.well-known/x402"]}],"handle":[{"handler":"x402_discovery"}]}
	]}}}}}`, t.TempDir(), port, gate("GET /b", "$0.05"), gate("GET /a", "$0.03"))
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	testClient.CloseIdleConnections()
	waitServing(t, port)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if got := siteManifest(t, base, "a.test").Resources; fmt.Sprint(got) != "[GET /a]" {
		t.Errorf("a.test lists %v, want [GET /a]", got)
	}
	if got := siteManifest(t, base, "b.test").Resources; fmt.Sprint(got) != "[GET /b]" {
		t.Errorf("b.test lists %v, want [GET /b]", got)
	}
}

// The MCP tools of one endpoint (one x402 per priced tool, each naming the
// endpoint's route) are each listed, at its own price: in the manifest as
// an item of type mcp per tool, in llms.txt as a row per tool, and in
// openapi.json under the endpoint's operation, by tool.
func TestDiscoveryListsEveryToolOfOneEndpoint(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	tool := func(name, price string) string {
		return fmt.Sprintf(`x402 {
			mcp_tool %s
			accept devnet %s %s
			description "tool %s"
			route "POST /agent/mcp"
			facilitator http %s
			store badger {data}/gate
		}`, name, price, payTo.Hex(), name, fac)
	}
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /agent/mcp {
		%s
		%s
		reverse_proxy %s
	}
	x402_discovery /.well-known/x402
	aov_docs
}
`, tool("alpha", "$0.02"), tool("beta", "$0.05"), strings.TrimPrefix(up.URL, "http://")))
	host := strings.TrimPrefix(base, "http://")

	doc := siteManifest(t, base, host)
	got := map[string]string{}
	for _, it := range doc.Items {
		b, _ := it.Extensions["bazaar"].(map[string]any)
		info, _ := b["info"].(map[string]any)
		in, _ := info["input"].(map[string]any)
		name, _ := in["toolName"].(string)
		if it.Type != "mcp" || it.Resource != base+"/agent/mcp" {
			t.Errorf("item %s: type %q at %s, want mcp at the endpoint", name, it.Type, it.Resource)
		}
		got[name] = it.Accepts[0].Amount
	}
	if len(doc.Items) != 2 || got["alpha"] != "20000" || got["beta"] != "50000" || strings.Join(doc.Resources, ",") != "POST /agent/mcp" {
		t.Errorf("manifest resources %v, tools %v; want the endpoint once and alpha at 20000, beta at 50000", doc.Resources, got)
	}

	llms := string(siteGet(t, base, host, "/llms.txt"))
	for _, want := range []string{"`POST /agent/mcp` (MCP tool `alpha`) | $0.02", "`POST /agent/mcp` (MCP tool `beta`) | $0.05"} {
		if !strings.Contains(llms, want) {
			t.Errorf("llms.txt lacks %q", want)
		}
	}

	var api map[string]any
	if err := json.Unmarshal(siteGet(t, base, host, "/openapi.json"), &api); err != nil {
		t.Fatal(err)
	}
	tools, _ := docsPaymentInfo(t, api, "/agent/mcp", "post")["tools"].(map[string]any)
	for name, amount := range map[string]string{"alpha": "20000", "beta": "50000"} {
		info, _ := tools[name].(map[string]any)
		price, _ := info["price"].(map[string]any)
		if price["amount"] != amount {
			t.Errorf("openapi.json tool %s: %v, want price %s", name, info, amount)
		}
	}
}

// One port, one site block: a paid route kept for b.test by a matcher that
// reads only the host, other than a plain host matcher (a `not host`, an
// expression on {host}, a Host header matcher). The walk evaluates it as
// Caddy does: a.test's manifest does not list b.test's route, b.test's
// does.
func TestDiscoveryEvaluatesMatchersThatReadOnlyTheHost(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	for _, matcher := range []string{"not host a.test", "expression {host} == 'b.test'", "expression `host('b.test') && {http.request.host}.endsWith('.test')`", "header Host b.test*"} {
		t.Run(matcher, func(t *testing.T) {
			base := startCaddy(t, fmt.Sprintf(`:{port} {
	@b %[1]s
	handle @b {
		route /b-only {
			%[2]s
			reverse_proxy %[4]s
		}
	}
	route /pub {
		%[3]s
		reverse_proxy %[4]s
	}
	x402_discovery /.well-known/x402
}
`, matcher, paidSiteGate(fac, "$0.07", payTo.Hex(), "GET /b-only", "b only"),
				paidSiteGate(fac, "$0.02", payTo.Hex(), "GET /pub", "public"), strings.TrimPrefix(up.URL, "http://")))
			for host, want := range map[string]string{"a.test": "GET /pub", "b.test": "GET /b-only,GET /pub"} {
				if got := strings.Join(siteManifest(t, base, host).Resources, ","); got != want {
					t.Errorf("%s's manifest lists %s; want %s", host, got, want)
				}
			}
		})
	}
}

// TestHostOnlyExpr: an expression is evaluated by the walk only when it
// reads nothing but the host; one that reads anything else, or that the
// check cannot read through, counts as matching every host.
func TestHostOnlyExpr(t *testing.T) {
	for expr, want := range map[string]bool{
		"{host} == 'b.test'":                              true,
		"host('a.test', 'b.test')":                        true,
		"{http.request.host} in [\"a.test\", 'b\\'x']":    true,
		"!({host}.endsWith('.test')) || size({host}) > 3": true,
		"{path} == '/x'":                                  false,
		"{host} == 'b.test' && path('/x')":                false,
		"req.host == 'b.test'":                            false,
		"{host} == 'b.test":                               false,
		"{http.request.header.Host} == 'b'":               false,
		"{host} == {method}":                              false,
		"header({'Host': 'b'})":                           false,
		"{host} == 'a' ? true : false":                    false,
	} {
		if got := hostOnlyExpr(expr); got != want {
			t.Errorf("hostOnlyExpr(%q) = %v, want %v", expr, got, want)
		}
	}
}
