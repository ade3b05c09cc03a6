package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/internal/inflight"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// sendsNothing is a facilitator that verifies through the real devnet
// facilitator and, while down is set, fails each settle before anything is
// sent (its chain read failed before the send): the plain error the
// Facilitator contract defines as "nothing sent". Otherwise it settles
// through the devnet facilitator.
type sendsNothing struct {
	x402.Facilitator
	down *atomic.Bool
}

func (s sendsNothing) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	if s.down.Load() {
		return x402.SettleResponse{}, errors.New("reading the relayer's nonce before the send: connection refused")
	}
	return s.Facilitator.Settle(ctx, p, req)
}

// A gate in front of a remote facilitator (facilitator http, here the x402
// facilitator API) whose settle sent nothing answers its buyer as README's
// "facilitator down" says, and as it answers the same error of an embedded
// facilitator: 503 upstream_unavailable with Retry-After and no new offer,
// the payment released, so the same payment is served once the
// facilitator settles again. (Before: 402 with a fresh PAYMENT-REQUIRED, a
// refusal of the payment counted against the client's rate_limit.)
func TestRemoteFacilitatorNothingSentIsFacilitatorDown(t *testing.T) {
	_, fac := sharedDevnet(t)
	var down atomic.Bool
	down.Store(true)
	front := sendsNothing{x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: fac}), &down}
	remote := httptest.NewServer(x402.NewFacilitatorHandler(front))
	defer remote.Close()
	url := gatedSite(t, remote.URL)
	pr := paymentRequired(t, post(t, url, "", nil))
	sig := signFor(t, pr, 3)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body := readJSON(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || body["code"] != "upstream_unavailable" || resp.Header.Get("Retry-After") == "" ||
		resp.Header.Get(x402.HeaderPaymentRequired) != "" {
		t.Fatalf("remote facilitator sent nothing: status %d, code %v, reason %v, Retry-After %q, PAYMENT-REQUIRED set %v; want 503 upstream_unavailable with Retry-After and no new offer",
			resp.StatusCode, body["code"], body["reason"], resp.Header.Get("Retry-After"), resp.Header.Get(x402.HeaderPaymentRequired) != "")
	}
	down.Store(false)
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	readJSON(t, resp)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("the same payment once the facilitator settles: status %d; want 200 with PAYMENT-RESPONSE (released, not held)", resp.StatusCode)
	}
}

// An x402_facilitator reached after a reload unloaded its configuration
// runs nothing, so a /settle there sent nothing: it is answered in the
// settle shape, success false, facilitator_unavailable, naming the
// payment's network, which a remote gate's client reads as nothing
// settled (the payment released, the buyer retrying the same payment into
// the configuration now running), while /verify stays 503. (Before: 503
// upstream_unavailable, which the client reads as an unknown outcome:
// the payment, never sent, held and its buyer told not to pay again.)
func TestUnloadedFacilitatorHandlerSettleSentNothing(t *testing.T) {
	cctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	uses := inflight.For(cctx)
	cancel()
	if err := uses.AfterRequests(func() error { return nil }); err != nil { // the reload unloads the config
		t.Fatal(err)
	}
	var calls atomic.Int32
	h := &FacilitatorHandler{api: x402.NewFacilitatorHandler(counting{&calls}), uses: uses}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { h.ServeHTTP(w, r, nil) }))
	defer srv.Close()
	c := x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: srv.URL + "/facilitator", Retries: -1})
	pr := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkDevnet, Amount: "10000", Asset: payTo.Hex(), PayTo: payTo.Hex(),
		MaxTimeoutSeconds: 60, Extra: map[string]any{"name": "USD Coin", "version": "2"}}
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(3), pr, &x402.Resource{URL: "http://example.com/verify/schema"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sr, err := c.Settle(context.Background(), p, pr)
	var fe *x402.FacilitatorError
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &fe) || errors.As(err, &unknown) {
		t.Errorf("settle at an unloaded x402_facilitator read by a remote gate's client as %+v, %v; want nothing settled (*FacilitatorError), never an unknown outcome", sr, err)
	}
	resp, err := http.Post(srv.URL+"/settle", "application/json", strings.NewReader(`{"x402Version":2,"paymentPayload":`+string(mustJSON(p))+`,"paymentRequirements":`+string(mustJSON(pr))+`}`))
	if err != nil {
		t.Fatal(err)
	}
	body := readJSON(t, resp)
	if resp.StatusCode != http.StatusOK || body["success"] != false || body["errorReason"] != x402.ReasonFacilitatorUnavailable || body["network"] != x402.NetworkDevnet {
		t.Errorf("settle at an unloaded x402_facilitator: %d %v; want 200, success false, facilitator_unavailable, the network", resp.StatusCode, body)
	}
	resp, err = http.Post(srv.URL+"/verify", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	if body := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || body["code"] != "upstream_unavailable" {
		t.Errorf("verify at an unloaded x402_facilitator: %d %v; want 503 upstream_unavailable", resp.StatusCode, body)
	}
	if n := calls.Load(); n != 0 {
		t.Errorf("the unloaded configuration's facilitator was called %d times", n)
	}
}

// counting is a facilitator that counts its calls and answers none.
type counting struct{ calls *atomic.Int32 }

func (c counting) Verify(context.Context, x402.PaymentPayload, x402.PaymentRequirements) (x402.VerifyResponse, error) {
	c.calls.Add(1)
	return x402.VerifyResponse{}, errors.New("unused")
}

func (c counting) Settle(context.Context, x402.PaymentPayload, x402.PaymentRequirements) (x402.SettleResponse, error) {
	c.calls.Add(1)
	return x402.SettleResponse{}, errors.New("unused")
}

func (c counting) Supported(context.Context) (x402.SupportedResponse, error) {
	c.calls.Add(1)
	return x402.SupportedResponse{}, nil
}
