package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// getHost GETs url with the Host header host.
func getHost(t *testing.T, url, host string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Host = host
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// runningDocs returns the provisioned aov_docs handler of the running
// Caddy's servers.
func runningDocs(t *testing.T) *Docs {
	t.Helper()
	d, _ := runningHandler[*Docs](t)
	return d
}

// runningHandler returns the first provisioned handler of type T in the
// running Caddy's servers, and the server it is in.
func runningHandler[T caddyhttp.MiddlewareHandler](t testing.TB) (T, *caddyhttp.Server) {
	t.Helper()
	app, err := caddy.ActiveContext().App("http")
	if err != nil {
		t.Fatal(err)
	}
	var found T
	var in *caddyhttp.Server
	var walk func(*caddyhttp.Server, caddyhttp.RouteList)
	walk = func(srv *caddyhttp.Server, list caddyhttp.RouteList) {
		for _, rt := range list {
			for _, h := range rt.Handlers {
				if v, ok := h.(T); ok && in == nil {
					found, in = v, srv
				}
				if sub, ok := h.(*caddyhttp.Subroute); ok {
					walk(srv, sub.Routes)
				}
			}
		}
	}
	for _, srv := range app.(*caddyhttp.App).Servers {
		walk(srv, srv.Routes)
	}
	if in == nil {
		t.Fatalf("no %T handler", found)
	}
	return found, in
}

// namesOrigin reports whether body names origin, and not only an origin
// that starts with it (http://a.example in http://a.example:8080).
func namesOrigin(body, origin string) bool {
	for i := 0; ; {
		j := strings.Index(body[i:], origin)
		if j < 0 {
			return false
		}
		i += j + len(origin)
		if i == len(body) || body[i] != ':' && body[i] != '.' && body[i] != '-' && !('a' <= body[i] && body[i] <= 'z' || '0' <= body[i] && body[i] <= '9') {
			return true
		}
	}
}

// docsHostsSite is one site whose priced routes differ by Host: a.example
// has GET /a, b.example GET /b, any other Host none.
func docsHostsSite(docsOptions string) string {
	route := func(name, price string) string {
		return fmt.Sprintf(`@%[1]s {
		host %[1]s.example
		path /%[1]s
	}
	route @%[1]s {
		x402 {
			accept devnet %[2]s %[3]s
			route "GET /%[1]s"
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger {data}/%[1]s
		}
		respond "%[1]s"
	}`, name, price, payTo.Hex())
	}
	return fmt.Sprintf(`:{port} {
	aov_docs {
		%s
	}
	x402_discovery /.well-known/x402
	%s
	%s
}
`, docsOptions, route("a", "$0.01"), route("b", "$0.02"))
}

// TestDocsBuiltOncePerRouteSet: requests alternating between Hosts whose
// routes differ (host matchers in one site) cost one build of the
// documents per set of routes, not one per request (about 4 ms and 0.9 MB
// each); and each Host still gets its own routes and its own origin.
func TestDocsBuiltOncePerRouteSet(t *testing.T) {
	base := startCaddy(t, docsHostsSite(""))
	d := runningDocs(t)
	hosts := []string{"a.example", "b.example", "c.example", "a.example:8080"}
	for i := range 40 {
		host := hosts[i%len(hosts)]
		for _, p := range []string{"/llms.txt", "/openapi.json"} {
			resp, body := getHost(t, base+p, host)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s %s: status %d", host, p, resp.StatusCode)
			}
			name := host[:1]
			hasA, hasB := strings.Contains(body, `"/a"`), strings.Contains(body, `"/b"`)
			if p == "/llms.txt" {
				hasA, hasB = strings.Contains(body, "`GET /a`"), strings.Contains(body, "`GET /b`")
			}
			if hasA != (name == "a") || hasB != (name == "b") {
				t.Fatalf("%s %s: GET /a listed %v, GET /b listed %v", host, p, hasA, hasB)
			}
			for _, other := range hosts {
				if names := namesOrigin(body, "http://"+other); names != (other == host) {
					t.Fatalf("%s %s: names the origin http://%s %v", host, p, other, names)
				}
			}
		}
	}
	d.cache.mu.Lock()
	builds := d.cache.builds
	d.cache.mu.Unlock()
	if builds != 3 {
		t.Errorf("80 requests alternating 4 Hosts over 3 sets of routes built the documents %d times, want 3", builds)
	}
}

