package caddymodule

import (
	"net/http"
	neturl "net/url"
	"testing"
)

// An answer labelled with any WHATWG label of UTF-8 (utf8, unicode-1-1-utf-8,
// in any case, quoted or not) is read as UTF-8 by every reader and passes
// the check. (Before: only "utf-8" was taken, and charset=utf8, a valid
// UTF-8 answer, was 503 response_unverifiable.)
func TestCharsetUTF8LabelsAreUTF8(t *testing.T) {
	base := relabellingSeller(t)
	for _, ct := range []string{"application/json; charset=utf8", "application/json; charset=UTF8", `application/json; charset="Unicode-1-1-UTF-8"`, "application/json; charset=utf-8"} {
		resp, body := getBody(t, base+"/s/invoices/INV-7731?ct="+neturl.QueryEscape(ct), nil)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderVerificationStatus) != "pass" {
			t.Errorf("%s: %d %q %.200s; want 200 pass (a UTF-8 label)", ct, resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
		}
	}
	// Another charset is still refused.
	resp, body := getBody(t, base+"/s/invoices/INV-7731?ct="+neturl.QueryEscape("application/json; charset=utf-16le"), nil)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("utf-16le: %d %.200s; want 503 response_unverifiable", resp.StatusCode, body)
	}
}

// notUTF8 takes the WHATWG labels of UTF-8 and nothing else.
func TestNotUTF8Labels(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                              true,
		"application/json; charset=utf-8":               true,
		"application/json; charset=UTF8":                true,
		`application/json; charset="unicode-1-1-utf-8"`: true,
		"application/json; charset=utf-16le":            false,
		"application/json; charset=iso-8859-1":          false,
		"application/json; charset=utf-8x":              false,
		// Go's parser refuses two charsets; npm's content-type takes the last.
		"application/json; charset=utf-8; charset=utf-7": false,
	} {
		if got := notUTF8(ct) == ""; got != want {
			t.Errorf("notUTF8(%q) == \"\" is %v, want %v", ct, got, want)
		}
	}
}
