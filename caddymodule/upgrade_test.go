package caddymodule

import (
	"io"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// upgradePayer signs the payments of the protocol switch tests, whose
// balance they read.
const upgradePayer = 7

var upgradePayerAddress = evmfacilitator.DevAccounts()[upgradePayer].Address

// routePrice is gateSite's price of /verify/schema ($0.02) in the token's
// units.
var routePrice = big.NewInt(20_000)

// settle after: a protocol switch (101) is the upstream accepting the
// call. The gate settles at the 101, once, and only then sends it with
// PAYMENT-RESPONSE; the tunnel then runs past upstream_timeout, which
// bounds the wait for the answer, not the open tunnel.
func TestSettleAfterProtocolSwitchSettlesAtThe101(t *testing.T) {
	d, fac := sharedDevnet(t)
	up, tunnels, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "upstream_timeout 500ms")) + "/verify/schema"
	before := balance(t, d, upgradePayerAddress)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), upgradePayer)
	resp := upgradePost(t, url, sig)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("upgrade: %d %s, want 101", resp.StatusCode, b)
	}
	settlementOf(t, resp)
	if l := echo(t, resp, "one"); l != "echo one\n" {
		t.Fatalf("first echo %q", l)
	}
	time.Sleep(1500 * time.Millisecond) // past upstream_timeout
	if l := echo(t, resp, "two"); l != "echo two\n" {
		t.Fatalf("the tunnel after upstream_timeout (500ms): %q, want \"echo two\"", l)
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Cmp(routePrice) != 0 || tunnels.Load() != 1 {
		t.Fatalf("charged %v for %d tunnels, want %v for one", got, tunnels.Load(), routePrice)
	}
}

// settle after, the facilitator refuses the settlement at the 101: no 101
// reaches the buyer, who gets the settle failure's 402, uncharged, and the
// upstream's connection is closed (its tunnel ends).
func TestSettleAfterProtocolSwitchRefusedSettlementSendsNo101(t *testing.T) {
	d, fac := sharedDevnet(t)
	refusing := reasonFacilitator(t, fac, false, func(int64) string { return "insufficient_funds" })
	up, tunnels, ended := echoUpgradeUpstream(t)
	url := startCaddy(t, gateSite(up.URL, refusing.URL, 0, "")) + "/verify/schema"
	before := balance(t, d, upgradePayerAddress)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), upgradePayer)
	resp := upgradePost(t, url, sig)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), "insufficient_funds") {
		t.Fatalf("upgrade whose settlement is refused: %d %s, want the settle failure's 402", resp.StatusCode, b)
	}
	var sr x402.SettleResponse
	if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); err != nil || sr.Success {
		t.Fatalf("PAYMENT-RESPONSE %+v (%v), want the failed settlement", sr, err)
	}
	for deadline := time.Now().Add(5 * time.Second); ended.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if tunnels.Load() != 1 || ended.Load() != 1 {
		t.Fatalf("upstream tunnels opened %d, ended %d; want its one tunnel closed by the gate", tunnels.Load(), ended.Load())
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Sign() != 0 {
		t.Fatalf("charged %v for a refused settlement", got)
	}
}

// settle after: concurrent protocol switches with one payment open one
// tunnel and settle once; the others are refused with a 402 and never
// reach the upstream.
func TestSettleAfterProtocolSwitchConcurrentSettlesOnce(t *testing.T) {
	d, fac := sharedDevnet(t)
	up, tunnels, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "")) + "/verify/schema"
	before := balance(t, d, upgradePayerAddress)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), upgradePayer)
	const n = 4
	var wg sync.WaitGroup
	status := make([]int, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, err := sendUpgradePost(url, sig)
			if err != nil {
				errs[i] = err
				return
			}
			status[i] = resp.StatusCode
			t.Cleanup(func() { resp.Body.Close() }) // a tunnel stays open to the end
		}()
	}
	close(start)
	wg.Wait()
	switched := 0
	for i := range n {
		switch {
		case errs[i] != nil:
			t.Fatalf("request %d: %v", i, errs[i])
		case status[i] == http.StatusSwitchingProtocols:
			switched++
		case status[i] != http.StatusPaymentRequired:
			t.Fatalf("request %d: %d, want 101 or 402", i, status[i])
		}
	}
	if switched != 1 || tunnels.Load() != 1 {
		t.Fatalf("%d switched, %d tunnels for one payment; want one of each (statuses %v)", switched, tunnels.Load(), status)
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Cmp(routePrice) != 0 {
		t.Fatalf("charged %v, want one settlement (%v)", got, routePrice)
	}
}

