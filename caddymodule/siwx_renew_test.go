package caddymodule

import (
	"net/http"
	"testing"
	"time"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// TestSignInWithXAccessRenewsWithEachPayment: a wallet charged again for
// a resource keeps its sign-in access siwx_access_ttl from its latest
// payment, not its first.
func TestSignInWithXAccessRenewsWithEachPayment(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, siwxOfferedSite(up.URL, fac, "3s"))
	url := base + "/report/q9"
	signIn := func() int {
		t.Helper()
		info, _ := siwxChallengeOf(t, url)
		s := walletauth.SIWXFromChallenge(info, x402.NetworkDevnet)
		if err := s.Sign(walletKey(8)); err != nil {
			t.Fatal(err)
		}
		h, _ := s.Encode()
		st, _, _ := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: h})
		return st
	}
	payFor(t, url, 8)
	time.Sleep(2 * time.Second)
	payFor(t, url, 8) // charged again
	time.Sleep(1500 * time.Millisecond)
	if st := signIn(); st != 200 {
		t.Errorf("sign-in 3.5s after the first payment, 1.5s after the second (siwx_access_ttl 3s): %d, want 200", st)
	}
	time.Sleep(2 * time.Second)
	if st := signIn(); st != http.StatusPaymentRequired {
		t.Errorf("sign-in after the second payment's access ended: %d, want 402", st)
	}
}
