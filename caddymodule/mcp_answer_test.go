package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/store"
)

// toolSucceeded is judgeAnswer's verdict alone, what these tests check.
func toolSucceeded(body []byte, id json.RawMessage) (ok, interim bool, err error) {
	_, ok, interim, err = judgeAnswer(body, id)
	return ok, interim, err
}

// answerMembersReference is the reading toolSucceeded must agree with:
// encoding/json into maps of raw members (exact names, the last of
// duplicates, as JSON.parse and the MCP SDKs read them), with the rules by
// which the buyer's MCP client takes an answer as the one to its call id:
// jsonrpc "2.0", no method, the call's id (numbers compared as written: the
// gate takes only integers without fraction or exponent as ids). An error
// that is not null makes the answer the client's error, readable only
// alone (no result member) and as a JSON-RPC error (an object, code an
// integer, message a string, either null or absent). A result is read as
// the client reads it: encoding/json into the SDK's CallToolResult. A
// result is interim, a round of a multi-round-trip call and not the
// call's answer, when the SDK's client retries it (inputRequests not
// null); an interim result with content is unreadable, and so is one that
// reads as needing input, or whose resultType is neither "complete" nor
// empty, without input requests (the client returns it as its answer).
func answerMembersReference(body []byte, id json.RawMessage) (ok bool, err error) {
	ok, _, err = answerReference(body, id)
	return ok, err
}

// answerReference is answerMembersReference's reading, with interim.
func answerReference(body []byte, id json.RawMessage) (ok, interim bool, err error) {
	var resp map[string]json.RawMessage
	if err = json.Unmarshal(body, &resp); err != nil {
		return false, false, err
	}
	if nestingDepth(body) > maxClientAnswerDepth {
		return false, false, errNotTheCallsAnswer
	}
	var version string
	if json.Unmarshal(resp["jsonrpc"], &version) != nil || version != "2.0" {
		return false, false, errNotTheCallsAnswer
	}
	if _, has := resp["method"]; has {
		return false, false, errNotTheCallsAnswer
	}
	if got, has := resp["id"]; !has || !reflect.DeepEqual(decodeNumber(got), decodeNumber(id)) {
		return false, false, errNotTheCallsAnswer
	}
	raw, hasResult := resp["result"]
	if e, has := resp["error"]; has && string(e) != "null" {
		var members map[string]json.RawMessage
		var code int64
		var message string
		if hasResult || json.Unmarshal(e, &members) != nil || members == nil ||
			(members["code"] != nil && json.Unmarshal(members["code"], &code) != nil) ||
			(members["message"] != nil && json.Unmarshal(members["message"], &message) != nil) {
			return false, false, errNotAnError
		}
		return false, false, nil
	}
	if !hasResult || string(raw) == "null" {
		return false, false, nil
	}
	var result mcp.CallToolResult
	if err = json.Unmarshal(raw, &result); err != nil {
		return false, false, err
	}
	var members map[string]json.RawMessage
	var resultType string
	json.Unmarshal(raw, &members)
	json.Unmarshal(members["resultType"], &resultType)
	switch {
	case result.InputRequests != nil:
		if len(result.Content) > 0 || result.StructuredContent != nil {
			return false, false, errors.New("an input request with content")
		}
		return false, true, nil
	case result.NeedsInput() || (resultType != "" && resultType != "complete"):
		return false, false, errors.New("neither a final answer nor a round with input requests")
	}
	return !result.IsError, false, nil
}

// nestingDepth is the deepest nesting of arrays and objects in valid JSON.
func nestingDepth(b []byte) int {
	d := json.NewDecoder(bytes.NewReader(b))
	depth, deepest := 0, 0
	for {
		tok, err := d.Token()
		if err != nil {
			return deepest
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			depth++
			deepest = max(deepest, depth)
		case json.Delim('}'), json.Delim(']'):
			depth--
		}
	}
}

// decodeNumber decodes a JSON value with numbers kept as written.
func decodeNumber(raw json.RawMessage) any {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return errNotTheCallsAnswer
	}
	return v
}

var errNotTheCallsAnswer = errors.New("not an answer to the call")

