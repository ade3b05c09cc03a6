package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// nestedWalletSite has a site-wide wallet_auth (optional, with siwx, and
// a second site name) in front of routes with their own wallet_auth,
// which know only 127.0.0.1:{port} and have no siwx: /req/* required,
// /opt/* optional, and /who/* optional answering from the placeholders.
func nestedWalletSite(up string) string {
	inner := func(mode string) string {
		return `wallet_auth ` + mode + ` {
				store badger {data}/gate
				domains 127.0.0.1:{port}
			}`
	}
	return fmt.Sprintf(`:{port} {
	route {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port} other.example
			siwx
		}
		route /req/* {
			%[2]s
			reverse_proxy %[1]s
		}
		route /opt/* {
			%[3]s
			reverse_proxy %[1]s
		}
		route /who/* {
			%[3]s
			respond "{http.auth.wallet.address}|{http.auth.user.id}"
		}
	}
}
`, strings.TrimPrefix(up, "http://"), inner("required"), inner("optional"))
}

// TestNestedWalletAuthKeepsTheProvenWallet: behind a site-wide
// wallet_auth, a route's own wallet_auth judges the same proofs by its own
// settings. It accepts the X-Wallet-Auth proof the first verified, without
// claiming its nonce again, and the upstream and the placeholders keep the
// wallet. (Before: the first took the proofs, so the second refused the
// request 401 "is missing" in mode required, and in mode optional removed
// X-Aov-Wallet and blanked the placeholders.) The proof stays single-use,
// a route's own domains still refuse a proof for a name only the
// site-wide one knows, and a wallet signed in with SIGN-IN-WITH-X by the
// site-wide one stays for a route's wallet_auth without siwx, whose mode
// required still asks for an X-Wallet-Auth proof.
func TestNestedWalletAuthKeepsTheProvenWallet(t *testing.T) {
	up := walletUpstream(t)
	base := startCaddy(t, nestedWalletSite(up.URL))
	host := strings.TrimPrefix(base, "http://")

	url := base + "/req/items"
	proof := walletProof(t, walletKey(1), "POST", url, nil)
	t.Run("a route's required wallet_auth accepts the proof the site-wide one verified", func(t *testing.T) {
		st, _, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: proof})
		if st != 200 || body["wallet"] != walletAddr(1) || body["wallet_auth"] != "" {
			t.Fatalf("status %d, upstream saw %v (want 200, wallet %s, no proof)", st, body, walletAddr(1))
		}
	})
	t.Run("the proof is still single-use", func(t *testing.T) {
		st, hdr, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: proof})
		wantUnauthorized(t, st, hdr, body, walletauth.HeaderName+".nonce")
	})
	t.Run("a route's optional wallet_auth keeps the wallet", func(t *testing.T) {
		url := base + "/opt/items"
		st, _, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: walletProof(t, walletKey(2), "POST", url, nil)})
		if st != 200 || body["wallet"] != walletAddr(2) {
			t.Fatalf("status %d, upstream saw %v (want 200, wallet %s)", st, body, walletAddr(2))
		}
		url = base + "/who/me"
		st, _, body = walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: walletProof(t, walletKey(2), "GET", url, nil)})
		if want := walletAddr(2) + "|" + walletAddr(2); st != 200 || body["text"] != want {
			t.Fatalf("placeholders: status %d, %v (want %q)", st, body, want)
		}
	})
	t.Run("a route's own domains judge the proof", func(t *testing.T) {
		st, hdr, body := walletCall(t, "POST", url, "{}", map[string]string{walletauth.HeaderName: walletProof(t, walletKey(1), "POST", "http://other.example/req/items", nil)})
		wantUnauthorized(t, st, hdr, body, walletauth.HeaderName+".domain")
	})

	signIn := func(t *testing.T, uri string) string {
		t.Helper()
		s := walletauth.SIWXFromChallenge(walletauth.SIWXChallenge(host, uri, []string{x402.NetworkDevnet}, time.Now())["info"].(map[string]any), x402.NetworkDevnet)
		if err := s.Sign(walletKey(3)); err != nil {
			t.Fatal(err)
		}
		h, err := s.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	t.Run("a wallet signed in by the site-wide wallet_auth stays for a route's without siwx", func(t *testing.T) {
		url := base + "/who/me"
		st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: signIn(t, url)})
		if want := walletAddr(3) + "|" + walletAddr(3); st != 200 || body["text"] != want {
			t.Fatalf("placeholders: status %d, %v (want %q)", st, body, want)
		}
	})
	t.Run("a route's required wallet_auth without siwx still asks for X-Wallet-Auth", func(t *testing.T) {
		url := base + "/req/items"
		st, hdr, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: signIn(t, url)})
		wantUnauthorized(t, st, hdr, body, walletauth.HeaderName)
	})
}

