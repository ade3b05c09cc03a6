package caddymodule

import (
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// TestSignInWithXIsBoundToItsResource: a sign-in-with-x proof is good for
// the resource whose challenge it signed (its uri: the path, any query),
// and refused (401 naming its uri) on any other path of the site, so one
// captured for GET /report/q3 cannot act as its wallet on POST /api/items.
func TestSignInWithXIsBoundToItsResource(t *testing.T) {
	up := walletUpstream(t)
	base := startCaddy(t, walletSite(up.URL, "required", "siwx"))
	host := strings.TrimPrefix(base, "http://")
	signed := func(uri string) string {
		t.Helper()
		s := walletauth.SIWXFromChallenge(walletauth.SIWXChallenge(host, uri, []string{x402.NetworkDevnet}, time.Now())["info"].(map[string]any), x402.NetworkDevnet)
		if err := s.Sign(walletKey(5)); err != nil {
			t.Fatal(err)
		}
		h, _ := s.Encode()
		return h
	}
	items := base + "/api/items"
	for _, tc := range []struct {
		desc, signedFor, sentTo string
		ok                      bool
	}{
		{"a proof for the request's path", items, items, true},
		{"a proof for the path, sent with a query", items, items + "?page=2", true},
		{"a proof for another route's path", base + "/report/q3", items, false},
		{"a proof for a sub-path", items + "/7", items, false},
		{"a proof whose uri has a query", items + "?page=2", items, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			st, hdr, body := walletCall(t, "POST", tc.sentTo, `{}`, map[string]string{walletauth.SIWXHeaderName: signed(tc.signedFor)})
			if tc.ok {
				if st != 200 || body["wallet"] != walletAddr(5) {
					t.Fatalf("%d %v, want 200 as wallet 5", st, body)
				}
				return
			}
			if body["wallet"] != nil {
				t.Errorf("the upstream saw wallet %v", body["wallet"])
			}
			wantUnauthorized(t, st, hdr, body, "SIGN-IN-WITH-X.uri")
		})
	}
}