// TestDocsNamingTheRequestsHostAreNotShared: documents that name the
// origin the request addressed (no public_base_url, or one with a
// request placeholder) are private to the client, with Vary: Host, as
// /.well-known/x402 is: a shared cache must not hand one client's Host to
// everyone. With a fixed public_base_url they name no Host, but this
// site's routes differ by Host, so they are private too
// (TestDocumentsVaryByHostWhenTheirRoutesDo has the public ones).
func TestDocsNamingTheRequestsHostAreNotShared(t *testing.T) {
	for _, tc := range []struct {
		docs, discovery string
	}{
		{"", ""},
		{"public_base_url http://{http.request.host}", ""},
		{"mcp_url http://{http.request.host}/mcp\n\t\tpublic_base_url https://verify.example.com", "public_base_url https://verify.example.com"},
		{"public_base_url https://verify.example.com", "public_base_url https://verify.example.com"},
	} {
		site := docsHostsSite(tc.docs)
		if tc.discovery != "" {
			site = strings.Replace(site, "x402_discovery /.well-known/x402", "x402_discovery /.well-known/x402 {\n\t\t"+tc.discovery+"\n\t}", 1)
		}
		base := startCaddy(t, site)
		for _, p := range []string{"/llms.txt", "/openapi.json", "/.well-known/x402"} {
			resp, body := getHost(t, base+p, "a.example")
			cc, varyHost := resp.Header.Get("Cache-Control"), headerHasToken(resp.Header, "Vary", "Host")
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%q %s: status %d", tc.docs, p, resp.StatusCode)
			}
			if named := strings.Contains(body, "a.example"); named && tc.discovery != "" && !strings.Contains(tc.docs, "{") {
				t.Errorf("%q %s names the request's Host though the base URL is fixed", tc.docs, p)
			}
			if cc != "private, max-age=60" || !varyHost {
				t.Errorf("%q %s names the request's Host or its routes: Cache-Control %q, Vary %q; want private, max-age=60 with Vary: Host", tc.docs, p, cc, resp.Header.Values("Vary"))
			}
		}
	}
}

// TestDocsRequestBaseBuiltOncePerRouteSet: with a request placeholder in
// public_base_url or mcp_url, the documents name what each request
// chose, substituted into documents built once per set of routes: sixty
// new Hosts cost one build, and each answer names its own Host only.
func TestDocsRequestBaseBuiltOncePerRouteSet(t *testing.T) {
	for _, opt := range []string{
		"public_base_url http://{http.request.host}",
		"public_base_url http://{http.request.host}\n\t\tmcp_url http://{http.request.host}/tools/mcp",
	} {
		base := startCaddy(t, docsHostsSite(opt))
		d := runningDocs(t)
		for i := range 60 {
			host := fmt.Sprintf("x%d.example", i)
			for _, p := range []string{"/openapi.json", "/llms.txt"} {
				resp, body := getHost(t, base+p, host)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%q %s: status %d", opt, p, resp.StatusCode)
				}
				if !namesOrigin(body, "http://"+host) || namesOrigin(body, "http://x0.example") != (i == 0) || strings.Contains(body, ".invalid") {
					t.Fatalf("%q %s with Host %s: does not name its own origin only", opt, p, host)
				}
				if strings.Contains(opt, "mcp_url") && !strings.Contains(body, "http://"+host+"/tools/mcp") {
					t.Fatalf("%q %s with Host %s: does not name the MCP URL as expanded", opt, p, host)
				}
			}
		}
		d.cache.mu.Lock()
		builds := d.cache.builds
		d.cache.mu.Unlock()
		if builds != 1 {
			t.Errorf("%q: 120 requests with 60 Hosts over one set of routes built the documents %d times, want 1", opt, builds)
		}
	}
}

