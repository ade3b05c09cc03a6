package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/interop"
)

// A page on another site (http://localhost:…, the gate on
// http://127.0.0.1:…) loads a free route in Chromium as an <img> and with a
// no-cors fetch: both GETs arrive without Origin, with Sec-Fetch-Site
// cross-site, and neither is served from the visitor's allowance. (Before:
// without Origin they were served free, and any page could spend its
// visitors' free calls.)
func TestFreeAllowanceIsNotSpentByAnotherSitesImageInABrowser(t *testing.T) {
	chromium := chromiumPath(t)
	interop.Dir(t, "playwright-core")
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, "<!doctype html><title>another site</title><p>a page on another site</p>")
	}))
	t.Cleanup(page.Close)
	base := freeSiteOn(t, "")
	var res struct {
		Image  string `json:"image"`
		NoCors string `json:"noCors"`
	}
	interop.Run(t, "free-nocors-browser.mjs", nil, map[string]any{
		"page":     strings.Replace(page.URL, "127.0.0.1", "localhost", 1) + "/",
		"url":      base + "/report/1",
		"chromium": chromium,
	}, &res)
	if res.Image != "error" || res.NoCors != "opaque" {
		t.Fatalf("the page's <img> %q, no-cors fetch %q; want the 402 to arrive for both (error, opaque)", res.Image, res.NoCors)
	}
	resp := freeGet(t, base+"/report/1", "", nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "3" {
		t.Errorf("after the other site's two GETs, a call of the visitor's own: %d, %s %q; want 200 from the allowance, 3 left (the other site's GETs counted nothing)",
			resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
	}
}

// The state a DNS-rebinding attack reaches, the browser deciding the
// headers: Chromium resolves rebind.evil.example to the gate's address,
// opens a page there over plain http and fetches the free GET route from
// it. That same-origin GET carries no Origin, nor (the page not being a
// secure origin) any Sec-Fetch-Site, and its Host is rebind.evil.example,
// not public_base_url's site.example: it gets the 402 offer and counts
// nothing. (Before: a request without Origin was served
// free, and the rebinding page read its visitor's free answers.)
func TestFreeAllowanceIsNotReadByARebindingPageInABrowser(t *testing.T) {
	chromium := chromiumPath(t)
	interop.Dir(t, "playwright-core")
	base := freeSiteOn(t, "")
	port := base[strings.LastIndexByte(base, ':')+1:]
	var res struct {
		Status    int    `json:"status"`
		Remaining string `json:"remaining"`
		Body      string `json:"body"`
	}
	interop.Run(t, "free-rebind-browser.mjs", nil, map[string]any{
		"page":     "http://rebind.evil.example:" + port + "/",
		"chromium": chromium,
	}, &res)
	if res.Status != http.StatusPaymentRequired || res.Remaining != "" {
		t.Errorf("rebinding page (http://rebind.evil.example:%s) fetch('/report/1') in Chromium: %d, %s %q, body %.80q; want the 402 offer, no free call",
			port, res.Status, HeaderFreeRemaining, res.Remaining, res.Body)
	}
	resp := freeGet(t, base+"/report/1", "", nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "3" {
		t.Errorf("after the rebinding page's GET, a call of the visitor's own: %d, %s %q; want 200 from the allowance, 3 left",
			resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
	}
}
