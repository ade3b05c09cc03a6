package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/x402"
)

// A gate's proxy goes on to another server of the same Caddy (B), whose
// routes choose the upstream by client_ip. A restart that has B read the
// client address from a header the gate's proxy sets (client_ip_headers,
// with the loopback proxy trusted) moves the call's upstream from
// verifierd A to verifierd B: the gate is renamed, and the outcome A
// recorded is not reported to B; with nothing changed it goes to A.
// (Before: other servers were named by their routes alone, and B was sent
// A's verification id.)
func TestGateNameFollowsAnotherServersClientIPHeaders(t *testing.T) {
	t.Run("moved", func(t *testing.T) {
		// Only B's server (the helper's global `servers {` block is closed
		// and one for B's listener opened).
		gateProxyingToATenantServer(t, "\t}\n\tservers :{inner} {\n\t\ttrusted_proxies static 127.0.0.1/8\n\t\tclient_ip_headers X-Tenant")
	})
	t.Run("nothing changed", func(t *testing.T) { gateProxyingToATenantServer(t, "") })
}

// gateProxyingToATenantServer holds a paid call of a gate whose proxy goes
// on to server B of the same Caddy (B routes 10.0.0.0/8 clients to
// verifierd B, others to verifierd A), restarts Caddy with servers added
// to its global options, and checks verifierd B is sent nothing.
func gateProxyingToATenantServer(t *testing.T, servers string) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = time.Hour
	_, _ = sharedDevnet(t)
	release := stallChain(t)
	a, b := newReportingUpstream(t), newReportingUpstream(t)
	inner := freePort(t)
	sites := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply_stall
			store badger %[2]s
		}
		reverse_proxy 127.0.0.1:%[3]d {
			header_up X-Tenant 10.1.2.3
		}
	}
}
:%[3]d {
	@tenant client_ip 10.0.0.0/8
	handle @tenant {
		reverse_proxy %[5]s
	}
	handle {
		reverse_proxy %[4]s
	}
}
`, payTo.Hex(), gateDir(t), inner,
		strings.TrimPrefix(a.URL, "http://"), strings.TrimPrefix(b.URL, "http://"))
	port := freePort(t)
	loadCaddyServers(t, port, "", "", sites)
	t.Cleanup(func() { caddy.Stop() })
	before := loneGateName(t)
	url := fmt.Sprintf("http://127.0.0.1:%d/verify/schema", port)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 9)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("paid call: %d %.300s; want 503 settlement_pending", resp.StatusCode, body)
	}
	if a.n.Load() != 1 || b.n.Load() != 0 {
		t.Fatalf("the call went to A %d times, B %d times; want A once", a.n.Load(), b.n.Load())
	}
	resolveInterval = 300 * time.Millisecond
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	// The same sites; the servers now trust the loopback proxy and read
	// the client address from X-Tenant: B now sends A's calls to verifierd B.
	loadCaddyServers(t, port, strings.ReplaceAll(servers, "{inner}", fmt.Sprint(inner)), "", sites)
	if moved := loneGateName(t) != before; moved != (servers != "") {
		t.Errorf("gate renamed %v; want %v", moved, servers != "")
	}
	readAll(t, post(t, url, "", nil)) // the restarted gate learns its way
	close(release)
	for i := 0; i < 100 && len(a.got())+len(b.got()) == 0; i++ {
		time.Sleep(100 * time.Millisecond)
	}
	if got := b.got(); len(got) != 0 {
		t.Errorf("verifierd B, which never recorded the call, was sent %q (A got %q); want nothing", got, a.got())
	}
}

// A restart adding only the gate's own server's trusted_proxies (and
// client_ip_headers) keeps the gate's name and reports the held outcome to
// the site's one upstream. (Before: the request variable trusted_proxy,
// which the setting changes, was part of the call's route, and the outcome
// was kept unreported.)
func TestOutcomeReportedAfterRestartAddingOwnTrustedProxies(t *testing.T) {
	for _, tc := range []struct{ what, servers string }{
		{"trusted_proxies", "\t\ttrusted_proxies static 127.0.0.1/8"},
		{"trusted_proxies and client_ip_headers", "\t\ttrusted_proxies static 127.0.0.1/8\n\t\tclient_ip_headers X-Tenant"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
			resolveInterval = time.Hour
			_, _ = sharedDevnet(t)
			release := stallChain(t)
			a := newReportingUpstream(t)
			site := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply_stall
			store badger %[2]s
		}
		reverse_proxy %[3]s
	}
}
`, payTo.Hex(), gateDir(t), strings.TrimPrefix(a.URL, "http://"))
			port := freePort(t)
			loadCaddyServers(t, port, "", "", site)
			t.Cleanup(func() { caddy.Stop() })
			before := loneGateName(t)
			url := fmt.Sprintf("http://127.0.0.1:%d/verify/schema", port)
			sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 9)
			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("paid call: %d %.300s; want 503 settlement_pending", resp.StatusCode, body)
			}
			resolveInterval = 300 * time.Millisecond
			if err := caddy.Stop(); err != nil {
				t.Fatal(err)
			}
			loadCaddyServers(t, port, tc.servers, "", site)
			after := loneGateName(t)
			readAll(t, post(t, url, "", nil)) // the restarted gate learns its way
			close(release)
			for i := 0; i < 50 && len(a.got()) == 0; i++ {
				time.Sleep(100 * time.Millisecond)
			}
			if got := a.got(); len(got) != 1 || got[0] != "v-1=paid" {
				t.Errorf("after a restart adding only %s (name kept: %v), the site's one upstream got %q; want [v-1=paid]", tc.what, before == after, got)
			}
		})
	}
}

// What follows the gate in handle_errors and a named route an invoke
// after the gate reaches rename it; an unchanged reload does not.
func TestGateNameFollowsErrorsAndNamedRoutes(t *testing.T) {
	dir := t.TempDir()
	site := func(errUp, namedUp string) string {
		return fmt.Sprintf(`&(backend) {
	reverse_proxy %[4]s
}
:{port} {
	route /v1/* {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator http http://127.0.0.1:1
			store badger %[2]s
		}
		invoke backend
	}
	handle_errors {
		reverse_proxy %[3]s
	}
}
`, payTo.Hex(), dir, errUp, namedUp)
	}
	port := freePort(t)
	t.Cleanup(func() { caddy.Stop() })
	loadCaddyServers(t, port, "", "", site("127.0.0.1:9", "127.0.0.1:8"))
	base := loneGateName(t)
	loadCaddyServers(t, port, "", "", site("127.0.0.1:9", "127.0.0.1:8"))
	if loneGateName(t) != base {
		t.Errorf("an unchanged reload renamed the gate")
	}
	loadCaddyServers(t, port, "", "", site("127.0.0.1:7", "127.0.0.1:8"))
	if loneGateName(t) == base {
		t.Errorf("moving the handle_errors upstream kept the name")
	}
	loadCaddyServers(t, port, "", "", site("127.0.0.1:9", "127.0.0.1:7"))
	if loneGateName(t) == base {
		t.Errorf("moving the invoked named route's upstream kept the name")
	}
}
