package main

import (
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// marker precedes each block of baseline.Caddyfile that must stay a copy
// of Caddyfile.example's, so the baseline differs from the gateway's site
// only by our modules.
const marker = "# as in Caddyfile.example"

// blockAfter returns the lines of the brace-delimited block that starts on
// the line after index i, each trimmed of its indentation, comment lines
// left out (the copies must agree in configuration, not in prose).
func blockAfter(t *testing.T, lines []string, i int) []string {
	t.Helper()
	var out []string
	depth := 0
	for _, l := range lines[i+1:] {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") {
			continue
		}
		out = append(out, l)
		depth += strings.Count(l, "{") - strings.Count(l, "}")
		if depth == 0 {
			return out
		}
	}
	t.Fatalf("unterminated block after line %d", i+1)
	return nil
}

func TestBaselineCopiesTheGatewaysSite(t *testing.T) {
	base, err := os.ReadFile("baseline.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	var trimmed []string
	for _, l := range strings.Split(string(example), "\n") {
		if l = strings.TrimSpace(l); !strings.HasPrefix(l, "#") {
			trimmed = append(trimmed, l)
		}
	}
	exampleText := "\n" + strings.Join(trimmed, "\n") + "\n"
	lines := strings.Split(string(base), "\n")
	var copies int
	for i, l := range lines {
		if strings.TrimSpace(l) != marker {
			continue
		}
		copies++
		block := strings.Join(blockAfter(t, lines, i), "\n")
		if !strings.Contains(exampleText, "\n"+block+"\n") {
			t.Errorf("the block after line %d of baseline.Caddyfile is not in Caddyfile.example:\n%s", i+1, block)
		}
	}
	// The server timeouts, the upstream deadlines and the access log.
	if copies != 3 {
		t.Fatalf("%d blocks marked %q, want 3", copies, marker)
	}
	for _, want := range []string{
		"request_header -X-Aov-*",
		"request_header -Incremental",
		"header_up X-Aov-Gateway-Token {env.AOV_GATEWAY_TOKEN}",
		"request_buffers 1MiB",
		"import upstream_deadlines",
	} {
		if !strings.Contains(string(base), want) || !strings.Contains(string(example), want) {
			t.Errorf("%q is not in both files", want)
		}
	}
}

// The baseline is a Caddyfile Caddy loads, with no module of ours: the
// stock Caddy modules alone adapt it.
func TestBaselineAdapts(t *testing.T) {
	base, err := os.ReadFile("baseline.Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	adapter := caddyconfig.GetAdapter("caddyfile")
	if adapter == nil {
		t.Fatal("no caddyfile adapter")
	}
	cfg, warn, err := adapter.Adapt(base, map[string]any{"filename": "baseline.Caddyfile"})
	if err != nil {
		t.Fatalf("adapt: %v", err)
	}
	if len(warn) > 0 {
		t.Errorf("warnings: %v", warn)
	}
	// One reverse_proxy for the whole site, no path matcher: /mcp reaches
	// verifierd as /verify/schema does, as the gateway's @mcp route sends
	// it (the mcp-baseline scenario).
	if strings.Contains(string(cfg), `"path":`) {
		t.Errorf("the baseline routes by path, so some path may not reach verifierd as through the gateway:\n%s", cfg)
	}
	for _, want := range []string{`"read_header_timeout":5000000000`, `"listen":["127.0.0.1:8090"]`, `"response_header_timeout":15000000000`, `"filename":"./data/logs/access.log"`, `"handler":"reverse_proxy"`} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("adapted config lacks %s:\n%s", want, cfg)
		}
	}
}
