package server_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/verify"
)

// nodeMCPResult is what interop/mcp-client.mjs prints.
type nodeMCPResult struct {
	Server struct {
		Name    string `json:"name"`
		Version string `json:"version"`
	} `json:"server"`
	Tools []struct {
		Name        string         `json:"name"`
		Description string         `json:"description"`
		InputSchema map[string]any `json:"inputSchema"`
	} `json:"tools"`
	Results []struct {
		IsError           bool            `json:"isError"`
		ContentItems      int             `json:"contentItems"`
		Text              string          `json:"text"`
		StructuredContent json.RawMessage `json:"structuredContent"`
	} `json:"results"`
}

// TestMCPNodeClient drives verifierd's /mcp with the official MCP
// TypeScript SDK (Client + StreamableHTTPClientTransport).
func TestMCPNodeClient(t *testing.T) {
	interop.Dir(t, "@modelcontextprotocol/sdk")
	f := newFixture(t, fixtureOpts{noSync: true})
	keys := f.keySet(t)
	base := f.serve(t)
	f.verifyAs(t, wallet, "129.5", viaWallet)

	var fail, pass map[string]any
	if err := json.Unmarshal(invoice("135.0", ""), &fail); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(invoice("129.5", ""), &pass); err != nil {
		t.Fatal(err)
	}
	input := map[string]any{
		"url":     base + "/mcp",
		"headers": map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid"},
		"calls": []map[string]any{
			{"name": "verify_schema", "arguments": fail},
			{"name": "verify_schema", "arguments": pass},
			{"name": "verify_schema", "arguments": map[string]any{"task_id": "x", "expected_schema": map[string]any{}, "submitted_output": 1,
				"rules": []any{map[string]any{"type": "nope", "field": "a"}}}},
			{"name": "get_verification_record", "arguments": map[string]any{"agent_id": wallet}},
			{"name": "get_verification_record", "arguments": map[string]any{"agent_id": "test-demo"}},
		},
	}
	var out nodeMCPResult
	interop.Run(t, "mcp-client.mjs", nil, input, &out)

	if out.Server.Name != "Agent Output Verifier" || out.Server.Version != "test" {
		t.Errorf("server info %+v", out.Server)
	}
	tools := map[string]map[string]any{}
	for _, tl := range out.Tools {
		tools[tl.Name] = tl.InputSchema
	}
	if tools["verify_schema"]["$defs"] == nil || tools["get_verification_record"]["required"] == nil {
		t.Fatalf("the Node client did not get the input schemas: %v", tools)
	}
	if len(out.Results) != 5 {
		t.Fatalf("%d results, want 5", len(out.Results))
	}
	for i, r := range out.Results {
		if r.ContentItems != 1 {
			t.Errorf("call %d: %d content items", i, r.ContentItems)
		}
		var a, b any
		json.Unmarshal([]byte(r.Text), &a)
		json.Unmarshal(r.StructuredContent, &b)
		if a == nil || !reflect.DeepEqual(a, b) {
			t.Errorf("call %d: text and structuredContent differ", i)
		}
	}

	for i, c := range []struct {
		desc   string
		result string
		body   []byte
	}{
		{"the draft invoice fails with the exact SPEC §10 error", "fail", invoice("135.0", "")},
		{"the fixed invoice passes", "pass", invoice("129.5", "")},
	} {
		t.Run(c.desc, func(t *testing.T) {
			r := out.Results[i]
			if r.IsError {
				t.Fatalf("isError: %s", r.Text)
			}
			var doc map[string]any
			json.Unmarshal(r.StructuredContent, &doc)
			if doc["result"] != c.result {
				t.Fatalf("result %v", doc["result"])
			}
			if c.result == "fail" {
				want := "enforce_rules: consistency:sum_equals at 'line_items[].line_total': values sum to 129.5, expected total (135.0)"
				if errs := doc["errors"].([]any); len(errs) != 1 || errs[0] != want {
					t.Errorf("errors %q", errs)
				}
			}
			if err := receipt.VerifyReceipt([]byte(r.Text), keys, receipt.ContextVerify); err != nil {
				t.Fatalf("receipt: %v", err)
			}
			if err := receipt.VerifyReceipt(r.StructuredContent, keys, ""); err != nil {
				t.Fatalf("receipt from structuredContent as the Node client parsed it: %v", err)
			}
			want, err := verify.ComputeHashes(c.body)
			if err != nil {
				t.Fatal(err)
			}
			if err := receipt.CheckHashes([]byte(r.Text), want); err != nil {
				t.Fatalf("hashes: %v", err)
			}
		})
	}
	t.Run("an invalid request is an isError result with the invalid_request fields", func(t *testing.T) {
		r := out.Results[2]
		var e map[string]any
		json.Unmarshal(r.StructuredContent, &e)
		if !r.IsError || e["code"] != "invalid_request" || e["fields"].([]any)[0].(map[string]any)["field"] != "rules[0].type" {
			t.Fatalf("%v %s", r.IsError, r.Text)
		}
	})
	t.Run("get_verification_record is a signed score", func(t *testing.T) {
		r := out.Results[3]
		v, err := receipt.Verify([]byte(r.Text), keys, "")
		if r.IsError || err != nil || v.Context != receipt.ContextScore {
			t.Fatalf("isError %v, context %q, %v", r.IsError, v.Context, err)
		}
	})
	t.Run("a test- agent's score is refused", func(t *testing.T) {
		if r := out.Results[4]; !r.IsError {
			t.Fatalf("not an error: %s", r.Text)
		}
	})
	// Paid through the gateway headers, recorded like REST calls.
	recs := f.allRecords(t)
	paid := 0
	for _, r := range recs {
		if r.Payment == "paid" {
			paid++
		}
	}
	if paid != 3 { // the setup call and the two MCP verifications
		t.Errorf("%d paid records, want 3", paid)
	}
}
