package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/internal/interop"
)

// sessionMCPUpstream is a real MCP server (the official Go SDK) that keeps
// sessions, as MCP servers other than verifierd do: it gives an
// Mcp-Session-Id on initialize, serves the SSE stream on GET and ends the
// session on DELETE. It records the method and MCP headers of every
// request that reached it.
type sessionMCPUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []string // "METHOD session=<id> version=<v>"
}

func newSessionMCPUpstream(t *testing.T) *sessionMCPUpstream {
	u := &sessionMCPUpstream{}
	server := mcp.NewServer(&mcp.Implementation{Name: "session-verifier", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "verify_schema", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{
				Content:           []mcp.Content{&mcp.TextContent{Text: `{"result":"pass"}`}},
				StructuredContent: map[string]any{"result": "pass"},
			}, nil
		})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{JSONResponse: true})
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, fmt.Sprintf("%s session=%s version=%s", r.Method, r.Header.Get("Mcp-Session-Id"), r.Header.Get("Mcp-Protocol-Version")))
		u.mu.Unlock()
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

type mcpBrowserStep struct {
	Name      string          `json:"name"`
	Status    int             `json:"status"`
	SessionID string          `json:"sessionId"`
	Body      json.RawMessage `json:"body"`
	Error     string          `json:"error"`
}

// TestCORSLetsABrowserMCPClientThrough: a page on another origin speaks
// MCP's Streamable HTTP transport to a priced MCP route with x402_cors and
// its defaults only. The browser sends every request the official SDK
// client sends (MCP-Protocol-Version and Mcp-Session-Id after initialize,
// the SSE GET, Last-Event-ID, the DELETE that ends the session) only after
// a preflight the gateway allowed, and the page reads Mcp-Session-Id. The
// browser enforces CORS itself (nothing is stubbed), so the test fails if
// a default header, method or exposed header is missing.
func TestCORSLetsABrowserMCPClientThrough(t *testing.T) {
	chromium := chromiumPath(t)
	interop.Dir(t, "playwright-core")
	_, fac := sharedDevnet(t)
	up := newSessionMCPUpstream(t)
	page := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, "<!doctype html><title>agent</title><p>an agent's page</p>")
	}))
	t.Cleanup(page.Close)
	api := startCaddy(t, fmt.Sprintf(`:{port} {
	route /mcp {
		x402_cors %[4]s
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			free_allowance {
				pool verify
				per_day 5
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), page.URL))

	var res struct {
		Steps []mcpBrowserStep `json:"steps"`
	}
	interop.Run(t, "mcp-cors-browser.mjs", nil, map[string]any{
		"page": page.URL + "/", "mcp": api + "/mcp", "chromium": chromium,
		"tool": "verify_schema", "args": verifyArgs,
	}, &res)

	steps := map[string]mcpBrowserStep{}
	for _, s := range res.Steps {
		steps[s.Name] = s
		if s.Error != "" {
			t.Errorf("%s: the browser refused the request: %s", s.Name, s.Error)
		}
	}
	session := steps["initialize"].SessionID
	if steps["initialize"].Status != http.StatusOK || session == "" {
		t.Fatalf("initialize: status %d, Mcp-Session-Id %q readable by the page", steps["initialize"].Status, session)
	}
	want := map[string]int{
		"initialized": http.StatusAccepted, "sse": http.StatusOK, "tools/list": http.StatusOK,
		"tools/call": http.StatusOK, "delete": http.StatusNoContent, "after-delete": http.StatusNotFound,
	}
	for name, status := range want {
		if got := steps[name].Status; got != status {
			t.Errorf("%s: status %d, want %d", name, got, status)
		}
	}
	if s := steps["sse-resume"]; s.Status == 0 {
		t.Errorf("the resumed SSE GET (Last-Event-ID) got no answer the page could read")
	}
	if b := string(steps["tools/list"].Body); !strings.Contains(b, `"verify_schema"`) {
		t.Errorf("tools/list: %s", b)
	}
	if b := string(steps["tools/call"].Body); !strings.Contains(b, `"result":"pass"`) || strings.Contains(b, `"isError":true`) {
		t.Errorf("tools/call (free allowance): %s", b)
	}

	// What reached the MCP server: every request after initialize carried
	// the session and the negotiated version, and the DELETE ended it.
	up.mu.Lock()
	defer up.mu.Unlock()
	var deletes int
	for i, s := range up.seen {
		if i == 0 {
			continue
		}
		if !strings.Contains(s, "session="+session+" ") || strings.HasSuffix(s, "version=") {
			t.Errorf("request %d reached the server as %q, want session %s and a protocol version", i, s, session)
		}
		if strings.HasPrefix(s, http.MethodDelete) {
			deletes++
		}
	}
	if deletes != 1 {
		t.Errorf("the server saw %d DELETEs, want 1: %v", deletes, up.seen)
	}
}
