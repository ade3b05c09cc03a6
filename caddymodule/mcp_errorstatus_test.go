package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// fixedBody answers body, of media type ct, whatever the SDK answered.
func fixedBody(ct, body string) func(http.Header, []byte) []byte {
	return func(h http.Header, _ []byte) []byte {
		h.Set("Content-Type", ct)
		return []byte(body)
	}
}

// An answer of HTTP status 400 or more is never charged, and keeps its
// status, but is no way around the rebuild of what is handed over
// uncharged: a body that reads as JSON-RPC is handed over as the call's
// jsonrpc and id and the error the SDK reads in it, never a result (the
// tool's content, a twin, a forged x402 payment response), whatever its
// status. A body that is not JSON-RPC (the SDK server's plain-text errors)
// is handed over as the tool server sent it: it has no result._meta, where
// an x402 client reads a payment response.
func TestMCPErrorStatusAnswerIsRebuilt(t *testing.T) {
	d, up, paidURL, freeURL, pr := paidAndFreeFaultN(t, 10)
	const payer = 9
	payerAddr := evmfacilitator.DevAccounts()[payer].Address
	result := `{"content":[{"type":"text","text":"PAID"}],"_meta":{"x402/payment-response":{"success":true,"transaction":"0xforged"}}}`
	rpcErr := `{"code":-32603,"message":"tool backend failed","data":{"retry":true}}`
	bare := `{"jsonrpc":"2.0","id":7}`
	withErr := `{"jsonrpc":"2.0","id":7,"error":` + rpcErr + `}`
	for _, c := range []struct {
		name     string
		status   int
		ct, body string
		want     string // the answer handed over, of media type wantCT
		wantCT   string
	}{
		{"a result", 400, "application/json", `{"jsonrpc":"2.0","id":7,"result":` + result + `,"Result":` + result + `}`, bare, "application/json"},
		{"a result", 422, "application/json", `{"jsonrpc":"2.0","id":7,"result":` + result + `}`, bare, "application/json"},
		{"a result", 500, "application/json", `{"jsonrpc":"2.0","id":7,"result":` + result + `}`, bare, "application/json"},
		{"an error beside a result", 500, "application/json", `{"jsonrpc":"2.0","id":7,"error":` + rpcErr + `,"result":` + result + `}`, withErr, "application/json"},
		{"an error with a twin", 400, "application/json", `{"Result":` + result + `,"jsonrpc":"2.0","id":7,"error":` + rpcErr + `}`, withErr, "application/json"},
		{"an error the SDK does not read", 400, "application/json", `{"jsonrpc":"2.0","id":7,"error":{"code":"x","message":"PAID"}}`, bare, "application/json"},
		{"a result under another id", 400, "application/json", `{"jsonrpc":"2.0","id":99,"result":` + result + `}`, bare, "application/json"},
		{"a result in a twin only", 400, "application/json", `{"RESULT":` + result + `}`, bare, "application/json"},
		{"a batch", 500, "application/json", `[{"jsonrpc":"2.0","id":7,"result":` + result + `}]`, bare, "application/json"},
		{"a result in a stream", 500, "text/event-stream", "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":7,\"result\":" + result + "}\n\n", bare, "application/json"},
		{"plain text", 404, "text/plain; charset=utf-8", "session not found\n", "session not found\n", "text/plain; charset=utf-8"},
		{"a JSON document that is not JSON-RPC", 400, "application/json", `{"detail":"bad arguments"}`, `{"detail":"bad arguments"}`, "application/json"},
	} {
		up.status.Store(int32(c.status))
		up.set(fixedBody(c.ct, c.body))
		for _, url := range []string{paidURL, freeURL} {
			var meta mcp.Meta
			if url == paidURL {
				meta = payMeta(t, pr, payer)
			}
			before := balance(t, d, payerAddr)
			params := map[string]any{"name": "verify_schema", "arguments": map[string]any{}}
			if meta != nil {
				params["_meta"] = meta
			}
			call, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
			req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(call))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			status, ct, body := doRaw(t, req)
			if status != c.status || string(body) != c.want || ct != c.wantCT {
				t.Fatalf("%s under HTTP %d at %s: handed over HTTP %d %s %s, want %s %s", c.name, c.status, url, status, ct, body, c.wantCT, c.want)
			}
			if charged := new(big.Int).Sub(before, balance(t, d, payerAddr)); charged.Sign() != 0 {
				t.Fatalf("%s: charged %v", c.name, charged)
			}
		}
	}
}

// doRaw sends req and returns the answer's status, media type and body.
func doRaw(t *testing.T, req *http.Request) (int, string, []byte) {
	t.Helper()
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), buf.Bytes()
}

// The official SDK client still reads what it reads of an error status: a
// JSON-RPC error under HTTP 400 is its call's error (and the session
// lives on), and a 404 of a stateful server that ended the session is
// ErrSessionMissing, after which the client connects again.
func TestMCPErrorStatusReachesTheSDKClient(t *testing.T) {
	_, up, _, freeURL, _ := paidAndFreeFaultN(t, 10)
	s := mcpSession(t, freeURL)
	up.status.Store(http.StatusBadRequest)
	up.set(withoutResult(`{"code":-32602,"message":"missing or invalid _meta field"}`))
	_, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: map[string]any{}})
	var je *jsonrpc.Error
	if !errors.As(err, &je) || je.Code != -32602 || je.Message != "missing or invalid _meta field" {
		t.Fatalf("a JSON-RPC error under HTTP 400: the client got %v, want its error", err)
	}
	up.status.Store(0)
	up.set(nil)
	if res := callTool(t, s, "verify_schema", map[string]any{}, nil); res.IsError {
		t.Fatalf("the session did not live on: %+v", res)
	}

	// A stateful tool server, whose sessions end.
	_, fac := sharedDevnet(t)
	server := mcp.NewServer(&mcp.Implementation{Name: "stateful", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "verify_schema", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil
	})
	stateful := httptest.NewServer(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{JSONResponse: true}))
	t.Cleanup(stateful.Close)
	base := startCaddy(t, faultSite(stateful.URL, fac, "free_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 10\n\t\t\t}"))
	s = mcpSession(t, base+"/mcp")
	if s.ID() == "" {
		t.Fatal("the stateful server gave no session")
	}
	callTool(t, s, "verify_schema", map[string]any{}, nil)
	for ss := range server.Sessions() {
		ss.Close()
	}
	if _, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: map[string]any{}}); !errors.Is(err, mcp.ErrSessionMissing) {
		t.Fatalf("a call in an ended session: %v, want ErrSessionMissing", err)
	}
	if res := callTool(t, mcpSession(t, base+"/mcp"), "verify_schema", map[string]any{}, nil); res.IsError {
		t.Fatalf("a new session was refused: %+v", res)
	}
}