// TestSiteWideWalletAuthLeavesSignInWithXToTheRoute: a site-wide
// wallet_auth without siwx (per-wallet features elsewhere on the site) in
// front of a route whose own wallet_auth has siwx. A wallet that paid for
// the resource and signs in with the 402's sign-in-with-x challenge is let
// in on its earlier payment. (Before: the site-wide one took the
// SIGN-IN-WITH-X proof off the request without reading it, so the route's
// never saw it, and the buyer was asked to pay again.)
func TestSiteWideWalletAuthLeavesSignInWithXToTheRoute(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := walletUpstream(t)
	inner := siwxOfferedSite(up.URL, fac, "")
	inner = strings.TrimPrefix(inner, ":{port} {\n")
	inner = strings.TrimSuffix(strings.TrimSpace(inner), "}")
	base := startCaddy(t, `:{port} {
	route {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
`+inner+`
	}
}
`)
	url := base + "/report/seller-7"
	payFor(t, url, 6)
	info, _ := siwxChallengeOf(t, url)
	s := walletauth.SIWXFromChallenge(info, x402.NetworkDevnet)
	if err := s.Sign(walletKey(6)); err != nil {
		t.Fatal(err)
	}
	h, _ := s.Encode()
	if st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: h}); st != 200 || body["wallet"] != walletAddr(6) || body["payment"] != "" {
		t.Fatalf("the payer's sign-in: status %d, upstream saw %v (want 200 as wallet %s, on its earlier payment, no X-Aov-Payment)", st, body, walletAddr(6))
	}
}

// TestDuplicateSignInWithXNamesItsHeader: a request that sends
// SIGN-IN-WITH-X twice (and no X-Wallet-Auth) is refused 401 naming
// SIGN-IN-WITH-X, the header to mend. (Before: the refusal named
// X-Wallet-Auth, which the client never sent.)
func TestDuplicateSignInWithXNamesItsHeader(t *testing.T) {
	up := walletUpstream(t)
	base := startCaddy(t, nestedWalletSite(up.URL))
	// walletCall sends "a\x00b" as two headers.
	st, hdr, body := walletCall(t, "GET", base+"/who/me", "", map[string]string{walletauth.SIWXHeaderName: "a\x00b"})
	wantUnauthorized(t, st, hdr, body, walletauth.SIWXHeaderName)
}

