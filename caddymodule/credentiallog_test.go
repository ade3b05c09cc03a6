package caddymodule

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// Caddy copies every request, headers as the client sent them, before any
// handler runs, and logs that copy with every error a handler returns
// (http.log.error: ERROR when no handle_errors handles it, so at the default
// INFO). README's seller Caddyfile (examples/seller-agent/Caddyfile, which
// README copies) has no handle_errors: with its agent down, a buyer's paid
// call is a 502, the payment unsettled and still good, and the log used to
// hold its PAYMENT-SIGNATURE, which a log reader presented once the agent
// was back and was served on the buyer's money. The file's global log now
// deletes the request headers from every line. Run here as
// shipped, its log at DEBUG and in a file, the agent down.
func TestSellerExampleLogsNoClientCredentialsWithItsAgentDown(t *testing.T) {
	d, fac := sharedDevnet(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()

	raw, err := os.ReadFile(filepath.Join("..", "examples", "seller-agent", "Caddyfile"))
	if err != nil {
		t.Fatal(err)
	}
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	cfg := string(raw)
	for old, repl := range map[string]string{
		"\t\toutput stderr\n": "\t\toutput file " + logFile + "\n",
		"\t\tlevel INFO\n":    "\t\tlevel DEBUG\n",
	} {
		if strings.Count(cfg, old) != 1 {
			t.Fatalf("the seller Caddyfile's global log has no %q", old)
		}
		cfg = strings.Replace(cfg, old, repl, 1)
	}
	port := freePort(t)
	t.Setenv("SELLER_PORT", fmt.Sprint(port))
	t.Setenv("SELLER_ADMIN_ADDR", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	t.Setenv("SELLER_FACILITATOR_URL", fac)
	t.Setenv("SELLER_AGENT_ADDR", dead)
	t.Setenv("AOV_VERIFIERD_ADDR", "127.0.0.1:1")
	t.Setenv("XDG_DATA_HOME", t.TempDir())
	t.Chdir("..") // the file names its schema and rules from the repository root
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { caddy.Stop() })
	testClient.CloseIdleConnections()
	waitServing(t, port)

	url := fmt.Sprintf("http://127.0.0.1:%d/invoices/7", port)
	st, hdr, _ := walletCall(t, http.MethodGet, url, "", nil)
	if st != http.StatusPaymentRequired {
		t.Fatalf("unpaid call: %d, want 402", st)
	}
	var pr x402.PaymentRequired
	if err := x402.DecodeHeader(hdr.Get(x402.HeaderPaymentRequired), &pr); err != nil {
		t.Fatal(err)
	}
	payer := evmfacilitator.DevAccounts()[8].Address
	before := balance(t, d, payer)
	sig := signFor(t, pr, 8)
	st, _, _ = walletCall(t, http.MethodGet, url, "", map[string]string{
		x402.HeaderPaymentSignature: sig,
		walletauth.HeaderName:       "WALLETPROOF-MARK",
		walletauth.SIWXHeaderName:   "SIWX-MARK",
	})
	if st != http.StatusBadGateway {
		t.Fatalf("paid call, agent down: %d, want 502", st)
	}
	if after := balance(t, d, payer); after.Cmp(before) != 0 {
		t.Fatalf("a call the agent never answered was charged: %v -> %v", before, after)
	}

	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	// The failed call is logged with its request: the filter deletes its
	// headers, not the line.
	var errLine string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "http.log.error") && strings.Contains(line, "/invoices/7") {
			errLine = line
		}
	}
	if !strings.Contains(errLine, `"method": "GET"`) {
		t.Fatalf("no http.log.error line with the request; the test proves nothing:\n%s", log)
	}
	// Nothing in the log to present again: the payment is not there, nor
	// any other request header.
	for _, mark := range []string{sig, "WALLETPROOF-MARK", "SIWX-MARK", "Payment-Signature", "X-Wallet-Auth", "Sign-In-With-X", "User-Agent"} {
		if i := strings.Index(log, mark); i >= 0 {
			lo := strings.LastIndex(log[:i], "\n") + 1
			t.Errorf("Caddy's log holds the client's %.40s: %.600s", mark, log[lo:])
		}
	}
}
