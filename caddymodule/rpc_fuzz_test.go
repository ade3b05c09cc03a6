package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/internal/jsontree"
	"github.com/aovhq/aov/strictjson"
)

// sdkCall is what the MCP SDK made of a message: the tool it ran, with
// which arguments.
type sdkCall struct {
	ran  bool
	tool string
	args json.RawMessage
}

// sdkReader runs bytes through the official MCP SDK's own Streamable HTTP
// handler (stateless, JSON answers) and reports which tool it ran. It is the
// reading the gate must agree with: verifierd's MCP endpoint is this SDK.
type sdkReader struct {
	mu      sync.Mutex
	handler http.Handler
	last    sdkCall
}

func newSDKReader() *sdkReader {
	sr := &sdkReader{}
	server := mcp.NewServer(&mcp.Implementation{Name: "reader", Version: "1"}, nil)
	for _, name := range []string{"verify_schema", "get_verification_record"} {
		server.AddTool(&mcp.Tool{Name: name, InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			sr.last = sdkCall{ran: true, tool: req.Params.Name, args: append(json.RawMessage(nil), req.Params.Arguments...)}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "{}"}}}, nil
		})
	}
	sr.handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	return sr
}

func (sr *sdkReader) read(body []byte) sdkCall {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	sr.last = sdkCall{}
	req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	sr.handler.ServeHTTP(httptest.NewRecorder(), req)
	return sr.last
}

