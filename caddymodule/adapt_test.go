package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	"github.com/aovhq/aov/internal/jsontree"
)

// TestCaddyfileAdapt checks every directive form of the gateway's
// directives against golden files in testdata/adapt.
func TestCaddyfileAdapt(t *testing.T) {
	checkAdaptGoldens(t, "testdata/adapt")
}

// checkAdaptGoldens adapts every golden file in dir: a Caddyfile, a line of
// ten dashes, the expected JSON. The adapter must not warn (a warning means
// the documented form is not how caddy fmt writes it). Run with -update to
// rewrite the expected halves after a deliberate change.
func checkAdaptGoldens(t *testing.T, dir string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no adapt cases in %s: %v", dir, err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			input, want, ok := strings.Cut(string(raw), "\n----------\n")
			if !ok {
				t.Fatalf("%s has no ---------- separator", file)
			}
			got := adapt(t, strings.TrimRight(input, "\n")+"\n")
			if *update {
				os.WriteFile(file, []byte(input+"\n----------\n"+got), 0o644)
				return
			}
			if strings.TrimSpace(got) != strings.TrimSpace(want) {
				t.Errorf("adapted JSON differs\n--- got\n%s\n--- want\n%s", got, want)
			}
		})
	}
}

// adapt runs the Caddyfile adapter on caddyfile and returns the JSON
// indented with tabs; a warning fails the test.
func adapt(t *testing.T, caddyfile string) string {
	t.Helper()
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(caddyfile), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("warning: %s", w.String())
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, out, "", "\t"); err != nil {
		t.Fatal(err)
	}
	return buf.String() + "\n"
}

// TestShippedCaddyfilesAdapt loads the Caddyfiles operators start from, so a
// directive change cannot leave them broken.
func TestShippedCaddyfilesAdapt(t *testing.T) {
	for _, file := range []string{"../Caddyfile.example", "../examples/seller-agent/Caddyfile"} {
		t.Run(filepath.Base(filepath.Dir(file))+"/"+filepath.Base(file), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			adapt(t, string(raw))
		})
	}
}

// TestExampleBuffersGatedBodies checks where Caddyfile.example's proxy to
// verifierd buffers request bodies: behind every x402 gate (the gate holds
// the body already, and the buffered request leaves in one write), and
// nowhere else (the free routes take no body, and an ungated body is not
// held in memory).
func TestExampleBuffersGatedBodies(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	var cfg any
	if err := json.Unmarshal([]byte(adapt(t, string(raw))), &cfg); err != nil {
		t.Fatal(err)
	}
	var gated, free int
	for _, sub := range jsontree.Objects(cfg) {
		if sub["handler"] != "subroute" {
			continue
		}
		var gate bool
		var proxies []map[string]any
		for _, r := range sub["routes"].([]any) {
			for _, h := range r.(map[string]any)["handle"].([]any) {
				h := h.(map[string]any)
				ups, _ := json.Marshal(h["upstreams"])
				switch {
				case h["handler"] == "x402":
					gate = true
				case h["handler"] == "reverse_proxy" && strings.Contains(string(ups), "127.0.0.1:8081"):
					proxies = append(proxies, h)
				}
			}
		}
		for _, p := range proxies {
			buffers, _ := p["request_buffers"].(float64)
			switch {
			case gate && buffers != 1<<20:
				t.Errorf("a gated route's proxy to verifierd has request_buffers %v, want 1 MiB", p["request_buffers"])
			case !gate && p["request_buffers"] != nil:
				t.Errorf("an ungated route's proxy to verifierd buffers request bodies (%v)", p["request_buffers"])
			}
			if gate {
				gated++
			} else {
				free++
			}
		}
	}
	// /verify/schema, /verify/deliverable, /score/*, /mcp; /reputation/*
	// and /health.
	if gated != 4 || free != 1 {
		t.Fatalf("%d gated and %d free proxies to verifierd, want 4 and 1", gated, free)
	}
}

