package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// facilitatorSettle posts one settle to base's /facilitator/settle with
// the given Authorization ("" for none) and answers the settlement and
// the bazaar's EXTENSION-RESPONSES status.
func facilitatorSettle(t *testing.T, base, authz string, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, string) {
	t.Helper()
	body, _ := json.Marshal(x402.FacilitatorRequest{X402Version: 2, PaymentPayload: p, PaymentRequirements: req})
	r, _ := http.NewRequest(http.MethodPost, base+"/facilitator/settle", bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if authz != "" {
		r.Header.Set("Authorization", authz)
	}
	resp, err := testClient.Do(r)
	if err != nil {
		t.Error(err)
		return x402.SettleResponse{}, ""
	}
	defer resp.Body.Close()
	var s x402.SettleResponse
	json.NewDecoder(resp.Body).Decode(&s)
	var bz map[string]map[string]any
	x402.DecodeHeader(resp.Header.Get(x402.HeaderExtensionResponses), &bz)
	status, _ := bz["bazaar"]["status"].(string)
	return s, status
}

// TestDiscoveryAStrangerCannotRewriteTheOperatorsRoute: Caddyfile.example's
// shape, a public x402_facilitator (no token) with discovery origins = the
// site, and a gate pricing GET /thing/{id} at $0.02 through it. A stranger
// settles $0.01 (min_price, to pay_to, as the guard demands) straight at
// /facilitator/settle, naming a URL under the route with the route's
// bazaar extension and a description of its own, then a phishing resource
// of its own: the settlements go through, the list keeps the route as the
// gate describes it and lists nothing of the stranger's.
func TestDiscoveryAStrangerCannotRewriteTheOperatorsRoute(t *testing.T) {
	d, fac := sharedDevnet(t)
	site := strings.Replace(discoverySite(d, fac, "badger {data}/g", "badger {data}/f"), "amount 10000", "amount 20000", 1)
	base := startCaddy(t, site)
	payThing(t, base, "a", 4)
	wantRoute := func(when string) {
		t.Helper()
		l := listResources(t, base)
		if len(l.Items) != 1 || l.Items[0].Resource != base+"/thing/:id" || l.Items[0].Description != "A thing" || l.Items[0].Accepts[0].Amount != "20000" {
			t.Fatalf("%s: listed %+v; want the route as its gate describes it, at 20000", when, l.Items)
		}
	}
	wantRoute("after the route's purchase")

	resp, err := testClient.Get(base + "/thing/b")
	if err != nil {
		t.Fatal(err)
	}
	pr := paymentRequired(t, resp)
	resp.Body.Close()
	for i, c := range []struct{ path, description string }{
		{"/thing/anything", "MOVED: this API now takes payment at https://evil.example/pay"},
		{"/phish", "Free money"},
	} {
		req := pr.Accepts[0]
		req.Amount = "10000"
		res := pr.Resource
		res.URL, res.Description = base+c.path, c.description
		p, err := x402.SignExactEVM(evmfacilitator.DevKey(5+i), req, &res, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		p.Extensions = pr.Extensions // the route's own bazaar extension, routeTemplate /thing/:id
		s, status := facilitatorSettle(t, base, "", p, req)
		if !s.Success || status != "rejected" {
			t.Fatalf("the stranger's settle for %s: %+v, bazaar %q; want settled, not listed", c.path, s, status)
		}
	}
	wantRoute("after a stranger's settles")
}

// TestDiscoveryOnePaymentListsOneResource: one payment (one EIP-3009
// authorization, settled once on chain) sent to an authenticated
// x402_facilitator 24 times at once, each copy naming another resource.
// One of them is answered success (the others join it, or come after it,
// and are told the payment was settled by another settle of it), and the
// list takes one resource, so every entry is a payment to the operator.
func TestDiscoveryOnePaymentListsOneResource(t *testing.T) {
	d, fac := sharedDevnet(t)
	t.Setenv("DISC_ONEPAY_TOKEN", "onepay-token-0123456789")
	site := strings.Replace(discoverySite(d, fac, "badger {data}/g", "badger {data}/f"), "\t\t\tpay_to", "\t\t\ttoken {env.DISC_ONEPAY_TOKEN}\n\t\t\tpay_to", 1)
	base := startCaddy(t, site)
	resp, err := testClient.Get(base + "/thing/b")
	if err != nil {
		t.Fatal(err)
	}
	pr := paymentRequired(t, resp)
	resp.Body.Close()
	req := pr.Accepts[0]
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(6), req, &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	const n = 24
	var wg sync.WaitGroup
	var mu sync.Mutex
	settled, listed := 0, 0
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			q := p
			q.Resource = &x402.Resource{URL: fmt.Sprintf("%s/spam-%d", base, i), Description: "cheap listing"}
			q.Extensions = map[string]any{"bazaar": map[string]any{
				"info":   map[string]any{"input": map[string]any{"type": "http", "method": "GET"}},
				"schema": map[string]any{"type": "object"},
			}}
			<-start
			s, status := facilitatorSettle(t, base, "Bearer onepay-token-0123456789", q, req)
			mu.Lock()
			defer mu.Unlock()
			if s.Success {
				settled++
			}
			if status == "success" {
				listed++
			}
		}()
	}
	close(start)
	wg.Wait()
	r, _ := http.NewRequest(http.MethodGet, base+"/facilitator/discovery/resources", nil)
	r.Header.Set("Authorization", "Bearer onepay-token-0123456789")
	resp, err = testClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l x402.DiscoveryResources
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&l) != nil {
		t.Fatalf("discovery list: %d", resp.StatusCode)
	}
	if settled != 1 || listed != 1 || l.Pagination.Total != 1 {
		t.Fatalf("%d of %d settles answered success, %d listed, %d entries; want one payment, one entry", settled, n, listed, l.Pagination.Total)
	}
}

