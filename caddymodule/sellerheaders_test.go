package caddymodule

import (
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
)

// An agent that is itself an x402 client (or runs behind another gate)
// answers with its own x402 headers, of both versions, and free allowance
// headers. None reaches the buyer: on an answer nothing was charged for,
// the buyer's client (@x402/core reads X-PAYMENT-RESPONSE when
// PAYMENT-RESPONSE is absent) would report the agent's settlement as its
// own; on a charged one, PAYMENT-RESPONSE is the gate's.
func TestAgentsPaymentHeadersNeverReachTheBuyer(t *testing.T) {
	_, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	forged := base64.StdEncoding.EncodeToString([]byte(`{"success":true,"transaction":"0xdead","network":"eip155:1337","payer":"0x0"}`))
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "application/json")
		h.Set("Payment-Response", forged)
		h.Set("X-Payment-Response", forged)
		h.Set("Payment-Required", forged)
		h.Set(HeaderFreeRemaining, "1000")
		h.Set(HeaderFreeLimit, "1000")
		h.Set(HeaderFreeResets, "2099-01-01T00:00:00Z")
		if strings.HasSuffix(r.URL.Path, "/fails") {
			// Fails sum_equals: 87 + 42.5 != 200.
			io.WriteString(w, strings.Replace(goodInvoice, `"total":129.5`, `"total":200`, 1))
			return
		}
		io.WriteString(w, goodInvoice)
	}))
	t.Cleanup(agent.Close)
	base := startCaddy(t, sellerPaidSite(agent.URL, fac, vf))
	for _, c := range []struct {
		path, status string
		charged      bool
	}{{"/invoices/fails", "fail", false}, {"/invoices/INV-7731", "pass", true}} {
		resp, _ := getBody(t, base+c.path, nil)
		sig := signFor(t, paymentRequired(t, resp), 2)
		resp, _ = getBody(t, base+c.path, map[string]string{x402.HeaderPaymentSignature: sig})
		h := resp.Header
		if resp.StatusCode != 200 || h.Get(HeaderVerificationStatus) != c.status {
			t.Fatalf("%s: status %d, Verification-Status %q", c.path, resp.StatusCode, h.Get(HeaderVerificationStatus))
		}
		for _, k := range []string{"X-Payment-Response", "Payment-Required", HeaderFreeRemaining, HeaderFreeLimit, HeaderFreeResets} {
			if v := h.Values(k); len(v) > 0 {
				t.Errorf("%s: the agent's %s reached the buyer: %q", c.path, k, v)
			}
		}
		switch pr := h.Values(x402.HeaderPaymentResponse); {
		case !c.charged && len(pr) > 0:
			t.Errorf("%s: an answer nothing was charged for carries PAYMENT-RESPONSE %q", c.path, pr)
		case c.charged && (len(pr) != 1 || pr[0] == forged):
			t.Errorf("%s: a charged answer carries PAYMENT-RESPONSE %q, want only the gate's", c.path, pr)
		}
	}
}

// An answer over max_response under on_error fail_open is let through
// unverified as it streams (bufferedWriter.spill) with the header an
// unverified answer under the limit gets: nosniff, Verification-Status
// exposed to pages, and one Content-Type (several, which readers take
// differently, become application/octet-stream, which no browser renders).
func TestSpilledAnswerGoesOutAsAHeldUnverifiedOne(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	agent := func(pad int) string {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ct := []string{"application/json"}
			if strings.HasSuffix(r.URL.Path, "/two") {
				ct = append(ct, "text/html")
			}
			w.Header()["Content-Type"] = ct
			w.Header().Set(HeaderVerificationStatus, "pass")
			fmt.Fprintf(w, `{"x":"<script>alert(document.domain)</script>%s"}`, strings.Repeat("x", pad))
		}))
		t.Cleanup(s.Close)
		return s.URL
	}
	opts := "max_response 16KiB\n\t\t\ton_error fail_open"
	base := startCaddy(t, ":{port} {"+
		sellerRoute("/big", agent(32<<10), vf, opts)+
		sellerRoute("/small", agent(0), vf, opts)+
		"}")
	for _, c := range []struct{ path, ct string }{
		{"/big/one", "application/json"},
		{"/small/two", "application/octet-stream"}, {"/big/two", "application/octet-stream"},
	} {
		resp, _ := getBody(t, base+c.path, nil)
		h := resp.Header
		if resp.StatusCode != 200 || !slices.Equal(h.Values(HeaderVerificationStatus), []string{outcomeUnverified}) {
			t.Errorf("%s: status %d, Verification-Status %q", c.path, resp.StatusCode, h.Values(HeaderVerificationStatus))
		}
		if h.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: no X-Content-Type-Options: nosniff", c.path)
		}
		if got := h.Values("Content-Type"); !slices.Equal(got, []string{c.ct}) {
			t.Errorf("%s: Content-Type %q, want %q", c.path, got, c.ct)
		}
		if !strings.Contains(strings.Join(h.Values("Access-Control-Expose-Headers"), ","), HeaderVerificationStatus) {
			t.Errorf("%s: Verification-Status is not exposed to pages: %q", c.path, h.Values("Access-Control-Expose-Headers"))
		}
	}
}
