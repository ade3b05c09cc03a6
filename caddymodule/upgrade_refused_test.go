package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/x402"
)

// wantUpgradeRefused fails t unless resp is the 400 upgrade_unsupported
// refusal: nothing charged, no offer and no settlement on it.
func wantUpgradeRefused(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	var e apierr.Error
	if resp.StatusCode != http.StatusBadRequest || json.Unmarshal(b, &e) != nil || e.Code != codeUpgradeUnsupported || e.Charged ||
		resp.Header.Get(x402.HeaderPaymentRequired) != "" || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("%s: %d %.300s, want 400 %s, nothing charged, no offer", what, resp.StatusCode, b, codeUpgradeUnsupported)
	}
}

// verifiedUpgradeSite puts echoUpgradeUpstream behind gates whose route
// has a verify_response (its verifier unreachable, on_error fail_open: an
// ordinary answer passes unverified): /any/* with settle_on any, /dflt/*
// with the default settle_on (pass, since verify_response handles the
// request), and, with settle_on any, /free/* serving free calls and
// /before/* with settle before and one free call a day.
func verifiedUpgradeSite(up, fac string) string {
	gate := func(opts string) string {
		return fmt.Sprintf(`x402 {
			accept devnet $0.02 %s
			facilitator http %s
			store badger {data}/gate
			%s
		}
		verify_response {
			schema `+"`"+`{"type":"object"}`+"`"+`
			verifier_url http://127.0.0.1:1
			on_error fail_open
		}
		reverse_proxy %s`, payTo.Hex(), fac, opts, strings.TrimPrefix(up, "http://"))
	}
	return fmt.Sprintf(`:{port} {
	route /any/* {
		%s
	}
	route /dflt/* {
		%s
	}
	route /free/* {
		%s
	}
	route /before/* {
		%s
	}
}`, gate("settle_on any"), gate(""), gate("settle_on any\n\t\t\tfree_allowance {\n\t\t\t\tpool free\n\t\t\t\tper_day 5\n\t\t\t}"),
		gate("settle before\n\t\t\tsettle_on any\n\t\t\tfree_allowance {\n\t\t\t\tpool before\n\t\t\t\tper_day 1\n\t\t\t}"))
}

