package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// gateBehindWalletAuth is a route whose wallet_auth (optional) passes a
// request on, through the handlers between (if any), to a gate, whose facilitator answers 503 on path (/verify or
// /settle) while down is set. The gate's upstream is reverse_proxy, whose
// runs served counts, or with respond, Caddy's own handler, which names
// the wallet.
type gateBehindWalletAuth struct {
	url    string // the gated resource
	down   atomic.Bool
	served atomic.Int32
}

func startGateBehindWalletAuth(t *testing.T, path string, respond bool, between string) *gateBehindWalletAuth {
	t.Helper()
	_, fac := sharedDevnet(t)
	s := &gateBehindWalletAuth{}
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path == path && s.down.Load() {
			http.Error(w, "down for a moment", http.StatusServiceUnavailable)
			return
		}
		if resp, reply, ok := relayTo(w, r, fac, body); ok {
			passOn(w, resp, reply)
		}
	}))
	t.Cleanup(proxy.Close)
	up := walletUpstream(t)
	counted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.served.Add(1)
		up.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(counted.Close)
	upstream := "reverse_proxy " + strings.TrimPrefix(counted.URL, "http://")
	if respond {
		upstream = `respond "{http.auth.wallet.address}"`
	}
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /paid/* {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		%[4]s
		x402 {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		%[1]s
	}
}
`, upstream, proxy.URL, payTo.Hex(), between))
	s.url = base + "/paid/x"
	return s
}

// paidProofCall is a GET of url with key i's wallet proof and payment.
func paidProofCall(t *testing.T, url string, i int) map[string]string {
	t.Helper()
	pr := paymentRequired(t, getWith(t, url, "", nil))
	p, err := x402.SignExactEVM(walletKey(i), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		walletauth.HeaderName:       walletProof(t, walletKey(i), "GET", url, nil),
		x402.HeaderPaymentSignature: sig,
	}
}

// TestGateRetryableRefusalGivesTheProofBack: SPEC §9, a proof whose
// request is refused with a retryable answer is not used up unless the
// request reached an upstream or was answered. wallet_auth passes a paid
// request to the gate behind it, whose facilitator's /verify is down
// once: the gate answers 503, retryable, nothing charged, the upstream
// never ran, and the client's retry of the same request (the same proof,
// the same payment) is served. (Before: only wallet_auth's own refusals
// gave a nonce back, and the retry was refused 401 "nonce was already
// used".)
func TestGateRetryableRefusalGivesTheProofBack(t *testing.T) {
	s := startGateBehindWalletAuth(t, "/verify", false, "")
	hdr := paidProofCall(t, s.url, 5)
	s.down.Store(true)
	st, _, body := walletCall(t, "GET", s.url, "", hdr)
	s.down.Store(false)
	if st != http.StatusServiceUnavailable || body["retryable"] != true || s.served.Load() != 0 {
		t.Fatalf("with /verify down: %d %v, upstream ran %d times; want 503 retryable, upstream not run", st, body, s.served.Load())
	}
	st, _, body = walletCall(t, "GET", s.url, "", hdr)
	if st != 200 || body["wallet"] != walletAddr(5) {
		t.Fatalf("the retry of the same request after the gate's retryable 503 (nothing served): %d %v, want 200 as %s", st, body, walletAddr(5))
	}
	st, h, body := walletCall(t, "GET", s.url, "", hdr)
	wantUnauthorized(t, st, h, body, walletauth.HeaderName+".nonce")
}

// TestGateRetryableRefusalAfterTheUpstreamKeepsTheProof: a gate behind
// wallet_auth that ran its upstream (Caddy's respond, not a proxy) and
// then answers retryably (its facilitator's /settle is down: the
// payment's outcome is not known) keeps the proof used up: the upstream
// may have served the request, so the same proof sent again is a replay,
// refused 401.
func TestGateRetryableRefusalAfterTheUpstreamKeepsTheProof(t *testing.T) {
	s := startGateBehindWalletAuth(t, "/settle", true, "")
	hdr := paidProofCall(t, s.url, 4)
	s.down.Store(true)
	st, _, body := walletCall(t, "GET", s.url, "", hdr)
	s.down.Store(false)
	if st != http.StatusServiceUnavailable || body["retryable"] != true {
		t.Fatalf("with /settle down: %d %v; want 503 retryable", st, body)
	}
	st, h, body := walletCall(t, "GET", s.url, "", hdr)
	wantUnauthorized(t, st, h, body, walletauth.HeaderName+".nonce")
}

// TestGateRetryableRefusalBehindForwardAuthGivesTheProofBack: an auth
// check is no upstream of the request. A forward_auth between wallet_auth
// and the gate asks its auth service about the request (which allows it)
// and passes it on; the gate's facilitator's /verify is down, so the gate
// answers 503 retryable before its upstream ran, and the client's retry of
// the same request is served. (Before: the gate's refusal kept the nonce
// once any reverse_proxy had chosen an upstream for the request, and
// forward_auth's check is one, so the retry was refused 401 "nonce was
// already used".)
func TestGateRetryableRefusalBehindForwardAuthGivesTheProofBack(t *testing.T) {
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(auth.Close)
	s := startGateBehindWalletAuth(t, "/verify", false, fmt.Sprintf(`forward_auth %s {
			uri /auth
		}`, strings.TrimPrefix(auth.URL, "http://")))
	hdr := paidProofCall(t, s.url, 6)
	s.down.Store(true)
	st, _, body := walletCall(t, "GET", s.url, "", hdr)
	s.down.Store(false)
	if st != http.StatusServiceUnavailable || body["retryable"] != true || s.served.Load() != 0 {
		t.Fatalf("with /verify down: %d %v, upstream ran %d times; want 503 retryable, upstream not run", st, body, s.served.Load())
	}
	st, _, body = walletCall(t, "GET", s.url, "", hdr)
	if st != 200 || body["wallet"] != walletAddr(6) {
		t.Fatalf("the retry of the same request after the gate's retryable 503 (only forward_auth's auth check ran): %d %v, want 200 as %s", st, body, walletAddr(6))
	}
}
