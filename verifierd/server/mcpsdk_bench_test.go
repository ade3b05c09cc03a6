package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// BenchmarkMCPSDK is the MCP transport alone: the official SDK's
// Streamable HTTP handler with verifierd's options (stateless, JSON
// responses) serving tools/call of a tool that only returns a fixed
// result shaped like verify_schema's (the signed document of the SPEC §10
// invoice as text and as structuredContent). "rest" is the same request
// body answered with the same document by a plain handler that reads the
// body and writes the document. Against BenchmarkTransport in the same
// run it splits an MCP verification into the SDK's share and the rest.
func BenchmarkMCPSDK(b *testing.B) {
	f := newFixture(b, fixtureOpts{noSync: true, localSigner: true})
	w := f.do(http.MethodPost, "/verify/schema", invoice("135.0", ""), nil)
	if w.Code != http.StatusOK {
		b.Fatalf("status %d: %s", w.Code, w.Body)
	}
	doc := bytes.TrimRight(w.Body.Bytes(), "\n")
	body := mcpCall("verify_schema", invoice("135.0", ""))

	srv := mcp.NewServer(&mcp.Implementation{Name: "bench", Version: "test"}, &mcp.ServerOptions{Logger: slog.New(slog.DiscardHandler)})
	srv.AddTool(&mcp.Tool{Name: "verify_schema", InputSchema: json.RawMessage(`{"type":"object"}`)},
		func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return &mcp.CallToolResult{
				Content:           []mcp.Content{&mcp.TextContent{Text: string(doc)}},
				StructuredContent: json.RawMessage(doc),
			}, nil
		})
	sdk := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless: true, JSONResponse: true, DisableLocalhostProtection: true, Logger: slog.New(slog.DiscardHandler),
	})
	plain := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		buf.ReadFrom(r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write(doc)
	})
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"rest", plain}, {"sdk", sdk}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu := startCPU()
			defer cpu.report(b)
			for b.Loop() {
				r := httptest.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(body))
				r.Header.Set("Content-Type", "application/json")
				r.Header.Set("Accept", "application/json, text/event-stream")
				w := httptest.NewRecorder()
				c.h.ServeHTTP(w, r)
				if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte(`"attestation"`)) {
					b.Fatalf("status %d: %s", w.Code, w.Body)
				}
			}
		})
	}
}
