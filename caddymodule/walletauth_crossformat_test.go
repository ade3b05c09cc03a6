package caddymodule

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// A consumed X-Wallet-Auth header, its fields copied into a
// SIGN-IN-WITH-X proof (the same signed text) and sent on another path and
// method, is refused with 401 and never reaches the upstream as the
// victim's wallet; a real sign-in-with-x proof and a fresh X-Wallet-Auth
// still pass.
func TestWalletAuthHeaderIsNotASignInWithX(t *testing.T) {
	up := walletUpstream(t)
	base := startCaddy(t, walletSite(up.URL, "optional", "siwx"))
	first := base + "/api/verify"
	h := walletProof(t, walletKey(2), "POST", first, func(r *walletauth.Request) { r.AgentID = "victim" })
	if code, _, body := walletCall(t, "POST", first, "{}", map[string]string{walletauth.HeaderName: h}); code != 200 || body["wallet"] != walletAddr(2) {
		t.Fatalf("the victim's own call: %d %v", code, body)
	}
	e, err := walletauth.Parse(h)
	if err != nil {
		t.Fatal(err)
	}
	s := &walletauth.SIWX{Domain: e.Domain, Address: e.Address, URI: e.URI, Version: e.Version, ChainID: e.ChainID,
		Type: e.Type, Nonce: e.Nonce, IssuedAt: e.IssuedAt, ExpirationTime: e.ExpirationTime,
		Resources: []string{walletauth.MethodURN(e.Method), walletauth.AgentURN(e.AgentID)}, Signature: e.Signature}
	if s.Message() != e.Message() {
		t.Fatal("the copy does not sign the same text: the test proves nothing")
	}
	sh, err := s.Encode()
	if err != nil {
		t.Fatal(err)
	}
	code, hdr, body := walletCall(t, "GET", base+"/api/somewhere-else", "", map[string]string{walletauth.SIWXHeaderName: sh})
	wantUnauthorized(t, code, hdr, body, "SIGN-IN-WITH-X.resources")
	if strings.Contains(body["message"].(string), "x-wallet-auth:method:POST") {
		t.Errorf("the refusal echoes the proof: %v", body)
	}

	// A genuine sign-in by the same wallet, and a fresh X-Wallet-Auth.
	host := strings.TrimPrefix(base, "http://")
	uri := base + "/api/somewhere-else"
	in := walletauth.SIWXFromChallenge(walletauth.SIWXChallenge(host, uri, []string{x402.NetworkDevnet}, time.Now())["info"].(map[string]any), x402.NetworkDevnet)
	if err := in.Sign(walletKey(2)); err != nil {
		t.Fatal(err)
	}
	ih, _ := in.Encode()
	if code, _, body := walletCall(t, "GET", uri, "", map[string]string{walletauth.SIWXHeaderName: ih}); code != http.StatusOK || body["wallet"] != walletAddr(2) {
		t.Fatalf("a genuine sign-in: %d %v", code, body)
	}
	again := walletProof(t, walletKey(2), "POST", first, nil)
	if code, _, body := walletCall(t, "POST", first, "{}", map[string]string{walletauth.HeaderName: again}); code != http.StatusOK || body["wallet"] != walletAddr(2) {
		t.Fatalf("a fresh X-Wallet-Auth: %d %v", code, body)
	}
}
