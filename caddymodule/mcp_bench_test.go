package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// mcpBenchAnswer is verifierd's answer to a tools/call of verify_schema
// with the SPEC §10 invoice: the signed document as text and as
// structuredContent.
var mcpBenchAnswer = func() []byte {
	b, err := os.ReadFile("testdata/mcp_verify_schema_answer.json")
	if err != nil {
		panic(err)
	}
	return b
}()

// BenchmarkGateMCPFreeDirect is a tools/call of the priced MCP tool served
// from the free allowance by the gate alone (no Caddy, no network; Badger
// without fsync; the verify_request validator on, as in
// Caddyfile.example), answered by an upstream that writes a fixed result
// of verify_schema's size. "upstream" is that upstream alone with the same
// request: the difference is the gate's MCP cost (reading the JSON-RPC
// message, the allowance, holding the answer and reading whether it is an
// error).
func BenchmarkGateMCPFreeDirect(b *testing.B) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "verify_schema", "arguments": json.RawMessage(validRequest)}})
	upstream := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, err := w.Write(mcpBenchAnswer)
		return err
	})
	g, _ := directGate(b, store.Options{NoSync: true}, func(g *Gate) {
		g.MCPTool, g.Free = "verify_schema", &FreeAllowance{PerDay: 1 << 30}
	})
	request := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "http://example.com/mcp", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{}))
	}
	for _, c := range []struct {
		name  string
		serve func(w http.ResponseWriter, r *http.Request) error
	}{
		{"upstream", upstream.ServeHTTP},
		{"gate", func(w http.ResponseWriter, r *http.Request) error { return g.ServeHTTP(w, r, upstream) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				w := httptest.NewRecorder()
				if err := c.serve(w, request()); err != nil || w.Code != 200 || !strings.Contains(w.Body.String(), `"structuredContent"`) {
					b.Fatalf("status %d, %v: %.300s", w.Code, err, w.Body)
				}
			}
		})
	}
}

// BenchmarkMCPDeliver is the end of a paid tools/call on the held
// verify_schema answer: "billable+deliver" judges it (billable) and writes
// it with its settlement in result._meta (deliver), as the paid path does;
// "deliver" is the writing alone, as for a saved answer replayed.
func BenchmarkMCPDeliver(b *testing.B) {
	sr := x402.SettleResponse{Success: true, Transaction: "0x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Network: x402.NetworkBase, Payer: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"}
	for _, judge := range []bool{true, false} {
		name := "deliver"
		if judge {
			name = "billable+deliver"
		}
		id := json.RawMessage("1") // the answer's id, as the gate read it from the call
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				e := &mcpExchange{g: &Gate{}, id: id}
				bw := &bufferedWriter{header: http.Header{"Content-Type": {"application/json"}}, code: 200,
					buf: bytes.NewBuffer(append([]byte(nil), mcpBenchAnswer...)), limit: 1 << 20, held: true}
				if judge && !e.billable(bw) {
					b.Fatal("not billable")
				}
				e.deliver(httptest.NewRecorder(), bw, sr)
			}
		})
	}
}

// BenchmarkMCPAnswerRead is the judging of verifierd's held verify_schema
// answer alone, three ways: "struct" is encoding/json into a struct (the
// free path's reading before toolSucceeded: any letter case), "members"
// encoding/json into maps of raw members (the paid path's before, and
// toolSucceeded's reference), "walk" toolSucceeded.
func BenchmarkMCPAnswerRead(b *testing.B) {
	for _, c := range []struct {
		name string
		read func([]byte) (bool, error)
	}{
		{"struct", func(body []byte) (bool, error) {
			var resp struct {
				Result *struct {
					IsError bool `json:"isError"`
				} `json:"result"`
			}
			err := json.Unmarshal(body, &resp)
			return err == nil && resp.Result != nil && !resp.Result.IsError, err
		}},
		{"members", func(body []byte) (bool, error) { return answerMembersReference(body, json.RawMessage("1")) }},
		{"walk", func(body []byte) (bool, error) {
			ok, _, err := toolSucceeded(body, json.RawMessage("1"))
			return ok, err
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if ok, err := c.read(mcpBenchAnswer); !ok || err != nil {
					b.Fatal(ok, err)
				}
			}
		})
	}
}
