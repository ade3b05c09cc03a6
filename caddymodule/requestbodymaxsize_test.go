package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// A body cut off by a request_body max_size in front of the gate (Caddy's
// MaxBytesReader) is over a limit, not cut short: it is answered 413
// payload_too_large naming that limit, as verifierd answers the same
// error, on a REST route with a free allowance and on an MCP route (one
// body reader for all). A body announcing a length over max_size is
// refused 413 by request_body itself, before the gate; a chunked one is
// cut off while the gate reads it. (Before: the chunked body was 422
// invalid_request "could not be read completely", telling the client to
// send the whole body again.)
func TestABodyOverRequestBodyMaxSizeIs413(t *testing.T) {
	_, fac := sharedDevnet(t)
	const maxSize = `
		request_body {
			max_size 100
		}`
	rest := strings.Replace(gateSite(newUpstream(t).URL, fac, 5, ""), "route /verify/schema {", "route /verify/schema {"+maxSize, 1)
	mcpRoute := strings.Replace(mcpSite(newMCPUpstream(t).URL, fac, 5), "route /mcp {", "route /mcp {"+maxSize, 1)
	for _, tc := range []struct{ name, site, path, body string }{
		{"REST", rest, "/verify/schema",
			`{"task_id":"t-1","expected_schema":{"type":"object"},"submitted_output":{"pad":"` + strings.Repeat("x", 300) + `"}}`},
		{"MCP", mcpRoute, "/mcp",
			`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{"task_id":"t-1","expected_schema":{"type":"object"},"submitted_output":{"pad":"` + strings.Repeat("x", 300) + `"}}}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := startCaddy(t, tc.site) + tc.path
			for _, chunked := range []bool{false, true} {
				req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(tc.body))
				if err != nil {
					t.Fatal(err)
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				if chunked {
					req.Body = io.NopCloser(strings.NewReader(tc.body))
					req.ContentLength = -1
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if !chunked {
					if resp.StatusCode != http.StatusRequestEntityTooLarge {
						t.Errorf("a %d-byte body announced over request_body max_size 100: %d %.300s; want 413", len(tc.body), resp.StatusCode, b)
					}
					continue
				}
				var e struct {
					Code    string `json:"code"`
					Message string `json:"message"`
				}
				if resp.StatusCode != http.StatusRequestEntityTooLarge || json.Unmarshal(b, &e) != nil || e.Code != "payload_too_large" ||
					!strings.Contains(e.Message, "100 bytes") {
					t.Errorf("chunked %t: a %d-byte body over request_body max_size 100: %d %.300s; want 413 payload_too_large naming 100 bytes",
						chunked, len(tc.body), resp.StatusCode, b)
				}
			}
		})
	}
}