var errNotAnError = errors.New("an error beside a result, or not a JSON-RPC error")

// answerCases are answers whose reading matters: case twins, escaped and
// duplicate names, nesting that holds the same names deeper, and every
// shape that is unreadable.
var answerCases = []struct {
	answer   string
	ok, fail bool // fail: unreadable
}{
	{string(mcpBenchAnswer), true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":true}}`, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"isError":true,"IsError":false}}`, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"IsError":true}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"Result":{"isError":true},"result":{}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"isError":true},"result":{"isError":false}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"isError":false,"isError":true}}`, false, false},
	{`{"jsonrpc":"2.0","id":1,"res\u0075lt":{"is\u0045rror":true}}`, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"x":{"isError":true},"y":["isError",{"isError":true}]}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"s":"a \"isError\":true \\","isError":null}}`, true, false},
	{` { "jsonrpc":"2.0","id":1,"result" : { "isError" : false } } `, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"n":123456789012345678901234567890,"isError":false}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"x"}}`, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":null}`, false, false},
	{`{"jsonrpc":"2.0","id":1}`, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"isError":"false"}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"isError":0}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":[]}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":"ok"}`, false, true},
	{`[{"result":{}}]`, false, true},
	{`"x"`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{}`, false, true},
	{`data: {"result":{}}`, false, true},
	{``, false, true},
	// Answers the buyer's MCP client does not take as this call's answer
	// (the SDK's jsonrpc2 decoder, then its wait for the call's id) are
	// unreadable, whatever their result; an error beside a result is the
	// client's answer (not a success).
	{`null`, false, true},
	{` null `, false, true},
	{`{}`, false, true},
	{`{"result":{}}`, false, true},
	{`{"jsonrpc":"1.0","id":1,"result":{}}`, false, true},
	{`{"jsonrpc":null,"id":1,"result":{}}`, false, true},
	{`{"jsonrpc":2.0,"id":1,"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","jsonrpc":"1.0","id":1,"result":{}}`, false, true},
	{`{"jsonrpc":"1.0","jsonrpc":"2.0","id":1,"result":{}}`, true, false},
	{`{"jsonrpc":"2\u002e0","id":1,"result":{}}`, true, false},
	{`{"Jsonrpc":"2.0","id":1,"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":null,"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":2,"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":"1","result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":[1],"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"id":2,"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":2,"id":1,"result":{}}`, true, false},
	{`{"jsonrpc":"2.0","id":1.0,"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":1e0,"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":2,"error":{"code":-32603,"message":"x"}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"method":"notifications/message","result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"method":null,"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"method":"","result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"Method":"x","result":{}}`, true, false},
	// An error is handed over only alone, and as a JSON-RPC error the
	// client reads; beside a result it would carry the result unpaid.
	{`{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":-32603,"message":"tool backend failed"}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"error":{},"result":{}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x"},"result":null}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"error":{}}`, false, false},
	{`{"jsonrpc":"2.0","id":1,"error":{"code":null,"message":null,"data":[1]}}`, false, false},
	{`{"jsonrpc":"2.0","id":1,"error":{"Code":1.5,"code":1,"message":"x"}}`, false, false},
	{`{"jsonrpc":"2.0","id":1,"error":[]}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"error":5}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"error":"x"}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"error":{"code":1.5,"message":"x"}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"error":{"code":"1","message":"x"}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":5}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"error":{"code":1,"code":1.5}}`, false, true},
	// A result is one the SDK's CallToolResult decodes, or the client's
	// CallTool fails on it.
	{`{"jsonrpc":"2.0","id":1,"result":{"content":5}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":{"type":"text","text":"x"}}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"bogus","text":"x"}]}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":5}]}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[null]}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"image","data":"%%%","mimeType":"image/png"}]}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"image","data":"AAAA","mimeType":"image/png"}]}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}],"content":5}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":5,"content":[{"type":"text","text":"x"}]}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"Content":5,"content":[]}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}],"structuredContent":"x"}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[],"_meta":5}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[],"structuredContent":{"n":1e400}}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":5}],"isError":true}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{},"error":null}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"Error":{"code":1,"message":"x"},"result":{}}`, true, false},
	// Bytes where one JSON validator might differ from encoding/json's:
	// numbers, escapes, control characters, white space, literals.
	{`{"jsonrpc":"2.0","id":1,"result":{"n":01}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"n":1.}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"n":-}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"n":1e}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"n":.5}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"n":+1}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"n":-0.0e-0}}`, true, false},
	{"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"s\":\"a\x00b\"}}", false, true},
	{"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"s\":\"\xff\xfe\"}}", true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"s":"\u12"}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"s":"\ud800"}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"s":"\x"}}`, false, true},
	{"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}\x0b}", false, true},
	{"\x00{\"result\":{}}", false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{},}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"a":[1,]}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"isError":tru}}`, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"isError":false}} x`, false, true},
	{`nul`, false, true},
}

// answerRecorder is a client's transport that keeps the last answer it
// got, as sent.
type answerRecorder struct{ last atomic.Value }

func (a *answerRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	resp.Body = io.NopCloser(bytes.NewReader(b))
	a.last.Store(b)
	return resp, err
}

// interimCases are results of the multi-round-trip protocol (SEP-2322):
// rounds that are not the call's answer (interim), final answers, and
// rounds that would give content away (unreadable).
var interimCases = []struct {
	answer      string
	ok, interim bool
	fail        bool // unreadable
}{
	{`{"jsonrpc":"2.0","id":1,"result":{"content":null,"requestState":"s","resultType":"input_required","inputRequests":{"c":{"method":"elicitation/create","params":{"mode":"form","message":"ok?"}}}}}`, false, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":null,"resultType":"input_required","inputRequests":{}}}`, false, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"inputRequests":{"r":{"method":"roots/list","params":{}}}}}`, false, true, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required"}}`, false, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","isError":true}}`, false, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","_meta":{"answer":{"result":"pass"}}}}`, false, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"resultType":"task","_meta":{}}}`, false, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_\u0072equired"}}`, false, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}],"resultType":"complete"}}`, true, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}],"resultType":""}}`, true, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}],"resultType":null,"inputRequests":null}}`, true, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}],"ResultType":"input_required"}}`, true, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}],"resultType":"input_required","resultType":"complete"}}`, true, false, false},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}],"resultType":"complete","resultType":"input_required"}}`, false, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}],"resultType":"input_required","inputRequests":{}}}`, false, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"a":1},"inputRequests":{}}}`, false, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a"}],"resultType":"task"}}`, false, false, true},
	{`{"jsonrpc":"2.0","id":1,"result":{"content":[],"resultType":5}}`, false, false, true},
}

// A round of a multi-round-trip call is not the call's answer: the SDK's
// client never returns it to its caller but answers its input requests
// and calls again, so it is handed over and never charged; one that
// carries content is unreadable (it would be the content, uncharged).
func TestToolSucceededTakesNoRoundForTheAnswer(t *testing.T) {
	for _, c := range interimCases {
		ok, interim, err := toolSucceeded([]byte(c.answer), json.RawMessage("1"))
		if ok != c.ok || interim != c.interim || (err != nil) != c.fail {
			t.Errorf("%s: ok %v, interim %v, err %v; want ok %v, interim %v, unreadable %v", c.answer, ok, interim, err, c.ok, c.interim, c.fail)
		}
		rok, rinterim, rerr := answerReference([]byte(c.answer), json.RawMessage("1"))
		if rok != c.ok || rinterim != c.interim || (rerr != nil) != c.fail {
			t.Errorf("%s: the reference reads ok %v, interim %v, err %v; the case is wrong", c.answer, rok, rinterim, rerr)
		}
	}
}

// verifierd's answer, the common one, is judged without decoding it, as
// is the answer of the SDK's own server to a client of the SDK's default
// protocol (2026-07-28), which carries "resultType":"complete".
func TestToolSucceededReadsTheCommonAnswerWithoutTheSDK(t *testing.T) {
	up := newMCPUpstream(t)
	var answers answerRecorder
	c := mcp.NewClient(&mcp.Implementation{Name: "buyer", Version: "1"}, nil)
	s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: up.URL, HTTPClient: &http.Client{Transport: &answers}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	callTool(t, s, "verify_schema", verifyArgs, nil)
	sdkAnswer := answers.last.Load().([]byte)
	if !bytes.Contains(sdkAnswer, []byte(`"resultType":"complete"`)) {
		t.Fatalf("the SDK server's answer has no resultType: %s", sdkAnswer)
	}
	for _, answer := range [][]byte{mcpBenchAnswer, sdkAnswer} {
		result, _, _ := answerResult(answer)
		if isError, plain := plainToolResult(result); !plain || isError {
			t.Fatalf("%.100s: the answer is not plain (%v) or is an error (%v)", result, plain, isError)
		}
		a, _ := readAnswer(answer) // the SDK's client numbers its calls
		if ok, interim, err := toolSucceeded(answer, a.id); !ok || interim || err != nil {
			t.Fatalf("%.100s: ok %v, interim %v, err %v", result, ok, interim, err)
		}
	}
	for _, result := range []string{
		`{"content":[],"resultType":"complete","resultType":"complete"}`,
		`{"content":[],"resultType":"input_required"}`,
		`{"content":[],"resultType":"Complete"}`,
		`{"content":[],"resultType":"compl\u0065te"}`,
		`{"content":[],"resultType":null}`,
		`{"content":[],"ResultType":"complete"}`,
	} {
		if _, plain := plainToolResult([]byte(result)); plain {
			t.Errorf("%s is plain: only one \"resultType\":\"complete\" is", result)
		}
	}
	if n := testing.AllocsPerRun(10, func() { toolSucceeded(mcpBenchAnswer, json.RawMessage("1")) }); n != 0 {
		t.Fatalf("judging verifierd's answer allocates %v times", n)
	}
}

func TestToolSucceededReadsExactNames(t *testing.T) {
	for _, c := range answerCases {
		ok, _, err := toolSucceeded([]byte(c.answer), json.RawMessage("1"))
		if ok != c.ok || (err != nil) != c.fail {
			t.Errorf("%.80s: ok %v, err %v; want ok %v, unreadable %v", c.answer, ok, err, c.ok, c.fail)
		}
		rok, rerr := answerMembersReference([]byte(c.answer), json.RawMessage("1"))
		if rok != c.ok || (rerr != nil) != c.fail {
			t.Errorf("%.80s: the reference reads ok %v, err %v; the case is wrong", c.answer, rok, rerr)
		}
	}
}

// An answer names its call's id as the gate read it from the call
// (rpcID): one id written two ways is one id, as to the SDK's client; an
// id the gate would not take from a call names no call.
func TestToolSucceededReadsTheCallsIDOneWay(t *testing.T) {
	for _, c := range []struct {
		call, answer string
		ok           bool
	}{
		{`1`, `1`, true},
		{`-7`, `-7`, true},
		{`"<a>"`, `"<a>"`, true},
		{`"<a>"`, `"\u003ca\u003e"`, true},
		{`"<a>"`, `"<a"`, false},
		{`"a"`, `"\u0061"`, true},
		{`"1"`, `1`, false},
		{`1`, `"1"`, false},
		{`1`, `1.0`, false},
		{`1`, `true`, false},
		{`1`, `{}`, false},
	} {
		call, bad := readRPC([]byte(`{"jsonrpc":"2.0","id":` + c.call + `,"method":"tools/call","params":{"name":"t"}}`))
		if bad != nil {
			t.Fatalf("call id %s: %v", c.call, bad.err)
		}
		answer := []byte(`{"jsonrpc":"2.0","id":` + c.answer + `,"result":{}}`)
		ok, _, err := toolSucceeded(answer, call.id)
		if ok != c.ok || (err != nil) == c.ok {
			t.Errorf("call id %s, answer id %s: ok %v, err %v; want ok %v", c.call, c.answer, ok, err, c.ok)
		}
		if rok, _ := answerMembersReference(answer, call.id); rok != c.ok {
			t.Errorf("call id %s, answer id %s: the reference reads ok %v; the case is wrong", c.call, c.answer, rok)
		}
	}
}

// fuzzCallIDs are the call ids FuzzToolSucceeded reads every answer for,
// as the gate holds them (rpcID).
var fuzzCallIDs = func() []json.RawMessage {
	s, _ := rpcID("<a>")
	return []json.RawMessage{json.RawMessage(`1`), s}
}()

// FuzzToolSucceeded: the gate's walk over an answer and encoding/json's
// reading of it into maps of raw members agree on every input, both on
// whether it is readable and whether it is a successful tool result; an
// answer the gate reads as a success is one the official SDK's client
// decodes (jsonrpc.DecodeMessage) as the call's answer without an error,
// with a result its CallToolResult decodes as a success; an error answer
// the gate hands over is one the client decodes as an error, with no
// result; and answerResult finds the result member encoding/json keeps,
// at its offset.
func FuzzToolSucceeded(f *testing.F) {
	for _, c := range answerCases {
		f.Add([]byte(c.answer))
	}
	f.Add([]byte(`{"jsonrpc":"2.0","id":"<a>","result":{}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"text":"a","type":"text"},{"type":"text","text":"b"}],"structuredContent":{"n":-0.5,"m":[1,"1e400"]},"_meta":null,"isError":null}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"a","type":"image"}],"isError":false,"isError":true}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":"\u003ca\u003e","result":{"isError":false}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"x":` + strings.Repeat("[", maxClientAnswerDepth-1) + strings.Repeat("]", maxClientAnswerDepth-1) + `}}`))
	for _, c := range interimCases {
		f.Add([]byte(c.answer))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		for _, id := range fuzzCallIDs {
			ok, interim, err := toolSucceeded(answer, id)
			rok, rinterim, rerr := answerReference(answer, id)
			if ok != rok || interim != rinterim || (err != nil) != (rerr != nil) {
				t.Fatalf("%q for id %s: ok %v, interim %v, err %v; encoding/json reads ok %v, interim %v, err %v", answer, id, ok, interim, err, rok, rinterim, rerr)
			}
			if ok {
				checkSDKTakesAnswer(t, answer, id)
			}
			if !ok && err == nil {
				checkHandedOverCarriesNoResult(t, answer, id)
				checkHandedOverUncharged(t, answer, id)
			}
		}
		var resp map[string]json.RawMessage
		if json.Unmarshal(answer, &resp) != nil {
			return
		}
		raw, at, err := answerResult(answer)
		want := resp["result"]
		if err != nil || !bytes.Equal(raw, want) || (raw != nil && !bytes.Equal(answer[at:at+len(raw)], raw)) {
			t.Fatalf("%q: result %q at %d (%v), encoding/json keeps %q", answer, raw, at, err, want)
		}
		// The shortcut past the SDK's decoding takes only what it decodes.
		if isError, plain := plainToolResult(raw); plain {
			var res mcp.CallToolResult
			if err := json.Unmarshal(raw, &res); err != nil || res.IsError != isError || res.NeedsInput() || res.InputRequests != nil {
				t.Fatalf("%q: plainToolResult reads isError %v, the SDK %v, needs input %v (%v)", raw, isError, res.IsError, res.NeedsInput(), err)
			}
		}
	})
}

