package e2e

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// With Caddy's own log at DEBUG (how an operator debugs the gateway),
// reverse_proxy logs the headers of every request it sends upstream, and
// Caddy redacts only Authorization and cookies. Caddyfile.example passes a
// client's PAYMENT-SIGNATURE, X-Wallet-Auth or SIGN-IN-WITH-X to none of
// its upstreams: verifierd (which reads only the gate's X-Aov-* headers),
// certd's agent card, and the facilitator of AOV_FACILITATOR=remote (which
// reads payments from the body), so they never reach that log; the gateway
// token must reach verifierd, so it does, and the example says so where the
// level is set. Before, the agent card and /facilitator/* routes passed
// them on.
func TestDebugLogHoldsNoClientPaymentOrWalletHeaders(t *testing.T) {
	f := startFacilitator(t)
	s := newStack(t, f.remoteFacilitatorEnv()...)
	orig, err := os.ReadFile(filepath.Join(repoRoot, "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	at := bytes.Index(orig, []byte("\t\tlevel INFO\n"))
	if at < 0 {
		t.Fatal("no `level INFO` in Caddyfile.example")
	}
	if warn := orig[bytes.LastIndex(orig[:at], []byte("\n\n")):at]; !bytes.Contains(warn, []byte("X-Aov-Gateway-Token")) || !bytes.Contains(warn, []byte("rotate")) {
		t.Errorf("Caddyfile.example's log level has no warning that DEBUG logs the gateway token:\n%s", warn)
	}
	s.caddy.stop(t)
	cfg := filepath.Join(s.dir, "Caddyfile.debug")
	if err := os.WriteFile(cfg, bytes.Replace(orig, []byte("\t\tlevel INFO\n"), []byte("\t\tlevel DEBUG\n"), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	s.startCaddyWith(t, cfg)
	waitFor(t, "Caddy at DEBUG", func() error {
		if !s.caddy.running() {
			return errStopped
		}
		return httpOK(s.url("/health"))
	})

	send := func(method, path string, body []byte) {
		req, _ := http.NewRequest(method, s.url(path), bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Wallet-Auth", "WALLETPROOF-MARK")
		req.Header.Set("PAYMENT-SIGNATURE", "PAYSIG-MARK")
		req.Header.Set("SIGN-IN-WITH-X", "SIWX-MARK")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// Every route of the example that proxies: to verifierd (free and
	// gated), to certd, to the facilitator.
	send("GET", "/reputation/seller-7", nil)
	send("POST", "/verify/schema", example(t, "invoice-fixed.json"))
	send("GET", "/.well-known/agent-card.json", nil)
	send("GET", "/facilitator/supported", nil)
	send("POST", "/facilitator/verify", []byte(`{}`))
	s.caddy.stop(t)

	log, _ := os.ReadFile(s.caddy.logPath)
	for _, up := range []string{s.verifierdAddr, s.certdPublic, f.addr} {
		if !strings.Contains(string(log), `"upstream": "`+up+`"`) {
			t.Fatalf("no reverse_proxy debug line for %s in Caddy's log; the test proves nothing:\n%s", up, s.caddy.tail(2000))
		}
	}
	for _, mark := range []string{"WALLETPROOF-MARK", "PAYSIG-MARK", "SIWX-MARK"} {
		if n := strings.Count(string(log), mark); n > 0 {
			t.Errorf("Caddy's DEBUG log holds the client's %s %d times", mark, n)
		}
	}
}
