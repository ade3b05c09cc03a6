package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// redirectAgent is a seller's agent that answers with the paid result out
// of verify_response's sight: a redirect to where the result is, with the
// result in its body too, or a Location alone; and an answer with nothing
// in it (204).
func redirectAgent(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/found"):
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Location", "https://results.example/INV-7731?total=87.0")
			w.WriteHeader(http.StatusFound)
			io.WriteString(w, `{"invoice_id":"INV-7731","line_total":87.0}`)
		case strings.HasSuffix(r.URL.Path, "/see-other"):
			w.Header().Set("Location", "https://results.example/INV-7731?total=87.0")
			w.WriteHeader(http.StatusSeeOther)
		case strings.HasSuffix(r.URL.Path, "/created"):
			w.Header().Set("Location", "https://results.example/INV-7731?total=87.0")
			w.WriteHeader(http.StatusCreated)
		case strings.HasSuffix(r.URL.Path, "/two-locations"): // the first one empty
			w.Header()["Location"] = []string{"", "https://results.example/INV-7731?total=87.0"}
			w.WriteHeader(http.StatusFound)
		case strings.HasSuffix(r.URL.Path, "/content-location"):
			w.Header().Set("Content-Location", "https://results.example/INV-7731?total=87.0")
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/refresh"):
			w.Header().Set("Refresh", "0; url=https://results.example/INV-7731?total=87.0")
			w.WriteHeader(http.StatusOK)
		case strings.HasSuffix(r.URL.Path, "/link"):
			w.Header().Set("Link", `<https://results.example/INV-7731?total=87.0>; rel="alternate"`)
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/early-hints"):
			w.Header().Set("Link", `<https://results.example/INV-7731?total=87.0>; rel=preload`)
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
			w.WriteHeader(http.StatusNoContent)
		case strings.HasSuffix(r.URL.Path, "/not-modified"):
			w.Header().Set("Content-Location", "https://results.example/INV-7731?total=87.0")
			w.Header().Set("ETag", `"v1"`)
			w.WriteHeader(http.StatusNotModified)
		case strings.HasSuffix(r.URL.Path, "/own-header"):
			w.Header().Set("X-Result", "total=87.0")
			w.Header().Set("Access-Control-Allow-Origin", "https://buyer.example")
			w.Header().Set("Content-Language", "en")
			w.WriteHeader(http.StatusNoContent)
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// redirectSite serves redirectAgent behind three gates of one offer:
// /pass/* with settle_on pass and a verify_response, /dflt/* with a
// verify_response and the default settle_on (pass, since it handles the
// request), and /plain/* with neither (settle after, every answer below
// 400 charged).
func redirectSite(t *testing.T) (*evmfacilitator.Devnet, string) {
	d, fac := sharedDevnet(t)
	agent := redirectAgent(t)
	verify := "verify_response {\n\t\t\tschema `{\"type\":\"object\"}`\n\t\t\tverifier_url http://127.0.0.1:1\n\t\t}"
	return d, startCaddy(t, fmt.Sprintf(`:{port} {
	route /pass/* {
		x402 {
			accept devnet $0.05 %[1]s
			facilitator http %[2]s
			store badger {data}/gate
			settle_on pass
		}
		%[4]s
		reverse_proxy %[3]s
	}
	route /dflt/* {
		x402 {
			accept devnet $0.05 %[1]s
			facilitator http %[2]s
			store badger {data}/gate
		}
		%[4]s
		reverse_proxy %[3]s
	}
	route /plain/* {
		x402 {
			accept devnet $0.05 %[1]s
			facilitator http %[2]s
			store badger {data}/gate
		}
		reverse_proxy %[3]s
	}
}`, payTo.Hex(), fac, strings.TrimPrefix(agent.URL, "http://"), verify))
}

// noRedirects reads a redirect as the answer, as a buyer's client sees it
// before following it.
var noRedirects = &http.Client{Transport: testClient.Transport, Timeout: testClient.Timeout,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

func getNoRedirect(t *testing.T, url string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := noRedirects.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}

// Under settle_on pass only an answer verify_response found passing is
// charged, and an answer it did not check is handed over uncharged only
// when it has nothing in it. A redirect carries content where
// verify_response does not look: in its Location (a URL holding the
// result) and in its body. It used to be handed over uncharged, so a buyer
// who steered the agent to answer 302 had the work free. Such an answer (a
// 3xx, or a 2xx with a Location) is now withheld like any unchecked
// content: 503 response_unverifiable, neither its Location nor its body
// out, the payment released. A 204 is still handed over uncharged. Under
// the default settle after, without verify_response, a redirect is an
// answer below 400 and is charged (SPEC §7), as before.
func TestSettleOnPassWithholdsRedirects(t *testing.T) {
	d, base := redirectSite(t)
	payerIdx := 6
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	before := balance(t, d, payer)
	resp, _ := getNoRedirect(t, base+"/pass/found", nil)
	sig := signFor(t, paymentRequired(t, resp), payerIdx)
	paid := map[string]string{x402.HeaderPaymentSignature: sig}

	for _, path := range []string{"/pass/found", "/pass/see-other", "/pass/created"} {
		resp, body := getNoRedirect(t, base+path, paid)
		var e apierr.Error
		if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Code != codeResponseUnverifiable || e.Charged {
			t.Fatalf("%s: status %d: %s", path, resp.StatusCode, body)
		}
		if loc := resp.Header.Get("Location"); loc != "" || strings.Contains(string(body), "87.0") || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
			t.Fatalf("%s: the redirect's content (Location %q), or a receipt of payment, reached the buyer: %s", path, loc, body)
		}
		if balance(t, d, payer).Cmp(before) != 0 {
			t.Fatalf("%s: charged for an answer nothing verified", path)
		}
	}
	// The payment was released each time. Nothing in the answer: handed
	// over, uncharged.
	resp, body := getNoRedirect(t, base+"/pass/empty", paid)
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("204: status %d: %s", resp.StatusCode, body)
	}
	// Without verify_response and settle_on, a redirect is charged and
	// delivered whole.
	resp, body = getNoRedirect(t, base+"/plain/found", paid)
	if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") == "" || resp.Header.Get(x402.HeaderPaymentResponse) == "" || !strings.Contains(string(body), "87.0") {
		t.Fatalf("settle after, a 302: status %d, Location %q: %s", resp.StatusCode, resp.Header.Get("Location"), body)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(50000)) != 0 {
		t.Fatalf("charged %v, want 50000 (the one redirect settle after sold)", got)
	}
}

