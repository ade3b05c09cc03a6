package caddymodule

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// A page on another origin is not served from the free allowance of the
// visitor whose browser it runs in, unless free_allowance lists it: it
// gets the 402 offer (which it may pay) and nothing is counted. A request
// without Origin (an agent, curl), a page of the site itself and a listed
// origin are served free as before. (Before: with `x402_cors { origins * }`,
// as Caddyfile.example writes it, and key ip, any page a visitor opened
// could spend that visitor's free calls and read the answers.)
func TestFreeAllowanceIsNotServedToPagesOnOtherOrigins(t *testing.T) {
	up := reflectingUpstream(t, `{"report":"for the visitor"}`)
	base := startCaddy(t, `:{port} {
	x402_cors {
		origins *
	}
	route /report/* {
		x402 {
			accept devnet $0.01 `+payTo.Hex()+`
			route "GET /report/{id}"
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger {data}/gate
			free_allowance {
				pool p
				per_day 4
				key ip
				origins https://app.example
			}
		}
		reverse_proxy `+up+`
	}
}
`)
	for _, origin := range []string{"https://evil.example", "https://evil.example", "null", "https://app.example.evil.example", strings.Replace(base, "http://", "https://", 1) + "0"} {
		resp := corsDo(t, http.MethodGet, base+"/report/1", map[string]string{"Origin": origin})
		if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get(HeaderFreeRemaining) != "" {
			t.Errorf("GET from a page on %s: %d, %s %q; want the 402 offer, no free call", origin, resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
		}
		if origin == "https://evil.example" && resp.Header.Get("Access-Control-Allow-Origin") == "" {
			t.Errorf("the 402 to %s carries no CORS grant: the page cannot pay", origin)
		}
	}
	for i, origin := range []string{base, "https://app.example", "HTTPS://APP.EXAMPLE:443", ""} {
		hdr := map[string]string{}
		if origin != "" {
			hdr["Origin"] = origin
		}
		resp := corsDo(t, http.MethodGet, base+"/report/1", hdr)
		if want := []string{"3", "2", "1", "0"}[i]; resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != want {
			t.Errorf("GET with Origin %q: %d, %s %q; want 200 from the allowance, %s left (the refused pages counted nothing)",
				origin, resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining), want)
		}
	}
}

// free_allowance's origins are origins, as x402_cors's are.
func TestFreeAllowanceOriginsAreChecked(t *testing.T) {
	for _, o := range []string{"app.example", "https://app.example/path", "ftp://app.example"} {
		f := &FreeAllowance{PerDay: 1, Origins: []string{o}}
		if err := f.provision(); err == nil || !strings.Contains(err.Error(), o) {
			t.Errorf("origins %q: %v; want an error naming it", o, err)
		}
	}
}

// freeSiteOn is a GET route with a free allowance (4 a day, key ip, the
// free_allowance lines extra added), behind x402_cors any origin as
// Caddyfile.example has it, and public_base_url https://site.example.
func freeSiteOn(t *testing.T, extra string) string {
	up := reflectingUpstream(t, `{"report":"for the visitor"}`)
	return startCaddy(t, `:{port} {
	x402_cors {
		origins *
	}
	route /report/* {
		x402 {
			accept devnet $0.01 `+payTo.Hex()+`
			route "GET /report/{id}"
			public_base_url https://site.example
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger {data}/gate
			free_allowance {
				pool p
				per_day 4
				key ip
				`+extra+`
			}
		}
		reverse_proxy `+up+`
	}
}
`)
}

