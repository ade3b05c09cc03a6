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
// page keeps the SSE stream open, as the SDK does, and the session's DELETE
// must end it.
// First a hand-written client that makes each of those requests in turn
// (Last-Event-ID included, which the SDK sends only to resume), then the
// official TypeScript SDK client itself, loaded into a page from
// node_modules. The browser enforces CORS itself (nothing is intercepted),
// so the test fails if a default header, method or exposed header is
// missing.
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
	// The same priced MCP route twice: for the hand-written client's page
	// (its exact origin) and for the SDK's page, whose port the script
	// picks (any origin, as Caddyfile.example). Each lists its page's
	// origin for free calls too, which a page on another origin is not
	// served by default.
	route := func(path, cors, free string) string {
		return fmt.Sprintf(`route %[5]s {
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
				origins %[6]s
			}
		}
		reverse_proxy %[1]s
	}`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), cors, path, free)
	}
	api := startCaddy(t, ":{port} {\n\t"+route("/mcp", page.URL, page.URL)+"\n\t"+route("/any/mcp", "{\n\t\t\torigins *\n\t\t}", "*")+"\n}\n")

	var res struct {
		Steps  []mcpBrowserStep `json:"steps"`
		SSEEnd string           `json:"sseEnd"`
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
	if res.SSEEnd != "ended" {
		t.Errorf("the SSE stream after the session's DELETE: %s, want it ended with the session", res.SSEEnd)
	}
	if b := string(steps["tools/list"].Body); !strings.Contains(b, `"verify_schema"`) {
		t.Errorf("tools/list: %s", b)
	}
	if b := string(steps["tools/call"].Body); !strings.Contains(b, `"result":"pass"`) || strings.Contains(b, `"isError":true`) {
		t.Errorf("tools/call (free allowance): %s", b)
	}

	up.checkSession(t, session)

	// The official SDK client itself, in a page the script serves.
	up.reset()
	var sdk struct {
		SessionID string   `json:"sessionId"`
		Tools     []string `json:"tools"`
		Call      *struct {
			IsError           bool           `json:"isError"`
			StructuredContent map[string]any `json:"structuredContent"`
		} `json:"call"`
		Terminated     bool     `json:"terminated"`
		AfterTerminate string   `json:"afterTerminate"`
		Error          string   `json:"error"`
		ConsoleErrors  []string `json:"consoleErrors"`
	}
	interop.Run(t, "mcp-sdk-browser.mjs", nil, map[string]any{
		"mcp": api + "/any/mcp", "chromium": chromium, "tool": "verify_schema", "args": verifyArgs,
	}, &sdk)
	if sdk.Error != "" || sdk.SessionID == "" {
		t.Fatalf("the SDK client in the page: session %q, error %s; console: %q", sdk.SessionID, sdk.Error, sdk.ConsoleErrors)
	}
	if len(sdk.Tools) != 1 || sdk.Tools[0] != "verify_schema" {
		t.Errorf("the SDK client listed %q", sdk.Tools)
	}
	if sdk.Call == nil || sdk.Call.IsError || sdk.Call.StructuredContent["result"] != "pass" {
		t.Errorf("the SDK client's tool call (free allowance): %+v", sdk.Call)
	}
	if !sdk.Terminated || sdk.AfterTerminate == "" {
		t.Errorf("ending the session: terminated %v, a later call answered %q", sdk.Terminated, sdk.AfterTerminate)
	}
	up.checkSession(t, sdk.SessionID)
}

func (u *sessionMCPUpstream) reset() {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.seen = nil
}

// checkSession fails t unless every request after initialize (and before
// the session ended) reached the server with the session and a protocol
// version, one of them the SSE GET, and exactly one DELETE ended it: a
// DELETE the browser sent again (it resends a request whose reused
// connection fails before the answer) is counted too.
func (u *sessionMCPUpstream) checkSession(t *testing.T, session string) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	var gets, deletes int
	for i, s := range u.seen {
		if i > 0 && deletes == 0 {
			if !strings.Contains(s, "session="+session+" ") || strings.HasSuffix(s, "version=") {
				t.Errorf("request %d reached the server as %q, want session %s and a protocol version", i, s, session)
			}
			if strings.HasPrefix(s, http.MethodGet) {
				gets++
			}
		}
		if strings.HasPrefix(s, http.MethodDelete) {
			deletes++
		}
	}
	if gets == 0 || deletes != 1 {
		t.Errorf("the server saw %d SSE GETs and %d DELETEs, want some and 1: %q", gets, deletes, u.seen)
	}
}
