package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// scoreSite is the score route and the MCP score tool as Caddyfile.example
// configures them: priced, never free, with validate score_request.
func scoreSite(up, mcpUp, fac string) string {
	return fmt.Sprintf(`:{port} {
	route /score/* {
		x402 {
			accept devnet $0.01 %[4]s
			route "GET /score/{agent_id}"
			facilitator http {
				url %[3]s
			}
			store badger {data}/gate
			validate score_request
		}
		reverse_proxy %[1]s
	}
	route /mcp {
		x402 {
			mcp_tool get_verification_record
			accept devnet $0.01 %[4]s
			facilitator http {
				url %[3]s
			}
			store badger {data}/gate
			validate score_request
		}
		reverse_proxy %[2]s
	}
}
`, strings.TrimPrefix(up, "http://"), strings.TrimPrefix(mcpUp, "http://"), fac, payTo.Hex())
}

// scorePayer is the development account the score tests pay from.
const scorePayer = 8

func getScore(t *testing.T, url, payment string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if payment != "" {
		req.Header.Set(x402.HeaderPaymentSignature, payment)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestTestAgentScoreIs422BeforePayment(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, scoreSite(up.URL, up.URL, fac))

	// A valid agent is offered for sale; its demand gives the payment the
	// refused requests carry.
	resp := getScore(t, base+"/score/seller-7", "")
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("valid agent: status %d, want 402", resp.StatusCode)
	}
	sig := signFor(t, paymentRequired(t, resp), scorePayer)
	payer := evmfacilitator.DevAccounts()[scorePayer].Address
	before := balance(t, d, payer)

	for _, tc := range []struct{ desc, path, payment string }{
		{"test- agent", "/score/test-demo", ""},
		{"test- agent with a payment", "/score/test-demo", sig},
		{"test- agent, URL-encoded", "/score/%74est-demo", sig},
		{"empty agent id", "/score/", sig},
		{"agent id over 200 characters", "/score/" + strings.Repeat("a", 201), sig},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			resp := getScore(t, base+tc.path, tc.payment)
			if resp.StatusCode != http.StatusUnprocessableEntity {
				t.Fatalf("status %d, want 422", resp.StatusCode)
			}
			for _, h := range []string{x402.HeaderPaymentRequired, x402.HeaderPaymentResponse} {
				if v := resp.Header.Get(h); v != "" {
					t.Errorf("%s sent with the refusal: %.80s", h, v)
				}
			}
			m := readJSON(t, resp)
			fields, _ := m["fields"].([]any)
			if m["code"] != "invalid_request" || m["charged"] != false || len(fields) != 1 || fields[0].(map[string]any)["field"] != "agent_id" {
				t.Fatalf("body %v", m)
			}
		})
	}
	if up.calls.Load() != 0 {
		t.Fatalf("the upstream ran %d times for refused requests", up.calls.Load())
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("a refused score request was charged")
	}
	// The payment sent with the refusals was neither settled nor claimed:
	// it still buys a valid agent's score, exactly once.
	if resp := getScore(t, base+"/score/seller-7", sig); resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("the payment after the refusals: status %d, PAYMENT-RESPONSE %q", resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse))
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(10000)) != 0 {
		t.Fatalf("charged %v, want 10000", got)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("the upstream ran %d times, want 1", up.calls.Load())
	}
}

