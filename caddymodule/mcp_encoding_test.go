package caddymodule

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/klauspost/compress/gzhttp"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// gzipToolServer is a real go-sdk MCP server behind klauspost's gzhttp, as
// behind nginx's `gzip_types application/json` or any compression
// middleware: it compresses an answer (over gzhttp's 1 KiB minimum; the
// tool's is larger) when the request accepts gzip. always makes it compress
// whatever the request accepts, as a misconfigured server does. asked holds
// the Accept-Encoding of the last call that reached it.
type gzipToolServer struct {
	*httptest.Server
	runs  atomic.Int64
	asked atomic.Value
}

func newGzipToolServer(t *testing.T, always bool) *gzipToolServer {
	u := &gzipToolServer{}
	server := mcp.NewServer(&mcp.Implementation{Name: "gz", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "verify_schema", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.runs.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Repeat(`{"result":"pass"}`, 100)}}}, nil
	})
	gz := gzhttp.GzipHandler(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true}))
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.asked.Store(r.Header.Get("Accept-Encoding"))
		if always {
			r.Header.Set("Accept-Encoding", "gzip")
		}
		gz.ServeHTTP(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// rawToolCall POSTs one tools/call of verify_schema as a client that
// accepts gzip and decodes nothing itself, and returns the answer as sent.
func rawToolCall(t *testing.T, url string, meta map[string]any) (*http.Response, []byte) {
	t.Helper()
	params := map[string]any{"name": "verify_schema", "arguments": map[string]any{}}
	if meta != nil {
		params["_meta"] = meta
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, raw
}

// A tool server that compresses for clients that accept it is asked for
// plain bytes, as verify_response asks its upstream: the gate judges the
// answer, and the official SDK client (which, as Go's HTTP client, accepts
// gzip by default) gets the tool's result, free and paid alike, and the
// settlement. Before, the gate passed the buyer's Accept-Encoding on, held
// gzip bytes it could not read and withheld every answer as
// upstream_answer_unreadable.
func TestMCPToolServerIsAskedForPlainAnswers(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newGzipToolServer(t, false)
	base := startCaddy(t, faultSite(up.URL, fac, "free_allowance {\n\t\t\t\tpool mcp-plain\n\t\t\t\tper_day 1\n\t\t\t}"))
	s := mcpSession(t, base+"/mcp")

	free := callTool(t, s, "verify_schema", map[string]any{}, nil)
	if free.IsError {
		b, _ := json.Marshal(free.StructuredContent)
		t.Fatalf("a free call through the gate failed: %s", b)
	}
	if got := up.asked.Load(); got != "identity" {
		t.Fatalf("the tool server was asked for Accept-Encoding %q, not identity", got)
	}
	pr := demandOf(t, callTool(t, s, "verify_schema", map[string]any{}, nil))
	paid := callTool(t, s, "verify_schema", map[string]any{}, payMeta(t, pr, 7))
	if paid.IsError || paid.Meta[mcpMetaPaymentResponse] == nil {
		b, _ := json.Marshal(paid)
		t.Fatalf("a paid call through the gate was not served and settled: %s", b)
	}
	if n := up.runs.Load(); n != 2 {
		t.Fatalf("the tool ran %d times for two served calls", n)
	}
}

// A tool server that compresses all the same (it was asked for identity)
// sent bytes the gate cannot read: the answer is withheld as
// upstream_answer_unreadable, in plain JSON the client can read. Nothing
// the tool server said about its own body (Content-Encoding,
// Content-Length) describes the gate's reply, which a client would
// otherwise try to gunzip.
func TestMCPCompressedToolAnswerIsUnreadableAndRepliedPlain(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newGzipToolServer(t, true)
	base := startCaddy(t, faultSite(up.URL, fac, "free_allowance {\n\t\t\t\tpool mcp-gz\n\t\t\t\tper_day 5\n\t\t\t}"))
	resp, raw := rawToolCall(t, base+"/mcp", nil)
	if up.runs.Load() != 1 {
		t.Fatalf("the tool ran %d times", up.runs.Load())
	}
	if ce := resp.Header.Values("Content-Encoding"); len(ce) != 0 {
		t.Fatalf("the gate's own reply says Content-Encoding %q: %q", ce, raw)
	}
	if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(raw)) {
		t.Fatalf("Content-Length %q for a %d-byte reply", cl, len(raw))
	}
	var out struct {
		ID     int             `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  struct {
			Data struct {
				Code    string `json:"code"`
				Charged *bool  `json:"charged"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("the reply is not plain JSON: %v: %q", err, raw)
	}
	if out.ID != 7 || out.Result != nil || out.Error.Data.Code != codeAnswerUnreadable || out.Error.Data.Charged == nil || *out.Error.Data.Charged {
		t.Fatalf("not an uncharged %s error under the call's id: %s", codeAnswerUnreadable, raw)
	}
	if strings.Contains(string(raw), "pass") {
		t.Fatalf("the reply carries the tool's content: %s", raw)
	}
}

// gzipped is a fault: the tool server's answer compressed whatever the
// gate asked for.
func gzipped(h http.Header, body []byte) []byte {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	z.Write(body)
	z.Close()
	h.Set("Content-Encoding", "gzip")
	return b.Bytes()
}

// A compressed answer of an error status is read no more than one of 200:
// the gate cannot tell what a client decoding it would take from it (a
// result beside the error, the tool's content uncharged), so it is
// withheld too, and the reply is plain.
func TestMCPCompressedErrorStatusAnswerIsWithheld(t *testing.T) {
	_, up, paidURL, _, pr := paidAndFreeFault(t)
	up.set(func(h http.Header, b []byte) []byte {
		return gzipped(h, setMember("error", `{"code":-32603,"message":"tool backend failed"}`)(h, b))
	})
	up.status.Store(http.StatusBadRequest)
	resp, raw := rawToolCall(t, paidURL, payMeta(t, pr, 8).GetMeta())
	if ce := resp.Header.Values("Content-Encoding"); len(ce) != 0 || strings.Contains(string(raw), "pass") || !strings.Contains(string(raw), codeAnswerUnreadable) {
		t.Fatalf("HTTP %d Content-Encoding %q: %q", resp.StatusCode, ce, raw)
	}
}

// A settled answer is rewritten by the gate (the settlement goes into its
// result's _meta): the tool server's headers about its own bytes (a
// digest, an Etag) would describe a body the buyer does not get, and a
// client checking them would reject its paid answer.
func TestMCPRewrittenAnswerLosesTheToolServersBodyHeaders(t *testing.T) {
	_, up, paidURL, _, pr := paidAndFreeFault(t)
	up.set(func(h http.Header, b []byte) []byte {
		h.Set("Etag", `"tool-bytes"`)
		h.Set("Content-Md5", "bm90IHRoZXNlIGJ5dGVz")
		h.Set("Content-Digest", "sha-256=:bm90IHRoZXNlIGJ5dGVz:")
		h.Set("Content-Range", "bytes 0-9/10")
		return b
	})
	resp, raw := rawToolCall(t, paidURL, payMeta(t, pr, 9).GetMeta())
	if !strings.Contains(string(raw), mcpMetaPaymentResponse) {
		t.Fatalf("not settled: HTTP %d %q", resp.StatusCode, raw)
	}
	for _, k := range []string{"Etag", "Content-Md5", "Content-Digest", "Content-Range", "Content-Encoding"} {
		if v := resp.Header.Values(k); len(v) != 0 {
			t.Errorf("the gate's rewritten answer carries the tool server's %s %q", k, v)
		}
	}
	if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(raw)) {
		t.Errorf("Content-Length %q for a %d-byte answer", cl, len(raw))
	}
}

