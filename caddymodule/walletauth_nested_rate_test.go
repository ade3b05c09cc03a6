package caddymodule

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/walletauth"
)

// TestNestedWalletAuthRecheckHoldsAProofSlot: README (rate_limit): "A
// wallet_auth proof's check holds a slot of its own kind ... so at most
// events of a client's proof checks run at once". A route's wallet_auth
// checking again, at the chain, a contract wallet's proof the site-wide
// one verified holds one of the client's proof slots as the first check
// did: with rate_limit 1 and that check at the chain, a second proof of
// the client is answered 429 before any work. The first request is then
// served. (Before: the site-wide one gave its slot back before the
// route's ran, and the route's took none for a verified proof, so the
// second request's two checks both ran at the chain beside the first's.)
func TestNestedWalletAuthRecheckHoldsAProofSlot(t *testing.T) {
	d, fac := sharedDevnet(t)
	atChain, resume := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	// eth_call 1 is the first request's site-wide check, 2 its route's.
	rpc := fakeChainRPC(t, d.RPCURL(), func(n int32) bool {
		calls.Store(n)
		if n == 2 {
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
	site := strings.Replace(nestedContractWalletSite(up.URL, rpc.URL, fac), "rate_limit 3 1m", "rate_limit 1 1m", 1)
	base := startCaddy(t, site)
	url := base + "/api/x"
	walletA, proofA := contractWalletProof(t, d, 7, url)
	_, proofB := contractWalletProof(t, d, 8, url)
	type answer struct {
		st   int
		body map[string]any
	}
	done := make(chan answer, 1)
	go func() {
		st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: proofA})
		done <- answer{st, body}
	}()
	<-atChain
	st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: proofB})
	inFlight := calls.Load()
	resumeOnce()
	if st != http.StatusTooManyRequests || inFlight != 2 {
		t.Fatalf("a second proof while the client's one proof check (rate_limit 1) is at the chain: %d %v after %d eth_calls, want 429 before any work (2)", st, body, inFlight)
	}
	if a := <-done; a.st != 200 || a.body["wallet"] != walletA.Hex() {
		t.Fatalf("the first proof's request: %d %v, want 200 as %s", a.st, a.body, walletA.Hex())
	}
}

// fakePause is a FAKE FOR A FAULT: a handler that holds a request marked
// with X-Test-Pause between two wallet_auth until told, so that another
// request of its client takes the proof slot in between, an interleaving
// no real handler can be made to wait for. It signals paused (when set)
// as it starts to wait on resume; unmarked requests pass.
type fakePause struct{}

var fakePaused struct {
	paused, resume chan struct{}
}

func (fakePause) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_fake_pause", New: func() caddy.Module { return new(fakePause) }}
}

func (fakePause) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	if r.Header.Get("X-Test-Pause") != "" {
		close(fakePaused.paused)
		<-fakePaused.resume
	}
	return next.ServeHTTP(w, r)
}

func init() {
	caddy.RegisterModule(fakePause{})
	httpcaddyfile.RegisterHandlerDirective("test_fake_pause", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return fakePause{}, nil
	})
}

// TestNestedWalletAuthRecheckWithoutASlotGivesTheProofBack: a route's
// wallet_auth that finds every proof slot of the client held (rate_limit
// 1, another proof of it at the chain) when it comes to check again the
// proof the site-wide one verified answers 429, Retry-After 1, and gives
// the nonce the site-wide one claimed back: the retry of the same proof
// is served.
func TestNestedWalletAuthRecheckWithoutASlotGivesTheProofBack(t *testing.T) {
	d, fac := sharedDevnet(t)
	fakePaused.paused, fakePaused.resume = make(chan struct{}), make(chan struct{})
	atChain, resume := make(chan struct{}), make(chan struct{})
	// eth_call 1 is the other proof's site-wide check.
	rpc := fakeChainRPC(t, d.RPCURL(), func(n int32) bool {
		if n == 1 {
			close(atChain)
			<-resume
		}
		return false
	})
	var resumed, unpaused atomic.Bool
	resumeOnce := func() {
		if resumed.CompareAndSwap(false, true) {
			close(resume)
		}
	}
	unpauseOnce := func() {
		if unpaused.CompareAndSwap(false, true) {
			close(fakePaused.resume)
		}
	}
	t.Cleanup(resumeOnce)
	t.Cleanup(unpauseOnce)
	up := walletUpstream(t)
	site := strings.Replace(nestedContractWalletSite(up.URL, rpc.URL, fac), "rate_limit 3 1m", "rate_limit 1 1m", 1)
	site = strings.Replace(site, "route /api/* {\n", "route /api/* {\n\t\t\ttest_fake_pause\n", 1)
	base := startCaddy(t, site)
	url := base + "/api/x"
	proof := walletProof(t, walletKey(9), "GET", url, nil)
	_, other := contractWalletProof(t, d, 9, url)
	type answer struct {
		st   int
		hdr  http.Header
		body map[string]any
	}
	first := make(chan answer, 1)
	go func() {
		st, h, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: proof, "X-Test-Pause": "1"})
		first <- answer{st, h, body}
	}()
	<-fakePaused.paused // the site-wide check passed, its slot given back
	otherDone := make(chan answer, 1)
	go func() {
		st, h, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: other})
		otherDone <- answer{st, h, body}
	}()
	<-atChain
	unpauseOnce()
	a := <-first
	resumeOnce()
	if a.st != http.StatusTooManyRequests || a.hdr.Get("Retry-After") != "1" {
		t.Fatalf("the route's check again with the client's one proof slot held: %d %v, want 429 with Retry-After 1", a.st, a.body)
	}
	if o := <-otherDone; o.st != 200 {
		t.Fatalf("the other proof's request: %d %v, want 200", o.st, o.body)
	}
	if st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.HeaderName: proof}); st != 200 || body["wallet"] != walletAddr(9) {
		t.Fatalf("the retry of the proof after the 429: %d %v, want 200 as %s", st, body, walletAddr(9))
	}
}