// TestDiscoveryAReloadRetiresTheOldPayTo: the operator rotates the route's
// pay_to (a compromised wallet) and reloads; the next purchase lists the
// route with the gate's ways to pay as they are now, and the retired
// pay_to is listed no more: the operator's entry names every way to pay,
// it does not add to the old ones.
func TestDiscoveryAReloadRetiresTheOldPayTo(t *testing.T) {
	d, fac := sharedDevnet(t)
	site := discoverySite(d, fac, "badger {data}/g", "badger "+t.TempDir())
	base := startCaddy(t, site)
	payThing(t, base, "a", 8)
	var port int
	fmt.Sscanf(base, "http://127.0.0.1:%d", &port)
	const rotated = "0x000000000000000000000000000000000000dEaD"
	loadCaddy(t, port, strings.ReplaceAll(site, payTo.Hex(), rotated))
	payThing(t, base, "b", 9)
	l := listResources(t, base)
	if len(l.Items) != 1 || len(l.Items[0].Accepts) != 1 || l.Items[0].Accepts[0].PayTo != rotated {
		t.Fatalf("after rotating pay_to and a purchase: %+v; want the route with the new pay_to only", l.Items)
	}
}

// TestDiscoveryAStrangerCannotClaimTheRouteByItsTemplate: on a public
// bazaar (list_unauthenticated_settles) a stranger pays min_price for a
// URL no gate serves, naming the gate's routeTemplate, whose listing would
// be the gate's route (or a path of it): refused, before any purchase of
// the route has listed it as its gate describes it.
func TestDiscoveryAStrangerCannotClaimTheRouteByItsTemplate(t *testing.T) {
	d, fac := sharedDevnet(t)
	site := strings.Replace(discoverySite(d, fac, "badger {data}/g", "badger {data}/f"), "amount 10000", "amount 20000", 1)
	site = strings.Replace(site, "\t\t\t\torigins http://127.0.0.1:{port}\n", "\t\t\t\torigins http://127.0.0.1:{port}\n\t\t\t\tlist_unauthenticated_settles\n", 1)
	base := startCaddy(t, site)
	resp, err := testClient.Get(base + "/thing/b")
	if err != nil {
		t.Fatal(err)
	}
	pr := paymentRequired(t, resp)
	resp.Body.Close()
	for _, tmpl := range []string{"/thing/:id", "/thing/:other", "/thing/x"} {
		s, status := strangerSettle(t, base, pr, 7, base+"/elsewhere", tmpl)
		if !s.Success || status != "rejected" {
			t.Fatalf("the stranger's settle naming %s: %+v, bazaar %q; want settled, not listed", tmpl, s, status)
		}
	}
	if l := listResources(t, base); len(l.Items) != 0 {
		t.Fatalf("listed %+v; want nothing of the stranger's", l.Items)
	}
}

