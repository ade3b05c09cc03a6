package apidocs

import (
	"encoding/json"
	"fmt"
	"strings"
)

// MCPServerName is the name the client configurations give this server.
const MCPServerName = "agent-output-verifier"

// MCPClientSetup is the "MCP client set-up" section of llms.txt: ready
// configurations for the common MCP clients, all pointing at mcpURL (the
// live endpoint). Every one is a remote Streamable HTTP server with no
// credentials: payment travels in each tool call's _meta, not in the
// connection.
func MCPClientSetup(mcpURL string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("## MCP client set-up\n\n")
	w("The server is remote (Streamable HTTP) and needs no credentials: the free allowance applies per client, and payment travels in each tool call's `_meta`.\n\n")
	w("- Any client, one line (writes the configuration of Claude Code, Cursor, VS Code, Codex and others; `-a <client>` picks one): `npx add-mcp %s --name %s`\n", mcpURL, MCPServerName)
	w("- Claude Code: `claude mcp add --transport http %s %s`, or in the project's `.mcp.json`:\n\n", MCPServerName, mcpURL)
	w("```json\n%s\n```\n\n", mcpConfigJSON(mcpURL, true))
	w("- Cursor (`.cursor/mcp.json` in the project or `~/.cursor/mcp.json`), Windsurf, Claude Desktop and other clients that read an `mcpServers` map:\n\n")
	w("```json\n%s\n```\n\n", mcpConfigJSON(mcpURL, false))
	w("- VS Code (`.vscode/mcp.json`): `{\"servers\": {\"%s\": {\"type\": \"http\", \"url\": \"%s\"}}}`\n", MCPServerName, mcpURL)
	w("- A client that only speaks stdio: `npx mcp-remote %s` as the command.\n", mcpURL)
	return b.String()
}

// mcpConfigJSON is the mcpServers document: with typed, the "type": "http"
// member that Claude Code's .mcp.json wants.
func mcpConfigJSON(mcpURL string, typed bool) string {
	server := map[string]string{"url": mcpURL}
	if typed {
		server["type"] = "http"
	}
	out, _ := json.MarshalIndent(map[string]any{"mcpServers": map[string]any{MCPServerName: server}}, "", "  ")
	return string(out)
}
