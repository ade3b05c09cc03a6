package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

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