// An answer no verify_response checked, with nothing in its body, can
// still point to the result in a header: Content-Location, Link, Refresh,
// an agent's own header, or a second Location after an empty first one.
// Under settle_on pass (written, or the default with verify_response in
// the route) such an answer is handed over uncharged with only the headers
// that cannot carry a result (an allowlist: ETag stays), and one with any
// Location is withheld; the payment is released each time and never
// charged.
func TestSettleOnPassHandsOverEmptyAnswersWithoutPointers(t *testing.T) {
	d, base := redirectSite(t)
	payerIdx := 7
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	before := balance(t, d, payer)
	resp, _ := getNoRedirect(t, base+"/pass/empty", nil)
	paid := map[string]string{x402.HeaderPaymentSignature: signFor(t, paymentRequired(t, resp), payerIdx)}
	for _, route := range []string{"/pass", "/dflt"} {
		for _, c := range []struct {
			path   string
			status int
		}{
			{"/two-locations", http.StatusServiceUnavailable},
			{"/content-location", http.StatusNoContent},
			{"/refresh", http.StatusOK},
			{"/link", http.StatusNoContent},
			{"/early-hints", http.StatusNoContent},
			{"/not-modified", http.StatusNotModified},
			{"/own-header", http.StatusNoContent},
		} {
			resp, body := getNoRedirect(t, base+route+c.path, paid)
			if resp.StatusCode != c.status || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
				t.Fatalf("%s%s: status %d (want %d), PAYMENT-RESPONSE %q: %s", route, c.path, resp.StatusCode, c.status,
					resp.Header.Get(x402.HeaderPaymentResponse), body)
			}
			for k, v := range resp.Header {
				if strings.Contains(strings.Join(v, " "), "87.0") {
					t.Fatalf("%s%s: the result reached the buyer free in %s: %q", route, c.path, k, v)
				}
			}
			if c.path == "/not-modified" && resp.Header.Get("ETag") != `"v1"` {
				t.Fatalf("%s%s: ETag %q, want the upstream's", route, c.path, resp.Header.Get("ETag"))
			}
			// Headers that describe the answer, or let a browser read it, stay.
			if c.path == "/own-header" && (resp.Header.Get("Access-Control-Allow-Origin") != "https://buyer.example" || resp.Header.Get("Content-Language") != "en") {
				t.Fatalf("%s%s: the upstream's CORS or Content-Language dropped: %v", route, c.path, resp.Header)
			}
		}
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("charged for answers nothing verified")
	}
}
