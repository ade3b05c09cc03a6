package server_test

import (
	"bytes"
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