// checkSDKTakesAnswer fails unless the MCP SDK's decoder, the one its
// client reads answers with, reads answer as a response to the call with
// id, without an error.
func checkSDKTakesAnswer(t *testing.T, answer []byte, id json.RawMessage) {
	t.Helper()
	var v any
	json.Unmarshal(id, &v)
	want, err := jsonrpc.MakeID(v)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := jsonrpc.DecodeMessage(answer)
	resp, isResp := msg.(*jsonrpc.Response)
	if err != nil || !isResp || resp.ID != want || resp.Error != nil {
		t.Fatalf("%q is charged, but the SDK's client reads it as %#v (%v), not the answer to call %s", answer, msg, err, id)
	}
	// The client's CallTool reads the result as its jsonrpc2 Await does,
	// and returns it to its caller only when it is no input request.
	var result mcp.CallToolResult
	if err := json.Unmarshal(resp.Result, &result); err != nil || result.IsError || result.NeedsInput() || result.InputRequests != nil {
		t.Fatalf("%q is charged, but the SDK's client reads its result as %+v (%v), not a successful CallToolResult", answer, result, err)
	}
}

// checkHandedOverUncharged fails unless an answer the gate hands over
// uncharged is rewritten to exactly its jsonrpc, the call's id and its
// error or its result, which the SDK's client reads as the same error, or
// the same result less the tool's x402 _meta members; and the rewrite
// carries no member name twice in any letter case.
func checkHandedOverUncharged(t *testing.T, answer []byte, id json.RawMessage) {
	t.Helper()
	a, _, _, _ := judgeAnswer(answer, id)
	bw := &bufferedWriter{buf: bytes.NewBuffer(append([]byte(nil), answer...))}
	if err := handOverUncharged(bw, id, a); err != nil {
		return // billable replaces it: upstream_answer_unreadable
	}
	got := bw.buf.Bytes()
	checkHandedOverCarriesNoResult(t, got, id)
	if twins := twinsOf(t, got, "structuredContent", "_meta", "data", "requestedSchema"); len(twins) > 0 {
		t.Fatalf("%q was handed over as %q, with twins %v", answer, got, twins)
	}
	var out map[string]json.RawMessage
	if err := json.Unmarshal(got, &out); err != nil || len(out) > 3 || out["jsonrpc"] == nil || !bytes.Equal(out["id"], id) {
		t.Fatalf("%q was handed over as %q (%v)", answer, got, err)
	}
	was, _ := jsonrpc.DecodeMessage(answer)
	is, err := jsonrpc.DecodeMessage(got)
	if err != nil {
		t.Fatalf("%q was handed over as %q, which the client does not read: %v", answer, got, err)
	}
	wasResp, isResp := was.(*jsonrpc.Response), is.(*jsonrpc.Response)
	if !reflect.DeepEqual(wasResp.Error, isResp.Error) {
		t.Fatalf("%q was handed over as %q, which the client reads as %#v", answer, got, is)
	}
	if wasResp.Error != nil || len(wasResp.Result) == 0 || string(wasResp.Result) == "null" {
		return
	}
	var before, after mcp.CallToolResult
	if before.UnmarshalJSON(wasResp.Result) != nil || after.UnmarshalJSON(isResp.Result) != nil {
		t.Fatalf("%q was handed over as %q, whose result the client does not read", answer, got)
	}
	maps.DeleteFunc(before.Meta, func(k string, _ any) bool { return isX402Key(k) })
	if len(before.Meta) == 0 {
		before.Meta = nil
	}
	if before.InputRequests != nil {
		before.StructuredContent, before.IsError = nil, false
	}
	if len(before.Content) == 0 && len(after.Content) == 0 {
		before.Content, after.Content = nil, nil
	}
	b1, _ := json.Marshal(&before)
	b2, _ := json.Marshal(&after)
	if !bytes.Equal(b1, b2) {
		t.Fatalf("%q was handed over as %q: the client reads %s, not %s", answer, got, b2, b1)
	}
}