// The gate asks the tool server for the whole answer (no Range), so a 206
// is a part it cannot tell is the whole, even when the part parses as a
// result: it is withheld as upstream_answer_unreadable, uncharged, and
// the gate's own reply, which is whole, goes out as 200 without the tool
// server's Content-Range. Before, it was charged and sent as 206 with a
// Content-Range describing bytes it no longer carried.
func TestMCPPartialToolAnswerIsUnreadable(t *testing.T) {
	_, up, paidURL, _, pr := paidAndFreeFault(t)
	up.set(func(h http.Header, b []byte) []byte { h.Set("Content-Range", "bytes 0-9/10"); return b })
	up.status.Store(http.StatusPartialContent)
	resp, raw := rawToolCall(t, paidURL, payMeta(t, pr, 6).GetMeta())
	if strings.Contains(string(raw), mcpMetaPaymentResponse) || !strings.Contains(string(raw), codeAnswerUnreadable) {
		t.Fatalf("a 206 was not withheld: HTTP %d %q", resp.StatusCode, raw)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Range") != "" {
		t.Fatalf("the withheld answer: HTTP %d, Content-Range %q", resp.StatusCode, resp.Header.Get("Content-Range"))
	}
	if cl := resp.Header.Get("Content-Length"); cl != strconv.Itoa(len(raw)) {
		t.Fatalf("Content-Length %q for a %d-byte answer", cl, len(raw))
	}
}
