package caddymodule

import (
	"html/template"
	"io"
	"math/big"
	"strings"

	"github.com/aovhq/aov/x402"
)

// paywallTemplate is the page a browser gets instead of a JSON 402. It says
// what the resource costs and how to pay; the machine-readable demand is in
// the PAYMENT-REQUIRED header of the same answer, so an x402-aware browser
// extension or wallet can still pay. No script, and no external asset but
// the operator's app_logo, shown with the app_name above the demand.
var paywallTemplate = template.Must(template.New("paywall").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{with .AppName}}{{.}}: {{end}}Payment required</title>
<style>body{font-family:system-ui,sans-serif;max-width:40rem;margin:3rem auto;padding:0 1rem;color:#222}
header{display:flex;align-items:center;gap:.6rem;font-size:1.2rem}header img{height:2.5rem}
code{background:#f3f3f3;padding:.1rem .3rem;border-radius:3px}table{border-collapse:collapse}td,th{padding:.3rem .8rem;border-bottom:1px solid #ddd;text-align:left}</style>
</head><body>
{{if or .AppLogo .AppName}}<header>{{with .AppLogo}}<img src="{{.}}" alt="">{{end}}{{with .AppName}}<strong>{{.}}</strong>{{end}}</header>{{end}}
<h1>Payment required</h1>
<p>{{if .Description}}{{.Description}}: {{end}}<code>{{.URL}}</code> is paid per call with <a href="https://x402.org">x402</a>.</p>
<table><tr><th>Price</th><th>Network</th><th>Pay to</th></tr>
{{range .Offers}}<tr><td>{{.Price}}</td><td>{{.Network}}</td><td><code>{{.PayTo}}</code></td></tr>{{end}}
</table>
{{with .Trial}}<p>{{.Message}}</p>{{end}}
<p>An x402 client pays automatically: it reads the <code>PAYMENT-REQUIRED</code> header of this answer, signs a payment and sends the request again with <code>PAYMENT-SIGNATURE</code>.</p>
</body></html>
`))

type paywallOffer struct{ Price, Network, PayTo string }

// paywallPage renders the browser page for a 402, with the app name and
// logo of p (nil: none).
func paywallPage(w io.Writer, pr x402.PaymentRequired, trial *freeTrial, p *Paywall) error {
	data := struct {
		URL, Description, AppName, AppLogo string
		Offers                             []paywallOffer
		Trial                              *freeTrial
	}{URL: pr.Resource.URL, Description: pr.Resource.Description, Trial: trial}
	if p != nil {
		data.AppName, data.AppLogo = p.AppName, p.AppLogo
	}
	for _, o := range pr.Accepts {
		data.Offers = append(data.Offers, paywallOffer{Price: displayAmount(o), Network: o.Network, PayTo: o.PayTo})
	}
	return paywallTemplate.Execute(w, data)
}

// displayAmount shows an atomic amount of a known 6-decimal asset as dollars
// ("20000" → "$0.02"), and anything else as atomic units.
func displayAmount(o x402.PaymentRequirements) string {
	a, ok := x402.USDC(o.Network)
	n, nok := new(big.Int).SetString(o.Amount, 10)
	if !ok || !nok || !strings.EqualFold(a.Address, o.Asset) {
		return o.Amount + " units of " + o.Asset
	}
	r := new(big.Rat).SetFrac(n, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(a.Decimals)), nil))
	s := strings.TrimRight(strings.TrimRight(r.FloatString(a.Decimals), "0"), ".")
	if !strings.Contains(s, ".") {
		s += ".00"
	} else if len(s)-strings.Index(s, ".") == 2 {
		s += "0"
	}
	return "$" + s + " USDC"
}
