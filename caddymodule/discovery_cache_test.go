package caddymodule

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// manifestSite is a site with /.well-known/x402 (discoveryOptions in its
// block) and n verify routes, each with the verify bazaar extension (the
// request schema): the manifest's bulk.
func manifestSite(n int, discoveryOptions string) string {
	var routes strings.Builder
	for i := range n {
		fmt.Fprintf(&routes, `
	route /v%[1]d {
		x402 {
			route "POST /v%[1]d"
			accept devnet $0.02 %[2]s
			validate verify_request
			facilitator http http://127.0.0.1:1
			store badger {data}/gate
		}
		respond ok
	}`, i, payTo.Hex())
	}
	return fmt.Sprintf(":{port} {\n\tx402_discovery /.well-known/x402 %s\n%s\n}\n", discoveryOptions, routes.String())
}

// serveManifest calls the running manifest handler d (of server srv) as
// the server would for a GET on host.
func serveManifest(d *Discovery, srv *caddyhttp.Server, host string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, "http://"+host+"/.well-known/x402", nil)
	r = caddyhttp.PrepareRequest(r, caddy.NewReplacer(), w, srv)
	if err := d.ServeHTTP(w, r, nil); err != nil {
		w.Code = http.StatusInternalServerError // Caddy's answer to an error
	}
	return w
}

// An unpaid GET /.well-known/x402 costs no rebuild: the manifest (40
// verify routes, some 500 KB with their bazaar schemas) is built and
// encoded once per set of routes, as /llms.txt and /openapi.json are, and
// a request naming a new Host costs the substitution of its origin.
func TestDiscoveryManifestIsNotRebuiltPerRequest(t *testing.T) {
	startCaddy(t, manifestSite(40, ""))
	d, srv := runningHandler[*Discovery](t)
	first := serveManifest(d, srv, "a.example.com")
	if first.Code != http.StatusOK || first.Body.Len() < 100_000 {
		t.Fatalf("manifest: %d, %d bytes", first.Code, first.Body.Len())
	}
	i := 0
	allocs := testing.AllocsPerRun(20, func() {
		i++
		if w := serveManifest(d, srv, fmt.Sprintf("h%d.example.com", i)); w.Code != http.StatusOK {
			t.Fatalf("manifest: %d", w.Code)
		}
	})
	// A rebuild is some 18,000 allocations; serving a kept manifest to a
	// new Host, the request's own handling and the recorder some hundreds.
	if allocs > 1000 {
		t.Errorf("a GET /.well-known/x402 costs %.0f allocations: the manifest is rebuilt per request", allocs)
	}
}

// The kept manifest names each request's own origin and never keeps one:
// the cache holds the template, with private caching and Vary: Host as
// before; with a public_base_url it is the same for everyone and public.
func TestDiscoveryManifestKeepsNoRequestsOrigin(t *testing.T) {
	startCaddy(t, manifestSite(2, ""))
	d, srv := runningHandler[*Discovery](t)
	for _, host := range []string{"a.example.com", "b.example.com:8443", "a.example.com"} {
		w := serveManifest(d, srv, host)
		body := w.Body.String()
		if !strings.Contains(body, `"resource": "http://`+host+`/v1"`) || strings.Contains(body, docsOrigin) {
			t.Errorf("the manifest for %s does not name its origin: %.300s", host, body)
		}
		if cc, vary := w.Header().Get("Cache-Control"), w.Header().Get("Vary"); cc != "private, max-age=60" || vary != "Host" {
			t.Errorf("Cache-Control %q, Vary %q; want private with Vary: Host", cc, vary)
		}
	}
	d.cache.mu.Lock()
	if d.cache.builds != 1 {
		t.Errorf("the manifest was built %d times for one set of routes", d.cache.builds)
	}
	for _, e := range d.cache.entries {
		if bytes.Contains(*e, []byte("example.com")) {
			t.Error("the cache keeps a request's origin")
		}
	}
	d.cache.mu.Unlock()

	startCaddy(t, manifestSite(2, "{\n\t\tpublic_base_url https://verify.example.com\n\t}"))
	d, srv = runningHandler[*Discovery](t)
	w := serveManifest(d, srv, "other.example.net")
	if !strings.Contains(w.Body.String(), `"resource": "https://verify.example.com/v1"`) || w.Header().Get("Cache-Control") != "public, max-age=60" || w.Header().Get("Vary") != "" {
		t.Errorf("with public_base_url: Cache-Control %q, Vary %q, %.300s", w.Header().Get("Cache-Control"), w.Header().Get("Vary"), w.Body.String())
	}
}

// BenchmarkDiscoveryManifest measures an unpaid GET /.well-known/x402 of
// a site with 40 verify routes, each request naming its own Host (the
// manifest then names the request's origin).
func BenchmarkDiscoveryManifest(b *testing.B) {
	startCaddy(b, manifestSite(40, ""))
	d, srv := runningHandler[*Discovery](b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if w := serveManifest(d, srv, fmt.Sprintf("h%d.example.com", i)); w.Code != http.StatusOK {
			b.Fatalf("manifest: %d", w.Code)
		}
	}
}