// fakeChainRPC is a FAKE FOR A FAULT in front of a real chain's rpcURL: a
// chain_rpc that fails one call, or stalls on one until told, which a real
// node cannot be made to do on demand. It forwards every JSON-RPC call,
// but first passes each eth_call's number (from 1) to onCall, which may
// block; when it returns true the call is answered with a provider's
// internal error (-32603) instead.
func fakeChainRPC(t *testing.T, rpcURL string, onCall func(n int32) (fail bool)) *httptest.Server {
	t.Helper()
	var calls atomic.Int32
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.Unmarshal(body, &req)
		w.Header().Set("Content-Type", "application/json")
		if req.Method == "eth_call" && onCall(calls.Add(1)) {
			w.Write([]byte(`{"jsonrpc":"2.0","id":` + string(req.ID) + `,"error":{"code":-32603,"message":"internal error"}}`))
			return
		}
		resp, err := http.Post(rpcURL, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(s.Close)
	return s
}

// nestedContractWalletSite is a site-wide wallet_auth (optional) and a
// route's own (/api/*, required), both checking contract wallets at rpc,
// and a gate on /paid/* with the server's rate limit, 3 a minute.
func nestedContractWalletSite(up, rpc, fac string) string {
	return fmt.Sprintf(`:{port} {
	route {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			chain_rpc %[2]s
		}
		route /api/* {
			wallet_auth required {
				store badger {data}/gate
				domains 127.0.0.1:{port}
				chain_rpc %[2]s
			}
			reverse_proxy %[1]s
		}
		route /paid/* {
			x402 {
				accept devnet $0.01 %[4]s
				facilitator http {
					url %[3]s
				}
				store badger {data}/gate
				rate_limit 3 1m
			}
			reverse_proxy %[1]s
		}
	}
}
`, strings.TrimPrefix(up, "http://"), rpc, fac, payTo.Hex())
}

// contractWalletProof deploys a contract wallet of key i's account on d
// and returns it with its proof for GET url.
func contractWalletProof(t *testing.T, d *evmfacilitator.Devnet, i int, url string) (common.Address, string) {
	t.Helper()
	owner := walletKey(i)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wallet, err := d.DeployTestWallet(ctx, crypto.PubkeyToAddress(owner.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	e, err := walletauth.New(walletauth.Request{Method: "GET", URL: url, ChainID: "eip155:1337", Now: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SignAs(owner, wallet); err != nil {
		t.Fatal(err)
	}
	proof, err := e.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return wallet, proof
}

// TestNestedWalletAuthChainFailureLeavesTheProofUsable: behind a
// site-wide wallet_auth, a route's own checks a contract wallet's proof
// at the chain again, and that check fails (the RPC errs once): the 503
// is retryable and the proof stays usable, as when one wallet_auth alone
// cannot reach the chain, so the retry of the same proof is served, once.
// (Before: the site-wide one had claimed the nonce, and the retry was
// refused 401 "nonce was already used".)
func TestNestedWalletAuthChainFailureLeavesTheProofUsable(t *testing.T) {
	d, fac := sharedDevnet(t)
	// eth_call 1 is the site-wide check's, 2 the route's.
	rpc := fakeChainRPC(t, d.RPCURL(), func(n int32) bool { return n == 2 })
	up := walletUpstream(t)
	base := startCaddy(t, nestedContractWalletSite(up.URL, rpc.URL, fac))
	url := base + "/api/x"
	wallet, proof := contractWalletProof(t, d, 3, url)
	hdr := map[string]string{walletauth.HeaderName: proof}
	if st, _, body := walletCall(t, "GET", url, "", hdr); st != http.StatusServiceUnavailable || body["retryable"] != true {
		t.Fatalf("the route's chain check failing: %d %v, want 503, retryable", st, body)
	}
	if st, _, body := walletCall(t, "GET", url, "", hdr); st != 200 || body["wallet"] != wallet.Hex() {
		t.Fatalf("the retry of the proof: %d %v, want 200 as %s", st, body, wallet.Hex())
	}
	st, h, body := walletCall(t, "GET", url, "", hdr)
	wantUnauthorized(t, st, h, body, walletauth.HeaderName+".nonce")
}

// TestNestedWalletAuthDoesNotRateLimitAVerifiedProof: a route's own
// wallet_auth behind a site-wide one does not hold the server's rate limit
// against a request whose proofs the site-wide one verified, which passed
// it there: SPEC §9 answers 429 before a proof is checked, never after its
// nonce is claimed. Here the client's budget runs out (three malformed
// proofs) while its contract wallet's proof is at the chain in the
// site-wide check, and the request is served. (Before: the route's
// wallet_auth answered it 429, its nonce claimed, and the proof sent
// again once the budget was back was refused 401 "nonce was already
// used".)
func TestNestedWalletAuthDoesNotRateLimitAVerifiedProof(t *testing.T) {
	d, fac := sharedDevnet(t)
	atChain, resume := make(chan struct{}), make(chan struct{})
	rpc := fakeChainRPC(t, d.RPCURL(), func(n int32) bool {
		if n == 1 {
			close(atChain)
			<-resume
		}
		return false
	})
	var resumed atomic.Bool
	resumeOnce := func() {
		if resumed.CompareAndSwap(false, true) {
			close(resume)
		}
	}
	t.Cleanup(resumeOnce) // before the fake closes, which waits for the call
	up := walletUpstream(t)
	base := startCaddy(t, nestedContractWalletSite(up.URL, rpc.URL, fac))
	url := base + "/api/x"
	wallet, proof := contractWalletProof(t, d, 4, url)
	hdr := map[string]string{walletauth.HeaderName: proof}
	type answer struct {
		st   int
		body map[string]any
	}
	done := make(chan answer, 1)
	go func() {
		st, _, body := walletCall(t, "GET", url, "", hdr)
		done <- answer{st, body}
	}()
	<-atChain
	for range 3 {
		if st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: "not-a-proof"}); st != http.StatusUnauthorized {
			t.Fatalf("a malformed proof: %d %v, want 401", st, body)
		}
	}
	resumeOnce()
	if a := <-done; a.st != 200 || a.body["wallet"] != wallet.Hex() {
		t.Fatalf("the proof's request: %d %v, want 200 as %s", a.st, a.body, wallet.Hex())
	}
}

// TestWalletAuthAfterTheUpstreamKeepsTheNonce: a wallet_auth that runs
// after the upstream answered (in reverse_proxy's handle_response) and
// cannot check the proof at the chain answers 503, but the nonce the
// route's wallet_auth claimed stays claimed: the upstream served the
// request, so the same proof sent again is a replay, refused 401.
func TestWalletAuthAfterTheUpstreamKeepsTheNonce(t *testing.T) {
	d, _ := sharedDevnet(t)
	// eth_call 1 is the route's check, 2 the one after the upstream.
	rpc := fakeChainRPC(t, d.RPCURL(), func(n int32) bool { return n == 2 })
	var served atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
	}))
	t.Cleanup(up.Close)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /api/* {
		wallet_auth required {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			chain_rpc %[2]s
		}
		reverse_proxy %[1]s {
			@ok status 2xx
			handle_response @ok {
				wallet_auth required {
					store badger {data}/gate
					domains 127.0.0.1:{port}
					chain_rpc %[2]s
				}
				respond "answered"
			}
		}
	}
}
`, strings.TrimPrefix(up.URL, "http://"), rpc.URL))
	url := base + "/api/x"
	_, proof := contractWalletProof(t, d, 5, url)
	hdr := map[string]string{walletauth.HeaderName: proof}
	if st, _, body := walletCall(t, "GET", url, "", hdr); st != http.StatusServiceUnavailable || served.Load() != 1 {
		t.Fatalf("the check after the upstream failing: %d %v, upstream served %d, want 503 after the upstream served it once", st, body, served.Load())
	}
	st, h, body := walletCall(t, "GET", url, "", hdr)
	wantUnauthorized(t, st, h, body, walletauth.HeaderName+".nonce")
}

// TestWalletAuthInHandleErrorsKeepsTheNonce: a wallet_auth in
// handle_errors runs after the route's wallet_auth passed the request on
// and its handlers answered (here with an error); when it cannot check the
// proof at the chain it answers 503, but the nonce the route's
// wallet_auth claimed stays claimed: the same proof sent again is a
// replay, refused 401.
func TestWalletAuthInHandleErrorsKeepsTheNonce(t *testing.T) {
	d, _ := sharedDevnet(t)
	// eth_call 1 is the route's check, 2 the one in handle_errors.
	rpc := fakeChainRPC(t, d.RPCURL(), func(n int32) bool { return n == 2 })
	check := fmt.Sprintf(`wallet_auth required {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			chain_rpc %s
		}`, rpc.URL)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /api/* {
		%[1]s
		error "gone" 410
	}
	handle_errors {
		%[1]s
		respond "error {err.status_code}"
	}
}
`, check))
	url := base + "/api/x"
	_, proof := contractWalletProof(t, d, 6, url)
	hdr := map[string]string{walletauth.HeaderName: proof}
	if st, _, body := walletCall(t, "GET", url, "", hdr); st != http.StatusServiceUnavailable {
		t.Fatalf("the check in handle_errors failing: %d %v, want 503", st, body)
	}
	st, h, body := walletCall(t, "GET", url, "", hdr)
	wantUnauthorized(t, st, h, body, walletauth.HeaderName+".nonce")
}
