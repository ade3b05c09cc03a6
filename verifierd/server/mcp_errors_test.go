package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestMCPJSONRPCErrorsEchoNothing: the MCP SDK's JSON-RPC errors quote the
// request (an unknown tool's name, params it could not decode); verifierd
// answers them with the same id and code and a message that names only the
// kind of error.
func TestMCPJSONRPCErrorsEchoNothing(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	base := f.serve(t)
	for _, c := range []struct {
		desc, body string
		code       float64
	}{
		{"an unknown tool", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"SECRET-tool-name","arguments":{}}}`, -32602},
		{"params that are not an object", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":"SECRET-params"}`, -32602},
		{"an unknown resource", `{"jsonrpc":"2.0","id":7,"method":"resources/read","params":{"uri":"file:///SECRET"}}`, -32602},
		{"an unknown prompt", `{"jsonrpc":"2.0","id":7,"method":"prompts/get","params":{"name":"SECRET-prompt"}}`, -32602},
	} {
		t.Run(c.desc, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if strings.Contains(string(raw), "SECRET") {
				t.Fatalf("the answer echoes the request: %s", raw)
			}
			var m struct {
				JSONRPC string  `json:"jsonrpc"`
				ID      float64 `json:"id"`
				Error   struct {
					Code    float64 `json:"code"`
					Message string  `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(raw, &m); err != nil || m.JSONRPC != "2.0" || m.ID != 7 || m.Error.Code != c.code || m.Error.Message == "" {
				t.Fatalf("answer %d %s (%v)", resp.StatusCode, raw, err)
			}
		})
	}
}