// checkHandedOverCarriesNoResult fails unless an answer the gate hands
// over uncharged carries no successful result: the client reads it as the
// call's error with no result member, or its result is null, absent or a
// CallToolResult with isError.
func checkHandedOverCarriesNoResult(t *testing.T, answer []byte, id json.RawMessage) {
	t.Helper()
	var resp map[string]json.RawMessage
	if err := json.Unmarshal(answer, &resp); err != nil {
		t.Fatalf("%q is handed over, but is not JSON: %v", answer, err)
	}
	raw, hasResult := resp["result"]
	if e, has := resp["error"]; has && string(e) != "null" {
		msg, err := jsonrpc.DecodeMessage(answer)
		r, isResp := msg.(*jsonrpc.Response)
		if hasResult || err != nil || !isResp || r.Error == nil {
			t.Fatalf("%q is handed over as an error, but the SDK's client reads it as %#v (%v)", answer, msg, err)
		}
		return
	}
	if !hasResult || string(raw) == "null" {
		return
	}
	// A tool error, or a round that is not the call's answer (an input
	// request, or a resultType other than complete) with no content.
	var result mcp.CallToolResult
	err := json.Unmarshal(raw, &result)
	interim := err == nil && len(result.Content) == 0 && result.StructuredContent == nil
	if err != nil || !result.IsError && !interim {
		t.Fatalf("%q is handed over uncharged, but its result reads as %+v (%v), not a tool error", answer, result, err)
	}
}