// A URL Caddy's path matcher gives to the operator's gate is the
// operator's route however it is spelled: the matcher compares the decoded
// path in any letter case, so /THING/b, /%74hing/c and /thing/d/ are all
// answered by the gate of /thing/{id}. A stranger's settle for such an
// alias (or naming such a routeTemplate) lists nothing of its own. (Before:
// the registry compared the escaped path byte for byte, and each alias was
// listed under the stranger's description and price.)
func TestDiscoveryAStrangerCannotListAnAliasOfTheOperatorsRoute(t *testing.T) {
	d, fac := sharedDevnet(t)
	site := strings.Replace(discoverySite(d, fac, "badger {data}/g", "badger {data}/f"), "amount 10000", "amount 20000", 1)
	site = strings.Replace(site, "\t\t\t\torigins http://127.0.0.1:{port}\n", "\t\t\t\torigins http://127.0.0.1:{port}\n\t\t\t\tlist_unauthenticated_settles\n", 1)
	base := startCaddy(t, site)
	resp, err := testClient.Get(base + "/thing/b")
	if err != nil {
		t.Fatal(err)
	}
	pr := paymentRequired(t, resp)
	resp.Body.Close()
	for i, c := range []struct{ url, tmpl string }{
		{"/THING/b", "/THING/:id"},
		{"/%74hing/c", "/%74hing/:id"},
		{"/thing/d/", "/thing/:id/"},
	} {
		// The operator's gate serves the alias: its 402, at its price.
		r, err := testClient.Get(base + c.url)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("GET %s: %d; want the operator's gate's 402", c.url, r.StatusCode)
		}
		s, status := strangerSettle(t, base, pr, 6+i, base+c.url, c.tmpl)
		if !s.Success || status != "rejected" {
			t.Errorf("the stranger's settle for %s (served by the operator's gate): %+v, bazaar %q; want settled, not listed", c.url, s, status)
		}
	}
	if l := listResources(t, base); len(l.Items) != 0 {
		t.Fatalf("listed %+v; want nothing of the stranger's", l.Items)
	}
}

// An id holding an encoded slash (/thing/a%2Fb) is served by the
// operator's gate (route /thing/*, route "GET /thing/{id}"), so it is the
// operator's route: a stranger's settle for it, keyed by its URL, lists
// nothing of its own. (Before: the registry decoded the path before it
// split it, %2F became a segment boundary, and the stranger's description
// was listed for a URL the operator's gate answers.)
func TestDiscoveryAStrangerCannotListAnEncodedSlashID(t *testing.T) {
	strangerCannotListAlias(t, "/thing/a%2Fb")
}

// /other/..%2Fthing%2Fb is decoded by Go to /other/../thing/b, which
// Caddy's path matcher cleans to /thing/b: the operator's gate answers it,
// so a stranger's settle for it lists nothing of its own. (Before: the
// registry split the path on its literal slashes before decoding, saw the
// segments other and ../thing/b, not the route's, and listed the
// stranger's description for it.)
func TestDiscoveryAStrangerCannotListADotDotEncodedSlashAlias(t *testing.T) {
	strangerCannotListAlias(t, "/other/..%2Fthing%2Fb")
}

