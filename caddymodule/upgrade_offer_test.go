package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/aovhq/aov/x402"
)

// upgradeAnswers sends n upgrade POSTs asking for upgrade (with sig, or
// none) and returns each answer's status, and its body's code when it has
// one, for the test's checks and messages.
func upgradeAnswers(t *testing.T, url, upgrade, sig string, n int) []string {
	t.Helper()
	var got []string
	for range n {
		resp, err := sendUpgradePostAs(url, upgrade, sig)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, answerOf(t, resp))
	}
	time.Sleep(200 * time.Millisecond) // a dropped 101's upstream handler runs on
	return got
}

// answerOf is resp's status and its error code ("" for none), the body
// closed.
func answerOf(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/") {
		return fmt.Sprint(resp.StatusCode)
	}
	code, _ := readJSON(t, resp)["code"].(string)
	return strings.TrimSpace(fmt.Sprint(resp.StatusCode, " ", code))
}

// A free route with per_day 1 behind an upstream that switches on any
// Upgrade naming a protocol it takes: the upstream switches no more often
// than free calls were counted, whatever spelling of Upgrade the client
// sent. An h2c offer alone is answered as the same request without it
// (the upstream, which takes h2c, never sees it): one free answer, then
// the demand for payment. A list, or a value that is not one protocol
// token, is refused before anything is counted: the free call is still
// there afterwards.
func TestFreeUpgradeSpellingsSpendPerDay(t *testing.T) {
	for _, tc := range []struct {
		name, upgrade, accept string
		want                  []string
	}{
		{"h2c", "h2c", "h2c", []string{"200", "402", "402", "402"}},
		{"H2C", "H2C", "h2c", []string{"200", "402", "402", "402"}},
		{"list", "h2c, echo", "echo", []string{"400 upgrade_unsupported", "400 upgrade_unsupported", "400 upgrade_unsupported", "400 upgrade_unsupported"}},
		// reverse_proxy relays only a 101 naming the value whole; an
		// upstream trimming Unicode space would switch and be dropped.
		{"non-ASCII space", "websocket\u00a0", "websocket", []string{"400 upgrade_unsupported", "400 upgrade_unsupported", "400 upgrade_unsupported", "400 upgrade_unsupported"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, fac := sharedDevnet(t)
			up, switches, _ := upgradeUpstream(t, tc.accept)
			url := startCaddy(t, gateSite(up.URL, fac, 1, "")) + "/verify/schema"
			got := upgradeAnswers(t, url, tc.upgrade, "", 4)
			if switches.Load() != 0 || strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("per_day 1, Upgrade %q: the upstream switched %d times; answers %v, want %v and no switch", tc.upgrade, switches.Load(), got, tc.want)
			}
			if tc.want[0] != "200" {
				if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK {
					t.Fatalf("the free call after refused upgrades: %d, want 200 (none was counted)", resp.StatusCode)
				}
			}
		})
	}
}