// A free call is read as a paid one: an answer that is an error to the
// client ({"isError":true} with a case twin "IsError":false, which
// encoding/json's struct matching took for a success) gives its free unit
// back, however often it comes; a success then takes the one unit of the
// day, and the next call is asked to pay.
func TestMCPFreeAnswerIsReadWithExactNames(t *testing.T) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "verify_schema", "arguments": json.RawMessage(validRequest)}})
	var answer atomic.Value
	var served atomic.Int32
	upstream := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		served.Add(1)
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, err := io.WriteString(w, answer.Load().(string))
		return err
	})
	g, _ := directGate(t, store.Options{NoSync: true}, func(g *Gate) {
		g.MCPTool, g.Free = "verify_schema", &FreeAllowance{PerDay: 1}
	})
	call := func() string {
		t.Helper()
		r := httptest.NewRequest(http.MethodPost, "http://example.com/mcp", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: "192.0.2.7"}))
		w := httptest.NewRecorder()
		if err := g.ServeHTTP(w, r, upstream); err != nil || w.Code != 200 {
			t.Fatalf("status %d, %v: %s", w.Code, err, w.Body)
		}
		return w.Body.String()
	}
	twin := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"failed"}],"isError":true,"IsError":false}}`
	rebuilt := `{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"failed"}],"isError":true}}` // handOverUncharged
	answer.Store(twin)
	for i := range 2 {
		if got := call(); got != rebuilt || served.Load() != int32(i+1) {
			t.Fatalf("error answer %d: served %d times, answered %s", i, served.Load(), got)
		}
	}
	answer.Store(string(mcpBenchAnswer))
	if got := call(); got != string(mcpBenchAnswer) || served.Load() != 3 {
		t.Fatalf("success after the errors: served %d times, answered %.300s", served.Load(), got)
	}
	if got := call(); served.Load() != 3 || !strings.Contains(got, "free_trial_exhausted") {
		t.Fatalf("the day's unit was not taken by the success: served %d times, answered %.300s", served.Load(), got)
	}
}

// encoding/json refuses an answer nested deeper than 10,000 levels, and the
// MCP SDK's client one deeper than 1000: the gate charges for neither,
// wherever the depth is: inside the result or in another member, in arrays
// or objects.
func TestToolSucceededRefusesWhatEncodingJSONNestsTooDeep(t *testing.T) {
	nest := func(n int, open, close string) string {
		return strings.Repeat(open, n) + strings.Repeat(close, n)
	}
	for _, c := range []struct {
		name string
		mk   func(n int) string
	}{
		{"arrays in the result", func(n int) string { return `{"jsonrpc":"2.0","id":1,"result":{"x":` + nest(n-2, "[", "]") + `}}` }},
		{"objects in the result", func(n int) string {
			return `{"jsonrpc":"2.0","id":1,"result":{"x":` + strings.Repeat(`{"a":`, n-2) + "1" + strings.Repeat("}", n-2) + `}}`
		}},
		{"arrays beside the result", func(n int) string { return `{"jsonrpc":"2.0","id":1,"x":` + nest(n-1, "[", "]") + `,"result":{}}` }},
	} {
		for _, n := range []int{maxClientAnswerDepth, maxClientAnswerDepth + 1, maxAnswerDepth, maxAnswerDepth + 1} {
			answer := []byte(c.mk(n))
			ok, _, err := toolSucceeded(answer, json.RawMessage("1"))
			rok, rerr := answerMembersReference(answer, json.RawMessage("1"))
			if ok != rok || (err != nil) != (rerr != nil) || (n > maxClientAnswerDepth) != (err != nil) {
				t.Errorf("%s, depth %d: ok %v, err %v; encoding/json reads ok %v, err %v", c.name, n, ok, err, rok, rerr)
			}
		}
	}
}
