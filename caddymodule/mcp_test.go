package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// mcpUpstream is a real MCP server (the official Go SDK, Streamable HTTP,
// JSON responses) with a verify_schema tool that passes or, for task_id
// "tool-fails", answers a tool error, and a get_verification_record tool.
type mcpUpstream struct {
	*httptest.Server
	calls      atomic.Int64
	sawPayment atomic.Bool
	lastPaid   atomic.Value // the X-Aov-Payment header of the last call
}

func newMCPUpstream(t *testing.T) *mcpUpstream {
	u := &mcpUpstream{}
	server := mcp.NewServer(&mcp.Implementation{Name: "test-verifier", Version: "1"}, nil)
	schema := json.RawMessage(`{"type":"object"}`)
	server.AddTool(&mcp.Tool{Name: "verify_schema", InputSchema: schema}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.calls.Add(1)
		if _, ok := req.Params.Meta[mcpMetaPayment]; ok {
			u.sawPayment.Store(true)
		}
		u.lastPaid.Store(req.Extra.Header.Get(HeaderUpstreamPayment))
		var args struct {
			TaskID string `json:"task_id"`
		}
		json.Unmarshal(req.Params.Arguments, &args)
		if args.TaskID == "tool-fails" {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "the tool failed"}}}, nil
		}
		return &mcp.CallToolResult{
			Content:           []mcp.Content{&mcp.TextContent{Text: `{"result":"pass"}`}},
			StructuredContent: map[string]any{"result": "pass"},
		}, nil
	})
	server.AddTool(&mcp.Tool{Name: "get_verification_record", InputSchema: schema}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.calls.Add(1)
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: `{"score":0.9}`}}, StructuredContent: map[string]any{"score": 0.9}}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	u.Server = httptest.NewServer(h)
	t.Cleanup(u.Close)
	return u
}

func mcpSite(up, fac string, perDay int) string {
	return fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			description "Verify an agent's JSON output"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			validate verify_request
			free_allowance {
				pool verify
				per_day %[4]d
			}
		}
		x402 {
			mcp_tool get_verification_record
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex(), perDay)
}

func mcpSession(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	c := mcp.NewClient(&mcp.Implementation{Name: "buyer", Version: "1"}, nil)
	s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatalf("connecting through the gate: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

var verifyArgs = map[string]any{
	"task_id":          "t-mcp",
	"expected_schema":  map[string]any{"type": "object"},
	"submitted_output": map[string]any{"ok": true},
}

func callTool(t *testing.T, s *mcp.ClientSession, tool string, args any, meta mcp.Meta) *mcp.CallToolResult {
	t.Helper()
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args, Meta: meta})
	if err != nil {
		t.Fatalf("calling %s: %v", tool, err)
	}
	return res
}

// demandOf reads the PaymentRequired of a payment-required tool result.
func demandOf(t *testing.T, res *mcp.CallToolResult) x402.PaymentRequired {
	t.Helper()
	if !res.IsError {
		t.Fatalf("not a payment-required result: %+v", res)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var pr x402.PaymentRequired
	if err := json.Unmarshal(b, &pr); err != nil || pr.X402Version != 2 || len(pr.Accepts) == 0 {
		t.Fatalf("structuredContent is not a PaymentRequired: %s", b)
	}
	text := res.Content[0].(*mcp.TextContent).Text
	var fromText x402.PaymentRequired
	if err := json.Unmarshal([]byte(text), &fromText); err != nil || fromText.Accepts[0].Amount != pr.Accepts[0].Amount {
		t.Fatalf("text content is not the same PaymentRequired: %s", text)
	}
	return pr
}

// payMeta signs a payment for the first offer and carries it as x402's MCP
// transport does: the PaymentPayload object in _meta.
func payMeta(t *testing.T, pr x402.PaymentRequired, payer int) mcp.Meta {
	t.Helper()
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(payer), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(p)
	var obj map[string]any
	json.Unmarshal(b, &obj)
	return mcp.Meta{mcpMetaPayment: obj}
}

func TestMCPToolsArePricedLikeTheirRESTTwins(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 1))
	s := mcpSession(t, base+"/mcp")

	// initialize (in Connect) and tools/list are free.
	tools, err := s.ListTools(context.Background(), nil)
	if err != nil || len(tools.Tools) != 2 {
		t.Fatalf("tools/list through the gate: %v %v", tools, err)
	}

	// One free call, drawn from the allowance.
	if res := callTool(t, s, "verify_schema", verifyArgs, nil); res.IsError {
		t.Fatalf("free call refused: %+v", res)
	}
	if up.lastPaid.Load() != "free" {
		t.Errorf("the tool was told payment=%v", up.lastPaid.Load())
	}

	// Then a payment-required result, with free_trial_exhausted in _meta.
	res := callTool(t, s, "verify_schema", verifyArgs, nil)
	pr := demandOf(t, res)
	if res.Meta["code"] != "free_trial_exhausted" || pr.Resource.URL != base+"/mcp" || pr.Accepts[0].Amount != "20000" {
		t.Fatalf("demand %+v, _meta %v", pr, res.Meta)
	}

	// Paying in _meta runs the tool, settles, and reports the settlement.
	payer := evmfacilitator.DevAccounts()[1].Address
	before := balance(t, d, payer)
	meta := payMeta(t, pr, 1)
	res = callTool(t, s, "verify_schema", verifyArgs, meta)
	if res.IsError {
		t.Fatalf("paid call: %+v", res)
	}
	b, _ := json.Marshal(res.Meta[mcpMetaPaymentResponse])
	var sr x402.SettleResponse
	if err := json.Unmarshal(b, &sr); err != nil || !sr.Success || sr.Transaction == "" {
		t.Fatalf("_meta[x402/payment-response] = %s", b)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want 20000", got)
	}
	if up.sawPayment.Load() {
		t.Error("the tool saw the payment")
	}
	if up.lastPaid.Load() != "paid" {
		t.Errorf("the tool was told payment=%v", up.lastPaid.Load())
	}

	// The same payment again is refused.
	res = callTool(t, s, "verify_schema", verifyArgs, meta)
	demandOf(t, res)
	if res.Meta["reason"] != x402.ReasonPaymentAlreadyUsed {
		t.Fatalf("replay _meta %v", res.Meta)
	}

	// get_verification_record is never free.
	res = callTool(t, s, "get_verification_record", map[string]any{"agent_id": "a"}, nil)
	if demandOf(t, res).Accepts[0].Amount != "10000" {
		t.Fatal("score tool priced wrong")
	}
}

func TestMCPToolErrorIsNotCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 0))
	s := mcpSession(t, base+"/mcp")
	pr := demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil))
	payer := evmfacilitator.DevAccounts()[2].Address
	before := balance(t, d, payer)
	failing := map[string]any{"task_id": "tool-fails", "expected_schema": map[string]any{}, "submitted_output": 1}
	res := callTool(t, s, "verify_schema", failing, payMeta(t, pr, 2))
	if !res.IsError || res.Meta[mcpMetaPaymentResponse] != nil {
		t.Fatalf("tool error result %+v", res)
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("a tool error was charged")
	}
}

func TestMCPInvalidArgumentsAreAnErrorBeforePayment(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 0))
	s := mcpSession(t, base+"/mcp")
	res := callTool(t, s, "verify_schema", map[string]any{"task_id": ""}, nil)
	b, _ := json.Marshal(res.StructuredContent)
	var e struct {
		Code    string `json:"code"`
		Charged bool   `json:"charged"`
	}
	json.Unmarshal(b, &e)
	if !res.IsError || e.Code != "invalid_request" || e.Charged {
		t.Fatalf("result %s", b)
	}
	if up.calls.Load() != 0 {
		t.Error("the tool ran for invalid arguments")
	}
}

func TestMCPBatchesAreRefused(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, mcpSite(up.URL, fac, 5))
	body := `[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}]`
	req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || up.calls.Load() != 0 {
		t.Fatalf("batch: status %d, tool calls %d", resp.StatusCode, up.calls.Load())
	}
}

func TestRESTAndMCPShareOneAllowance(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	rest := newUpstream(t)
	site := strings.Replace(mcpSite(up.URL, fac, 1), "\troute /mcp {", fmt.Sprintf(`	route /verify/schema {
		x402 {
			accept devnet $0.02 %s
			facilitator http {
				url %s
			}
			store badger {data}/gate
			validate verify_request
			free_allowance {
				pool verify
				per_day 1
			}
		}
		reverse_proxy %s
	}
	route /mcp {`, payTo.Hex(), fac, strings.TrimPrefix(rest.URL, "http://")), 1)
	base := startCaddy(t, site)
	if resp := post(t, base+"/verify/schema", validRequest, nil); resp.StatusCode != 200 {
		t.Fatalf("REST free call: %d", resp.StatusCode)
	}
	s := mcpSession(t, base+"/mcp")
	res := callTool(t, s, "verify_schema", verifyArgs, nil)
	demandOf(t, res)
	if res.Meta["code"] != "free_trial_exhausted" {
		t.Fatalf("the MCP call did not see the REST call's use of the allowance: %v", res.Meta)
	}
}

// A replay of a payment settled moments ago, within its attempt span on
// Redis (maybe settled by a gateway that still holds its answer), is
// answered settlement_pending, charged, as the call's tool result: before,
// an MCP buyer got a bare 503 its client could not read.
func TestMCPReplayOfSettledPaymentWithinItsSpanIsAToolResult(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	srv := servers.StartRedis(t)
	site := fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store redis %[4]s {
				prefix mcpreplayspan
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), srv.Addr)
	base := startCaddy(t, site)
	s := mcpSession(t, base+"/mcp")
	pr := demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil))
	meta := payMeta(t, pr, 3)
	first := callTool(t, s, "verify_schema", verifyArgs, meta)
	if first.IsError || first.Meta[mcpMetaPaymentResponse] == nil {
		t.Fatalf("the paid call: %+v", first)
	}
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: verifyArgs, Meta: meta})
	if err != nil {
		t.Fatalf("the replay's answer is not a JSON-RPC tool result: %v", err)
	}
	if c := toolErrorOf(t, res); c["code"] != codeSettlementPending || c["charged"] != true {
		t.Fatalf("the replay: %+v; want settlement_pending, charged", res)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("the tool ran %d times, want once", up.calls.Load())
	}
}

