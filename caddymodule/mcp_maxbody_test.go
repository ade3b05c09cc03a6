package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/apierr"
)

// The first mcp_tool gate of a route reads the JSON-RPC message for every
// gate after it. It read it up to its own max_body, before knowing which
// tool was called, so a small limit on the first gate answered a bare
// HTTP 413 (which an MCP client cannot read) to every larger message on
// the endpoint: the other gates' calls, free or paid, and initialize or
// tools/list. (Before: the free verify_schema call below failed at the
// transport.) Now the message is read up to the largest max_body of the
// server's mcp_tool gates, and each gate holds its own tool's calls to its
// own, in either order (TestMCPGateMaxBodyBoundsItsOwnTool is the other).
func TestMCPFirstGateMaxBodyBoundsOnlyItsOwnTool(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool get_verification_record
			accept devnet $0.01 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
			max_body 300
		}
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
			max_body 2MiB
			free_allowance {
				per_day 5
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	s := mcpSession(t, base+"/mcp")
	big := map[string]any{"task_id": "t-mcp", "expected_schema": map[string]any{"type": "object"},
		"submitted_output": map[string]any{"text": strings.Repeat("x", 400)}}
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: big})
	if err != nil || res.IsError {
		t.Fatalf("a free call of verify_schema over the first gate's max_body 300: err=%v res=%+v", err, res)
	}
	// Over the default 1MiB and verify_schema's free max_body, within its
	// gate's 2MiB: read, and answered with the gate's demand for payment.
	huge := map[string]any{"task_id": "t-mcp", "expected_schema": map[string]any{"type": "object"},
		"submitted_output": map[string]any{"text": strings.Repeat("x", 1200<<10)}}
	res, err = s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: huge})
	if err != nil {
		t.Fatalf("a 1.2MiB call of verify_schema (max_body 2MiB) behind a gate of max_body 300: %v", err)
	}
	demandOf(t, res)
	// A message not priced by any gate is read as far as any gate reads.
	list := `{"jsonrpc":"2.0","id":2,"method":"tools/list","params":{"_meta":{"pad":"` + strings.Repeat("p", 1000) + `"}}}`
	if resp, raw := mcpPost(t, base+"/mcp", []byte(list), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("tools/list of 1KB behind a gate of max_body 300: %d %.200s", resp.StatusCode, raw)
	}
	// The first gate's own tool is still held to its 300 bytes, as a
	// tool result.
	res, err = s.CallTool(context.Background(), &mcp.CallToolParams{Name: "get_verification_record",
		Arguments: map[string]any{"verification_id": strings.Repeat("v", 400)}})
	if err != nil {
		t.Fatalf("a call over its own gate's max_body is not a tool result: %v", err)
	}
	if c := toolErrorOf(t, res); c["code"] != apierr.CodePayloadTooLarge || c["charged"] != false {
		t.Fatalf("over its own gate's max_body: %v", c)
	}
	// Beyond every gate's limit the message is not read: 413.
	over, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 3, "method": "tools/call",
		"params": map[string]any{"name": "verify_schema", "arguments": map[string]any{"pad": strings.Repeat("x", 2<<20)}}})
	if resp, raw := mcpPost(t, base+"/mcp", over, nil); resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("a message over every gate's max_body: %d %.200s", resp.StatusCode, raw)
	}
}
