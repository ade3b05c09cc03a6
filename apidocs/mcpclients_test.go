package apidocs

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// The MCP client configurations in llms.txt are valid JSON documents that
// name the live endpoint, in the shapes the clients read.
func TestLLMsTxtCarriesReadyMCPClientConfigurations(t *testing.T) {
	s := testService()
	s.MCPURL = "https://mcp.example.net/custom/mcp"
	txt := string(LLMsTxt(s))
	i := strings.Index(txt, "\n## MCP client set-up\n")
	if i < 0 {
		t.Fatal("llms.txt has no MCP client set-up section")
	}
	section := txt[i:]
	if j := strings.Index(section[1:], "\n## "); j >= 0 {
		section = section[:j+1]
	}
	for _, want := range []string{
		"`npx add-mcp https://mcp.example.net/custom/mcp --name agent-output-verifier`",
		"`claude mcp add --transport http agent-output-verifier https://mcp.example.net/custom/mcp`",
		"`npx mcp-remote https://mcp.example.net/custom/mcp`",
	} {
		if !strings.Contains(section, want) {
			t.Errorf("the section lacks %s", want)
		}
	}
	blocks := regexp.MustCompile("(?s)```json\n(.*?)\n```").FindAllStringSubmatch(section, -1)
	if len(blocks) != 2 {
		t.Fatalf("%d JSON configurations, want 2 (.mcp.json and mcp.json)", len(blocks))
	}
	for i, wantType := range []string{"http", ""} {
		var doc struct {
			MCPServers map[string]map[string]string `json:"mcpServers"`
		}
		if err := json.Unmarshal([]byte(blocks[i][1]), &doc); err != nil {
			t.Fatalf("configuration %d is not JSON: %v", i, err)
		}
		srv, ok := doc.MCPServers[MCPServerName]
		if !ok || len(doc.MCPServers) != 1 {
			t.Fatalf("configuration %d: servers %v", i, doc.MCPServers)
		}
		if srv["url"] != s.MCPURL || srv["type"] != wantType {
			t.Errorf("configuration %d: %v, want url %s and type %q", i, srv, s.MCPURL, wantType)
		}
	}
	vscode := regexp.MustCompile("`(\\{\"servers\".*?)`").FindStringSubmatch(section)
	var doc map[string]map[string]map[string]string
	if vscode == nil || json.Unmarshal([]byte(vscode[1]), &doc) != nil || doc["servers"][MCPServerName]["url"] != s.MCPURL {
		t.Errorf("the VS Code configuration is missing or wrong: %v", vscode)
	}
}

// The interactive docs (the OpenAPI description /docs shows first) point at
// the one-line set-up and at the configurations.
func TestOpenAPIDescriptionNamesTheMCPClientSetUp(t *testing.T) {
	s := testService()
	s.MCPURL = "https://mcp.example.net/custom/mcp"
	doc := buildDoc(t, s)
	desc, _ := doc["info"].(map[string]any)["description"].(string)
	for _, want := range []string{"`npx add-mcp https://mcp.example.net/custom/mcp`", "(" + s.BaseURL + "/llms.txt)"} {
		if !strings.Contains(desc, want) {
			t.Errorf("info.description lacks %s:\n%s", want, desc)
		}
	}
}
