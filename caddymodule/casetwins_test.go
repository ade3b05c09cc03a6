package caddymodule

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/aovhq/aov/verify"
)

// TestCaseTwinsAreOneRuleForRESTAndMCP: names equal in another letter case
// are accepted inside a verification's data and refused among the
// request's own names, over REST and over MCP alike, through the gate in
// front of a real verifierd. An accepted request gets the same verdict
// and the same hashes both ways, and they are the hashes anyone computes
// from the REST body (verify.ComputeHashes): every reader kept the twins
// as distinct keys.
func TestCaseTwinsAreOneRuleForRESTAndMCP(t *testing.T) {
	_, fac := sharedDevnet(t)
	vf := startVerifier(t)
	base := startCaddy(t, realSite(vf, fac, 100, "rate_limit off"))

	rest := func(t *testing.T, body string) (int, map[string]any) {
		t.Helper()
		resp := post(t, base+"/verify/schema", body, nil)
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var doc map[string]any
		if err := json.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("REST %d: %s", resp.StatusCode, raw)
		}
		return resp.StatusCode, doc
	}
	mcp := func(t *testing.T, args string) (int, map[string]any) {
		t.Helper()
		resp, raw := postMCP(t, base+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":`+args+`}}`)
		var msg struct {
			Result *struct {
				IsError           bool           `json:"isError"`
				StructuredContent map[string]any `json:"structuredContent"`
			} `json:"result"`
			Error map[string]any `json:"error"`
		}
		if err := json.Unmarshal(raw, &msg); err != nil {
			t.Fatalf("MCP %d: %s", resp.StatusCode, raw)
		}
		if msg.Result == nil {
			return resp.StatusCode, msg.Error
		}
		if msg.Result.IsError {
			return http.StatusUnprocessableEntity, msg.Result.StructuredContent
		}
		return resp.StatusCode, msg.Result.StructuredContent
	}
	hashesOf := func(t *testing.T, doc map[string]any) map[string]any {
		t.Helper()
		out := map[string]any{"result": doc["result"]}
		for _, k := range []string{"output_hash", "schema_hash", "rules_hash", "request_hash"} {
			out[k] = doc[k]
		}
		if out["request_hash"] == nil {
			t.Fatalf("no request_hash in %v", doc)
		}
		return out
	}

	for _, c := range []struct{ desc, body, result string }{
		{"twins in submitted_output, one checked by the schema",
			`{"task_id":"t-twins","expected_schema":{"type":"object","required":["total"],"properties":{"total":{"type":"number"}}},"submitted_output":{"total":1,"Total":"one","TOTAL":{"k":1,"\u212a":2}}}`, "pass"},
		{"twins in submitted_output that fail the schema",
			`{"task_id":"t-twins","expected_schema":{"type":"object","required":["total"],"properties":{"total":{"type":"number"}}},"submitted_output":{"Total":1}}`, "fail"},
		{"twins in the schema and in bounds",
			`{"task_id":"t-twins","expected_schema":{"type":"object","properties":{"a":{"type":"number"},"A":{"type":"string"}}},"submitted_output":{"a":1,"A":"x"},"bounds":{"a":{"min":0},"A":{"min":0,"if_present":true}}}`, "fail"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			rs, rdoc := rest(t, c.body)
			ms, mdoc := mcp(t, c.body)
			if rs != 200 || ms != 200 {
				t.Fatalf("REST %d %v, MCP %d %v; want both served", rs, rdoc, ms, mdoc)
			}
			r, m := hashesOf(t, rdoc), hashesOf(t, mdoc)
			if r["result"] != c.result {
				t.Fatalf("REST result %v, want %s", r["result"], c.result)
			}
			want, err := verify.ComputeHashes([]byte(c.body))
			if err != nil {
				t.Fatal(err)
			}
			for name, got := range map[string]map[string]any{"REST": r, "MCP": m} {
				if got["result"] != r["result"] || got["output_hash"] != want.Output || got["schema_hash"] != want.Schema ||
					got["rules_hash"] != want.Rules || got["request_hash"] != want.Request {
					t.Fatalf("%s: %v, want result %v and hashes %+v", name, got, r["result"], want)
				}
			}
		})
	}

	t.Run("twins among the request's own names are refused both ways, uncharged and unrecorded", func(t *testing.T) {
		before, _, err := vf.db.Verifications(context.Background(), "", "", 100)
		if err != nil {
			t.Fatal(err)
		}
		body := `{"task_id":"t-twins","Task_ID":"other","expected_schema":{},"submitted_output":{}}`
		rs, rdoc := rest(t, body)
		ms, mdoc := mcp(t, body)
		data, _ := mdoc["data"].(map[string]any)
		if rs != 422 || rdoc["code"] != "invalid_request" || rdoc["charged"] != false ||
			ms != 400 || data["code"] != "invalid_message" || data["charged"] != false {
			t.Fatalf("REST %d %v, MCP %d %v; want both refused", rs, rdoc, ms, mdoc)
		}
		if after, _, err := vf.db.Verifications(context.Background(), "", "", 100); err != nil || len(after) != len(before) {
			t.Fatalf("%d records after the refusals, %d before (%v)", len(after), len(before), err)
		}
	})
}