// settle_on pass settles only an answer verify_response found passing, and
// a tunnel cannot be checked: an upgrade request is refused before any
// payment is verified or anything runs, paid or not (never offered for
// sale), and nothing is charged.
func TestSettleOnPassRefusesProtocolSwitch(t *testing.T) {
	d, fac := sharedDevnet(t)
	up, tunnels, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "settle_on pass")) + "/verify/schema"
	before := balance(t, d, upgradePayerAddress)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), upgradePayer)
	for _, s := range []string{"", sig} {
		resp, err := sendUpgradePost(url, s)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		m := readJSON(t, resp)
		if resp.StatusCode != http.StatusBadRequest || m["code"] != codeUpgradeUnsupported || m["charged"] != false || resp.Header.Get(x402.HeaderPaymentRequired) != "" {
			t.Fatalf("upgrade (paid %v) on a settle_on pass route: %d %v, want 400 %s, nothing charged, no offer", s != "", resp.StatusCode, m["code"], codeUpgradeUnsupported)
		}
	}
	if tunnels.Load() != 0 {
		t.Fatalf("the upstream opened %d tunnels", tunnels.Load())
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Sign() != 0 {
		t.Fatalf("charged %v for a refused upgrade", got)
	}
}

// settle after, the settle reply lost at the 101: no 101 goes out, the
// buyer is told settlement_pending (nothing held: a tunnel cannot be), and
// the retry that finds the transfer runs the upstream again, once: its
// tunnel is the one the payment bought, charged once.
func TestSettleAfterProtocolSwitchUnknownSettlementRunsAgainOnce(t *testing.T) {
	d, _ := sharedDevnet(t)
	up, tunnels, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "")) + "/verify/schema"
	before := balance(t, d, upgradePayerAddress)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), upgradePayer)
	first := upgradePost(t, url, sig)
	m := readJSON(t, first)
	if first.StatusCode != http.StatusServiceUnavailable || m["code"] != x402.ReasonSettlementPending {
		t.Fatalf("first try: %d %v, want 503 settlement_pending", first.StatusCode, m["code"])
	}
	resp := upgradePost(t, url, sig)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("retry: %d %s, want the run again's 101", resp.StatusCode, b)
	}
	if l := echo(t, resp, "hello"); l != "echo hello\n" {
		t.Fatalf("run again's tunnel: %q", l)
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Cmp(routePrice) != 0 || tunnels.Load() != 2 {
		t.Fatalf("charged %v, %d tunnels; want %v and the first try's tunnel and the run again's", got, tunnels.Load(), routePrice)
	}
}

// settle after: an upgrade request whose upstream sends nothing within
// upstream_timeout fails as any call past it does (504, nothing charged,
// the payment free for a retry), not as a client gone away (499).
func TestSettleAfterProtocolSwitchPastUpstreamTimeoutIs504(t *testing.T) {
	d, fac := sharedDevnet(t)
	up, stalling, _ := stallingUpstream(t, 2*time.Minute)
	stalling.Store(true)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "upstream_timeout 500ms")) + "/verify/schema"
	before := balance(t, d, upgradePayerAddress)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), upgradePayer)
	resp := upgradePost(t, url, sig)
	if resp.StatusCode != http.StatusGatewayTimeout {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("upgrade past upstream_timeout: %d %s, want 504", resp.StatusCode, b)
	}
	stalling.Store(false)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK {
		t.Fatalf("the same payment after the timeout: %d, want 200", resp.StatusCode)
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Cmp(routePrice) != 0 {
		t.Fatalf("charged %v, want the one settled call (%v)", got, routePrice)
	}
}

// An ordinary request that merely offers an h2c upgrade (curl --http2 on
// an http:// URL sends Connection: Upgrade, HTTP2-Settings and Upgrade:
// h2c with every request) is no protocol switch: reverse_proxy forwards it
// without the HTTP2-Settings no upstream upgrades without, and the
// upstream answers it as any request. A settle_on pass route offers it
// for sale as it does the same request without the offer.
func TestSettleOnPassOffersRequestWithH2COffer(t *testing.T) {
	_, fac := sharedDevnet(t)
	up, tunnels, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "settle_on pass")) + "/verify/schema"
	resp := post(t, url, validRequest, map[string]string{
		"Connection":     "Upgrade, HTTP2-Settings",
		"Upgrade":        "h2c",
		"HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA",
	})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get(x402.HeaderPaymentRequired) == "" {
		t.Fatalf("request with an h2c upgrade offer: %d %s, want the route's 402 offer", resp.StatusCode, b)
	}
	if tunnels.Load() != 0 {
		t.Fatalf("the upstream opened %d tunnels", tunnels.Load())
	}
}

