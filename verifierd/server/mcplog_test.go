package server_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestMCPCallLogsOneLine: a tool call writes the access log line and
// nothing else. The SDK's per-session info lines (in stateless mode three
// per POST: connecting, connected, disconnected) are not the service's.
func TestMCPCallLogsOneLine(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true, localSigner: true})
	before := f.logs.String()
	w := f.do(http.MethodPost, "/mcp", mcpCall("verify_schema", invoice("135.0", "")),
		map[string]string{"Accept": "application/json, text/event-stream"})
	if w.Code != http.StatusOK || !bytes.Contains(w.Body.Bytes(), []byte(`"attestation"`)) {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	lines := strings.Split(strings.TrimSpace(strings.TrimPrefix(f.logs.String(), before)), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d log lines for one tool call, want 1:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	var line struct{ Msg, Route, Tool string }
	if err := json.Unmarshal([]byte(lines[0]), &line); err != nil || line.Msg != "request" || line.Route != "mcp" || line.Tool != "verify_schema" {
		t.Fatalf("log line %s (%v), want the access log line of the tool call", lines[0], err)
	}
}
