package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
)

// TestStaticPaywallShowsTheAppNameAndLogo: the static page (and the
// fallback of official for other networks) is headed by app_name and
// app_logo, escaped; without them it has no header.
func TestStaticPaywallShowsTheAppNameAndLogo(t *testing.T) {
	pr := x402.PaymentRequired{X402Version: 2, Resource: x402.Resource{URL: "http://h/score/a"},
		Accepts: []x402.PaymentRequirements{{Scheme: "exact", Network: x402.NetworkDevnet, Amount: "10000", Asset: "0x1", PayTo: "0x2"}}}
	for _, tc := range []struct {
		p          *Paywall
		want, not  []string
		firstOffer string
	}{
		{p: nil, not: []string{"<header>", "<img"}},
		{p: &Paywall{Mode: PaywallStatic, AppName: "Shop <&>", AppLogo: "https://example.com/logo.png?a=1&b=2"},
			want: []string{"<title>Shop &lt;&amp;&gt;: Payment required</title>", `<img src="https://example.com/logo.png?a=1&amp;b=2" alt="">`, "<strong>Shop &lt;&amp;&gt;</strong>"},
			not:  []string{"Shop <&>"}},
		{p: &Paywall{Mode: PaywallOfficial, AppName: "Shop"}, firstOffer: "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=",
			want: []string{"<strong>Shop</strong>", "is paid per call with"}, not: []string{"<img", "window.x402"}},
	} {
		pr := pr
		if tc.firstOffer != "" {
			pr.Accepts = []x402.PaymentRequirements{{Network: tc.firstOffer, Amount: "1"}}
		}
		rec := httptest.NewRecorder()
		if err := tc.p.serve(rec, httptest.NewRequest(http.MethodGet, "/", nil), pr, 6, nil, "http://h/score/a"); err != nil {
			t.Fatal(err)
		}
		page := rec.Body.String()
		if rec.Code != http.StatusPaymentRequired || !strings.Contains(page, "is paid per call with") {
			t.Fatalf("%+v: status %d, not the static page", tc.p, rec.Code)
		}
		for _, s := range tc.want {
			if !strings.Contains(page, s) {
				t.Errorf("%+v: the page lacks %q:\n%s", tc.p, s, page)
			}
		}
		for _, s := range tc.not {
			if strings.Contains(page, s) {
				t.Errorf("%+v: the page has %q", tc.p, s)
			}
		}
	}
}