// hostileEnvelopes are the ways of making the gate and the SDK read one
// message differently that were tried against the gateway: each must be
// refused by the gate or read by both alike.
var hostileEnvelopes = []struct{ desc, body string }{
	{"a priced call", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t"}}}`},
	{"an extra Name beside name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","Name":"free_tool","arguments":{}}}`},
	{"an extra Name before name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"Name":"free_tool","name":"verify_schema","arguments":{}}}`},
	{"an extra Method beside method", `{"jsonrpc":"2.0","id":1,"Method":"tools/list","method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`},
	{"an extra PARAMS beside params", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}},"PARAMS":{"name":"x"}}`},
	{"only PARAMS", `{"jsonrpc":"2.0","id":1,"method":"tools/call","PARAMS":{"name":"verify_schema","arguments":{}}}`},
	{"trailing bytes", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}garbage`},
	{"a second message after the first", `{"jsonrpc":"2.0","id":1,"method":"tools/list"} {"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`},
	{"a byte-order mark", "\xef\xbb\xbf" + `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`},
	{"a batch", `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}]`},
	{"a duplicate name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_verification_record","name":"verify_schema","arguments":{}}}`},
	{"a duplicate method", `{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`},
	{"duplicate params", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x"},"params":{"name":"verify_schema","arguments":{}}}`},
	{"duplicate arguments", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"a"},"arguments":{"task_id":"b"}}}`},
	{"arguments with names in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"a","Task_ID":"b"}}}`},
	{"an escaped member name", `{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"n\u0061me":"verify_schema","arguments":{}}}`},
	{"a Kelvin sign in a name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"k":1,"\u212a":2}}}`},
	{"an unpriced tool", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_verification_record","arguments":{"agent_id":"a"}}}`},
	{"a free method", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`},
	{"a notification", `{"jsonrpc":"2.0","method":"notifications/initialized"}`},
	{"_meta with a payment", `{"jsonrpc":"2.0","id":"a","method":"tools/call","params":{"name":"verify_schema","arguments":{},"_meta":{"x402/payment":{"x402Version":2}}}}`},
	{"a payment among other _meta members, numbers a double cannot hold", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"progressToken":1.50, "x402/payment" : {"x402Version":2,"n":1e2} ,"b":[0.1E-1]},"name":"verify_schema","arguments":{"submitted_output":{"n":1.00000000000000000001,"m":-0.0,"x402/payment":1}}}}`},
	{"a payment as the last _meta member", ` { "jsonrpc" : "2.0" , "id" : 2 , "method" : "tools/call" , "params" : { "name" : "verify_schema" , "arguments" : { "n" : 9007199254740991 } , "_meta" : { "a" : "\u00e9" , "x402\/payment" : { } } } } `},
	{"a payment named like the member the gate cuts, elsewhere", `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"verify_schema","arguments":{"_meta":{"x402/payment":{}}},"_meta":{"x402/payments":1}}}`},
	{"a multi-round-trip retry with its payment", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t"},"_meta":{"x402/payment":{"x402Version":2}},"inputResponses":{"c":{"action":"accept","content":{"name":"verify_schema"}}},"requestState":"s"}}`},
	{"a retry whose inputResponses carry arguments", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"inputResponses":{"arguments":{"roots":[]},"name":{"action":"decline"}},"requestState":""}}`},
	{"inputResponses that are not an object", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"inputResponses":[]}}`},
	{"a requestState that is not a string", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"requestState":5}}`},
	{"an InputResponses beside inputResponses", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"inputResponses":{},"InputResponses":{"c":{"action":"accept"}}}}`},
	{"a fractional id", `{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`},
	{"an exponent id", `{"jsonrpc":"2.0","id":1e0,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`},
	{"a negative zero id", `{"jsonrpc":"2.0","id":-0,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`},
	{"null params", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":null}`},
	{"arguments null", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":null}}`},
	{"an id that is an object", `{"jsonrpc":"2.0","id":{"a":1},"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`},
	{"no jsonrpc member", `{"id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`},
	// Names in two letter cases inside a tool's data are distinct keys to
	// every reader (accepted, as over REST); in _meta, in params of other
	// methods and among the arguments' own names they are refused.
	{"submitted_output with names in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t","expected_schema":{"type":"object"},"submitted_output":{"total":1,"Total":2,"TOTAL":[{"k":1,"\u212a":2}]}}}}`},
	{"expected_schema with names in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t","expected_schema":{"type":"object","Type":"array","properties":{"a":{},"A":{}}},"submitted_output":{}}}}`},
	{"bounds and rule values in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t","expected_schema":{},"submitted_output":{"a":1,"A":2},"bounds":{"a":{"min":0},"A":{"max":5}},"rules":[{"type":"exists_in","field":"a","values":[{"x":1,"X":2}]}]}}}`},
	{"_meta with names in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"_meta":{"progressToken":1,"ProgressToken":2}}}`},
	{"a payment with names in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"_meta":{"x402/payment":{"x402Version":2,"accepted":{"payTo":"a","PayTo":"b"}}}}}`},
	{"initialize params with names in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"a","Name":"b","version":"1"}}}`},
	{"a response with names in two letter cases", `{"jsonrpc":"2.0","id":1,"result":{"content":[],"Content":[{"type":"text","text":"x"}]}}`},
	// Arguments the tool refuses (argsErr): the call is still one call.
	{"arguments nested past a request's limit", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"submitted_output":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}}}`},
	{"an unpriced tool's arguments nested past a request's limit", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_verification_record","arguments":{"o":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}}}`},
	{"a lone surrogate in the arguments", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"s":"\ud800","\udc00":1}}}`},
	{"a lone surrogate in the tool's name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema\ud800","arguments":{}}}`},
}

// acceptedTwins are the hostile envelopes whose names in two letter cases
// lie inside a tool's data: the gate must pass them, and the SDK read them
// alike (checkAgreement).
var acceptedTwins = []string{"submitted_output with names in two letter cases", "expected_schema with names in two letter cases", "bounds and rule values in two letter cases"}

