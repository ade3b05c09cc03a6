package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/walletauth"
)

// TestClientWalletProofsNeverReachTheUpstream: a client's wallet proofs
// (X-Wallet-Auth, SIGN-IN-WITH-X) are bearer credentials until they
// expire, and README promises they are never forwarded upstream. A gated
// route without wallet_auth (README's seller Caddyfile: x402,
// verify_response, reverse_proxy to the seller's agent) must drop them as
// wallet_auth does; and where wallet_auth does run, in any order the
// Caddyfile lets a route put it beside the gate, it must still verify the
// proof the client sent and tell the upstream the wallet.
func TestClientWalletProofsNeverReachTheUpstream(t *testing.T) {
	up := walletUpstream(t)
	gate := `x402 {
			accept devnet $0.02 ` + cfgPayTo + `
			facilitator http http://127.0.0.1:1
			store badger {data}/gate
			free_allowance {
				per_day 5
			}
		}`
	walletAuth := `wallet_auth required {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}`
	proxy := "reverse_proxy " + strings.TrimPrefix(up.URL, "http://")
	for _, tc := range []struct {
		name, site string
		wallet     bool // the route runs wallet_auth
	}{
		{"gate without wallet_auth", "route /api/* {\n\t\t" + gate + "\n\t\t" + proxy + "\n\t}", false},
		// README's form: wallet_auth first in the route.
		{"wallet_auth then gate in a route", "route /api/* {\n\t\t" + walletAuth + "\n\t\t" + gate + "\n\t\t" + proxy + "\n\t}", true},
		// Outside route the directive order puts wallet_auth first
		// whatever the order written.
		{"directive order", gate + "\n\t" + walletAuth + "\n\t" + proxy, true},
		// Handlers in a route run as written: here the gate runs first,
		// and wallet_auth must still see the proof.
		{"gate then wallet_auth in a route", "route /api/* {\n\t\t" + gate + "\n\t\t" + walletAuth + "\n\t\t" + proxy + "\n\t}", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := startCaddy(t, fmt.Sprintf(":{port} {\n\t%s\n}\n", tc.site))
			url := base + "/api/items"
			st, _, body := walletCall(t, "POST", url, `{"a":1}`, map[string]string{
				walletauth.HeaderName:     walletProof(t, walletKey(3), "POST", url, nil),
				walletauth.SIWXHeaderName: "SIWX-MARK",
			})
			if st != http.StatusOK {
				t.Fatalf("free call with a proof: %d %v", st, body)
			}
			if body["wallet_auth"] != "" || body["siwx"] != "" {
				t.Errorf("the upstream received the client's proofs: X-Wallet-Auth %q, SIGN-IN-WITH-X %q", body["wallet_auth"], body["siwx"])
			}
			if body["payment"] != "free" {
				t.Errorf("the upstream was told payment %q, want free", body["payment"])
			}
			want := ""
			if tc.wallet {
				want = walletAddr(3)
			}
			if body["wallet"] != want {
				t.Errorf("the upstream was told wallet %q, want %q", body["wallet"], want)
			}
			if tc.wallet {
				// required still refuses a request without a proof.
				st, hdr, body := walletCall(t, "POST", url, `{"a":1}`, nil)
				wantUnauthorized(t, st, hdr, body, "X-Wallet-Auth")
			}
		})
	}
}