// settle after with validate verify_request: the upstream took an upgrade
// request the gate's check would refuse and sent its 101, which is its
// answer; when the settlement at that 101 is refused the buyer gets the
// settle failure's 402 with the failed PAYMENT-RESPONSE, as after any
// answer, not the check's 422 for a request the upstream already ran.
func TestSettleAfterProtocolSwitchRefusedSettlementIs402AfterTheUpstreamRan(t *testing.T) {
	d, fac := sharedDevnet(t)
	refusing := reasonFacilitator(t, fac, false, func(int64) string { return "insufficient_funds" })
	up, tunnels, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, gateSite(up.URL, refusing.URL, 0, "")) + "/verify/schema"
	before := balance(t, d, upgradePayerAddress)
	sig := signFor(t, paymentRequired(t, post(t, url, validRequest, nil)), upgradePayer)
	resp := post(t, url, `{"task_id":"t-1"}`, map[string]string{
		"Connection":                "Upgrade",
		"Upgrade":                   "echo",
		x402.HeaderPaymentSignature: sig,
	})
	b, _ := io.ReadAll(resp.Body)
	if tunnels.Load() != 1 {
		t.Fatalf("the upstream opened %d tunnels, want its one (test premise)", tunnels.Load())
	}
	var sr x402.SettleResponse
	if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); resp.StatusCode != http.StatusPaymentRequired || err != nil || sr.Success {
		t.Fatalf("settlement refused at the 101: %d %s PAYMENT-RESPONSE %+v (%v); want the settle failure's 402 with the failed settlement", resp.StatusCode, b, sr, err)
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Sign() != 0 {
		t.Fatalf("charged %v for a refused settlement", got)
	}
}

// settle after, a call served from the free allowance: the upstream's 101
// is the free call's answer. Its unit is committed there, the 101 goes out
// with the Free-Allowance headers and the tunnel opens, nothing charged.
func TestSettleAfterFreeProtocolSwitchIsServedFree(t *testing.T) {
	d, fac := sharedDevnet(t)
	up, tunnels, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, gateSite(up.URL, fac, 2, "")) + "/verify/schema"
	before := balance(t, d, upgradePayerAddress)
	resp := upgradePost(t, url, "")
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("free upgrade: %d %s, want 101", resp.StatusCode, b)
	}
	if got := resp.Header.Get(HeaderFreeRemaining); got != "1" {
		t.Fatalf("%s on the free 101: %q, want 1", HeaderFreeRemaining, got)
	}
	if resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatal("a free 101 carries PAYMENT-RESPONSE")
	}
	if l := echo(t, resp, "free"); l != "echo free\n" {
		t.Fatalf("free tunnel: %q", l)
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Sign() != 0 || tunnels.Load() != 1 {
		t.Fatalf("charged %v, %d tunnels; want nothing and one", got, tunnels.Load())
	}
}

// Free protocol switches spend the free allowance as any free answer:
// past per_day an upgrade request gets the route's 402 offer, before the
// upstream runs, and is then paid as any paid switch.
func TestFreeProtocolSwitchesCountAgainstPerDay(t *testing.T) {
	_, fac := sharedDevnet(t)
	up, tunnels, _ := echoUpgradeUpstream(t)
	url := startCaddy(t, gateSite(up.URL, fac, 2, "")) + "/verify/schema"
	for i := range 2 {
		if resp := upgradePost(t, url, ""); resp.StatusCode != http.StatusSwitchingProtocols {
			t.Fatalf("free upgrade %d of per_day 2: %d, want 101", i+1, resp.StatusCode)
		}
	}
	past := upgradePost(t, url, "")
	if past.StatusCode != http.StatusPaymentRequired || tunnels.Load() != 2 {
		t.Fatalf("upgrade past per_day 2: %d after %d tunnels; want the 402 offer after 2", past.StatusCode, tunnels.Load())
	}
	sig := signFor(t, paymentRequired(t, past), upgradePayer)
	paid := upgradePost(t, url, sig)
	if paid.StatusCode != http.StatusSwitchingProtocols || tunnels.Load() != 3 {
		t.Fatalf("paid upgrade past per_day: %d, %d tunnels; want 101 and a third", paid.StatusCode, tunnels.Load())
	}
	settlementOf(t, paid)
}
