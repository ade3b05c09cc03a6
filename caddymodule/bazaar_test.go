package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// TestMCPDemandCarriesTheBazaar: a payment-required tool result describes
// the tool to catalogs as input type mcp, with its name.
func TestMCPDemandCarriesTheBazaar(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 0))
	s := mcpSession(t, base+"/mcp")
	for _, tool := range []string{"verify_schema", "get_verification_record"} {
		args := any(verifyArgs)
		if tool == "get_verification_record" {
			args = map[string]any{"agent_id": "agent-a"}
		}
		pr := demandOf(t, callTool(t, s, tool, args, nil))
		b, _ := pr.Extensions["bazaar"].(map[string]any)
		info, _ := b["info"].(map[string]any)
		in, _ := info["input"].(map[string]any)
		if in["type"] != "mcp" || in["toolName"] != tool || b["schema"] == nil {
			t.Errorf("%s: bazaar %v, want input type mcp named %s", tool, b, tool)
		}
		if pr.Resource.URL != base+"/mcp" {
			t.Errorf("%s: resource %q, want the endpoint's URL %s/mcp", tool, pr.Resource.URL, base)
		}
	}
}

// mcpValidatedSite prices both tools with the validators of
// Caddyfile.example, and serves our facilitator (its list in its own
// Badger folder) that the gates settle through. The tools are not named
// with `route`, so the facilitator does not know them as its gates': it
// lists them as the settles describe them, which it does for its own
// callers only, as an operator sets it up: a token, which the gates send.
const mcpBazaarToken = "mcp-bazaar-token-0123456789"

func mcpValidatedSite(up, fac string) string {
	return fmt.Sprintf(`:{port} {
	handle_path /facilitator/* {
		x402_facilitator {
			pay_to %[3]s
			token {env.MCP_BAZAAR_FACILITATOR_TOKEN}
			store badger {data}/facilitator
			http %[2]s
		}
	}
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			description "Verify an agent's JSON output"
			facilitator http http://127.0.0.1:{port}/facilitator {
				header Authorization "Bearer {env.MCP_BAZAAR_FACILITATOR_TOKEN}"
			}
			store badger {data}/gate
			validate verify_request
		}
		x402 {
			mcp_tool get_verification_record
			accept devnet $0.01 %[3]s
			facilitator http http://127.0.0.1:{port}/facilitator {
				header Authorization "Bearer {env.MCP_BAZAAR_FACILITATOR_TOKEN}"
			}
			store badger {data}/gate
			validate score_request
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex())
}

// TestMCPBazaarDescribesTheToolsArguments: the bazaar extension of a priced
// MCP tool carries the tool's real argument schema (verifierd's
// mcpschema files, read here from disk), the official
// validateDiscoveryExtension accepts it, and once a payment for the tool is
// settled, the official withBazaar().listResources({type: "mcp"}) lists the
// tool at the endpoint's URL with that description.
func TestMCPBazaarDescribesTheToolsArguments(t *testing.T) {
	interop.Dir(t, "@x402/extensions", "@x402/core")
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	t.Setenv("MCP_BAZAAR_FACILITATOR_TOKEN", mcpBazaarToken)
	base := startCaddy(t, mcpValidatedSite(up.URL, fac))
	s := mcpSession(t, base+"/mcp")

	var exts []any
	var verifyDemand x402.PaymentRequired
	for tool, file := range map[string]string{"verify_schema": "verify_schema.input.json", "get_verification_record": "get_verification_record.input.json"} {
		args := any(verifyArgs)
		if tool == "get_verification_record" {
			args = map[string]any{"agent_id": "agent-a"}
		}
		pr := demandOf(t, callTool(t, s, tool, args, nil))
		if tool == "verify_schema" {
			verifyDemand = pr
		}
		raw, err := os.ReadFile("../verifierd/server/mcpschema/" + file)
		if err != nil {
			t.Fatal(err)
		}
		var want any
		json.Unmarshal(raw, &want)
		b, _ := json.Marshal(pr.Extensions["bazaar"])
		var ext struct {
			Info struct {
				Input struct {
					ToolName    string `json:"toolName"`
					InputSchema any    `json:"inputSchema"`
				} `json:"input"`
			} `json:"info"`
		}
		json.Unmarshal(b, &ext)
		if ext.Info.Input.ToolName != tool || !reflect.DeepEqual(ext.Info.Input.InputSchema, want) {
			t.Errorf("%s: inputSchema %v, want the tool's schema from %s", tool, ext.Info.Input.InputSchema, file)
		}
		exts = append(exts, pr.Extensions["bazaar"])
	}

	// Pay for verify_schema, echoing the bazaar extension as official
	// clients do.
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(1), verifyDemand.Accepts[0], &verifyDemand.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	p.Extensions = verifyDemand.Extensions
	var meta map[string]any
	b, _ := json.Marshal(p)
	json.Unmarshal(b, &meta)
	if res := callTool(t, s, "verify_schema", verifyArgs, mcp.Meta{mcpMetaPayment: meta}); res.IsError {
		t.Fatalf("paid call: %+v", res)
	}

	var out bazaarResult
	interop.Run(t, "bazaar.mjs", nil, map[string]any{
		"facilitatorURL":   base + "/facilitator",
		"facilitatorToken": mcpBazaarToken,
		"lists":            []any{map[string]any{"type": "mcp"}, map[string]any{"type": "http"}},
		"extensions":       exts,
		"payments":         []any{map[string]any{"url": verifyDemand.Resource.URL, "extension": verifyDemand.Extensions["bazaar"]}},
	}, &out)
	out.checkValidations(t, exts)
	if x := out.Extracted; len(x) != 1 || x[0] == nil || x[0].ResourceURL != base+"/mcp" || x[0].ToolName != "verify_schema" {
		t.Fatalf("official extractDiscoveryInfo of the tool's payment: %+v", x)
	}
	l := out.Pages[0]
	if l.Pagination.Total != 1 || len(l.Items) != 1 {
		t.Fatalf("type mcp: %+v, want the paid tool", l)
	}
	it := l.Items[0]
	ib, _ := json.Marshal(it.Extensions["bazaar"])
	wb, _ := json.Marshal(verifyDemand.Extensions["bazaar"])
	if it.Resource != base+"/mcp" || it.Type != "mcp" || len(it.Accepts) != 1 || it.Accepts[0].Amount != "20000" || !bytes.Equal(ib, wb) {
		t.Fatalf("listed %+v, want the tool at %s/mcp with its bazaar extension", it, base)
	}
	if out.Pages[1].Pagination.Total != 0 {
		t.Fatalf("type http: %+v, want none", out.Pages[1])
	}
}
