package caddymodule

import (
	"fmt"
	"strings"
	"testing"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// TestNestedSIWXRecordsPaidAccessForEach: a site-wide wallet_auth with
// siwx (its own store) in front of a route whose wallet_auth (siwx, the
// gate's store) checks GETs. A wallet pays with a GET, and each
// wallet_auth records its paid access, as it would alone: the payer's
// later sign-in with a POST, which only the site-wide one checks, is let
// in on that payment. (Before: the route's wallet_auth replaced the
// request's wait for the settlement, so the gate told only the route's,
// the site-wide one recorded nothing, and the payer was asked to pay
// again.)
func TestNestedSIWXRecordsPaidAccessForEach(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route {
		wallet_auth optional {
			store badger {data}/site
			domains 127.0.0.1:{port}
			siwx
		}
		route /report/* {
			@get method GET
			wallet_auth @get optional {
				store badger {data}/gate
				domains 127.0.0.1:{port}
				siwx
			}
			@unpaid not vars {http.auth.wallet.paid_access} true
			x402 @unpaid {
				accept devnet $0.01 %[3]s
				siwx 127.0.0.1:{port}
				facilitator http {
					url %[2]s
				}
				store badger {data}/gate
			}
			reverse_proxy %[1]s
		}
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	url := base + "/report/seller-9"
	payFor(t, url, 6)
	info, _ := siwxChallengeOf(t, url)
	signIn := func() string {
		s := walletauth.SIWXFromChallenge(info, x402.NetworkDevnet)
		if err := s.Sign(walletKey(6)); err != nil {
			t.Fatal(err)
		}
		h, err := s.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	if st, _, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.SIWXHeaderName: signIn()}); st != 200 || body["wallet"] != walletAddr(6) {
		t.Fatalf("the payer's sign-in, checked by the site-wide wallet_auth alone: %d %v, want 200 as %s on its earlier payment", st, body, walletAddr(6))
	}
	info, _ = siwxChallengeOf(t, url) // a fresh nonce
	if st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: signIn()}); st != 200 || body["wallet"] != walletAddr(6) {
		t.Fatalf("the payer's sign-in, checked by both: %d %v, want 200 as %s on its earlier payment", st, body, walletAddr(6))
	}
}
