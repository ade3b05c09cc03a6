package caddymodule

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/aovhq/aov/verifierd/server/mcpschema"
)

// routeBazaar is x402's bazaar extension for a priced route that has no
// richer one (the verify routes carry apidocs.BazaarVerify): an MCP tool is
// described as input type "mcp" with its name, and a GET, HEAD or DELETE
// route named with `route` as a query call, with the route's {name} path
// segments as the routeTemplate's :name parameters, so a facilitator
// catalogs one resource per route rather than one per URL. The shapes are
// those of @x402/extensions' declareDiscoveryExtension. Nil when the gate
// says too little to describe the call.
func routeBazaar(g *Gate) map[string]any {
	if g.MCPTool != "" {
		return mcpBazaar(g.MCPTool, g.Description, toolInputSchema(g.Validator))
	}
	method, path := splitRoute(g.Route)
	if (method != "GET" && method != "HEAD" && method != "DELETE") || !strings.HasPrefix(path, "/") {
		return nil
	}
	input := map[string]any{
		"type": "object",
		"properties": map[string]any{
			"type":   map[string]any{"type": "string", "const": "http"},
			"method": map[string]any{"type": "string", "enum": []any{method}},
		},
		"required":             []any{"type", "method"},
		"additionalProperties": false,
	}
	ext := map[string]any{
		"info":   map[string]any{"input": map[string]any{"type": "http", "method": method}},
		"schema": bazaarSchema(input),
	}
	if tmpl := routeParam.ReplaceAllString(path, ":$1"); tmpl != path {
		ext["routeTemplate"] = tmpl
		input["properties"].(map[string]any)["pathParams"] = map[string]any{"type": "object"}
	}
	return ext
}

// routeParam is a {name} segment of a `route` path.
var routeParam = regexp.MustCompile(`\{([a-zA-Z_][a-zA-Z0-9_]*)\}`)

// mcpBazaar describes a priced MCP tool: its name, its transport, and the
// JSON Schema of its arguments (MCP's Tool.inputSchema, which the bazaar
// specification asks servers to reuse).
func mcpBazaar(tool, description string, inputSchema map[string]any) map[string]any {
	info := map[string]any{
		"type":        "mcp",
		"toolName":    tool,
		"transport":   "streamable-http",
		"inputSchema": inputSchema,
	}
	props := map[string]any{
		"type":        map[string]any{"type": "string", "const": "mcp"},
		"toolName":    map[string]any{"type": "string", "const": tool},
		"transport":   map[string]any{"type": "string", "enum": []any{"streamable-http"}},
		"inputSchema": map[string]any{"type": "object"},
	}
	if description != "" {
		info["description"] = description
		props["description"] = map[string]any{"type": "string"}
	}
	return map[string]any{
		"info": map[string]any{"input": info},
		"schema": bazaarSchema(map[string]any{
			"type":                 "object",
			"properties":           props,
			"required":             []any{"type", "toolName", "inputSchema"},
			"additionalProperties": false,
		}),
	}
}

// toolInputSchema is the argument schema of a tool whose arguments the
// gate validates: the validator reads exactly what verifierd's tool of
// that kind declares in tools/list (verifierd/server/mcpschema). For a
// tool the gate does not validate it says only that the arguments are an
// object, described by the MCP server's tools/list.
func toolInputSchema(validator string) map[string]any {
	var raw []byte
	switch validator {
	case "verify_request":
		raw = mcpschema.VerifySchema()
	case validateScore:
		raw = mcpschema.GetVerificationRecord()
	default:
		return map[string]any{"type": "object", "description": "The tool's arguments, as the MCP server's tools/list describes them."}
	}
	var s map[string]any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&s); err != nil {
		panic("mcpschema: " + err.Error()) // embedded at build time and tested
	}
	return s
}

func bazaarSchema(input map[string]any) map[string]any {
	return map[string]any{
		"$schema":    "https://json-schema.org/draft/2020-12/schema",
		"type":       "object",
		"properties": map[string]any{"input": input},
		"required":   []any{"input"},
	}
}
