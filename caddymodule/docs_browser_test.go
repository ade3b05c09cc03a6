package caddymodule

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/interop"
)

// chromiumPath finds the system Chromium (Debian's `chromium` package, or
// AOV_CHROMIUM). Without it the browser test is skipped with the install
// command, except under CI, where it fails.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("AOV_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	interop.Missing(t, "no Chromium on PATH: install it (Debian: apt-get install -y chromium) or set AOV_CHROMIUM to run the docs page browser test")
	return ""
}

// browserResult is what interop/docs-browser.mjs reports.
type browserResult struct {
	Title         string   `json:"title"`
	Operations    []string `json:"operations"`
	Status        string   `json:"status"`
	RequestURL    string   `json:"requestURL"`
	Response      string   `json:"response"`
	OtherOrigins  []string `json:"otherOrigins"`
	ConsoleErrors []string `json:"consoleErrors"`
}

// TestDocsPageWorksInABrowser opens /docs in headless Chromium, sees the
// operations rendered from the live document, and runs "Try it out" on
// POST /verify/schema with the documented example: the call goes through
// the gate, is served from the free allowance, and the page shows the 200.
func TestDocsPageWorksInABrowser(t *testing.T) {
	chromium := chromiumPath(t)
	interop.Dir(t, "playwright-core")
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, docsSite(up.URL, fac, "$0.02", 3, ""))

	var res browserResult
	interop.Run(t, "docs-browser.mjs", nil, map[string]any{
		"base":      base,
		"chromium":  chromium,
		"operation": "operations-Verification-verifySchema",
	}, &res)

	for _, op := range []string{"POST /verify/schema", "POST /verify/deliverable", "GET /score/{agent_id}", "GET /reputation/{agent_id}", "GET /health", "POST /mcp", "GET /llms.txt"} {
		if !slices.Contains(res.Operations, op) {
			t.Errorf("the page does not render %s; it renders %v", op, res.Operations)
		}
	}
	if res.Title != "Agent Output Verifier: API docs" {
		t.Errorf("title %q", res.Title)
	}
	t.Logf("%d operations rendered; try it out on POST /verify/schema rendered:\n%s", len(res.Operations), res.Response)
	if res.Status != "200" {
		t.Fatalf("try it out on POST /verify/schema rendered status %q:\n%s", res.Status, res.Response)
	}
	if res.RequestURL != base+"/verify/schema" {
		t.Errorf("the page called %q, want %s/verify/schema", res.RequestURL, base)
	}
	// The answer came through the gate from the free allowance.
	for _, want := range []string{"free-allowance-remaining: 2", "free-allowance-limit: 3", `"payment": "free"`} {
		if !strings.Contains(res.Response, want) {
			t.Errorf("the rendered response lacks %q:\n%s", want, res.Response)
		}
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("the upstream was called %d times, want once", n)
	}
	if len(res.OtherOrigins) > 0 {
		t.Errorf("the page requested other origins: %v", res.OtherOrigins)
	}
	if len(res.ConsoleErrors) > 0 {
		t.Errorf("the page logged errors: %v", res.ConsoleErrors)
	}
}
