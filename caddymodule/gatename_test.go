package caddymodule

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/x402"
)

// A gate's name digests what decides where its requests go (its server's
// listeners, routes, error routes and named routes), not the server-wide
// settings that route nothing: a reload adding an access log, a server
// timeout (AOV_READ_BODY_TIMEOUT's), metrics or log_credentials keeps it,
// and the outcomes held before stay the gate's to report. (Before: each
// one renamed the gate, and every outcome it held was kept as moved.)
func TestGateNameKeptAcrossReloadOfServerWideSettings(t *testing.T) {
	dir := t.TempDir()
	site := func(inSite string) string {
		return fmt.Sprintf(`:{port} {
	%s
	route /v1/* {
		x402 {
			accept devnet $0.02 %s
			facilitator http http://127.0.0.1:1
			store badger %s
		}
		reverse_proxy 127.0.0.1:9
	}
}
`, inSite, payTo.Hex(), dir)
	}
	port := freePort(t)
	t.Cleanup(func() { caddy.Stop() })
	loadCaddyServers(t, port, "", "", site(""))
	base := loneGateName(t)
	loadCaddyServers(t, port, "", "", site(""))
	if again := loneGateName(t); again != base {
		t.Fatalf("an unchanged reload renamed the gate")
	}
	for _, tc := range []struct{ what, servers, inSite string }{
		{"an access log on the site", "", "log {\n\t\toutput discard\n\t}"},
		{"a server read_body timeout", "\t\ttimeouts {\n\t\t\tread_body 10s\n\t\t}", ""},
		{"server metrics", "\t\tmetrics", ""},
		{"log_credentials", "\t\tlog_credentials", ""},
	} {
		loadCaddyServers(t, port, tc.servers, "", site(tc.inSite))
		if got := loneGateName(t); got != base {
			t.Errorf("a reload adding %s renamed the gate: its held outcomes are then kept as moved, unreported", tc.what)
		}
	}
	// What routes still counts: another upstream after the gate.
	loadCaddyServers(t, port, "", "", strings.Replace(site(""), "127.0.0.1:9", "127.0.0.1:8", 1))
	if got := loneGateName(t); got == base {
		t.Errorf("a reload moving the gate's upstream kept its name")
	}
}

// A call held (its settlement's outcome unknown), then a restart whose
// only change is a server read_body timeout or an access log on the site:
// the outcome the background pass resolves is reported to the site's one
// upstream, where nothing moved. (Before: it was kept as moved, and
// verifierd's record stayed pending until the buyer's retry.)
func TestResolvedOutcomeReportedAfterRestartAddingServerSetting(t *testing.T) {
	for _, tc := range []struct{ what, servers, inSite string }{
		{"nothing", "", ""},
		{"read_body timeout", "\t\ttimeouts {\n\t\t\tread_body 10s\n\t\t}", ""},
		{"access log", "", "log {\n\t\toutput discard\n\t}"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
			resolveInterval = time.Hour
			_, _ = sharedDevnet(t)
			release := stallChain(t)
			a := newReportingUpstream(t)
			site := func(inSite string) string {
				return fmt.Sprintf(`:{port} {
	%[4]s
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply_stall
			store badger %[2]s
		}
		reverse_proxy %[3]s
	}
}
`, payTo.Hex(), gateDir(t), strings.TrimPrefix(a.URL, "http://"), inSite)
			}
			port := freePort(t)
			first := site("")
			loadCaddyServers(t, port, "", "", first)
			t.Cleanup(func() { caddy.Stop() })
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
			// The same site and store, with the setting added.
			second := strings.Replace(first, "\n\t\n\troute", "\n\t"+tc.inSite+"\n\troute", 1)
			loadCaddyServers(t, port, tc.servers, "", second)
			readAll(t, post(t, url, "", nil)) // the restarted gate learns its way
			close(release)
			waitFor(t, "the resolved outcome's report", func() bool { return len(a.got()) > 0 })
			if got := a.got(); len(got) != 1 || got[0] != "v-1=paid" {
				t.Errorf("after a restart adding only a %s, the site's one upstream got %q; want [v-1=paid]", tc.what, got)
			}
		})
	}
}