// A real gorilla/websocket upstream behind a free GET route with per_day
// 1: a handshake listing another protocol before websocket, which gorilla
// accepts, is refused before the upstream sees it, so the upstream's
// WebSocket handler never runs free past per_day; websocket alone is
// served free once, then asked to pay.
func TestGorillaFreeHandshakesSpendPerDay(t *testing.T) {
	_, fac := sharedDevnet(t)
	var handlers atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		handlers.Add(1) // the session's work starts here
		defer c.Close()
		c.WriteMessage(websocket.TextMessage, []byte("hello"))
		c.ReadMessage()
	}))
	t.Cleanup(up.Close)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /ws {
		x402 {
			accept devnet $0.02 %[3]s
			route "GET /ws"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			free_allowance {
				pool ws
				per_day 1
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	handshake := func(upgrade string) string {
		req, _ := http.NewRequest(http.MethodGet, base+"/ws", nil)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", upgrade)
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return answerOf(t, resp)
	}
	var got []string
	for range 3 {
		got = append(got, handshake("foo, websocket"))
	}
	time.Sleep(200 * time.Millisecond)
	if handlers.Load() != 0 || strings.Join(got, ",") != "400 upgrade_unsupported,400 upgrade_unsupported,400 upgrade_unsupported" {
		t.Fatalf("per_day 1, Upgrade \"foo, websocket\": the upstream's WebSocket handler ran %d times; answers %v, want 400 upgrade_unsupported each and none", handlers.Load(), got)
	}
	got = []string{handshake("websocket"), handshake("websocket")}
	time.Sleep(200 * time.Millisecond)
	if handlers.Load() != 1 || strings.Join(got, ",") != "101,402" {
		t.Fatalf("per_day 1, Upgrade websocket: answers %v, %d handlers; want 101 then 402, one handler", got, handlers.Load())
	}
}

// One signed payment sent again and again with an Upgrade the upstream
// would switch on: the upstream switches no more often than the payment
// was charged. A list is refused with nothing claimed (the payment then
// buys its one ordinary call); an h2c offer is answered as the ordinary
// call it is, charged once, and the same payment again is refused.
func TestOnePaymentBuysOneSwitchWhateverTheSpelling(t *testing.T) {
	for _, tc := range []struct {
		name, upgrade, accept string
		want                  []string
	}{
		{"list", "h2c, echo", "echo", []string{"400 upgrade_unsupported", "400 upgrade_unsupported", "400 upgrade_unsupported"}},
		{"non-ASCII space", "websocket\u00a0", "websocket", []string{"400 upgrade_unsupported", "400 upgrade_unsupported", "400 upgrade_unsupported"}},
		{"h2c", "h2c", "h2c", []string{"200", "402", "402"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, fac := sharedDevnet(t)
			up, switches, _ := upgradeUpstream(t, tc.accept)
			url := startCaddy(t, gateSite(up.URL, fac, 0, "")) + "/verify/schema"
			before := balance(t, d, upgradePayerAddress)
			sig := signFor(t, paymentRequired(t, post(t, url, validRequest, nil)), upgradePayer)
			got := upgradeAnswers(t, url, tc.upgrade, sig, 3)
			c := charged(t, d, upgradePayerAddress, before)
			if switches.Load() != 0 || strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Fatalf("one payment, Upgrade %q: the upstream switched %d times, charged %v; answers %v, want %v", tc.upgrade, switches.Load(), c, got, tc.want)
			}
			if tc.want[0] != "200" {
				if c.Sign() != 0 {
					t.Fatalf("charged %v for refused upgrades", c)
				}
				if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK {
					t.Fatalf("the payment after refused upgrades: %d, want 200 (nothing was claimed)", resp.StatusCode)
				}
				c = charged(t, d, upgradePayerAddress, before)
			}
			if c.Cmp(routePrice) != 0 {
				t.Fatalf("charged %v, want the one call (%v)", c, routePrice)
			}
		})
	}
}

// curl --http2 on an http:// URL: the upstream gets the request without
// the h2c offer (no Upgrade, no HTTP2-Settings, neither named in
// Connection), so it cannot switch on it.
func TestH2COfferReachesUpstreamWithoutIt(t *testing.T) {
	_, fac := sharedDevnet(t)
	seen := make(chan http.Header, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		seen <- r.Header.Clone()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"paid_content":true}`)
	}))
	t.Cleanup(up.Close)
	url := startCaddy(t, gateSite(up.URL, fac, 1, "")) + "/verify/schema"
	resp := post(t, url, validRequest, map[string]string{
		"Connection":     "Upgrade, HTTP2-Settings",
		"Upgrade":        "h2c",
		"HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA",
	})
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("free call with an h2c offer: %d, want 200", resp.StatusCode)
	}
	h := <-seen
	if h.Get("Upgrade") != "" || h.Get("HTTP2-Settings") != "" || h.Get("Connection") != "" {
		t.Fatalf("the upstream got Upgrade %q, HTTP2-Settings %q, Connection %q; want none", h.Get("Upgrade"), h.Get("HTTP2-Settings"), h.Get("Connection"))
	}
}

// Without Connection: Upgrade, reverse_proxy drops Upgrade (a hop-by-hop
// header) and the upstream sees an ordinary request: the gate serves and
// counts it as one, a list included, and the upstream, which would switch
// on the list, never does.
func TestUpgradeWithoutConnectionUpgradeIsOrdinary(t *testing.T) {
	_, fac := sharedDevnet(t)
	up, switches, _ := upgradeUpstream(t, "echo")
	url := startCaddy(t, gateSite(up.URL, fac, 1, "")) + "/verify/schema"
	var got []string
	for range 2 {
		got = append(got, answerOf(t, post(t, url, validRequest, map[string]string{"Upgrade": "h2c, echo"})))
	}
	if switches.Load() != 0 || strings.Join(got, ",") != "200,402" {
		t.Fatalf("Upgrade without Connection: Upgrade, per_day 1: answers %v, %d switches; want 200 then 402, none", got, switches.Load())
	}
}

// The rule holds on MCP gates: a tools/call whose Upgrade is a list is
// refused before the tool runs or a free call is counted, and one with an
// h2c offer is served as the call it is.
func TestMCPUpgradeOfferRule(t *testing.T) {
	_, fac := sharedDevnet(t)
	u := newMCPUpstream(t)
	url := startCaddy(t, mcpSite(u.URL, fac, 1)) + "/mcp"
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": map[string]any{"name": "verify_schema", "arguments": verifyArgs}})
	resp, raw := mcpPost(t, url, body, map[string]string{"Connection": "Upgrade", "Upgrade": "h2c, websocket"})
	if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(raw), codeUpgradeUnsupported) || u.calls.Load() != 0 {
		t.Fatalf("tools/call with a list Upgrade: %d %s, %d tool calls; want 400 %s and none", resp.StatusCode, raw, u.calls.Load(), codeUpgradeUnsupported)
	}
	resp, raw = mcpPost(t, url, body, map[string]string{"Connection": "Upgrade, HTTP2-Settings", "Upgrade": "h2c", "HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA"})
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(raw), `"result":"pass"`) || u.calls.Load() != 1 {
		t.Fatalf("tools/call with an h2c offer: %d %s, %d tool calls; want the free call served", resp.StatusCode, raw, u.calls.Load())
	}
}
