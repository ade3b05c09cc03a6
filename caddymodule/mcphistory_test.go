package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// mcpHistorySite puts the gate, with a facilitator in mode (pending_test.go),
// in front of a real verifierd's /mcp: one free call a day, then paid.
func mcpHistorySite(vf *verifierFixture, mode, storeDir string) string {
	return fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator faulty_devnet %[2]s
			store badger %[4]s
			free_allowance {
				per_day 1
			}
		}
		x402 {
			mcp_tool get_verification_record
			accept devnet $0.01 %[3]s
			facilitator faulty_devnet %[2]s
			store badger %[4]s
		}
		reverse_proxy %[1]s {
			header_up X-Aov-Gateway-Token %[5]s
		}
	}
}
`, strings.TrimPrefix(vf.srv.URL, "http://"), mode, payTo.Hex(), storeDir, verifierToken)
}

// payDemand signs, for the devnet account payer, the payment a tool
// call's answer demands (an isError result carrying PaymentRequired).
func payDemand(t *testing.T, body []byte, payer int) x402.PaymentPayload {
	t.Helper()
	demand, isErr := toolResultOf(t, body)
	b, _ := json.Marshal(demand)
	var pr x402.PaymentRequired
	if !isErr || json.Unmarshal(b, &pr) != nil || len(pr.Accepts) == 0 {
		t.Fatalf("not a demand: %s", body)
	}
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(payer), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// toolCall is a raw JSON-RPC tools/call body, with a payment in _meta when
// payment is not nil.
func toolCall(t *testing.T, tool string, args map[string]any, payment *x402.PaymentPayload) string {
	t.Helper()
	params := map[string]any{"name": tool, "arguments": args}
	if payment != nil {
		params["_meta"] = map[string]any{mcpMetaPayment: payment}
	}
	b, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// toolResultOf reads a JSON-RPC tool result: its structuredContent and
// whether it is an error.
func toolResultOf(t *testing.T, body []byte) (doc map[string]any, isError bool) {
	t.Helper()
	var m struct {
		Result *struct {
			IsError           bool           `json:"isError"`
			StructuredContent map[string]any `json:"structuredContent"`
		} `json:"result"`
	}
	if err := json.Unmarshal(body, &m); err != nil || m.Result == nil {
		t.Fatalf("not a tool result: %s", body)
	}
	return m.Result.StructuredContent, m.Result.IsError
}

// A paid MCP verify_schema is recorded like a paid REST call: pending while
// the gate settles, then paid once it has, or unpaid (never counted) when
// settlement failed; a free call stays free; the score tool records nothing
// and asks for no report. The request for a report never reaches the client.
func TestPaidMCPHistoryTellsTheTruth(t *testing.T) {
	d, _ := sharedDevnet(t)
	for _, tc := range []struct {
		mode, want string
		counted    bool
	}{{"none", store.PaymentPaid, true}, {"refuse", store.PaymentUnpaid, false}} {
		t.Run(tc.mode, func(t *testing.T) {
			vf := startVerifier(t)
			url := startCaddy(t, mcpHistorySite(vf, tc.mode, gateDir(t))) + "/mcp"
			agent := "seller-mcp-" + tc.mode
			args := map[string]any{"task_id": "t-mcp", "agent_id": agent,
				"expected_schema": map[string]any{"type": "object"}, "submitted_output": map[string]any{"ok": true}}
			ctx := context.Background()

			// The free call of the day: recorded free, counted.
			resp, body := postMCP(t, url, toolCall(t, "verify_schema", args, nil))
			freeDoc, isErr := toolResultOf(t, body)
			if isErr || resp.Header.Get(headerSettlementReport) != "" {
				t.Fatalf("free call: %s, report header %q", body, resp.Header.Get(headerSettlementReport))
			}
			if v, err := vf.db.Verification(ctx, freeDoc["verification_id"].(string)); err != nil || v.Payment != store.PaymentFree {
				t.Fatalf("free call recorded %+v, %v", v, err)
			}

			// The next one is demanded, then paid.
			_, body = postMCP(t, url, toolCall(t, "verify_schema", args, nil))
			payer := evmfacilitator.DevAccounts()[2].Address
			before := balance(t, d, payer)
			p := payDemand(t, body, 2)
			resp, body = postMCP(t, url, toolCall(t, "verify_schema", args, &p))
			if h := resp.Header.Get(headerSettlementReport); h != "" {
				t.Fatalf("the report request reached the client: %q", h)
			}
			paidDoc, isErr := toolResultOf(t, body)
			if isErr == tc.counted {
				t.Fatalf("paid call (%s): isError %v: %s", tc.mode, isErr, body)
			}
			wantCharge := int64(0)
			if tc.counted {
				wantCharge = 20000
				if _, ok := paidDoc["verification_id"].(string); !ok {
					t.Fatalf("no verification_id in %s", body)
				}
			}
			if got := charged(t, d, payer, before); got.Int64() != wantCharge {
				t.Fatalf("charged %s, want %d", got, wantCharge)
			}

			// An unpaid report is made in the background, after the answer:
			// wait for it.
			var paid store.Verification
			waitFor(t, "the paid call's report", func() bool {
				recs, _, err := vf.db.Verifications(ctx, agent, "", 10)
				if err != nil || len(recs) != 2 {
					t.Fatalf("records %+v, %v", recs, err)
				}
				paid = recs[0] // newest first
				if paid.ID == freeDoc["verification_id"] {
					paid = recs[1]
				}
				return paid.Payment != store.PaymentPending
			})
			if paid.Payment != tc.want || paid.Counted() != tc.counted {
				t.Fatalf("paid call recorded as %q (counted %v), want %q", paid.Payment, paid.Counted(), tc.want)
			}
			c, err := vf.db.AgentCounts(ctx, agent)
			wantTotal, wantPaid := int64(1), int64(0)
			if tc.counted {
				wantTotal, wantPaid = 2, 1
			}
			if err != nil || c.Total() != wantTotal || c.Paid != wantPaid {
				t.Fatalf("counts %+v (total %d), want total %d paid %d", c, c.Total(), wantTotal, wantPaid)
			}

			// The score tool, paid, records nothing and asks for no report.
			_, body = postMCP(t, url, toolCall(t, "get_verification_record", map[string]any{"agent_id": agent}, nil))
			p = payDemand(t, body, 2)
			resp, body = postMCP(t, url, toolCall(t, "get_verification_record", map[string]any{"agent_id": agent}, &p))
			if _, isErr := toolResultOf(t, body); resp.Header.Get(headerSettlementReport) != "" || isErr == tc.counted {
				t.Fatalf("score tool: report header %q, isError %v: %s", resp.Header.Get(headerSettlementReport), isErr, body)
			}
			if recs, _, _ := vf.db.Verifications(ctx, "", "", 10); len(recs) != 2 {
				t.Fatalf("the score tool recorded something: %d records (%s)", len(recs), body)
			}
		})
	}
}

// A paid MCP verify_schema whose settlement outcome is lost (the transfer
// happened) stays pending, uncounted, until the buyer's retry with the same
// payment resolves it: then it is recorded paid, once, and charged once.
func TestPaidMCPUnknownOutcomeIsReportedOnRetry(t *testing.T) {
	d, _ := sharedDevnet(t)
	vf := startVerifier(t)
	url := startCaddy(t, mcpHistorySite(vf, "lose_reply", gateDir(t))) + "/mcp"
	agent := "seller-mcp-lost"
	args := map[string]any{"task_id": "t-mcp", "agent_id": agent,
		"expected_schema": map[string]any{"type": "object"}, "submitted_output": map[string]any{"ok": true}}
	ctx := context.Background()
	postMCP(t, url, toolCall(t, "verify_schema", map[string]any{"task_id": "t-free", "expected_schema": map[string]any{}, "submitted_output": 1}, nil)) // the free call of the day
	_, body := postMCP(t, url, toolCall(t, "verify_schema", args, nil))
	payer := evmfacilitator.DevAccounts()[2].Address
	before := balance(t, d, payer)
	p := payDemand(t, body, 2)
	if _, body = postMCP(t, url, toolCall(t, "verify_schema", args, &p)); !strings.Contains(string(body), "settlement_pending") {
		t.Fatalf("first try: %s", body)
	}
	recs, _, err := vf.db.Verifications(ctx, agent, "", 10)
	if err != nil || len(recs) != 1 || recs[0].Payment != store.PaymentPending {
		t.Fatalf("before the retry: %+v, %v", recs, err)
	}
	for range 2 {
		_, body = postMCP(t, url, toolCall(t, "verify_schema", args, &p))
		if doc, isErr := toolResultOf(t, body); isErr || doc["verification_id"] != recs[0].ID {
			t.Fatalf("retry: %s", body)
		}
	}
	if v, err := vf.db.Verification(ctx, recs[0].ID); err != nil || v.Payment != store.PaymentPaid {
		t.Fatalf("after the retry: %+v, %v", v, err)
	}
	if c, err := vf.db.AgentCounts(ctx, agent); err != nil || c.Total() != 1 || c.Paid != 1 {
		t.Fatalf("counts %+v, %v", c, err)
	}
	if got := charged(t, d, payer, before); got.Int64() != 20000 {
		t.Fatalf("charged %s", got)
	}
}

// The answer held back for an unknown settlement is delivered to the
// buyer's retry under the retry's own JSON-RPC id (an MCP client sends
// each request with a new id and drops an answer naming another), with the
// settlement in its _meta.
func TestPaidMCPHeldAnswerNamesTheRetry(t *testing.T) {
	d, _ := sharedDevnet(t)
	vf := startVerifier(t)
	url := startCaddy(t, mcpHistorySite(vf, "lose_reply", gateDir(t))) + "/mcp"
	args := map[string]any{"task_id": "t-mcp-id", "agent_id": "seller-mcp-id",
		"expected_schema": map[string]any{"type": "object"}, "submitted_output": map[string]any{"ok": true}}
	postMCP(t, url, toolCall(t, "verify_schema", map[string]any{"task_id": "t-free", "expected_schema": map[string]any{}, "submitted_output": 1}, nil)) // the free call of the day
	_, body := postMCP(t, url, toolCall(t, "verify_schema", args, nil))
	payer := evmfacilitator.DevAccounts()[3].Address
	before := balance(t, d, payer)
	p := payDemand(t, body, 3)
	call := toolCall(t, "verify_schema", args, &p)
	if _, body = postMCP(t, url, call); !strings.Contains(string(body), "settlement_pending") {
		t.Fatalf("first try: %s", body)
	}
	for _, id := range []string{`"retry-1"`, `42`} {
		retry := strings.Replace(call, `"id":1,`, `"id":`+id+`,`, 1)
		if retry == call {
			t.Fatal("the call's id was not found")
		}
		_, body = postMCP(t, url, retry)
		var resp struct {
			ID     json.RawMessage `json:"id"`
			Result struct {
				Meta map[string]json.RawMessage `json:"_meta"`
			} `json:"result"`
		}
		if err := json.Unmarshal(body, &resp); err != nil || string(resp.ID) != id {
			t.Fatalf("retry with id %s answered as id %s (%v): %s", id, resp.ID, err, body)
		}
		var sr x402.SettleResponse
		if json.Unmarshal(resp.Result.Meta[mcpMetaPaymentResponse], &sr) != nil || !sr.Success {
			t.Fatalf("retry with id %s: no settlement in _meta: %s", id, body)
		}
		if doc, isErr := toolResultOf(t, body); isErr || doc["task_id"] != "t-mcp-id" {
			t.Fatalf("retry with id %s: %s", id, body)
		}
	}
	if got := charged(t, d, payer, before); got.Int64() != 20000 {
		t.Fatalf("charged %s", got)
	}
}

// A paid MCP verify_schema whose settling write lands on the store but
// whose reply is lost, the store then unreachable for the gate's tries
// (landed_blip_badger): the call is settlement_pending, charged, and
// recorded paid in the background (the transfer was made). Once the store is back,
// the retry under a new JSON-RPC id gets the answer held back, once
// charged and once counted.
func TestPaidMCPSettleWriteLandedIsServedOnRetry(t *testing.T) {
	d, _ := sharedDevnet(t)
	vf := startVerifier(t)
	site := strings.ReplaceAll(mcpHistorySite(vf, "none", gateDir(t)), "store badger ", "store landed_blip_badger ")
	url := startCaddy(t, site) + "/mcp"
	agent := "seller-mcp-landed"
	args := map[string]any{"task_id": "t-mcp-landed", "agent_id": agent,
		"expected_schema": map[string]any{"type": "object"}, "submitted_output": map[string]any{"ok": true}}
	ctx := context.Background()
	postMCP(t, url, toolCall(t, "verify_schema", map[string]any{"task_id": "t-free", "expected_schema": map[string]any{}, "submitted_output": 1}, nil)) // the free call of the day
	_, body := postMCP(t, url, toolCall(t, "verify_schema", args, nil))
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	p := payDemand(t, body, 6)
	call := toolCall(t, "verify_schema", args, &p)

	startLandedOutage(t)
	if _, body = postMCP(t, url, call); !strings.Contains(string(body), `"settlement_pending"`) || !strings.Contains(string(body), `"charged":true`) {
		t.Fatalf("first try: %s; want settlement_pending, charged", body)
	}
	// The report goes in the background (the 503 does not wait for it).
	var recs []store.Verification
	waitFor(t, "the report before the retry: paid (the transfer was made)", func() bool {
		var err error
		recs, _, err = vf.db.Verifications(ctx, agent, "", 10)
		return err == nil && len(recs) == 1 && recs[0].Payment == store.PaymentPaid
	})

	landedOutage.Store(0)
	retry := strings.Replace(call, `"id":1,`, `"id":"retry-1",`, 1)
	_, body = postMCP(t, url, retry)
	var resp struct {
		ID     json.RawMessage `json:"id"`
		Result struct {
			Meta map[string]json.RawMessage `json:"_meta"`
		} `json:"result"`
	}
	var sr x402.SettleResponse
	if json.Unmarshal(body, &resp) != nil || string(resp.ID) != `"retry-1"` || json.Unmarshal(resp.Result.Meta[mcpMetaPaymentResponse], &sr) != nil || !sr.Success {
		t.Fatalf("the retry once the store is back: %s; want the tool result under its id, with the settlement", body)
	}
	if doc, isErr := toolResultOf(t, body); isErr || doc["verification_id"] != recs[0].ID {
		t.Fatalf("the retry: %s; want the held answer", body)
	}
	if c, err := vf.db.AgentCounts(ctx, agent); err != nil || c.Total() != 1 || c.Paid != 1 {
		t.Fatalf("counts %+v, %v", c, err)
	}
	if got := charged(t, d, payer, before); got.Int64() != 20000 {
		t.Fatalf("charged %s", got)
	}
}