// freeGet sends a GET with Host host (unless empty) and hdr, and returns
// its answer, read and closed.
func freeGet(t *testing.T, url, host string, hdr map[string]string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// With public_base_url set, its origin is the only one whose pages are
// the site's own. A DNS-rebinding page (http://rebind.evil.example, the
// name pointed at the site's address) sends Host rebind.evil.example with
// a matching Origin, and the browser lets it read the answers as its own:
// it gets the 402 offer and nothing is counted. The site's own page is
// served free whatever Host it came through. (Before: an Origin whose host
// was the request's Host, which the client chooses, was the site's own, so
// the rebinding page spent its visitor's free calls and read the answers.)
func TestFreeAllowanceADNSRebindingPageIsNotTheSitesOwn(t *testing.T) {
	base := freeSiteOn(t, "")
	resp := freeGet(t, base+"/report/1", "rebind.evil.example", map[string]string{"Origin": "http://rebind.evil.example"})
	if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get(HeaderFreeRemaining) != "" {
		t.Errorf("page on http://rebind.evil.example (Host rebind.evil.example, public_base_url https://site.example): %d, %s %q; want the 402 offer, no free call",
			resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
	}
	resp = freeGet(t, base+"/report/1", "", map[string]string{"Origin": "https://site.example"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "3" {
		t.Errorf("page on https://site.example (the public_base_url): %d, %s %q; want 200 from the allowance, 3 left (the rebinding page counted nothing)",
			resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
	}
}

// A DNS-rebinding page (http://rebind.evil.example, the name pointed at
// the site's address) fetching a free GET route makes a same-origin GET:
// no Origin, and over plain http not even Sec-Fetch-Site (Chromium sends
// it only to secure origins), and it reads the answer. With
// public_base_url https://site.example a request without Origin is served
// free only when its Host is site.example (a default port dropped, in any
// letter case), an IP address or localhost: the rebinding page gets the
// 402 offer and counts nothing, with or without Sec-Fetch-Site, and so
// does a client calling the gate by another name. (Before: a request
// without Origin was served free, and the rebinding page spent and read
// its visitor's free calls.)
func TestFreeAllowanceIsNotServedToARebindingPagesSameOriginGet(t *testing.T) {
	base := freeSiteOn(t, "")
	sameOrigin := map[string]string{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}
	for _, c := range []struct {
		host string
		hdr  map[string]string
	}{
		{"rebind.evil.example", sameOrigin},
		{"rebind.evil.example", nil},
		{"site.example.evil.example", nil},
		{"site.example:8443", nil},
	} {
		resp := freeGet(t, base+"/report/1", c.host, c.hdr)
		if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get(HeaderFreeRemaining) != "" {
			t.Errorf("GET without Origin, Host %s, %v (public_base_url https://site.example): %d, %s %q; want the 402 offer, no free call",
				c.host, c.hdr, resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
		}
	}
	for i, c := range []struct {
		host string
		hdr  map[string]string
	}{
		{"site.example", sameOrigin},
		{"SITE.example:443", nil},
		{"", sameOrigin}, // 127.0.0.1:<port>
		{"localhost", nil},
	} {
		resp := freeGet(t, base+"/report/1", c.host, c.hdr)
		if want := []string{"3", "2", "1", "0"}[i]; resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != want {
			t.Errorf("GET without Origin, Host %q, %v: %d, %s %q; want 200 from the allowance, %s left (the refused requests counted nothing)",
				c.host, c.hdr, resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining), want)
		}
	}
}

// A browser sends no Origin on a GET it makes for an <img>, a <script> or
// fetch(…, {mode: 'no-cors'}), only Sec-Fetch-Site: such a request from
// another site (cross-site, or same-site: another origin of the same
// site) is a page of another origin, served free only when its Origin is
// listed, and nothing is counted when it is refused. A top-level
// navigation the user made (a link clicked: Sec-Fetch-Mode navigate,
// Sec-Fetch-User ?1) is the visitor's own call, and served free as a
// request from the site itself (same-origin) or typed in (none) is.
// (Before: without Origin every request was served free, so any page could
// spend every visitor's free calls with an image.)
func TestFreeAllowanceIsNotServedToANoCorsRequestFromAnotherSite(t *testing.T) {
	base := freeSiteOn(t, "origins https://app.example")
	for _, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image", "Referer": "https://evil.example/"},
		{"Sec-Fetch-Site": "same-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "empty"},
		{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"},
		{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Origin": "https://site.example"},
		{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Origin": "https://evil.example"},
	} {
		resp := freeGet(t, base+"/report/1", "", hdr)
		if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get(HeaderFreeRemaining) != "" {
			t.Errorf("GET with %v: %d, %s %q; want the 402 offer, no free call",
				hdr, resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
		}
	}
	for i, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Origin": "https://site.example"},
		{"Sec-Fetch-Site": "none", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document", "Sec-Fetch-User": "?1"},
		{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document", "Sec-Fetch-User": "?1"},
		{"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty", "Origin": "https://app.example"},
	} {
		resp := freeGet(t, base+"/report/1", "", hdr)
		if want := []string{"3", "2", "1", "0"}[i]; resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != want {
			t.Errorf("GET with %v: %d, %s %q; want 200 from the allowance, %s left (the refused requests counted nothing)",
				hdr, resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining), want)
		}
	}
}

// A Host written with the trailing dot of a fully qualified name is the
// same name: "localhost." is as unrebindable as "localhost" (browsers
// resolve it to loopback themselves), "site.example." is public_base_url's
// host. (Before: both got the 402 offer.)
func TestFreeCallWithoutOriginFromAFullyQualifiedHost(t *testing.T) {
	base := freeSiteOn(t, "")
	for _, host := range []string{"localhost.", "localhost.:8080", "site.example.", "site.example.:443"} {
		resp := freeGet(t, base+"/report/1", host, nil)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET without Origin, Host %q (public_base_url https://site.example): %d; want 200 from the allowance", host, resp.StatusCode)
		}
	}
}
