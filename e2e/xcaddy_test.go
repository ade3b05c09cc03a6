package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// xcaddy.sh finds the packages of this repository that register Caddy
// modules by itself (offline, with go list), so a new plugin directory is
// built in without editing the script.
func TestXcaddyScriptFindsOurModules(t *testing.T) {
	cmd := exec.Command("./xcaddy.sh", "--list")
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("xcaddy.sh --list: %v", err)
	}
	pkgs := strings.Fields(string(out))
	if !slices.Contains(pkgs, "github.com/aovhq/aov/caddymodule") {
		t.Fatalf("xcaddy.sh --list = %q, lacks the gateway package", pkgs)
	}
	for _, p := range pkgs {
		if strings.Contains(p, "/internal") || strings.HasPrefix(p, "github.com/aovhq/aov/cmd/") {
			t.Errorf("xcaddy.sh would import %s, which is not a Caddy module package", p)
		}
	}
}

func TestXcaddyScriptRefusesUnknownArguments(t *testing.T) {
	for _, args := range [][]string{{"--frobnicate"}, {"--with"}, {"--output"}} {
		cmd := exec.Command("./xcaddy.sh", args...)
		cmd.Dir = repoRoot
		out, err := cmd.CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 {
			t.Errorf("xcaddy.sh %q: %v (want exit 2)\n%s", args, err, out)
		}
	}
}

// The real build: Caddy v2.11.9 with our modules plus a third-party plugin,
// through xcaddy. It needs the Go module proxy and takes minutes, so it
// runs only when asked:
//
//	AOV_TEST_XCADDY=1 go test -run TestXcaddyBuild -timeout 30m ./e2e
func TestXcaddyBuild(t *testing.T) {
	if os.Getenv("AOV_TEST_XCADDY") != "1" {
		t.Skip("set AOV_TEST_XCADDY=1 to build Caddy with xcaddy.sh (needs the Go module proxy; takes minutes)")
	}
	out := filepath.Join(t.TempDir(), "caddy")
	cmd := exec.Command("./xcaddy.sh", "--output", out, "--with", "github.com/mholt/caddy-l4@v0.1.2")
	cmd.Dir = repoRoot
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("xcaddy.sh: %v\n%s", err, b)
	}
	b, err := exec.Command(out, "list-modules").CombinedOutput()
	if err != nil {
		t.Fatalf("list-modules: %v\n%s", err, b)
	}
	mods := strings.Fields(string(b))
	for _, want := range []string{"http.handlers.x402", "http.handlers.x402_facilitator", "x402.stores.badger", "layer4"} {
		if !slices.Contains(mods, want) {
			t.Errorf("the xcaddy build lacks %s", want)
		}
	}
	b, err = exec.Command(out, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(b), "v2.11.9 ") {
		t.Fatalf("version: %v: %s", err, b)
	}
}
