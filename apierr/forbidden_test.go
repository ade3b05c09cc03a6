package apierr

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
)

func TestForbiddenShape(t *testing.T) {
	rec := httptest.NewRecorder()
	Write(rec, Forbidden("the agent_id belongs to another wallet", "use_own_agent_id",
		Field{Field: "X-Wallet-Auth.agent_id", Problem: "is bound to another wallet", Fix: "Bind an agent_id of your own."}))
	if rec.Code != 403 || rec.Header().Get("Retry-After") != "" {
		t.Fatalf("status %d, Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	var body struct {
		Code        string   `json:"code"`
		Message     string   `json:"message"`
		Status      int      `json:"status"`
		Retryable   bool     `json:"retryable"`
		Charged     bool     `json:"charged"`
		NextActions []Action `json:"next_actions"`
		Fields      []Field  `json:"fields"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Code != CodeForbidden || body.Status != 403 || body.Retryable || body.Charged ||
		body.Message != "The request is not allowed (the agent_id belongs to another wallet) and nothing was charged." ||
		len(body.NextActions) != 1 || body.NextActions[0].Action != "use_own_agent_id" ||
		len(body.Fields) != 1 || body.Fields[0].Field != "X-Wallet-Auth.agent_id" {
		t.Fatalf("body %s", rec.Body)
	}
}
