package caddymodule

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// TestSignInWithXAccessRenewsWithEachPayment: a wallet charged again for
// a resource keeps its sign-in access siwx_access_ttl from its latest
// payment, not its first. The sign-in that must be let in is timed from
// when the second payment was sent, in the middle of the 4 s between the
// first payment's access ending and the second's, so however long the
// second settlement takes on a loaded machine it falls where only the
// renewal lets it in.
func TestSignInWithXAccessRenewsWithEachPayment(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	base := startCaddy(t, siwxOfferedSite(up.URL, fac, "6s"))
	url := base + "/report/q9"
	payFor(t, url, 8)
	time.Sleep(4 * time.Second)
	sent := time.Now()
	payFor(t, url, 8) // charged again
	renewed := time.Now()
	time.Sleep(time.Until(sent.Add(3 * time.Second)))
	if st := signInStatus(t, url, 8); st != 200 {
		t.Errorf("sign-in 7s after the first payment, 3s after the second was sent (siwx_access_ttl 6s): %d, want 200", st)
	}
	time.Sleep(time.Until(renewed.Add(6500 * time.Millisecond)))
	if st := signInStatus(t, url, 8); st != http.StatusPaymentRequired {
		t.Errorf("sign-in after the second payment's access ended: %d, want 402", st)
	}
}

// signInStatus signs in on url with development wallet i's sign-in-with-x
// proof for url's challenge, and returns the status.
func signInStatus(t *testing.T, url string, i int) int {
	t.Helper()
	info, _ := siwxChallengeOf(t, url)
	s := walletauth.SIWXFromChallenge(info, x402.NetworkDevnet)
	if err := s.Sign(walletKey(i)); err != nil {
		t.Fatal(err)
	}
	h, _ := s.Encode()
	st, _, _ := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: h})
	return st
}

// TestSignInWithXAccessIsNotRenewedByAPaymentIDRetry: a payment_identifier
// retry gets the saved answer of the one settlement, and charges nothing:
// the wallet's access still ends siwx_access_ttl after that settlement.
func TestSignInWithXAccessIsNotRenewedByAPaymentIDRetry(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	site := strings.Replace(siwxOfferedSite(up.URL, fac, "3s"), "store badger {data}/gate\n\t\t}\n\t\treverse_proxy",
		"store badger {data}/gate\n\t\t\tpayment_identifier optional\n\t\t}\n\t\treverse_proxy", 1)
	if !strings.Contains(site, "payment_identifier") {
		t.Fatal("the site has no payment_identifier")
	}
	base := startCaddy(t, site)
	url := base + "/report/renew1"
	sig := signWithID(t, paymentRequired(t, getWith(t, url, "", nil)), walletKey(7), "pay_siwx_renew_retry_0001")
	if resp := getWith(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		t.Fatalf("payment: %d", resp.StatusCode)
	}
	paid := time.Now()
	time.Sleep(2 * time.Second)
	if resp := getWith(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		t.Fatalf("retry with the same payment: %d", resp.StatusCode)
	}
	time.Sleep(time.Until(paid.Add(3500 * time.Millisecond)))
	if st := signInStatus(t, url, 7); st != http.StatusPaymentRequired {
		t.Errorf("sign-in 3.5s after the only settlement (siwx_access_ttl 3s), its retry at 2s: %d, want 402", st)
	}
}

// TestSignInWithXAccessIsNotRenewedByAHeldAnswerReplay: a settlement whose
// reply was lost grants access when its retry learns it settled, and the
// held answer served again to later retries renews nothing.
func TestSignInWithXAccessIsNotRenewedByAHeldAnswerReplay(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	site := strings.Replace(siwxOfferedSite(up.URL, fac, "3s"), "facilitator http {\n\t\t\t\turl "+fac+"\n\t\t\t}", "facilitator faulty_devnet lose_reply", 1)
	if !strings.Contains(site, "faulty_devnet") {
		t.Fatal("the site has no faulty facilitator")
	}
	base := startCaddy(t, site)
	url := base + "/report/held1"
	pr := paymentRequired(t, getWith(t, url, "", nil))
	p, err := x402.SignExactEVM(walletKey(9), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, _ := x402.EncodeHeader(p)
	if resp := getWith(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("payment whose settlement reply is lost: %d, want 503", resp.StatusCode)
	}
	if resp := getWith(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		t.Fatalf("retry: %d", resp.StatusCode)
	}
	resolved := time.Now()
	if st := signInStatus(t, url, 9); st != 200 {
		t.Fatalf("sign-in after the retry learned the payment settled: %d, want 200", st)
	}
	time.Sleep(2 * time.Second)
	if resp := getWith(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		t.Fatalf("second retry: %d", resp.StatusCode)
	}
	time.Sleep(time.Until(resolved.Add(3500 * time.Millisecond)))
	if st := signInStatus(t, url, 9); st != http.StatusPaymentRequired {
		t.Errorf("sign-in 3.5s after the settlement was learned (siwx_access_ttl 3s), the held answer replayed at 2s: %d, want 402", st)
	}
}