// Each refusal of a paid call that once skipped the exchange answers an MCP
// buyer with the tool error a REST buyer gets as HTTP: the same code and
// the same charged flag. An MCP client's transport rejects a bare 502/503
// unread, so the buyer would never learn it was charged, nor "do not sign
// a new payment". Both routes share the gate's options. (The answer
// settle_on pass withholds cannot reach an MCP gate: that pairing does not
// load.)
func TestMCPRefusalsMatchTheirRESTAnswers(t *testing.T) {
	d, fac := sharedDevnet(t)
	cases := []struct {
		name string
		opts string // the gates' options; %s is the store's folder
		// outage, if set, starts a store fault just before each paid call.
		outage  func(*testing.T)
		status  int
		code    string
		charged bool
	}{
		{name: "unknown settlement outcome", opts: "facilitator faulty_devnet lose_request\n\t\t\tstore badger %s",
			status: http.StatusServiceUnavailable, code: codeSettlementPending},
		{name: "answer larger than max_buffer", opts: "facilitator http {\n\t\t\t\turl " + fac + "\n\t\t\t}\n\t\t\tstore badger %s\n\t\t\tmax_buffer 16",
			status: http.StatusBadGateway, code: "upstream_response_too_large"},
		{name: "settled, not recorded", opts: "facilitator faulty_devnet none\n\t\t\tstore landed_blip_badger %s",
			outage: startLandedOutage, status: http.StatusServiceUnavailable, code: codeSettlementPending, charged: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			up, mup := newUpstream(t), newMCPUpstream(t)
			site := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			%[4]s
		}
		reverse_proxy %[1]s
	}
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			%[5]s
		}
		reverse_proxy %[2]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), strings.TrimPrefix(mup.URL, "http://"), payTo.Hex(),
				fmt.Sprintf(tc.opts, "{data}/rest"), fmt.Sprintf(tc.opts, "{data}/mcp"))
			base := startCaddy(t, site)
			payer := evmfacilitator.DevAccounts()[4].Address
			before := balance(t, d, payer)

			url := base + "/verify/schema"
			sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 4)
			if tc.outage != nil {
				tc.outage(t)
			}
			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			rest := readJSON(t, resp)
			if resp.StatusCode != tc.status || rest["code"] != tc.code || rest["charged"] != tc.charged {
				t.Fatalf("REST: status %d, %v; want %d %s charged %v", resp.StatusCode, rest, tc.status, tc.code, tc.charged)
			}
			landedOutage.Store(0)

			s := mcpSession(t, base+"/mcp")
			meta := payMeta(t, demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil)), 4)
			if tc.outage != nil {
				tc.outage(t)
			}
			res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: verifyArgs, Meta: meta})
			if err != nil {
				t.Fatalf("MCP: not a JSON-RPC tool result: %v", err)
			}
			if c := toolErrorOf(t, res); c["code"] != rest["code"] || c["charged"] != rest["charged"] || c["status"] != float64(tc.status) {
				t.Fatalf("MCP: %v; want the REST answer's code %v, charged %v, status %d", c, rest["code"], rest["charged"], tc.status)
			}
			want := int64(0)
			if tc.charged {
				want = 2 * 20000
			}
			if got := charged(t, d, payer, before); got.Int64() != want {
				t.Fatalf("charged %s on chain, want %d", got, want)
			}
		})
	}
}

// One gate per priced tool: a second gate applied its own max_body to
// every message the first had read, before looking at the tool, so a
// call of the first gate's tool over the second's limit could never be
// served, and was refused with a bare HTTP 413 the MCP client cannot read.
// Now a gate's max_body bounds its own tool's calls only, answered as a
// tool result.
func TestMCPGateMaxBodyBoundsItsOwnTool(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
			free_allowance {
				per_day 5
			}
		}
		x402 {
			mcp_tool get_verification_record
			accept devnet $0.01 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
			max_body 200
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	s := mcpSession(t, base+"/mcp")
	big := map[string]any{"task_id": "t-mcp", "expected_schema": map[string]any{"type": "object"},
		"submitted_output": map[string]any{"text": strings.Repeat("x", 400)}}
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: big})
	if err != nil || res.IsError {
		t.Fatalf("a free call of verify_schema over the other gate's max_body: %v %+v", err, res)
	}
	res, err = s.CallTool(context.Background(), &mcp.CallToolParams{Name: "get_verification_record",
		Arguments: map[string]any{"verification_id": strings.Repeat("v", 400)}})
	if err != nil {
		t.Fatalf("a call over its own gate's max_body is not a tool result: %v", err)
	}
	if c := toolErrorOf(t, res); c["code"] != apierr.CodePayloadTooLarge || c["charged"] != false {
		t.Fatalf("over its own gate's max_body: %v", c)
	}
}
