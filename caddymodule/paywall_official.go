package caddymodule

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/internal/caddyopt"
	"github.com/aovhq/aov/x402"
)

// officialPages holds the official x402 paywall pages, vendored byte for
// byte from the @x402/paywall npm package by paywall/update.sh.
//
//go:embed paywall/evm.html paywall/svm.html paywall/VERSION paywall/LICENSE paywall/NOTICE
var officialPages embed.FS

// Paywall modes of the x402 directive's `paywall` option.
const (
	PaywallOff      = "off"      // browsers get the JSON 402 like any client
	PaywallStatic   = "static"   // the built-in page: price, network, pay-to; no script (default)
	PaywallOfficial = "official" // the official @x402/paywall wallet app
)

// Paywall is what a browser (Accept: text/html) gets with a 402. The
// official page is the wallet app of the @x402/paywall package (the one the
// reference Go middleware embeds): it connects the visitor's wallet, signs
// the payment for the first offer and fetches the resource again with
// PAYMENT-SIGNATURE. It exists for EVM and Solana offers; for any other
// first offer the static page is served instead. Every page, like every
// 402, carries PAYMENT-REQUIRED.
type Paywall struct {
	// Mode is off, static (default) or official.
	Mode string `json:"mode,omitempty"`
	// AppName and AppLogo (an http(s) URL or a path) head the static
	// page. The official page gets both in window.x402, as the package's
	// generateHtml passes them; its EVM page (2.12.0) hands the name to the
	// Coinbase Wallet connector, and neither page shows them itself.
	AppName string `json:"app_name,omitempty"`
	AppLogo string `json:"app_logo,omitempty"`
}

// officialPage is one vendored page split where the configuration script
// goes (before </head>, as the package's own generateHtml puts it), and
// the same compressed (gzipPage; built at its first use, once per process).
type officialPage struct {
	// head and rest are bytes: a string written to a ResponseWriter that
	// has no WriteString (Caddy's wrappers have none) is copied first,
	// 2.3 MB a page.
	head, rest []byte
	gzipped    func() *gzipPage
}

var evmPage, svmPage = loadOfficialPage("paywall/evm.html"), loadOfficialPage("paywall/svm.html")

func loadOfficialPage(name string) officialPage {
	b, err := officialPages.ReadFile(name)
	if err != nil {
		panic(err) // embedded: cannot happen in a built binary
	}
	i := bytes.Index(b, []byte("</head>"))
	if i < 0 {
		panic(name + " has no </head>")
	}
	page := officialPage{head: b[:i:i], rest: b[i:]}
	page.gzipped = sync.OnceValue(func() *gzipPage { return newGzipPage(page) })
	return page
}

// html reports whether browsers get a page at all.
func (p *Paywall) html() bool { return p == nil || p.Mode != PaywallOff }

// validate checks the mode and the logo URL.
func (p *Paywall) validate() error {
	switch p.Mode {
	case "", PaywallOff, PaywallStatic, PaywallOfficial:
	default:
		return fmt.Errorf("paywall: mode %q is not off, static or official", p.Mode)
	}
	if p.AppLogo != "" {
		u, err := url.Parse(p.AppLogo)
		if err != nil || (u.Scheme != "https" && u.Scheme != "http" && !strings.HasPrefix(p.AppLogo, "/")) {
			return fmt.Errorf("paywall: app_logo %q is not an http(s) URL or a path", p.AppLogo)
		}
	}
	return nil
}

