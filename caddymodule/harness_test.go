package caddymodule

import (
	"fmt"
	"github.com/aovhq/aov/internal/servers"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
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
	loadCaddy(t, port, sites)
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

// loadCaddy loads sites behind the generated global block into this
// process's Caddy, serving on port: startCaddy's first load, or a reload of
// the running Caddy as an operator's reload does.
func loadCaddy(t testing.TB, port int, sites string) {
	t.Helper()
	if err := tryLoadCaddy(t, port, sites); err != nil {
		t.Fatalf("loading Caddy config: %v", err)
	}
	// A reload closes the old server's idle keep-alive connections; a
	// request on one of those would be reset, so the client forgets them.
	testClient.CloseIdleConnections()
	waitServing(t, port)
}

// tryLoadCaddy is loadCaddy's load alone, for the tests of configs Caddy
// must refuse: it returns caddy.Load's error.
func tryLoadCaddy(t testing.TB, port int, sites string) error {
	t.Helper()
	// Caddy's storage is the process's (TestMain), not the test's: the TLS
	// app cleans it in a goroutine of its own, which can still be writing
	// when a test's temporary folder is removed.
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\thttp_port %d\n\tstorage file_system %s\n\tlog {\n\t\toutput discard\n\t}\n}\n", port, caddyStorage)
	cfg += strings.NewReplacer("{port}", fmt.Sprint(port), "{data}", dataDir(t)).Replace(sites)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting Caddyfile: %v\n%s", err, cfg)
	}
	return caddy.Load(js, true)
}

// dataDir is a fresh {data} folder for one config load. Caddy stops a
// config without waiting for its requests in flight (only an exiting
// process waits), and a store closes when the last of them ends
// (internal/inflight): a request still running when its test ends (an
// answer its client never read) can have Badger close, writing its last
// files, while the folder is being removed. So before the folder goes,
// Caddy is stopped and the test waits (10 s at most) until no Badger under
// it holds its directory lock (the LOCK file Badger removes at Close).
func dataDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() {
		caddy.Stop()
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if !badgerOpenUnder(dir) {
				return
			}
		}
		t.Logf("a Badger store under %s was still open 10 s after its test", dir)
	})
	return dir
}

// badgerOpenUnder reports whether a Badger database under dir is open.
func badgerOpenUnder(dir string) bool {
	open := false
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && d.Name() == "LOCK" {
			open = true
			return filepath.SkipAll
		}
		return nil
	})
	return open
}

// waitServing waits until requests on new connections to port get answers
// in a row: while Caddy hands the listener from the old server to the new
// one, a connection can still be reset, which a test's POST (never retried
// by net/http) would report as a failure of the code under test.
func waitServing(t testing.TB, port int) {
	t.Helper()
	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	// Caddy stops the old servers in goroutines after caddy.Load returns,
	// so one answer can still come from the new server while the old one
	// accepts (and then drops) the next connection: wait for a run of
	// answers in a row.
	var err error
	for ok, deadline := 0, time.Now().Add(5*time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		var resp *http.Response
		if resp, err = probe.Get(url); err != nil {
			ok = 0
			continue
		}
		resp.Body.Close()
		if ok++; ok == 5 {
			return
		}
	}
	t.Fatalf("Caddy does not answer on port %d: %v", port, err)
}

// adaptSiteError adapts a site block holding directives and returns the
// Caddyfile adapter's error, for the tests of Caddyfile mistakes.
func adaptSiteError(directives string) error {
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":8080 {\n"+directives+"\n}\n"), nil)
	return err
}

// wantErr fails t unless err contains want; with want "" err must be nil.
func wantErr(t testing.TB, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("error %v", err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("error %v, want it to contain %q", err, want)
	}
}

// freePort is a free loopback port never handed out before in this
// process (servers.FreePort): the kernel can give the port a test just
// took again before the test's Caddy listens on it, and two sites on one
// port are refused as ambiguous.
func freePort(t testing.TB) int {
	t.Helper()
	return servers.FreePort(t, false)
}

// waitFor polls cond until it holds, failing the test after 20 s. A result
// the gate produces in the background (a settlement report, an outcome
// counter, a log line, a released payment) is waited for with it rather
// than read right after the answer or after a fixed sleep: on a loaded
// machine the background work can lag the answer by seconds. The bound is
// far past any wait the product makes, so a result that never comes still
// fails, only later.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// noRedirect is an HTTP client for tests: it never follows redirects and
// has a timeout, so a hung gateway fails the test instead of hanging it.
var testClient = &http.Client{Timeout: 30 * time.Second}

// gateDir is a folder for a gate's store that outlives the test's Caddy
// long enough: a config's database closes once its requests in flight and
// its holders are done (BadgerStore.Cleanup), which can be just after
// caddy.Stop returns, so removing the folder waits for its last write (up
// to 10 s) rather than failing the test on a file written meanwhile.
func gateDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "gate-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			err := os.RemoveAll(dir)
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("removing the gate's store folder: %v", err)
				return
			}
		}
	})
	return filepath.Join(dir, "gate")
}
