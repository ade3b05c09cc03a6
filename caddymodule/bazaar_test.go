package caddymodule

import (
	"testing"
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
	}
}