// TestScoreRouteIsThePublicPath: route names the path the client sends (as
// /.well-known/x402 lists it), and validate score_request reads the agent
// id from that path, whatever handle_path strips before the gate: a valid
// agent is offered for sale, a test- or empty one is 422 as without the
// prefix.
func TestScoreRouteIsThePublicPath(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, strippedSite(up.URL, fac, "validate score_request"))
	for path, want := range map[string]int{
		"/api/score/agent-1":   http.StatusPaymentRequired,
		"/v2/score/agent-1":    http.StatusPaymentRequired,
		"/api/score/test-demo": http.StatusUnprocessableEntity,
		"/api/score/":          http.StatusUnprocessableEntity,
	} {
		resp := getScore(t, base+path, "")
		if resp.StatusCode != want {
			t.Errorf("GET %s: status %d, want %d", path, resp.StatusCode, want)
			continue
		}
		if want == http.StatusUnprocessableEntity {
			m := readJSON(t, resp)
			fields, _ := m["fields"].([]any)
			if m["code"] != "invalid_request" || m["charged"] != false || len(fields) != 1 || fields[0].(map[string]any)["field"] != "agent_id" {
				t.Errorf("GET %s: body %v", path, m)
			}
		}
	}
	if up.calls.Load() != 0 {
		t.Fatalf("the upstream ran %d times for unpaid requests", up.calls.Load())
	}
}

// toolErrorOf reads the SPEC §6 error of a tool error result.
func toolErrorOf(t *testing.T, res *mcp.CallToolResult) map[string]any {
	t.Helper()
	b, _ := json.Marshal(res.StructuredContent)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil || !res.IsError {
		t.Fatalf("not a tool error: isError %v, %s", res.IsError, b)
	}
	if _, demand := m["accepts"]; demand || m["x402Version"] != nil {
		t.Fatalf("a payment-required result, not a refusal: %s", b)
	}
	if res.Meta[mcpMetaPaymentResponse] != nil {
		t.Fatalf("a settlement with the refusal: %v", res.Meta)
	}
	return m
}

func TestScoreToolArgumentsAreRefusedBeforePayment(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, scoreSite(up.URL, up.URL, fac))
	s := mcpSession(t, base+"/mcp")

	// A valid agent gets the demand.
	pr := demandOf(t, callTool(t, s, "get_verification_record", map[string]any{"agent_id": "seller-7"}, nil))
	if pr.Accepts[0].Amount != "10000" {
		t.Fatalf("score tool priced %s", pr.Accepts[0].Amount)
	}
	meta := payMeta(t, pr, scorePayer)
	payer := evmfacilitator.DevAccounts()[scorePayer].Address
	before := balance(t, d, payer)

	for _, tc := range []struct {
		desc, field string
		args        any
		meta        mcp.Meta
	}{
		{"test- agent", "agent_id", map[string]any{"agent_id": "test-demo"}, nil},
		{"test- agent with a payment", "agent_id", map[string]any{"agent_id": "test-demo"}, meta},
		{"no arguments", "agent_id", nil, meta},
		{"agent_id missing", "agent_id", map[string]any{}, nil},
		{"agent_id not a string", "agent_id", map[string]any{"agent_id": 7}, meta},
		{"agent_id empty", "agent_id", map[string]any{"agent_id": ""}, meta},
		{"an extra argument", "arguments", map[string]any{"agent_id": "seller-7", "window": 5}, meta},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			m := toolErrorOf(t, callTool(t, s, "get_verification_record", tc.args, tc.meta))
			fields, _ := m["fields"].([]any)
			if m["code"] != "invalid_request" || m["status"] != float64(422) || m["charged"] != false || len(fields) == 0 || fields[0].(map[string]any)["field"] != tc.field {
				t.Fatalf("error %v", m)
			}
		})
	}
	if up.calls.Load() != 0 {
		t.Fatalf("the tool ran %d times for refused calls", up.calls.Load())
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("a refused tool call was charged")
	}
	// The payment the refused calls carried is still unspent.
	res := callTool(t, s, "get_verification_record", map[string]any{"agent_id": "seller-7"}, meta)
	if res.IsError || res.Meta[mcpMetaPaymentResponse] == nil {
		t.Fatalf("paid call after the refusals: %+v", res)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(10000)) != 0 {
		t.Fatalf("charged %v, want 10000", got)
	}
	if _, err := s.ListTools(context.Background(), nil); err != nil {
		t.Fatalf("the session broke: %v", err)
	}
}