// A proxy naming its upstream by {env.*} goes where the variable points
// when the request is made: a restart pointing it at another verifierd is
// a move, and the outcome verifierd A recorded is kept, never reported to
// B, which never had the verification. (Before: the name read the
// placeholder's text, and B was sent A's verification id and outcome.)
func TestGateNameFollowsEnvPlaceholderUpstream(t *testing.T) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = time.Hour
	_, _ = sharedDevnet(t)
	release := stallChain(t)
	a, b := newReportingUpstream(t), newReportingUpstream(t)
	t.Setenv("AOV_TEST_BACKEND", strings.TrimPrefix(a.URL, "http://"))
	site := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply_stall
			store badger %[2]s
		}
		reverse_proxy {env.AOV_TEST_BACKEND}
	}
}
`, payTo.Hex(), gateDir(t))
	port := freePort(t)
	loadCaddyServers(t, port, "", "", site)
	t.Cleanup(func() { caddy.Stop() })
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
	t.Setenv("AOV_TEST_BACKEND", strings.TrimPrefix(b.URL, "http://"))
	loadCaddyServers(t, port, "", "", site)
	readAll(t, post(t, url, "", nil)) // the restarted gate learns its way
	close(release)
	// The pass resolves the record and keeps it as moved: wait for it to
	// have run several times.
	time.Sleep(3 * time.Second)
	if got := b.got(); len(got) != 0 {
		t.Errorf("verifierd B, which never recorded the call, was sent %q (A got %q); want nothing", got, a.got())
	}
}

// The placeholders whose value is fixed for the life of the process are
// read into the name: a reload after {env.*} or the file of a {file.*}
// changed renames the gate, one after neither keeps it, and a placeholder
// read per request ({time.*}, a request's own) never renames it.
func TestGateNameReadsFixedPlaceholders(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "backend")
	if err := os.WriteFile(file, []byte("one\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AOV_TEST_TENANT", "a")
	site := fmt.Sprintf(`:{port} {
	route /v1/* {
		x402 {
			accept devnet $0.02 %s
			facilitator http http://127.0.0.1:1
			store badger %s
		}
		reverse_proxy 127.0.0.1:9 {
			header_up X-Tenant {env.AOV_TEST_TENANT}
			header_up X-Backend {file.%s}
			header_up X-Now {time.now.unix_ms}
			header_up X-Host {http.request.host}
		}
	}
}
`, payTo.Hex(), dir, file)
	port := freePort(t)
	t.Cleanup(func() { caddy.Stop() })
	loadCaddyServers(t, port, "", "", site)
	base := loneGateName(t)
	time.Sleep(5 * time.Millisecond) // another {time.now.unix_ms}
	loadCaddyServers(t, port, "", "", site)
	if got := loneGateName(t); got != base {
		t.Fatalf("a reload with every fixed placeholder unchanged renamed the gate")
	}
	t.Setenv("AOV_TEST_TENANT", "b")
	loadCaddyServers(t, port, "", "", site)
	tenant := loneGateName(t)
	if tenant == base {
		t.Errorf("a reload after {env.AOV_TEST_TENANT} changed kept the gate's name")
	}
	if err := os.WriteFile(file, []byte("two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	loadCaddyServers(t, port, "", "", site)
	read := loneGateName(t)
	if read == tenant {
		t.Errorf("a reload after the file of {file.*} changed kept the gate's name")
	}
	// Another server's proxy may lead the gate's requests on: its
	// placeholders count the same way.
	t.Setenv("AOV_TEST_OTHER", "127.0.0.1:7")
	withOther := site + fmt.Sprintf(":%d {\n\treverse_proxy {env.AOV_TEST_OTHER}\n}\n", freePort(t))
	loadCaddyServers(t, port, "", "", withOther)
	other := loneGateName(t)
	t.Setenv("AOV_TEST_OTHER", "127.0.0.1:6")
	loadCaddyServers(t, port, "", "", withOther)
	if got := loneGateName(t); got == other {
		t.Errorf("a reload after another server's {env.AOV_TEST_OTHER} changed kept the gate's name")
	}
}

// Naming a load's gates writes each server out once (its own part, shared
// by its gates, and the other servers' part, shared the same way), not
// once per gate: n gated routes cost linear time to name. (Before: each
// gate wrote its whole server and every other server out again, and 800
// gates took seconds to load.)
func TestGateNamingWritesEachServerOncePerLoad(t *testing.T) {
	dir := t.TempDir()
	other := freePort(t)
	config := func(n int) string {
		var b strings.Builder
		for _, addr := range []string{":{port}", fmt.Sprintf(":%d", other)} {
			b.WriteString(addr + " {\n")
			for i := range n {
				fmt.Fprintf(&b, `	route /t%d/* {
		x402 {
			accept devnet $0.02 %s
			facilitator http http://127.0.0.1:1
			store badger %s
		}
		reverse_proxy 127.0.0.1:9
	}
`, i, payTo.Hex(), dir)
			}
			b.WriteString("}\n")
		}
		return b.String()
	}
	port := freePort(t)
	t.Cleanup(func() { caddy.Stop() })
	for _, n := range []int{1, 40} {
		before := serversWritten.Load()
		loadCaddyServers(t, port, "", "", config(n))
		// Both servers: each once for its own gates, once for the others'.
		if got := serversWritten.Load() - before; got != 4 {
			t.Errorf("a load of 2 servers of %d gates each wrote a server out %d times; want 4", n, got)
		}
	}
	// What a load's gates share goes with its config: nothing stays from
	// one load to the next.
	namings := func() int {
		serverNamings.Lock()
		defer serverNamings.Unlock()
		return len(serverNamings.m)
	}
	waitFor(t, "the namings of the replaced load dropped", func() bool { return namings() == 2 })
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the namings of the stopped load dropped", func() bool { return namings() == 0 })
}

// The gate proxies to another server of its own Caddy, which chooses the
// verifierd by what Caddy keeps only loaded: a dynamic upstream source
// (`dynamic a`) and a selection policy (`lb_policy`). A reload changing
// either renames the gate, so its held outcomes are not reported to the
// verifierd it no longer leads to; an unchanged reload keeps the name.
// A `dynamic multi`, whose sources cannot be read once loaded, renames it
// at every load. (Before: the other server's proxy was named by its JSON,
// from which Caddy drops both once loaded, and a reload pointing the
// dynamic upstreams at another verifierd kept the gate's name.)
func TestGateNameFollowsAnotherServersDynamicUpstreamsAndPolicy(t *testing.T) {
	dir := t.TempDir()
	other := freePort(t)
	site := func(proxy string) string {
		return fmt.Sprintf(`:{port} {
	route /v1/* {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator http http://127.0.0.1:1
			store badger %[2]s
		}
		reverse_proxy 127.0.0.1:%[3]d
	}
}
:%[3]d {
	reverse_proxy {
		%[4]s
	}
}
`, payTo.Hex(), dir, other, proxy)
	}
	dynamic := func(host string) string {
		return "dynamic a {\n\t\t\tname " + host + "\n\t\t\tport 8080\n\t\t}"
	}
	const static = "to 127.0.0.1:5 127.0.0.1:6\n\t\t"
	port := freePort(t)
	t.Cleanup(func() { caddy.Stop() })
	name := func(proxy string) string {
		loadCaddyServers(t, port, "", "", site(proxy))
		return loneGateName(t)
	}
	base := name(dynamic("verifier-a.invalid"))
	if name(dynamic("verifier-a.invalid")) != base {
		t.Errorf("an unchanged reload renamed the gate")
	}
	if name(dynamic("verifier-b.invalid")) == base {
		t.Errorf("a reload pointing the other server's dynamic upstreams at another host kept the gate's name")
	}
	first := name(static + "lb_policy first")
	if name(static+"lb_policy first") != first {
		t.Errorf("an unchanged reload with lb_policy first renamed the gate")
	}
	if name(static+"lb_policy header X-Tenant") == first {
		t.Errorf("a reload changing the other server's lb_policy kept the gate's name")
	}
	multi := "dynamic multi {\n\t\t\ta verifier-a.invalid 8080\n\t\t}"
	if name(multi) == name(multi) {
		t.Errorf("an unchanged reload with dynamic multi kept the gate's name; want a name no load shares (its sources cannot be read)")
	}
}