// FuzzMCPEnvelopeAgreesWithTheSDK gives the same bytes to the gate's reader
// and to the MCP SDK. Whenever the gate lets a message through, the SDK must
// run exactly the tool the gate priced (or no tool when the gate saw no
// tools/call), with the arguments the gate read; and the message the tool
// of a paid call receives is the message as sent without exactly its
// payment (checkWithoutPayment).
func FuzzMCPEnvelopeAgreesWithTheSDK(f *testing.F) {
	for _, h := range hostileEnvelopes {
		f.Add([]byte(h.body))
	}
	sr := newSDKReader()
	f.Fuzz(func(t *testing.T, body []byte) {
		checkAgreement(t, sr, body)
	})
}

func checkAgreement(t *testing.T, sr *sdkReader, body []byte) {
	t.Helper()
	msg, bad := readRPC(body)
	got := sr.read(body)
	if bad != nil {
		return // refused by the gate: nothing reaches the SDK
	}
	if msg.argsErr != nil {
		// Arguments the tool refuses, which the gate does not read
		// whole: the SDK must still run no other tool than the gate read
		// (the gate answers a call of its own tool itself, argsErr).
		if got.ran && (msg.method != "tools/call" || msg.tool != got.tool) {
			t.Fatalf("the SDK ran %q, the gate read method %q tool %q: %q", got.tool, msg.method, msg.tool, body)
		}
		return
	}
	checkWithoutPayment(t, sr, msg, body)
	gateCall := msg.method == "tools/call"
	if !got.ran {
		return // the SDK ran nothing: nothing to charge for, nothing served
	}
	if !gateCall || msg.tool != got.tool {
		t.Fatalf("the SDK ran %q, the gate read method %q tool %q: %q", got.tool, msg.method, msg.tool, body)
	}
	var sdkArgs any
	if len(got.args) > 0 && string(got.args) != "null" {
		v, err := strictjson.Decode(got.args, strictjson.Limits{MaxDepth: rpcDepth})
		if err != nil {
			t.Fatalf("the SDK's arguments do not decode strictly (%v): %q", err, body)
		}
		sdkArgs = v
	}
	if !reflect.DeepEqual(sdkArgs, msg.args) {
		t.Fatalf("arguments differ: SDK %s, gate %#v: %q", got.args, msg.args, body)
	}
}

// checkWithoutPayment holds withoutPayment to the message as sent: the
// stripped message decodes to the original without params._meta's
// "x402/payment" and nothing else changed (compared as decoded with
// json.Number, so every number keeps its text: 1.50 stays 1.50, not 1.5),
// its bytes are the original's less one contiguous run, and the SDK runs
// the same tool with the same arguments on it. A message without a payment
// is passed on as it came.
func checkWithoutPayment(t *testing.T, sr *sdkReader, msg *rpcMessage, body []byte) {
	t.Helper()
	stripped := msg.withoutPayment()
	want, err := strictjson.Decode(body, strictjson.Limits{MaxDepth: rpcDepth})
	if err != nil {
		t.Fatalf("the gate accepted what strictjson refuses (%v): %q", err, body)
	}
	params, _ := want.(map[string]any)["params"].(map[string]any)
	meta, _ := params["_meta"].(map[string]any)
	_, paid := meta[mcpMetaPayment]
	if _, gatePaid := msg.meta[mcpMetaPayment]; paid != gatePaid || (paid && msg.method != "tools/call") {
		return // only a tools/call's payment is read, and cut
	}
	if !paid {
		if !bytes.Equal(stripped, body) {
			t.Fatalf("a message without a payment was changed: %q became %q", body, stripped)
		}
		return
	}
	delete(meta, mcpMetaPayment)
	got, err := strictjson.Decode(stripped, strictjson.Limits{MaxDepth: rpcDepth})
	if err != nil {
		t.Fatalf("the message without its payment does not decode (%v): %q", err, stripped)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("without its payment the message reads %v, want %v: %q", got, want, stripped)
	}
	if !slices.Equal(sortedNumbers(got), sortedNumbers(want)) {
		t.Fatalf("numbers changed: %v, want %v", sortedNumbers(got), sortedNumbers(want))
	}
	pre := 0
	for pre < len(stripped) && stripped[pre] == body[pre] {
		pre++
	}
	if !bytes.HasSuffix(body, stripped[pre:]) {
		t.Fatalf("more than the payment's bytes were changed: %q became %q", body, stripped)
	}
	if got := sr.read(stripped); got.ran {
		var args any
		if len(got.args) > 0 && string(got.args) != "null" {
			args, _ = strictjson.Decode(got.args, strictjson.Limits{MaxDepth: rpcDepth})
		}
		if got.tool != msg.tool || !reflect.DeepEqual(args, msg.args) {
			t.Fatalf("without its payment the SDK ran %q with %s, the gate priced %q with %v", got.tool, got.args, msg.tool, msg.args)
		}
	}
}