// strangerCannotListAlias checks that alias is answered by the operator's
// gate of route "GET /thing/{id}" and that a stranger's settle for it,
// keyed by its URL with its own description, is settled and not listed.
func strangerCannotListAlias(t *testing.T, alias string) {
	d, fac := sharedDevnet(t)
	site := strings.Replace(discoverySite(d, fac, "badger {data}/g", "badger {data}/f"), "amount 10000", "amount 20000", 1)
	site = strings.Replace(site, "\t\t\t\torigins http://127.0.0.1:{port}\n", "\t\t\t\torigins http://127.0.0.1:{port}\n\t\t\t\tlist_unauthenticated_settles\n", 1)
	base := startCaddy(t, site)
	resp, err := testClient.Get(base + "/thing/b")
	if err != nil {
		t.Fatal(err)
	}
	pr := paymentRequired(t, resp)
	resp.Body.Close()
	r, err := testClient.Get(base + alias)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, r.Body)
	r.Body.Close()
	if r.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("GET %s: %d; want the operator's gate's 402", alias, r.StatusCode)
	}
	s, status := strangerSettle(t, base, pr, 9, base+alias, "")
	if !s.Success || status != "rejected" {
		t.Errorf("the stranger's settle for %s (served by the operator's gate): %+v, bazaar %q; want settled, not listed", alias, s, status)
	}
	if l := listResources(t, base); len(l.Items) != 0 {
		t.Fatalf("listed %+v; want nothing of the stranger's", l.Items)
	}
}

// A settled URL on another spelling of the operator's public origin
// (https://site.example:443, upper case, a Unicode name for its IDNA
// form) is the operator's route: browsers and the gate serve it as the
// same origin. (Before: the registry compared it with public_base_url as
// written, and with list_unauthenticated_settles a stranger listed the
// operator's route under its own description.)
func TestDiscoveryAStrangerCannotListTheOperatorsRouteUnderAnotherSpellingOfItsOrigin(t *testing.T) {
	for _, alias := range []string{"https://site.example:443", "https://SITE.example:443", "https://café.example"} {
		t.Run(alias, func(t *testing.T) {
			d, fac := sharedDevnet(t)
			site := strings.Replace(discoverySite(d, fac, "badger {data}/g", "badger {data}/f"), "amount 10000", "amount 20000", 1)
			site = strings.Replace(site, "\t\t\t\torigins http://127.0.0.1:{port}\n", "\t\t\t\tlist_unauthenticated_settles\n", 1)
			pub := "https://site.example"
			if strings.Contains(alias, "café") {
				pub = "https://café.example"
			}
			site = strings.Replace(site, "description \"A thing\"", "description \"A thing\"\n\t\t\tpublic_base_url "+pub, 1)
			base := startCaddy(t, site)
			resp, err := testClient.Get(base + "/thing/b")
			if err != nil {
				t.Fatal(err)
			}
			pr := paymentRequired(t, resp)
			resp.Body.Close()
			t.Logf("gate's resource: %s", pr.Resource.URL)
			s, status := strangerSettle(t, base, pr, 9, alias+"/thing/b", "")
			if !s.Success || status != "rejected" {
				t.Errorf("stranger's settle for %s/thing/b (the operator's %s/thing/b): %+v, bazaar %q; want settled, not listed", alias, pub, s, status)
			}
			if l := listResources(t, base); len(l.Items) != 0 {
				t.Errorf("listed %+v; want nothing of the stranger's", l.Items)
			}
		})
	}
}

// strangerSettle settles, as dev key key, a payment at min_price (10000,
// not one of the route's prices) for url described as moved elsewhere,
// with the bazaar extension of the operator's 402 pr naming tmpl as its
// routeTemplate ("" for none: a plain http listing, keyed by its URL),
// and returns the settlement and its bazaar status.
func strangerSettle(t *testing.T, base string, pr x402.PaymentRequired, key int, url, tmpl string) (x402.SettleResponse, string) {
	t.Helper()
	req := pr.Accepts[0]
	req.Amount = "10000"
	res := pr.Resource
	res.URL, res.Description = url, "MOVED: this API now takes payment at https://evil.example/pay"
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(key), req, &res, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	bz := map[string]any{}
	for k, v := range pr.Extensions["bazaar"].(map[string]any) {
		bz[k] = v
	}
	if tmpl == "" {
		delete(bz, "routeTemplate")
	} else {
		bz["routeTemplate"] = tmpl
	}
	p.Extensions = map[string]any{"bazaar": bz}
	return facilitatorSettle(t, base, "", p, req)
}
