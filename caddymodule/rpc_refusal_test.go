package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/apidocs"
	"github.com/aovhq/aov/apierr"
)

// TestMCPEnvelopeRefusalsAreOneTruth: a JSON-RPC message the gate refuses
// is answered as MCP's Streamable HTTP transport requires and the official
// SDK does (HTTP 400), with the JSON-RPC code the refusal calls for, id
// null, and data carrying invalid_message with the status the code table
// documents; nothing reaches the tool. Wrong arguments of a readable call
// stay a tool error with invalid_request (TestMCPInvalidArgumentsAreToolErrors).
func TestMCPEnvelopeRefusalsAreOneTruth(t *testing.T) {
	var documented int
	for _, c := range apidocs.ErrorCodes {
		if c.Code == apierr.CodeInvalidMessage {
			documented = c.Status
		}
	}
	if documented != http.StatusBadRequest {
		t.Fatalf("the code table gives invalid_message status %d, want 400", documented)
	}
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 5))
	for _, c := range []struct {
		desc, body string
		rpcCode    int
		field      string
	}{
		{"not JSON", `{"jsonrpc":"2.0","id":1,SECRET}`, -32700, "body"},
		{"trailing bytes", `{"jsonrpc":"2.0","id":1,"method":"tools/list"}SECRET`, -32700, "body"},
		{"a name beside its twin in another letter case", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","Name":"SECRET","arguments":{}}}`, -32600, "params.Name"},
		{"argument names in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"SECRET","Task_ID":"SECRET"}}}`, -32600, "params.arguments.task_id"},
		{"_meta names in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"_meta":{"x402/payment":{"x402Version":2,"X402version":1}}}}`, -32600, `params._meta["x402/payment"].x402Version`},
		{"initialize params in two letter cases", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","ProtocolVersion":"SECRET"}}`, -32600, "params.protocolVersion"},
		{"inputResponses that are not an object", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"inputResponses":["SECRET"]}}`, -32600, "params.inputResponses"},
		{"a requestState that is not a string", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"requestState":{"SECRET":1}}}`, -32600, "params.requestState"},
		{"a requestState beside its twin in another letter case", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"requestState":"a","RequestState":"SECRET"}}`, -32600, "params.RequestState"},
		{"a batch", `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}]`, -32600, "body"},
		{"an unknown member", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}},"SECRET":1}`, -32600, "SECRET"},
		{"an object id", `{"jsonrpc":"2.0","id":{"SECRET":1},"method":"tools/list"}`, -32600, "id"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var msg struct {
				JSONRPC string          `json:"jsonrpc"`
				ID      json.RawMessage `json:"id"`
				Error   struct {
					Code int `json:"code"`
					Data struct {
						Code    string `json:"code"`
						Status  int    `json:"status"`
						Charged bool   `json:"charged"`
						Fields  []struct {
							Field string `json:"field"`
						} `json:"fields"`
					} `json:"data"`
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &msg); err != nil {
				t.Fatalf("%d %s: %v", resp.StatusCode, raw, err)
			}
			d := msg.Error.Data
			if resp.StatusCode != documented || msg.JSONRPC != "2.0" || string(msg.ID) != "null" || msg.Error.Code != c.rpcCode ||
				d.Code != apierr.CodeInvalidMessage || d.Status != documented || d.Charged || len(d.Fields) == 0 {
				t.Fatalf("answer %d %s; want HTTP 400, JSON-RPC %d, id null, data invalid_message with status 400", resp.StatusCode, raw, c.rpcCode)
			}
			if c.field != "SECRET" && strings.Contains(string(raw), "SECRET") {
				t.Fatalf("the refusal quotes the request: %s", raw)
			}
			if !strings.HasPrefix(d.Fields[0].Field, c.field) {
				t.Fatalf("field %q, want %q", d.Fields[0].Field, c.field)
			}
			if resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("Content-Type %q", resp.Header.Get("Content-Type"))
			}
		})
	}
	if up.calls.Load() != 0 {
		t.Fatalf("%d refused messages reached the tool", up.calls.Load())
	}
}

// TestMCPNonIntegerNumericIDsAreRefusedBeforeAnyCharge: the MCP SDK reads a
// numeric id as an int64 and answers 1.5 and 1e0 under id 1 (and -0 under
// 0), an id the client did not send, so the client drops an answer it was
// charged for. The gate refuses such ids as an invalid message before the
// allowance is touched; the same call with an integer id then gets the
// one free unit, answered under its own id.
func TestMCPNonIntegerNumericIDsAreRefusedBeforeAnyCharge(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 1))
	call := func(id string) string {
		return `{"jsonrpc":"2.0","id":` + id + `,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t"}}}`
	}
	for _, id := range []string{"1.5", "1e0", "1E2", "1.0", "-0", "-2.5e-1"} {
		resp, raw := postMCP(t, base+"/mcp", call(id))
		var msg struct {
			ID    json.RawMessage `json:"id"`
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
		json.Unmarshal(raw, &msg)
		if resp.StatusCode != http.StatusBadRequest || msg.Error.Code != rpcInvalidRequest || msg.Error.Data.Code != apierr.CodeInvalidMessage ||
			len(msg.Error.Data.Fields) != 1 || msg.Error.Data.Fields[0].Field != "id" || string(msg.ID) != "null" {
			t.Fatalf("id %s: %d %s; want HTTP 400, -32600, invalid_message on id", id, resp.StatusCode, raw)
		}
		if got := resp.Header.Get(HeaderFreeRemaining); got != "" {
			t.Fatalf("id %s: the refusal touched the allowance (Free-Allowance-Remaining %q)", id, got)
		}
	}
	if up.calls.Load() != 0 {
		t.Fatalf("%d refused calls reached the tool", up.calls.Load())
	}
	for _, id := range []string{"7", "-3", `"1.5"`} {
		if _, bad := readRPC([]byte(call(id))); bad != nil {
			t.Fatalf("id %s refused: %v", id, bad.err.Fields)
		}
	}
	resp, raw := postMCP(t, base+"/mcp", call("7"))
	if resp.Header.Get(HeaderFreeRemaining) != "0" || !strings.Contains(string(raw), `"id":7`) {
		t.Fatalf("the integer id did not get the free unit under its own id: %q %s", resp.Header.Get(HeaderFreeRemaining), raw)
	}
}