// sortedNumbers is every number's text in v, sorted.
func sortedNumbers(v any) []string {
	var out []string
	for _, n := range jsontree.Numbers(v) {
		out = append(out, string(n))
	}
	slices.Sort(out)
	return out
}

func TestHostileEnvelopesAreRefusedOrReadAlike(t *testing.T) {
	sr := newSDKReader()
	refused := map[string]bool{}
	for _, h := range hostileEnvelopes {
		t.Run(h.desc, func(t *testing.T) {
			checkAgreement(t, sr, []byte(h.body))
			_, bad := readRPC([]byte(h.body))
			refused[h.desc] = bad != nil
		})
	}
	// The SDK must really run the tools, or the agreement above is empty.
	if got := sr.read([]byte(hostileEnvelopes[0].body)); !got.ran || got.tool != "verify_schema" {
		t.Fatalf("the SDK did not run the priced call: %+v", got)
	}
	for _, desc := range []string{"an extra Name beside name", "an extra Method beside method", "an extra PARAMS beside params", "only PARAMS",
		"trailing bytes", "a second message after the first", "a byte-order mark", "a batch", "a duplicate name", "a duplicate method",
		"duplicate params", "duplicate arguments", "arguments with names in two letter cases", "a Kelvin sign in a name", "null params",
		"arguments null", "an id that is an object", "no jsonrpc member", "_meta with names in two letter cases",
		"a payment with names in two letter cases", "initialize params with names in two letter cases", "a response with names in two letter cases",
		"a fractional id", "an exponent id", "a negative zero id", "a lone surrogate in the tool's name"} {
		if !refused[desc] {
			t.Errorf("%s: not refused by the gate", desc)
		}
	}
	for _, desc := range acceptedTwins {
		if refused[desc] {
			t.Errorf("%s: refused by the gate, accepted over REST", desc)
		}
		for _, h := range hostileEnvelopes {
			if got := sr.read([]byte(h.body)); h.desc == desc && (!got.ran || got.tool != "verify_schema") {
				t.Errorf("%s: the SDK did not run the call (%+v), so the agreement checked nothing", desc, got)
			}
		}
	}
}

// BenchmarkReadRPC is the gate's strict reading of a priced tool call,
// against encoding/json decoding the members it once read (the baseline: a
// lenient reading of part of the message).
func BenchmarkReadRPC(b *testing.B) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": map[string]any{
		"name": "verify_schema", "arguments": verifyArgs, "_meta": map[string]any{"progressToken": "p"}}})
	b.Run("strict", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, bad := readRPC(body); bad != nil {
				b.Fatal(bad.err)
			}
		}
	})
	b.Run("encoding-json-baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var req struct {
				JSONRPC string          `json:"jsonrpc"`
				ID      json.RawMessage `json:"id"`
				Method  string          `json:"method"`
				Params  struct {
					Name      string                     `json:"name"`
					Arguments json.RawMessage            `json:"arguments"`
					Meta      map[string]json.RawMessage `json:"_meta"`
				} `json:"params"`
			}
			if err := json.Unmarshal(body, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
