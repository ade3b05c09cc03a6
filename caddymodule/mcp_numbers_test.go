package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// A number REST refuses with 422 invalid_request (an integer beyond
// ±(2^53−1), one a double cannot hold, one written too long) inside a
// priced tool's arguments is that call's invalid_request tool result,
// as the README promises for wrong arguments: nothing charged, no free
// unit taken, the tool never run. (Before: the gate refused the whole
// message with HTTP 400 and JSON-RPC -32700, which the SDK client takes
// for a transport failure and ends its session on.)
func TestMCPArgumentNumbersRESTRefusesAreToolErrors(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 1))
	s := mcpSession(t, base+"/mcp")
	for _, n := range []string{"9007199254740993", "-9007199254740993", "1e400", "1e-400", "0." + strings.Repeat("1", 400)} {
		args := map[string]any{"task_id": "t-mcp", "expected_schema": map[string]any{"type": "object"},
			"submitted_output": json.RawMessage(`{"n":` + n + `}`)}
		res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: args})
		if err != nil {
			t.Fatalf("submitted_output {\"n\":%.20s}: the call failed at the transport: %v", n, err)
		}
		c := toolErrorOf(t, res)
		fields, _ := c["fields"].([]any)
		if c["code"] != apierr.CodeInvalidRequest || c["charged"] != false || len(fields) != 1 ||
			fields[0].(map[string]any)["field"] != "submitted_output.n" {
			t.Fatalf("submitted_output {\"n\":%.20s}: %v", n, c)
		}
	}
	// The one free unit is still there, and the tool never ran for them.
	if up.calls.Load() != 0 {
		t.Fatalf("the tool ran %d times for refused arguments", up.calls.Load())
	}
	if res := callTool(t, s, "verify_schema", verifyArgs, nil); res.IsError {
		t.Fatalf("the free unit was taken by a refused call: %+v", res)
	}
	// A paid call with such an argument is refused before its payment is
	// claimed or settled.
	pr := demandOf(t, callTool(t, s, "get_verification_record", map[string]any{"verification_id": "v"}, nil))
	payer := evmfacilitator.DevAccounts()[5].Address
	before := balance(t, d, payer)
	res := callTool(t, s, "get_verification_record", map[string]any{"verification_id": "v", "n": json.RawMessage(`1e400`)}, payMeta(t, pr, 5))
	if c := toolErrorOf(t, res); c["code"] != apierr.CodeInvalidRequest || c["charged"] != false {
		t.Fatalf("a paid call with 1e400 in its arguments: %v", c)
	}
	if got := charged(t, d, payer, before); got.Sign() != 0 {
		t.Fatalf("charged %s for a refused call", got)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("the tool ran %d times, want 1 (the free call)", up.calls.Load())
	}
}

// Such a number anywhere else in a message leaves it unreadable: the
// envelope, _meta (a payment) and the params of any other method are the
// gate's and the SDK's to read, not a tool's data.
func TestMCPNumbersOutsideToolArgumentsRefuseTheMessage(t *testing.T) {
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"_meta":{"n":1e400}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"arguments":{"n":1e400}}}`,
		`{"jsonrpc":"2.0","method":"notifications/x","params":{"arguments":{"n":1e400}}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"arguments":{"n":1e400}}}`,
	} {
		if _, bad := readRPC([]byte(body)); bad == nil || bad.code != rpcParseError || bad.err.Code != apierr.CodeInvalidMessage {
			t.Errorf("%s was read", body)
		}
	}
}

// The MCP SDK behind the gate reads a numeric id as a double, then an
// int64: 9007199254740993 becomes 9007199254740992, and it would answer
// under an id the client did not send, so the client would drop the
// answer of a call it paid for. The gate refuses an integer id beyond
// ±(2^53−1) as an invalid message, as it refuses 1.5, and README says so.
func TestMCPIntegerIDsBeyondDoublesAreRefused(t *testing.T) {
	msg, err := jsonrpc.DecodeMessage([]byte(`{"jsonrpc":"2.0","id":9007199254740993,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	if id := msg.(*jsonrpc.Request).ID.Raw(); id != int64(9007199254740992) {
		t.Fatalf("the SDK reads id 9007199254740993 as %v: the gate need not refuse it", id)
	}
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 5))
	call := `{"jsonrpc":"2.0","id":9007199254740993,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t-mcp","expected_schema":{"type":"object"},"submitted_output":{"ok":true}}}}`
	resp, raw := mcpPost(t, base+"/mcp", []byte(call), nil)
	var got struct {
		Error struct {
			Code int `json:"code"`
			Data struct {
				Code   string `json:"code"`
				Fields []struct {
					Field string `json:"field"`
				} `json:"fields"`
			} `json:"data"`
		} `json:"error"`
	}
	json.Unmarshal(raw, &got)
	if resp.StatusCode != http.StatusBadRequest || got.Error.Data.Code != apierr.CodeInvalidMessage ||
		len(got.Error.Data.Fields) != 1 || got.Error.Data.Fields[0].Field != "id" {
		t.Fatalf("id 9007199254740993: %d %s", resp.StatusCode, raw)
	}
	if up.calls.Load() != 0 {
		t.Fatal("the call reached the tool")
	}
}
