package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
)

// A paid or free answer carries the gate's Cache-Control: no-store and
// none of the upstream's targeted cache-control fields (RFC 9213's
// CDN-Cache-Control, which a CDN honours instead of Cache-Control,
// Cloudflare-CDN-Cache-Control) nor Surrogate-Control (Fastly, Varnish,
// Akamai): settled after, settled before (streamed) and free. (Before: they
// went out as the upstream set them, beside no-store, and a CDN in front
// kept the paid answer and served it unpaid.)
func TestTargetedCacheControlNeverBesideNoStore(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		w.Header().Set("CDN-Cache-Control", "public, max-age=3600")
		w.Header().Set("Cloudflare-CDN-Cache-Control", "max-age=3600")
		w.Header().Set("Surrogate-Control", "max-age=3600")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"paid":"content"}`))
	}))
	t.Cleanup(up.Close)
	site := fmt.Sprintf(`:{port} {
	route /after/* {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http %[1]s
			store badger {data}/gate-after
			free_allowance {
				pool cdn
				per_day 1
			}
		}
		reverse_proxy %[3]s
	}
	route /before/* {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http %[1]s
			store badger {data}/gate-before
			settle before
		}
		reverse_proxy %[3]s
	}
}
`, fac, payTo.Hex(), strings.TrimPrefix(up.URL, "http://"))
	base := startCaddy(t, site)
	check := func(what string, resp *http.Response, body []byte) {
		t.Helper()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %.200s", what, resp.StatusCode, body)
		}
		for _, k := range []string{"CDN-Cache-Control", "Cloudflare-CDN-Cache-Control", "Surrogate-Control"} {
			if v := resp.Header.Get(k); v != "" {
				t.Errorf("%s: %s: %q beside Cache-Control %q; want only the gate's no-store to rule caching", what, k, v, resp.Header.Values("Cache-Control"))
			}
		}
	}
	resp, body := getBody(t, base+"/after/x", nil)
	check("free answer", resp, body)
	resp, _ = getBody(t, base+"/after/x", nil)
	sig := signFor(t, paymentRequired(t, resp), 4)
	resp, body = getBody(t, base+"/after/x", map[string]string{x402.HeaderPaymentSignature: sig})
	check("paid answer, settle after", resp, body)
	resp, _ = getBody(t, base+"/before/x", nil)
	sig = signFor(t, paymentRequired(t, resp), 3)
	resp, body = getBody(t, base+"/before/x", map[string]string{x402.HeaderPaymentSignature: sig})
	check("paid answer, settle before", resp, body)
}

// targetedCacheControl names the fields a cache in front reads instead of,
// or beside, Cache-Control, in any letter case, and nothing else.
func TestTargetedCacheControlNames(t *testing.T) {
	for k, want := range map[string]bool{
		"CDN-Cache-Control":            true,
		"Cdn-Cache-Control":            true,
		"Cloudflare-CDN-Cache-Control": true,
		"Vercel-CDN-Cache-Control":     true,
		"Surrogate-Control":            true,
		"surrogate-control":            true,
		"Edge-Control":                 true,
		"X-Accel-Expires":              true,
		"x-accel-expires":              true,
		"Cache-Control":                false,
		"Content-Type":                 false,
		"X-Cache":                      false,
	} {
		if got := targetedCacheControl(k); got != want {
			t.Errorf("targetedCacheControl(%q) = %v, want %v", k, got, want)
		}
	}
}
