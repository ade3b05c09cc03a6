package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	neturl "net/url"
	"strings"
	"testing"
)

// verify_response checks an answer's bytes as UTF-8 JSON (RFC 8259) and
// releases it under the agent's own Content-Type. One labelled with a
// charset other than UTF-8 is not verifiable (503 response_unverifiable,
// no receipt, nothing charged): a reader that honours the charset (a
// browser, Python requests' .json(), which decodes .text by it) would read
// other text than was checked, under utf-16le an unreadable invoice, under
// iso-8859-1 every non-ASCII string changed. UTF-8 in any letter case, or
// no charset, passes as before. (Before: a pass receipt went out on
// "application/json; charset=utf-16le".)
func TestCharsetOtherThanUTF8IsUnverifiable(t *testing.T) {
	base := relabellingSeller(t)
	for _, c := range []struct {
		ct   string
		pass bool
	}{
		{"application/json; charset=utf-16le", false},
		{"application/json; charset=ISO-8859-1", false},
		{`application/json; charset="utf-16"`, false},
		{"application/json; charset=UTF-8", true},
		{"application/json; Charset=utf-8", true},
		{"application/json", true},
	} {
		resp, body := getBody(t, base+"/s/invoices/INV-7731?ct="+neturl.QueryEscape(c.ct), nil)
		switch {
		case c.pass && (resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderVerificationStatus) != "pass"):
			t.Errorf("%s: %d %q, want 200 pass: %.200s", c.ct, resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
		case !c.pass && (resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), `"code":"response_unverifiable"`) ||
			resp.Header.Get(HeaderVerificationReceipt) != "" || !strings.Contains(string(body), "only UTF-8 is checked")):
			t.Errorf("%s: %d %q, want 503 response_unverifiable without a receipt, naming the charset: %.300s", c.ct, resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
		}
	}
}

// relabellingSeller starts a seller's site at /s, with verify_response
// and a real verifierd, whose upstream answers what the test agent answers
// under the Content-Type its request's ct query names. It returns the
// site's base URL.
func relabellingSeller(t *testing.T) string {
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resp, err := http.Get(agent + r.URL.Path)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		w.Header().Set("Content-Type", r.URL.Query().Get("ct"))
		w.WriteHeader(resp.StatusCode)
		w.Write(b)
	}))
	t.Cleanup(up.Close)
	return startCaddy(t, ":{port} {"+sellerRoute("/s", up.URL, vf, "")+"}\n")
}
