package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aovhq/aov/x402"
)

// A paid answer streamed under settle before carries exactly the gate's
// Cache-Control: no-store and its Access-Control-Expose-Headers, whatever
// the upstream said, as a held answer does (README: "Every 402, paid answer
// and free-allowance answer carries Cache-Control: no-store (replacing
// whatever the upstream said ...)"). (Before: the upstream's public,
// max-age=3600 went out beside no-store, so a shared cache in front could
// keep one buyer's paid answer for everyone.)
func TestSettleBeforePaidAnswerIsNoStore(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Cache-Control", "public, max-age=3600")
		w.Header().Set("Access-Control-Expose-Headers", "X-Upstream-Own")
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"paid_content":true}`))
	}))
	t.Cleanup(up.Close)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "settle before"))
	url := base + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	paid := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(paid.Body)
	paid.Body.Close()
	if paid.StatusCode != http.StatusOK || paid.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("paid: %d %s", paid.StatusCode, b)
	}
	if cc := paid.Header.Values("Cache-Control"); len(cc) != 1 || cc[0] != "no-store" {
		t.Errorf("a paid settle before answer: Cache-Control %q, want no-store (the upstream said public, max-age=3600)", cc)
	}
	if ex := paid.Header.Values("Access-Control-Expose-Headers"); len(ex) != 1 || ex[0] != exposedHeaders {
		t.Errorf("a paid settle before answer: Access-Control-Expose-Headers %q, want the gate's %q alone", ex, exposedHeaders)
	}
}
