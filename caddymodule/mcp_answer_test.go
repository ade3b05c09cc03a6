package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/aovhq/aov/store"
)

// answerMembersReference is the reading toolSucceeded must agree with:
// encoding/json into maps of raw members (exact names, the last of
// duplicates, as JSON.parse and the MCP SDKs read them), the gate's reading
// of a paid answer before toolSucceeded.
func answerMembersReference(body []byte) (ok bool, err error) {
	var resp, result map[string]json.RawMessage
	if err = json.Unmarshal(body, &resp); err != nil || resp == nil {
		return false, err
	}
	raw, has := resp["result"]
	if !has || string(raw) == "null" {
		return false, nil
	}
	if err = json.Unmarshal(raw, &result); err != nil {
		return false, err
	}
	switch string(result["isError"]) {
	case "", "false", "null":
		return true, nil
	case "true":
		return false, nil
	default:
		return false, errUnreadableIsError
	}
}

var errUnreadableIsError = errors.New("isError is not a boolean")

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
	{`{"Result":{"isError":true},"result":{}}`, true, false},
	{`{"result":{"isError":true},"result":{"isError":false}}`, true, false},
	{`{"result":{"isError":false,"isError":true}}`, false, false},
	{`{"res\u0075lt":{"is\u0045rror":true}}`, false, false},
	{`{"result":{"x":{"isError":true},"y":["isError",{"isError":true}]}}`, true, false},
	{`{"result":{"s":"a \"isError\":true \\","isError":null}}`, true, false},
	{` { "result" : { "isError" : false } } `, true, false},
	{`{"result":{"n":123456789012345678901234567890,"isError":false}}`, true, false},
	{`{"jsonrpc":"2.0","id":1,"error":{"code":-32603,"message":"x"}}`, false, false},
	{`{"result":null}`, false, false},
	{`null`, false, false},
	{`{}`, false, false},
	{`{"result":{"isError":"false"}}`, false, true},
	{`{"result":{"isError":0}}`, false, true},
	{`{"result":[]}`, false, true},
	{`{"result":"ok"}`, false, true},
	{`[{"result":{}}]`, false, true},
	{`"x"`, false, true},
	{`{"result":{}`, false, true},
	{`data: {"result":{}}`, false, true},
	{``, false, true},
	// Bytes where one JSON validator might differ from encoding/json's:
	// numbers, escapes, control characters, white space, literals.
	{`{"result":{"n":01}}`, false, true},
	{`{"result":{"n":1.}}`, false, true},
	{`{"result":{"n":-}}`, false, true},
	{`{"result":{"n":1e}}`, false, true},
	{`{"result":{"n":.5}}`, false, true},
	{`{"result":{"n":+1}}`, false, true},
	{`{"result":{"n":-0.0e-0}}`, true, false},
	{"{\"result\":{\"s\":\"a\x00b\"}}", false, true},
	{"{\"result\":{\"s\":\"\xff\xfe\"}}", true, false},
	{`{"result":{"s":"\u12"}}`, false, true},
	{`{"result":{"s":"\ud800"}}`, true, false},
	{`{"result":{"s":"\x"}}`, false, true},
	{"{\"result\":{}\x0b}", false, true},
	{"\x00{\"result\":{}}", false, true},
	{`{"result":{},}`, false, true},
	{`{"result":{"a":[1,]}}`, false, true},
	{`{"result":{"isError":tru}}`, false, true},
	{`{"result":{"isError":false}} x`, false, true},
	{`nul`, false, true},
	{` null `, false, false},
}

func TestToolSucceededReadsExactNames(t *testing.T) {
	for _, c := range answerCases {
		ok, err := toolSucceeded([]byte(c.answer))
		if ok != c.ok || (err != nil) != c.fail {
			t.Errorf("%.80s: ok %v, err %v; want ok %v, unreadable %v", c.answer, ok, err, c.ok, c.fail)
		}
		rok, rerr := answerMembersReference([]byte(c.answer))
		if rok != c.ok || (rerr != nil) != c.fail {
			t.Errorf("%.80s: the reference reads ok %v, err %v; the case is wrong", c.answer, rok, rerr)
		}
	}
}

// FuzzToolSucceeded: the gate's walk over an answer and encoding/json's
// reading of it into maps of raw members agree on every input, both on
// whether it is readable and whether it is a successful tool result; and
// answerResult finds the result member encoding/json keeps, at its offset.
func FuzzToolSucceeded(f *testing.F) {
	for _, c := range answerCases {
		f.Add([]byte(c.answer))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		ok, err := toolSucceeded(answer)
		rok, rerr := answerMembersReference(answer)
		if ok != rok || (err != nil) != (rerr != nil) {
			t.Fatalf("%q: ok %v, err %v; encoding/json reads ok %v, err %v", answer, ok, err, rok, rerr)
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
	})
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
	answer.Store(twin)
	for i := range 2 {
		if got := call(); got != twin || served.Load() != int32(i+1) {
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

// encoding/json refuses an answer nested deeper than 10,000 levels, and so
// does the gate, wherever the depth is: inside the result or in another
// member, in arrays or objects.
func TestToolSucceededRefusesWhatEncodingJSONNestsTooDeep(t *testing.T) {
	nest := func(n int, open, close string) string {
		return strings.Repeat(open, n) + strings.Repeat(close, n)
	}
	for _, c := range []struct {
		name string
		mk   func(n int) string
	}{
		{"arrays in the result", func(n int) string { return `{"result":{"x":` + nest(n-2, "[", "]") + `}}` }},
		{"objects in the result", func(n int) string {
			return `{"result":{"x":` + strings.Repeat(`{"a":`, n-2) + "1" + strings.Repeat("}", n-2) + `}}`
		}},
		{"arrays beside the result", func(n int) string { return `{"id":` + nest(n-1, "[", "]") + `,"result":{}}` }},
	} {
		for _, n := range []int{maxAnswerDepth, maxAnswerDepth + 1} {
			answer := []byte(c.mk(n))
			ok, err := toolSucceeded(answer)
			rok, rerr := answerMembersReference(answer)
			if ok != rok || (err != nil) != (rerr != nil) || (n > maxAnswerDepth) != (err != nil) {
				t.Errorf("%s, depth %d: ok %v, err %v; encoding/json reads ok %v, err %v", c.name, n, ok, err, rok, rerr)
			}
		}
	}
}
