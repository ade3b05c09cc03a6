package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// MCP on /mcp through the gateway and verifierd, with the official Go SDK
// client: the tools are listed free; verify_schema draws on the same daily
// allowance as the REST routes (SPEC §7), so after a REST call has used the
// only free call the tool answers payment-required with
// free_trial_exhausted; a payment in _meta is verified, the tool run and the
// payment settled; the tool's answer is a receipt the aov command verifies.
func TestMCPThroughTheGateway(t *testing.T) {
	s := newStack(t, "AOV_FREE_PER_DAY=1")
	const agent = "e2e-mcp-agent"
	args := json.RawMessage(bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1))

	mustStatus(t, post(t, s.url("/verify/schema"), example(t, "invoice-fixed.json")), http.StatusOK)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
	sess, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.url("/mcp"), DisableStandaloneSSE: true}, nil)
	if err != nil {
		t.Fatalf("connecting to /mcp through Caddy: %v", err)
	}
	defer sess.Close()

	t.Run("tools/list is free and names both tools", func(t *testing.T) {
		tools, err := sess.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, tool := range tools.Tools {
			names[tool.Name] = true
		}
		if !names["verify_schema"] || !names["get_verification_record"] {
			t.Fatalf("tools %v", names)
		}
	})

	var required x402.PaymentRequired
	t.Run("verify_schema after the REST call used the day's free call: payment required, free_trial_exhausted", func(t *testing.T) {
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "verify_schema", Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		if !res.IsError || res.Meta["code"] != "free_trial_exhausted" {
			t.Fatalf("result: isError %v, _meta %v", res.IsError, res.Meta)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, &required); err != nil || len(required.Accepts) == 0 {
			t.Fatalf("structuredContent is not a PaymentRequired (%v): %s", err, b)
		}
	})
	if len(required.Accepts) == 0 {
		t.FailNow()
	}

	payment, err := x402.SignExactEVM(evmfacilitator.DevKey(3), required.Accepts[0], &required.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	pb, _ := json.Marshal(payment)
	var meta map[string]any
	if err := json.Unmarshal(pb, &meta); err != nil {
		t.Fatal(err)
	}
	var receipt []byte
	t.Run("a payment in _meta pays for the call and is settled", func(t *testing.T) {
		res, err := sess.CallTool(ctx, &mcp.CallToolParams{Name: "verify_schema", Arguments: args, Meta: mcp.Meta{"x402/payment": meta}})
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError {
			t.Fatalf("paid call refused: %+v", res.StructuredContent)
		}
		sb, _ := json.Marshal(res.Meta["x402/payment-response"])
		var settle x402.SettleResponse
		if err := json.Unmarshal(sb, &settle); err != nil || !settle.Success || settle.Transaction == "" {
			t.Fatalf("payment response (%v): %s", err, sb)
		}
		receipt, _ = json.Marshal(res.StructuredContent)
		if r := decode[result](t, response{body: receipt}); r.Result != "pass" {
			t.Fatalf("result %q", r.Result)
		}
	})
	t.Run("the tool's answer is a receipt the aov command verifies", func(t *testing.T) {
		if out, code := verifyReceipt(t, s, "mcp.json", receipt); code != 0 {
			t.Fatalf("exit %d\n%s", code, out)
		}
	})
	sess.Close()
	t.Run("verifierd recorded the MCP call as paid", func(t *testing.T) {
		recs := s.history(t, agent)
		if len(recs) != 1 || recs[0].Payment != store.PaymentPaid {
			t.Fatalf("records %+v", recs)
		}
	})
}

// The same through the official MCP TypeScript SDK client, paying with the
// official x402 client's signature: after the day's only free call (used
// over REST), verify_schema answers payment-required; the buyer pays in
// _meta and gets a settled, signed verification; get_verification_record is
// never free and is paid the same way.
func TestOfficialMCPClientPaysThroughTheGateway(t *testing.T) {
	s := newStack(t, "AOV_FREE_PER_DAY=1")
	mustStatus(t, post(t, s.url("/verify/schema"), example(t, "invoice-fixed.json")), http.StatusOK)
	interop.Dir(t, "@modelcontextprotocol/sdk", "@x402/evm")
	var args map[string]any
	if err := json.Unmarshal(example(t, "invoice-fixed.json"), &args); err != nil {
		t.Fatal(err)
	}
	var out struct {
		Tools []string `json:"tools"`
		Calls []struct {
			Name  string `json:"name"`
			First struct {
				IsError bool   `json:"isError"`
				Code    string `json:"code"`
				Demand  bool   `json:"demand"`
			} `json:"first"`
			Paid *struct {
				IsError           bool            `json:"isError"`
				StructuredContent json.RawMessage `json:"structuredContent"`
				PaymentResponse   *struct {
					Success     bool   `json:"success"`
					Transaction string `json:"transaction"`
				} `json:"paymentResponse"`
			} `json:"paid"`
		} `json:"calls"`
	}
	interop.Run(t, "mcp-pay.mjs", nil, map[string]any{
		"url":        s.url("/mcp"),
		"privateKey": evmfacilitator.DevAccounts()[6].PrivateKeyHex,
		"calls": []map[string]any{
			{"name": "verify_schema", "arguments": args},
			{"name": "get_verification_record", "arguments": map[string]any{"agent_id": "seller-7"}},
		},
	}, &out)
	if len(out.Tools) != 2 || len(out.Calls) != 2 {
		t.Fatalf("tools %v, calls %d", out.Tools, len(out.Calls))
	}
	for _, c := range out.Calls {
		if !c.First.IsError || !c.First.Demand {
			t.Fatalf("%s without payment: %+v", c.Name, c.First)
		}
		if c.Paid == nil || c.Paid.IsError || c.Paid.PaymentResponse == nil || !c.Paid.PaymentResponse.Success || c.Paid.PaymentResponse.Transaction == "" {
			t.Fatalf("%s paid: %+v", c.Name, c.Paid)
		}
		if out, code := verifyReceipt(t, s, c.Name+".json", c.Paid.StructuredContent); code != 0 {
			t.Fatalf("%s receipt: %s", c.Name, out)
		}
	}
	if out.Calls[0].First.Code != "free_trial_exhausted" {
		t.Errorf("verify_schema after the allowance: code %q", out.Calls[0].First.Code)
	}
}
