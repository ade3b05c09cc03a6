package caddymodule

import (
	"net/http"
	"testing"

	"github.com/aovhq/aov/walletauth"
)

// An X-Wallet-Auth proof is bound to the path as the client sent it,
// escaped, as sign-in-with-x and paid access are: /api/a%2Fb and /api/a/b,
// which the upstream may route as different resources, are different
// paths, and a proof for one is refused (401 naming X-Wallet-Auth.path) on
// the other. (Before: the gateway compared the decoded path, so a proof
// for /api/a/b was accepted on /api/a%2Fb, and aov wallet-auth signed
// /api/a%2Fb as /api/a/b.)
func TestWalletProofIsBoundToTheEscapedPath(t *testing.T) {
	up := walletUpstream(t)
	base := startCaddy(t, walletSite(up.URL, "required", ""))
	for _, c := range []struct{ signed, sent string }{
		{"/api/a/b", "/api/a%2Fb"},
		{"/api/a%2Fb", "/api/a/b"},
	} {
		proof := walletProof(t, walletKey(1), "GET", base+c.signed, nil)
		status, hdr, body := walletCall(t, "GET", base+c.sent, "", map[string]string{walletauth.HeaderName: proof})
		t.Logf("proof for %s sent to %s: %d", c.signed, c.sent, status)
		wantUnauthorized(t, status, hdr, body, "X-Wallet-Auth.path")
	}
	for _, p := range []string{"/api/a%2Fb", "/api/a/b", "/api/caf%C3%A9"} {
		proof := walletProof(t, walletKey(1), "GET", base+p, nil)
		status, _, body := walletCall(t, "GET", base+p, "", map[string]string{walletauth.HeaderName: proof})
		if status != http.StatusOK || body["wallet"] != walletAddr(1) {
			t.Errorf("proof for %s sent to %s: %d %v, want 200 with the wallet", p, p, status, body)
		}
	}
}

// A proof whose path member is written decoded, as a browser client that
// decodes URL.pathname sends it ("/api/café"), is the same path as its
// escaped uri and the request's (RFC 3986's comparison, CanonicalPath):
// accepted.
func TestWalletProofPathMayBeWrittenDecoded(t *testing.T) {
	up := walletUpstream(t)
	base := startCaddy(t, walletSite(up.URL, "required", ""))
	e, err := walletauth.New(walletauth.Request{Method: "GET", URL: base + "/api/caf%C3%A9"})
	if err != nil {
		t.Fatal(err)
	}
	e.Path = "/api/café"
	if err := e.Sign(walletKey(1)); err != nil {
		t.Fatal(err)
	}
	proof, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	status, _, body := walletCall(t, "GET", base+"/api/caf%C3%A9", "", map[string]string{walletauth.HeaderName: proof})
	if status != http.StatusOK || body["wallet"] != walletAddr(1) {
		t.Errorf("path %q, uri %q: %d %v, want 200 with the wallet", e.Path, e.URI, status, body)
	}
}
