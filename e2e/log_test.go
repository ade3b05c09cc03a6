package e2e

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// With Caddy's own log at DEBUG (how an operator debugs the gateway),
// reverse_proxy logs the headers of every request it sends upstream, and
// Caddy redacts only Authorization and cookies. Caddyfile.example passes a
// client's PAYMENT-SIGNATURE, X-Wallet-Auth or SIGN-IN-WITH-X to none of
// its upstreams: verifierd (which reads only the gate's X-Aov-* headers),
// certd's agent card, and the facilitator of AOV_FACILITATOR=remote (which
// reads payments from the body); the gateway token must reach verifierd,
// and the log's filter deletes every line's request headers, so neither
// reaches that log. Before, the agent card and /facilitator/* routes passed
// the client's headers on, and the DEBUG log held the gateway token.
func TestDebugLogHoldsNoClientPaymentOrWalletHeaders(t *testing.T) {
	f := startFacilitator(t)
	s := newStack(t, f.remoteFacilitatorEnv()...)
	orig, err := os.ReadFile(filepath.Join(repoRoot, "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	restartCaddyAtDebug(t, s, orig)
	send := func(method, path string, body []byte) { sendWithCredentials(t, s, method, path, body) }
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
	noCredentialMarks(t, "Caddy's DEBUG log", log)
	if n := bytes.Count(log, []byte(s.token)); n > 0 {
		t.Errorf("Caddy's DEBUG log holds the gateway token %d times", n)
	}
}

// restartCaddyAtDebug restarts s's Caddy with Caddyfile.example (orig) at
// DEBUG, how an operator debugs the gateway.
func restartCaddyAtDebug(t *testing.T, s *stack, orig []byte) {
	t.Helper()
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
}

// credentialMarks are the values sendWithCredentials sends as a client's
// credential headers.
var credentialMarks = map[string]string{
	"X-Wallet-Auth":     "WALLETPROOF-MARK",
	"PAYMENT-SIGNATURE": "PAYSIG-MARK",
	"SIGN-IN-WITH-X":    "SIWX-MARK",
}

// sendWithCredentials sends a request to s's gateway carrying the
// credentialMarks of the headers named in only, or of all three.
func sendWithCredentials(t *testing.T, s *stack, method, path string, body []byte, only ...string) int {
	t.Helper()
	req, _ := http.NewRequest(method, s.url(path), bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for name, mark := range credentialMarks {
		if len(only) == 0 || slices.Contains(only, name) {
			req.Header.Set(name, mark)
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// noCredentialMarks fails t for each of credentialMarks in log.
func noCredentialMarks(t *testing.T, what string, log []byte) {
	t.Helper()
	for _, mark := range credentialMarks {
		if i := bytes.Index(log, []byte(mark)); i >= 0 {
			lo := bytes.LastIndexByte(log[:i], '\n') + 1
			t.Errorf("%s holds the client's %s %d times; e.g.: %.600s", what, mark, bytes.Count(log, []byte(mark)), log[lo:])
		}
	}
}

// Caddy copies each request, headers as the client sent them, before any
// handler runs, and logs the copy with every error a handler returns (at
// DEBUG when handle_errors handles it, as Caddyfile.example's 502/503/504
// handler does) and in the access log: removing a header in a route cannot
// reach that copy. With verifierd and certd down, every proxied route is
// such an error; before, the DEBUG log held each client credential as
// sent. Caddyfile.example's global log deletes them from every line
// (client_credentials_log, all request headers), as its access log does.
func TestDebugLogHoldsNoClientCredentialsWithUpstreamsDown(t *testing.T) {
	s := newStack(t)
	orig, err := os.ReadFile(filepath.Join(repoRoot, "Caddyfile.example"))
	if err != nil {
		t.Fatal(err)
	}
	restartCaddyAtDebug(t, s, orig)
	s.verifierd.stop(t)
	s.certd.stop(t)
	for _, c := range []struct {
		method, path string
		body         []byte
		only         []string
	}{
		{"GET", "/reputation/seller-7", nil, nil},
		{"GET", "/.well-known/agent-card.json", nil, nil},
		// A gated route: wallet_auth optional, without siwx there, ignores
		// SIGN-IN-WITH-X and the free call goes upstream. (A malformed
		// X-Wallet-Auth or payment is refused before it.)
		{"POST", "/verify/schema", example(t, "invoice-fixed.json"), []string{"SIGN-IN-WITH-X"}},
	} {
		if st := sendWithCredentials(t, s, c.method, c.path, c.body, c.only...); st != http.StatusServiceUnavailable {
			t.Errorf("%s %s with its upstream down: %d, want 503", c.method, c.path, st)
		}
	}
	s.caddy.stop(t)

	log, _ := os.ReadFile(s.caddy.logPath)
	if !bytes.Contains(log, []byte("http.log.error")) || !bytes.Contains(log, []byte(`"uri": "/reputation/seller-7"`)) {
		t.Fatalf("no error line with the request in Caddy's log; the test proves nothing:\n%s", s.caddy.tail(2000))
	}
	noCredentialMarks(t, "Caddy's DEBUG log", log)
	if bytes.Contains(log, []byte(`"User-Agent"`)) {
		t.Errorf("Caddy's DEBUG log holds request headers (User-Agent)")
	}
	access, err := os.ReadFile(filepath.Join(s.dir, "logs", "access.log"))
	if err != nil || !bytes.Contains(access, []byte("/reputation/seller-7")) {
		t.Fatalf("no access log line for the calls (%v); the test proves nothing", err)
	}
	noCredentialMarks(t, "the access log", access)
}