// verify_response holds every answer it checks, and a 101 is no answer it
// can hold: the upstream's tunnel would open and then fail, the call
// uncharged, as often as a client asks. On a route with verify_response an
// upgrade request is refused (400 upgrade_unsupported) before the upstream
// runs, whatever the gate's settle_on: by verify_response while the gate
// has not yet seen it handle a request, and by the gate itself, before it
// offers the call for sale or takes a payment or a free call for it, once
// it has. A payment sent with a refused upgrade is neither claimed nor
// charged, and a free call is not counted.
func TestVerifyResponseRouteRefusesProtocolSwitch(t *testing.T) {
	d, fac := sharedDevnet(t)
	up, tunnels, _ := echoUpgradeUpstream(t)
	base := startCaddy(t, verifiedUpgradeSite(up.URL, fac))
	before := balance(t, d, upgradePayerAddress)

	for _, route := range []string{"/any/x", "/dflt/x"} {
		url := base + route
		sig := signFor(t, paymentRequired(t, post(t, url, validRequest, nil)), upgradePayer)
		resp, err := sendUpgradePost(url, sig)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		wantUpgradeRefused(t, "paid upgrade on "+route, resp)
		if tunnels.Load() != 0 {
			t.Fatalf("%s: the upstream opened %d tunnels for an upgrade verify_response cannot hold", route, tunnels.Load())
		}
		if route == "/any/x" {
			// The payment was not claimed: it buys an ordinary call.
			paid := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			if paid.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(paid.Body)
				t.Fatalf("the refused upgrade's payment on an ordinary call: %d %s", paid.StatusCode, b)
			}
			settlementOf(t, paid)
		}
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Cmp(routePrice) != 0 {
		t.Fatalf("charged %v, want the one ordinary call (%v)", got, routePrice)
	}

	// The /any gate saw verify_response handle that call: an upgrade is
	// refused before it is offered for sale.
	resp, err := sendUpgradePost(base+"/any/x", "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	wantUpgradeRefused(t, "unpaid upgrade on /any once verify_response was seen", resp)

	// Free: the refused upgrade counts no free call, before or after the
	// gate learned.
	for i := range 2 {
		resp, err := sendUpgradePost(base+"/free/x", "")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		wantUpgradeRefused(t, fmt.Sprintf("free upgrade %d", i+1), resp)
		free := post(t, base+"/free/x", validRequest, nil)
		if want := fmt.Sprint(4 - i); free.StatusCode != http.StatusOK || free.Header.Get(HeaderFreeRemaining) != want {
			t.Fatalf("free call after refused upgrade %d: %d, remaining %q, want 200 and %s", i+1, free.StatusCode, free.Header.Get(HeaderFreeRemaining), want)
		}
	}

	// settle before charges before the upstream runs: once the gate has
	// seen verify_response (a free call), an upgrade is refused before the
	// offer, and a paid one before it is settled.
	if free := post(t, base+"/before/x", validRequest, nil); free.StatusCode != http.StatusOK {
		t.Fatalf("free call on /before: %d", free.StatusCode)
	}
	resp, err = sendUpgradePost(base+"/before/x", "")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	wantUpgradeRefused(t, "unpaid upgrade on /before past per_day", resp)
	sig := signFor(t, paymentRequired(t, post(t, base+"/before/x", validRequest, nil)), upgradePayer)
	resp, err = sendUpgradePost(base+"/before/x", sig)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	wantUpgradeRefused(t, "paid upgrade on /before", resp)
	if tunnels.Load() != 0 {
		t.Fatalf("the upstream opened %d tunnels", tunnels.Load())
	}
	if got := charged(t, d, upgradePayerAddress, before); got.Cmp(routePrice) != 0 {
		t.Fatalf("charged %v, want only the ordinary call (%v)", got, routePrice)
	}
}

// An MCP tool call is not sold as a tunnel: an upgrade request on an
// mcp_tool gate, a tools/call of its tool or any other request (a
// preflight too), is refused
// with 400 upgrade_unsupported before anything runs or a free call is
// counted. A GET without Upgrade (the SSE stream) still passes as before.
func TestMCPGateRefusesProtocolSwitch(t *testing.T) {
	_, fac := sharedDevnet(t)
	tunnelUp, tunnels, _ := echoUpgradeUpstream(t)
	mcpUp := newMCPUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	@tunnel header Upgrade echo
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
			free_allowance {
				pool verify
				per_day 1
			}
		}
		reverse_proxy @tunnel %[1]s
		reverse_proxy %[4]s
	}
}`, strings.TrimPrefix(tunnelUp.URL, "http://"), fac, payTo.Hex(), strings.TrimPrefix(mcpUp.URL, "http://")))
	url := base + "/mcp"

	call := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t-mcp","expected_schema":{"type":"object"},"submitted_output":{"ok":true}}}}`
	for _, c := range []struct{ method, body string }{{http.MethodPost, call}, {http.MethodGet, ""}} {
		resp, err := sendUpgrade(c.method, url, c.body, "echo", "")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		wantUpgradeRefused(t, c.method+" upgrade on an mcp_tool gate", resp)
	}
	// Nor one dressed as a CORS preflight, which the gate passes to an MCP
	// server's own CORS: a browser cannot send Upgrade, so it is no
	// preflight. (Before: passed on, the upstream switched on each.)
	pre, err := http.NewRequest(http.MethodOptions, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	pre.Header.Set("Origin", "https://elsewhere.example")
	pre.Header.Set("Access-Control-Request-Method", "POST")
	pre.Header.Set("Connection", "Upgrade")
	pre.Header.Set("Upgrade", "echo")
	resp, err := http.DefaultClient.Do(pre)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// Its body is the switched connection: not read to its end.
		t.Fatalf("a preflight asking to switch on an mcp_tool gate switched (tunnels opened: %d)", tunnels.Load())
	}
	wantUpgradeRefused(t, "a preflight asking to switch on an mcp_tool gate", resp)
	if tunnels.Load() != 0 || mcpUp.calls.Load() != 0 {
		t.Fatalf("the upstream opened %d tunnels, ran %d calls", tunnels.Load(), mcpUp.calls.Load())
	}

	// A GET without Upgrade reaches the MCP server as before.
	direct, err := http.Get(mcpUp.URL)
	if err != nil {
		t.Fatal(err)
	}
	direct.Body.Close()
	if got, _ := getBody(t, url, nil); got.StatusCode != direct.StatusCode {
		t.Fatalf("GET through the gate: %d, the MCP server's own answer %d", got.StatusCode, direct.StatusCode)
	}

	// The refused upgrade counted no free call: per_day 1 still serves one.
	s := mcpSession(t, url)
	if res := callTool(t, s, "verify_schema", verifyArgs, nil); res.IsError || mcpUp.lastPaid.Load() != "free" {
		t.Fatalf("the free call after a refused upgrade: %+v", res)
	}
}
