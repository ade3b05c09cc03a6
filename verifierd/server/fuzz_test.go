package server_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/aovhq/aov/receipt"
)

// FuzzVerifyHandler: whatever body arrives, the answer is a signed result or
// a client error in the SPEC §6 shape, never a 5xx or a panic, and a 200 is
// always a receipt that verifies.
func FuzzVerifyHandler(f *testing.F) {
	fx := newFixture(f, fixtureOpts{noSync: true, maxBody: 64 << 10})
	keys := fx.keySet(f)
	f.Add(invoice("135.0", ""), "application/json")
	f.Add(invoice("129.5", `,"detail":"compact"`), "application/json; charset=utf-8")
	f.Add([]byte(`{"task_id":"a","expected_schema":{"type":"array"},"submitted_output":[1,2,{"a":null}],"strict_content_check":true}`), "application/problem+json")
	f.Add([]byte(`{"task_id":"\ud800"}`), "application/json")
	f.Add([]byte(`{"task_id":"a","task_id":"b"}`), "application/json")
	f.Add([]byte("\xff\xfe"), "text/plain")
	f.Add([]byte(`[]`), "")
	f.Fuzz(func(t *testing.T, body []byte, contentType string) {
		r := httptest.NewRequest(http.MethodPost, "/verify/schema", bytes.NewReader(body))
		r.Header.Set("Content-Type", contentType)
		w := httptest.NewRecorder()
		fx.h.ServeHTTP(w, r)
		switch w.Code {
		case http.StatusOK:
			if err := receipt.VerifyReceipt(w.Body.Bytes(), keys, receipt.ContextVerify); err != nil {
				t.Fatalf("a 200 whose receipt does not verify: %v", err)
			}
		case http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType, http.StatusUnprocessableEntity:
		default:
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
	})
}

// FuzzMCPToolCall: whatever arguments a tools/call carries, /mcp answers a
// JSON-RPC message (or a SPEC §6 refusal of the HTTP request), never a 5xx
// or a panic; a tool result is either a receipt that verifies or an
// isError result with a client error in the SPEC §6 shape.
func FuzzMCPToolCall(f *testing.F) {
	fx := newFixture(f, fixtureOpts{noSync: true, maxBody: 64 << 10})
	keys := fx.keySet(f)
	f.Add(false, invoice("135.0", ""))
	f.Add(false, []byte(`{"task_id":"a","expected_schema":{"type":"array"},"submitted_output":[1,2,{"a":null}],"strict_content_check":true}`))
	f.Add(false, []byte(`{"task_id":"a","task_id":"b"}`))
	f.Add(false, []byte(`"not an object"`))
	f.Add(true, []byte(`{"agent_id":"seller-7"}`))
	f.Add(true, []byte(`{"agent_id":"test-x"}`))
	f.Add(true, []byte(`{"agent_id":"a","agent_id":"b"}`))
	f.Add(true, []byte(`null`))
	f.Fuzz(func(t *testing.T, score bool, args []byte) {
		tool := "verify_schema"
		if score {
			tool = "get_verification_record"
		}
		r := httptest.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(mcpCall(tool, args)))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		fx.h.ServeHTTP(w, r)
		if w.Code >= 500 {
			t.Fatalf("status %d: %s", w.Code, w.Body)
		}
		var msg struct {
			Result *struct {
				StructuredContent json.RawMessage `json:"structuredContent"`
				IsError           bool            `json:"isError"`
			} `json:"result"`
		}
		if err := json.Unmarshal(w.Body.Bytes(), &msg); err != nil {
			t.Fatalf("status %d, not JSON: %s", w.Code, w.Body)
		}
		if msg.Result == nil {
			return // a JSON-RPC error: the arguments were not JSON
		}
		if msg.Result.IsError {
			var e struct {
				Status  int  `json:"status"`
				Charged bool `json:"charged"`
			}
			if err := json.Unmarshal(msg.Result.StructuredContent, &e); err != nil || e.Status < 400 || e.Status >= 500 || e.Charged {
				t.Fatalf("tool error %s", msg.Result.StructuredContent)
			}
			return
		}
		if err := receipt.VerifyReceipt(msg.Result.StructuredContent, keys, ""); err != nil {
			t.Fatalf("a tool result whose receipt does not verify: %v", err)
		}
	})
}