// serve writes the 402 page for pr in answer to r; decimals are those of
// the asset of its first offer (the one the official page pays),
// currentURL is the URL the official page fetches again with the payment.
func (p *Paywall) serve(w http.ResponseWriter, r *http.Request, pr x402.PaymentRequired, decimals int, trial *freeTrial, currentURL string) error {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	// A page that asks a visitor to pay must not be framed by another
	// site, which could lay a decoy over it and have the visitor press
	// "Pay now" unknowingly (clickjacking). Only framing is restricted:
	// the official page runs its own inline scripts and reaches wallets
	// and RPC nodes it chooses, which a script or connect policy would
	// break.
	h.Set("Content-Security-Policy", "frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	page, ok := officialPage{}, false
	if len(pr.Accepts) > 0 {
		page, ok = p.official(pr.Accepts[0])
	}
	// An offer whose asset's decimals are unknown gets the static page,
	// which states atomic units: Validate refuses that for the first
	// configured offer (checkOffer), but the first one shown can be a
	// later one, while a Solana offer before it waits for its fee payer.
	if !ok || decimals == 0 {
		w.WriteHeader(http.StatusPaymentRequired)
		return paywallPage(w, pr, trial, p)
	}
	script, err := p.officialScript(pr, decimals, currentURL)
	if err != nil {
		return err
	}
	// The official page's bytes depend on Accept-Encoding: a cache in
	// between must not hand the gzipped one to a client that did not ask.
	h.Add("Vary", "Accept-Encoding")
	// Nothing compresses it per request either: Caddy's encode in front
	// would, for a client that takes another encoding but not gzip (zstd
	// alone), at any unpaid request's bidding.
	h.Set("Cache-Control", "no-store, no-transform")
	parts := [][]byte{page.head, script, page.rest}
	if !acceptsGzip(r) {
		w.WriteHeader(http.StatusPaymentRequired)
	} else {
		gz, n := page.gzipped().stream(script)
		h.Set("Content-Encoding", "gzip")
		h.Set("Content-Length", strconv.Itoa(n))
		w.WriteHeader(http.StatusPaymentRequired)
		if !bufferedInFront(w) {
			parts = gz[:]
		} else {
			// A handler in front keeps the answer (Caddy's intercept,
			// to replace it or change its status), and what it sends
			// instead goes under these same headers (intercept keeps
			// them): the page goes as it is, labelled as such.
			h.Del("Content-Encoding")
			h.Del("Content-Length")
		}
	}
	for _, b := range parts {
		if _, err := w.Write(b); err != nil {
			return err
		}
	}
	return nil
}

// bufferedInFront reports whether a Caddy response recorder in w's chain
// of wrappers has decided, at the WriteHeader just made, to keep the
// answer rather than pass it on. A recorder that has not seen WriteHeader
// yet (Caddy's own around every logged request; any behind an encode,
// which holds WriteHeader back until the first byte) has decided nothing:
// it reads as buffered until then.
func bufferedInFront(w http.ResponseWriter) bool {
	for w != nil {
		if rr, ok := w.(caddyhttp.ResponseRecorder); ok && rr.Status() != 0 && rr.Buffered() {
			return true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok {
			return false
		}
		w = u.Unwrap()
	}
	return false
}

// official returns the official page that pays offer, when the mode is
// official and the package has one for its network.
func (p *Paywall) official(offer x402.PaymentRequirements) (officialPage, bool) {
	if p == nil || p.Mode != PaywallOfficial {
		return officialPage{}, false
	}
	switch n := offer.Network; {
	case x402.IsEVM(n):
		return evmPage, true
	case strings.HasPrefix(n, "solana:"):
		return svmPage, true
	}
	return officialPage{}, false
}

// checkOffer refuses, when the config loads, an official page for a first
// offer whose asset's decimals are unknown (decimals 0: priced with amount,
// without asset_decimals). The page says "please pay $<amount> <token>" in
// whole tokens; read in guessed decimals that would be a price other than
// the one the wallet signs, and the page has no way to say "atomic units".
// The static page states such an amount in atomic units.
func (p *Paywall) checkOffer(offer x402.PaymentRequirements, decimals int) error {
	if _, ok := p.official(offer); !ok || decimals != 0 {
		return nil
	}
	return fmt.Errorf("paywall official: the first offer is priced with amount and its asset's decimals are unknown, so the page could not state its price in whole tokens; set asset_decimals, or use paywall static (a token without decimals cannot use the official page)")
}

// officialConfig is window.x402, the page's configuration, with the fields
// the package's generateHtml sets.
type officialConfig struct {
	// Amount is a string: the page writes it as it is ("please pay
	// $<amount>") and computes nothing with it, and a JSON number would be
	// a float64, printed in exponent form below 1e-6 and rounded past 15
	// or so digits.
	Amount          string                `json:"amount"`
	PaymentRequired x402.PaymentRequired  `json:"paymentRequired"`
	Testnet         bool                  `json:"testnet"`
	CurrentURL      string                `json:"currentUrl"`
	Config          officialChainSettings `json:"config"`
	AppName         string                `json:"appName"`
	AppLogo         string                `json:"appLogo"`
}

type officialChainSettings struct {
	ChainConfig map[string]officialChain `json:"chainConfig"`
}

type officialChain struct {
	USDCAddress string `json:"usdcAddress"`
	USDCName    string `json:"usdcName"`
}

// evmChainConfig is the chain table the package's EVM generateHtml passes.
var evmChainConfig = map[string]officialChain{
	"base":         {USDCAddress: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", USDCName: "USDC"},
	"base-sepolia": {USDCAddress: "0x036CbD53842c5426634e7929541eC2318f3dCF7e", USDCName: "USDC"},
}

// officialScript returns the script that sets window.x402 for pr, which
// goes before the official page's </head>.
func (p *Paywall) officialScript(pr x402.PaymentRequired, decimals int, currentURL string) ([]byte, error) {
	offer := pr.Accepts[0]
	cfg := officialConfig{
		Amount:          x402.FormatAmount(offer.Amount, decimals),
		PaymentRequired: pr,
		Testnet:         offer.Network != x402.NetworkBase && offer.Network != x402.NetworkSolana,
		CurrentURL:      currentURL,
		Config:          officialChainSettings{ChainConfig: map[string]officialChain{}},
		AppName:         p.AppName,
		AppLogo:         p.AppLogo,
	}
	if x402.IsEVM(offer.Network) {
		cfg.Config.ChainConfig = evmChainConfig
	}
	// encoding/json escapes <, > and & (and U+2028/9), so nothing in the
	// demand (its resource URL comes from the request) can close the
	// script element.
	js, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return fmt.Appendf(nil, "<script>window.x402 = %s;</script>\n", js), nil
}

// parsePaywall parses the x402 directive's option
//
//	paywall off|static|official {
//		app_name <name>
//		app_logo <url>
//	}
func parsePaywall(d *caddyfile.Dispenser) (*Paywall, error) {
	p := &Paywall{}
	if !d.NextArg() {
		return nil, d.ArgErr()
	}
	p.Mode = d.Val()
	if d.NextArg() {
		return nil, d.ArgErr()
	}
	seen := caddyopt.Once{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		if err := seen.Check(d); err != nil {
			return nil, err
		}
		var field *string
		switch d.Val() {
		case "app_name":
			field = &p.AppName
		case "app_logo":
			field = &p.AppLogo
		default:
			return nil, d.Errf("paywall: unknown option %q (want app_name or app_logo)", d.Val())
		}
		if !d.NextArg() {
			return nil, d.ArgErr()
		}
		*field = d.Val()
		if d.NextArg() {
			return nil, d.ArgErr()
		}
	}
	if err := p.validate(); err != nil {
		return nil, d.Err(err.Error())
	}
	return p, nil
}