// TestExampleRateLimitsFreeRoutes checks that every route of
// Caddyfile.example no gate prices (the proxies to verifierd and certd, the
// docs, the discovery manifest) counts its requests in the `free` zone
// before it does any work, and that on the MCP route, where gates pass
// unpriced messages on, the limit comes after every gate, so that the calls
// the gates serve are never counted.
func TestExampleRateLimitsFreeRoutes(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	var cfg any
	if err := json.Unmarshal([]byte(adapt(t, string(raw))), &cfg); err != nil {
		t.Fatal(err)
	}
	// The handlers of each subroute, in the order they run.
	limited := map[string]int{}
	for _, sub := range jsontree.Objects(cfg) {
		if sub["handler"] != "subroute" {
			continue
		}
		var handlers []map[string]any
		for _, r := range sub["routes"].([]any) {
			for _, h := range r.(map[string]any)["handle"].([]any) {
				handlers = append(handlers, h.(map[string]any))
			}
		}
		limit, gates, mcp := -1, 0, false
		for i, h := range handlers {
			if h["handler"] == "aov_rate_limit" && h["zone"] == "facilitator" {
				break // the facilitator API's own (TestExampleRateLimitsTheFacilitatorAPI)
			}
			switch h["handler"] {
			case "aov_rate_limit":
				if h["zone"] != "free" || h["off"] != nil {
					t.Errorf("a free route's limit is %v, want zone free", h)
				}
				limit = i
			case "x402":
				gates++
				mcp = mcp || h["mcp_tool"] != nil
				if limit >= 0 {
					t.Errorf("the rate limit runs before the gate of %v", h["mcp_tool"])
				}
			case "reverse_proxy", "aov_docs", "x402_discovery":
				if gates > 0 && !mcp {
					continue // a priced REST route: its gate bounds it
				}
				ups, _ := json.Marshal(h["upstreams"])
				name := fmt.Sprint(h["handler"], string(ups))
				if limit < 0 {
					t.Errorf("%s answers a free route with no rate limit before it", name)
				}
				limited[name]++
			}
		}
	}
	// /mcp and /reputation/* + /health to verifierd, the agent card to
	// certd, the docs, /.well-known/x402.
	if len(limited) != 4 || limited[`reverse_proxy[{"dial":"127.0.0.1:8081"}]`] != 2 {
		t.Fatalf("free responders behind the limit: %v", limited)
	}
}

// TestExampleRateLimitsTheFacilitatorAPI checks that Caddyfile.example's
// public facilitator API (/facilitator/*), whose verify and settle cost the
// chain's RPC and CPU and are paid by no one, counts each client's requests
// in a zone of its own, `facilitator`, AOV_FACILITATOR_RATE a minute
// (default 60), before the facilitator or the proxy to it runs: with the
// facilitator inside Caddy (devnet) and in its own process (remote).
func TestExampleRateLimitsTheFacilitatorAPI(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"devnet", "remote"} {
		t.Run(mode, func(t *testing.T) {
			t.Setenv("AOV_FACILITATOR", mode)
			var cfg any
			if err := json.Unmarshal([]byte(adapt(t, string(raw))), &cfg); err != nil {
				t.Fatal(err)
			}
			found := 0
			for _, sub := range jsontree.Objects(cfg) {
				if sub["handler"] != "subroute" {
					continue
				}
				var limit map[string]any
				for _, r := range sub["routes"].([]any) {
					for _, h := range r.(map[string]any)["handle"].([]any) {
						h := h.(map[string]any)
						ups, _ := json.Marshal(h["upstreams"])
						switch {
						case h["handler"] == "aov_rate_limit":
							limit = h
						case h["handler"] == "x402_facilitator" || (h["handler"] == "reverse_proxy" && strings.Contains(string(ups), "127.0.0.1:8546")):
							found++
							if limit == nil || limit["zone"] != "facilitator" || limit["events"] != 60.0 || limit["window"] != float64(time.Minute) {
								t.Errorf("the facilitator API (%s) runs behind the limit %v, want 60 a minute in zone facilitator", h["handler"], limit)
							}
						}
					}
				}
			}
			if found != 1 {
				t.Fatalf("%d facilitator APIs in the example, want 1", found)
			}
		})
	}
}

// With AOV_SOLANA=off (make run without the local Solana chain) nothing in
// the shipped Caddyfiles names solana-devnet: no 402 offers it, and neither
// /facilitator/supported (Caddyfile.example's x402_facilitator) nor the
// facilitator in its own process (examples/facilitator) lists it; with on,
// the default, all three do. (Before: off left the 402 offers out only,
// and /facilitator/ still declared solana-devnet, settled through an RPC
// nothing had started.)
func TestSolanaOffLeavesSolanaOut(t *testing.T) {
	for _, file := range []string{"../Caddyfile.example", "../examples/facilitator/Caddyfile"} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range []string{"", "on", "off"} {
			t.Setenv("AOV_SOLANA", v)
			if v == "" {
				os.Unsetenv("AOV_SOLANA") // the default; t.Setenv restores it
			}
			out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(raw, map[string]any{"filename": file})
			if err != nil {
				t.Fatalf("%s with AOV_SOLANA=%q: %v", file, v, err)
			}
			if got, want := bytes.Contains(out, []byte("solana-devnet")), v != "off"; got != want {
				t.Errorf("%s with AOV_SOLANA=%q names solana-devnet: %v, want %v", file, v, got, want)
			}
		}
	}
}
