package caddymodule

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// hijackUpgradeHandler switches protocols the way gorilla/websocket's
// Upgrader does: it hijacks the connection first (http.ResponseController)
// and writes its 101 itself, raw, so WriteHeader is never called. Like
// reverse_proxy, it ends the tunnel when its request's context ends. It
// echoes lines; a request that asks for no switch gets a JSON answer.
type hijackUpgradeHandler struct{}

// hijackTunnels counts the tunnels hijackUpgradeHandler opened.
var hijackTunnels atomic.Int32

func (hijackUpgradeHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_hijack_upgrade", New: func() caddy.Module { return hijackUpgradeHandler{} }}
}

func (hijackUpgradeHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "echo") {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"paid_content":true}`)
		return nil
	}
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return err
	}
	hijackTunnels.Add(1)
	defer c.Close()
	go func() { <-r.Context().Done(); c.Close() }()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	brw.Flush()
	for {
		line, err := brw.ReadString('\n')
		if err != nil {
			return nil
		}
		brw.WriteString("echo " + line)
		brw.Flush()
	}
}

func init() {
	caddy.RegisterModule(hijackUpgradeHandler{})
	httpcaddyfile.RegisterHandlerDirective("test_hijack_upgrade", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return hijackUpgradeHandler{}, nil
	})
}

// settle before: a handler that hijacks the connection and writes its 101
// itself has started the answer at the hijack, as a header does:
// upstream_timeout no longer applies, and the charged buyer's tunnel runs
// past it.
func TestSettleBeforeHijackedTunnelOutlivesUpstreamTimeout(t *testing.T) {
	_, fac := sharedDevnet(t)
	site := gateSite("127.0.0.1:1", fac, 0, "settle before\n\t\t\tupstream_timeout 500ms")
	site = strings.Replace(site, "reverse_proxy 127.0.0.1:1", "test_hijack_upgrade", 1)
	url := startCaddy(t, site) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	resp := upgradePost(t, url, sig)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("upgrade: %d %s", resp.StatusCode, b)
	}
	if l := echo(t, resp, "one"); l != "echo one\n" {
		t.Fatalf("first echo %q", l)
	}
	time.Sleep(1500 * time.Millisecond) // past upstream_timeout
	if l := echo(t, resp, "two"); l != "echo two\n" {
		t.Fatalf("the hijacked tunnel after upstream_timeout (500ms): %q, want \"echo two\"", l)
	}
}

// A run again through a hijacked tunnel is delivered at the hijack: the
// payment bought that one tunnel, and a retry with it after the tunnel
// outlived upstream_timeout is payment_already_used, not a second tunnel.
func TestRunAgainThroughAHijackedTunnelIsRunOnce(t *testing.T) {
	sharedDevnet(t)
	site := pendingSite("127.0.0.1:1", "lose_reply", gateDir(t), "settle before\n\t\t\tupstream_timeout 500ms")
	site = strings.Replace(site, "reverse_proxy 127.0.0.1:1", "test_hijack_upgrade", 1)
	url := startCaddy(t, site) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d", resp.StatusCode)
	}
	start := hijackTunnels.Load()
	resp := upgradePost(t, url, sig)
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("run again: %d %s", resp.StatusCode, b)
	}
	if l := echo(t, resp, "hello"); l != "echo hello\n" {
		t.Fatalf("run again's tunnel: %q", l)
	}
	time.Sleep(1500 * time.Millisecond) // past upstream_timeout
	if l := echo(t, resp, "still"); l != "echo still\n" {
		t.Fatalf("run again's tunnel after upstream_timeout: %q", l)
	}
	resp.Body.Close()
	retry := upgradePost(t, url, sig)
	if retry.StatusCode == http.StatusSwitchingProtocols {
		t.Fatalf("retry after the run's tunnel: a second tunnel (%d in all) for one payment", hijackTunnels.Load()-start)
	}
	b, _ := io.ReadAll(retry.Body)
	if n := hijackTunnels.Load() - start; retry.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), x402.ReasonPaymentAlreadyUsed) || n != 1 {
		t.Fatalf("retry after the run's tunnel: %d %s (tunnels %d), want payment_already_used and one tunnel", retry.StatusCode, b, n)
	}
}
