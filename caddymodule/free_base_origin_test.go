package caddymodule

import (
	"net/http"
	"testing"
)

// public_base_url is compared with a page's Origin in the form browsers
// send it: an explicit default port (https://site.example:443) is dropped
// and a Unicode host (https://café.example) is its IDNA ASCII form
// (xn--caf-dma.example), so the site's own page is served its free call.
// (Before: the base was kept as written and never equalled the Origin, so
// the site's own page got the 402.)
func TestFreeAllowancePublicBaseURLIsComparedAsBrowsersSendOrigins(t *testing.T) {
	for _, c := range []struct{ baseURL, host, origin string }{
		{"https://site.example:443", "site.example", "https://site.example"},
		{"https://café.example", "xn--caf-dma.example", "https://xn--caf-dma.example"},
		{"HTTP://Site.Example:80", "site.example", "http://site.example"},
	} {
		t.Run(c.baseURL, func(t *testing.T) {
			up := reflectingUpstream(t, `{"report":"for the visitor"}`)
			base := startCaddy(t, `:{port} {
	route /report/* {
		x402 {
			accept devnet $0.01 `+payTo.Hex()+`
			route "GET /report/{id}"
			public_base_url `+c.baseURL+`
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger {data}/gate
			free_allowance {
				pool p
				per_day 4
				key ip
			}
		}
		reverse_proxy `+up+`
	}
}
`)
			resp := freeGet(t, base+"/report/1", c.host, map[string]string{
				"Origin":         c.origin,
				"Sec-Fetch-Site": "same-origin",
				"Sec-Fetch-Mode": "cors",
			})
			if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "3" {
				t.Errorf("the site's own page (Origin %s, public_base_url %s): %d, %s %q; want 200 from the allowance, 3 left",
					c.origin, c.baseURL, resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
			}
		})
	}
}

// normalizeOrigin is the one form origins are compared in, the configured
// (public_base_url, origins) and the sent (Origin) alike.
func TestNormalizeOriginAsBrowsersSerialiseIt(t *testing.T) {
	for in, want := range map[string]string{
		"https://site.example:443":    "https://site.example",
		"http://site.example:80":      "http://site.example",
		"https://site.example:80":     "https://site.example:80",
		"https://Café.Example":        "https://xn--caf-dma.example",
		"https://café.example:8443":   "https://xn--caf-dma.example:8443",
		"https://xn--caf-dma.example": "https://xn--caf-dma.example",
		"http://[::1]:8080":           "http://[::1]:8080",
	} {
		if got, err := normalizeOrigin(in); err != nil || got != want {
			t.Errorf("normalizeOrigin(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
