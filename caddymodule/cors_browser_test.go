package caddymodule

import (
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// corsBrowserSite turns x402_cors on per route: /score and /verify/schema
// allow the page's origin; /private (priced too) does not use CORS;
// /reflect allows another origin only, in front of reflecting, an upstream
// that grants every origin itself.
func corsBrowserSite(up, fac, origin, reflecting string) string {
	gate := func(route, price string) string {
		return fmt.Sprintf(`x402 {
			accept devnet %s %s
			route %q
			facilitator http {
				url %s
			}
			store badger {data}/gate
		}
		reverse_proxy %s`, price, payTo.Hex(), route, fac, strings.TrimPrefix(up, "http://"))
	}
	return fmt.Sprintf(`:{port} {
	route /score/* {
		x402_cors %[1]s
		%[2]s
	}
	route /verify/schema {
		x402_cors %[1]s
		%[3]s
	}
	route /private/* {
		%[4]s
	}
	route /reflect/* {
		x402_cors http://other.example
		reverse_proxy %[5]s
	}
}
`, origin, gate("GET /score/{agent_id}", "$0.01"), gate("POST /verify/schema", "$0.02"), gate("GET /private/{id}", "$0.01"), reflecting)
}

type corsBrowserResult struct {
	Unpaid struct {
		Status          int    `json:"status"`
		PaymentRequired string `json:"paymentRequired"`
	} `json:"unpaid"`
	Paid struct {
		Status          int    `json:"status"`
		PaymentResponse string `json:"paymentResponse"`
		Body            string `json:"body"`
	} `json:"paid"`
	Blocked          string `json:"blocked"`
	BlockedReflected string `json:"blockedReflected"`
}

// TestCORSInABrowser: a page on another origin (another port) reads a
// 402's PAYMENT-REQUIRED with fetch(), and pays with a preflighted POST
// carrying PAYMENT-SIGNATURE; the token moves once. A route without
// x402_cors is blocked by the browser, so the test fails without CORS; so
// is a route whose x402_cors does not list the page's origin, though its
// upstream reflects every Origin with credentials.
func TestCORSInABrowser(t *testing.T) {
	chromium := chromiumPath(t)
	interop.Dir(t, "playwright-core")
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, "<!doctype html><title>buyer</title><p>a buyer's page</p>")
	}))
	t.Cleanup(page.Close)
	api := startCaddy(t, corsBrowserSite(up.URL, fac, page.URL, reflectingUpstream(t, `{"secret":"visitor data"}`)))

	// The payment the page sends, signed for the route's demand (a bodyless
	// POST is the discovery probe).
	probe := post(t, api+"/verify/schema", "", nil)
	pr := paymentRequired(t, probe)
	payer := evmfacilitator.DevAccounts()[4].Address
	before := balance(t, d, payer)

	var res corsBrowserResult
	interop.Run(t, "cors-browser.mjs", nil, map[string]any{
		"page": page.URL + "/", "api": api, "chromium": chromium,
		"signature": signFor(t, pr, 4), "body": validRequest,
	}, &res)

	if res.Unpaid.Status != http.StatusPaymentRequired {
		t.Errorf("the page's unpaid GET: status %d, want 402", res.Unpaid.Status)
	}
	var seen x402.PaymentRequired
	if err := x402.DecodeHeader(res.Unpaid.PaymentRequired, &seen); err != nil || len(seen.Accepts) == 0 {
		t.Errorf("the page could not read PAYMENT-REQUIRED (%q): %v", res.Unpaid.PaymentRequired, err)
	}
	if res.Paid.Status != http.StatusOK || !strings.Contains(res.Paid.Body, `"paid_content":true`) {
		t.Fatalf("the page's paid POST: status %d, body %s", res.Paid.Status, res.Paid.Body)
	}
	var sr x402.SettleResponse
	if err := x402.DecodeHeader(res.Paid.PaymentResponse, &sr); err != nil || !sr.Success {
		t.Errorf("the page read PAYMENT-RESPONSE %q: %+v %v", res.Paid.PaymentResponse, sr, err)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Errorf("payer paid %v, want 20000 once", got)
	}
	if res.Blocked == "" {
		t.Error("a route without x402_cors was readable from another origin")
	}
	if res.BlockedReflected == "" {
		t.Error("a route whose x402_cors does not list the page's origin was readable from it through the upstream's own grant")
	}
}

// x402FetchResult is what x402-fetch-browser.mjs reports.
type x402FetchResult struct {
	Status          int      `json:"status"`
	PaymentResponse string   `json:"paymentResponse"`
	Body            string   `json:"body"`
	Error           string   `json:"error"`
	Requests        []string `json:"requests"`
	ConsoleErrors   []string `json:"consoleErrors"`
}

// A page on another origin pays with the official x402 fetch client
// (@x402/fetch's wrapFetchWithPayment, unmodified) in Chromium, through
// x402_cors with its default headers (origins *, as Caddyfile.example):
// paid once, PAYMENT-RESPONSE readable. The client's paid retry carries a
// request header of its own, Access-Control-Expose-Headers, which the
// preflight must allow. (Before: it did not, and Chromium refused the paid
// request: the page got "Failed to fetch".)
func TestOfficialFetchClientPaysCrossOriginInABrowser(t *testing.T) {
	chromium := chromiumPath(t)
	interop.Dir(t, "playwright-core")
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	api := startCaddy(t, corsBrowserSite(up.URL, fac, "{\n\t\t\torigins *\n\t\t}", reflectingUpstream(t, `{"secret":"x"}`)))
	payer := evmfacilitator.DevAccounts()[1]
	before := balance(t, d, payer.Address)
	var res x402FetchResult
	interop.Run(t, "x402-fetch-browser.mjs", nil, map[string]any{
		"url": api + "/verify/schema", "body": validRequest, "privateKey": payer.PrivateKeyHex, "chromium": chromium,
	}, &res)
	if res.Status != http.StatusOK || res.PaymentResponse == "" || res.Error != "" {
		t.Fatalf("the official fetch client on another origin: status %d, PAYMENT-RESPONSE %q, error %q, requests %q, console %q",
			res.Status, res.PaymentResponse, res.Error, res.Requests, res.ConsoleErrors)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Errorf("payer charged %v, want the price once (20000)", got)
	}
}
