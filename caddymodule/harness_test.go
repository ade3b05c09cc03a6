package caddymodule

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// startCaddy runs a real Caddy in this process with the given Caddyfile
// site blocks behind a generated global block, on a free port, and returns
// the base URL. {port} in the Caddyfile is replaced by that port, and
// {data} by a fresh folder for the gateway store. Caddy is a process-wide
// singleton, so tests that use it do not run in parallel.
//
// Unlike caddytest, which uses fixed ports (9080, 2999), this lets several
// test packages run Caddy at the same time.
func startCaddy(t testing.TB, sites string) string {
	t.Helper()
	port := freePort(t)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\thttp_port %d\n\tstorage file_system %s\n\tlog {\n\t\toutput discard\n\t}\n}\n", port, t.TempDir())
	cfg += strings.NewReplacer("{port}", fmt.Sprint(port), "{data}", t.TempDir()).Replace(sites)
	a := caddyconfig.GetAdapter("caddyfile")
	js, _, err := a.Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, cfg)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatalf("loading Caddy config: %v", err)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Logf("stopping Caddy: %v", err)
		}
	})
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
			c.Close()
			return base
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("Caddy did not listen on %s", base)
	return ""
}

// freePort asks the kernel for a free loopback port.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// noRedirect is an HTTP client for tests: it never follows redirects and
// has a timeout, so a hung gateway fails the test instead of hanging it.
var testClient = &http.Client{Timeout: 30 * time.Second}