// TestDocsRefuseAnOriginNoDNSNameHas: what the documents (aov_docs's and
// x402_discovery's) take from the request (its origin, or public_base_url
// as expanded for it) is at most
// https:// with a DNS name's 253 bytes and :65535, with no character JSON
// escapes. A longer Host gets a small 400 in the contract's shape that
// does not repeat it, and the cache keeps no copy of it: one unpaid
// request cannot make the gateway build, send or keep documents many
// times its size. A Host of 253 bytes, with a port or not, is served.
func TestDocsRefuseAnOriginNoDNSNameHas(t *testing.T) {
	long := strings.Repeat(strings.Repeat("a", 62)+".", 4)[:249] + ".com" // 253 bytes
	for _, opt := range []string{"", "public_base_url http://{http.request.host}"} {
		base := startCaddy(t, docsHostsSite(opt))
		d := runningDocs(t)
		for _, host := range []string{strings.Repeat("a", 16000) + ".example", long + "xxxxxxxxx", "a&b.example"} {
			for _, p := range []string{"/openapi.json", "/llms.txt", "/.well-known/x402"} {
				resp, body := getHost(t, base+p, host)
				var e struct{ Code string }
				json.Unmarshal([]byte(body), &e)
				if resp.StatusCode != http.StatusBadRequest || e.Code != "invalid_request" || len(body) > 1000 || strings.Contains(body, host) {
					t.Errorf("%q %s with a %d-byte Host: status %d, %d bytes (%.80s); want a small 400 invalid_request", opt, p, len(host), resp.StatusCode, len(body), body)
				}
			}
		}
		for _, host := range []string{long, long + ":65535"} {
			if resp, body := getHost(t, base+"/llms.txt", host); resp.StatusCode != http.StatusOK || !strings.Contains(body, "http://"+long) {
				t.Errorf("%q with a %d-byte Host: status %d", opt, len(host), resp.StatusCode)
			}
		}
		d.cache.mu.Lock()
		for _, e := range d.cache.entries {
			if bytes.Contains(e.openapi, []byte(long)) || bytes.Contains(e.llms, []byte(long)) {
				t.Errorf("%q: the cache keeps a copy of the documents naming a request's Host", opt)
			}
		}
		d.cache.mu.Unlock()
	}
}

// TestDocumentsVaryByHostWhenTheirRoutesDo: a document is public, without
// Vary: Host, only when it is the same for every request that reaches it.
// With a fixed public_base_url, one site whose routes differ by host
// matcher still serves each Host its own routes, so its three documents
// are private with Vary: Host. Sites of their own (a site block per host
// on one port) and a site without host matchers are public.
func TestDocumentsVaryByHostWhenTheirRoutesDo(t *testing.T) {
	fixed := "public_base_url https://verify.example.com"
	hostsSite := strings.Replace(docsHostsSite(fixed), "x402_discovery /.well-known/x402", "x402_discovery /.well-known/x402 {\n\t\t"+fixed+"\n\t}", 1)
	site := func(name string) string {
		return fmt.Sprintf(`http://%[1]s.example:{port} {
	aov_docs {
		%[3]s
	}
	x402_discovery /.well-known/x402 {
		%[3]s
	}
	route /%[1]s {
		x402 {
			accept devnet $0.01 %[2]s
			route "GET /%[1]s"
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger {data}/%[1]s
		}
		respond "%[1]s"
	}
}
`, name, payTo.Hex(), fixed)
	}
	for _, tc := range []struct {
		name, sites string
		hosts       []string
		public      bool
	}{
		{"one site, routes by host matcher", hostsSite, []string{"a.example", "b.example", "c.example"}, false},
		{"a site per host", site("a") + site("b"), []string{"a.example", "b.example"}, true},
		{"one site, no host matcher", strings.NewReplacer("http://a.example:{port}", ":{port}").Replace(site("a")), []string{"a.example", "b.example"}, true},
	} {
		base := startCaddy(t, tc.sites)
		for _, p := range []string{"/llms.txt", "/openapi.json", "/.well-known/x402"} {
			for _, host := range tc.hosts {
				resp, _ := getHost(t, base+p, host)
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("%s: %s with Host %s: status %d", tc.name, p, host, resp.StatusCode)
				}
				cc, varyHost := resp.Header.Get("Cache-Control"), headerHasToken(resp.Header, "Vary", "Host")
				if tc.public && (cc != "public, max-age=60" || varyHost) {
					t.Errorf("%s: %s with Host %s: Cache-Control %q, Vary %q; want public, max-age=60 without Vary: Host", tc.name, p, host, cc, resp.Header.Values("Vary"))
				}
				if !tc.public && (cc != "private, max-age=60" || !varyHost) {
					t.Errorf("%s: %s with Host %s differs by Host: Cache-Control %q, Vary %q; want private, max-age=60 with Vary: Host", tc.name, p, host, cc, resp.Header.Values("Vary"))
				}
			}
		}
	}
}
