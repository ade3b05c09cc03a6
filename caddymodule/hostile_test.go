package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// realSite puts the gate in front of a real verifierd (REST and MCP), as
// make run does: one shared allowance of perDay calls.
func realSite(vf *verifierFixture, fac string, perDay int, extra string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			validate verify_request
			free_allowance {
				pool verify
				per_day %[4]d
			}
			%[6]s
		}
		reverse_proxy %[1]s {
			header_up X-Aov-Gateway-Token %[5]s
		}
	}
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			validate verify_request
			free_allowance {
				pool verify
				per_day %[4]d
			}
			%[6]s
		}
		x402 {
			mcp_tool get_verification_record
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			%[6]s
		}
		reverse_proxy %[1]s {
			header_up X-Aov-Gateway-Token %[5]s
		}
	}
}
`, strings.TrimPrefix(vf.srv.URL, "http://"), fac, payTo.Hex(), perDay, verifierToken, extra)
}

// postMCP sends one raw JSON-RPC body as an MCP client would.
func postMCP(t *testing.T, url, body string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// servedTool reports whether an MCP answer is a successful tool result.
func servedTool(body []byte) bool {
	var m struct {
		Result *struct {
			IsError bool `json:"isError"`
		} `json:"result"`
	}
	return json.Unmarshal(body, &m) == nil && m.Result != nil && !m.Result.IsError
}

func TestHostileRequestsAreNeitherServedNorRecorded(t *testing.T) {
	_, fac := sharedDevnet(t)
	vf := startVerifier(t)
	base := startCaddy(t, realSite(vf, fac, 1, "rate_limit off"))

	// The day's one free call, so every request below finds the allowance
	// used up.
	if resp := post(t, base+"/verify/schema", validRequest, nil); resp.StatusCode != 200 {
		t.Fatalf("the free call: %d", resp.StatusCode)
	}
	calls := vf.calls.Load()

	rest := []struct {
		desc   string
		body   string
		status int
	}{
		{"an invalid request", `{"task_id":""}`, 422},
		{"trailing bytes after the request", validRequest + `{"task_id":"x"}`, 422},
		{"a byte-order mark", "\xef\xbb\xbf" + validRequest, 422},
		{"a member twice", strings.Replace(validRequest, `{"task_id":"t-1",`, `{"task_id":"t-1","task_id":"t-2",`, 1), 422},
		{"a valid request without payment", validRequest, 402},
		{"a pathological pattern over a long string", hostileCosts[0].body(), 402},
		// Deterministic, unlike the pattern's cost: the gate's precheck
		// counts it and refuses before asking for payment.
		{"a hundred rules over one large array", overIntegrityBudget(), 422},
		{"a body over the limit", `{"pad":"` + strings.Repeat("x", 1<<20) + `"}`, 413},
	}
	for _, tc := range rest {
		t.Run("REST: "+tc.desc, func(t *testing.T) {
			resp := post(t, base+"/verify/schema", tc.body, nil)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.status)
			}
		})
	}
	for _, h := range hostileEnvelopes {
		switch h.desc {
		case "a free method", "a notification":
			continue // free messages: they pass, and run no tool
		}
		t.Run("MCP: "+h.desc, func(t *testing.T) {
			resp, body := postMCP(t, base+"/mcp", h.body)
			if servedTool(body) {
				t.Fatalf("served: %d %.300s", resp.StatusCode, body)
			}
			for _, leak := range []string{"free_tool", "garbage", `"b"`} {
				if bytes.Contains(body, []byte(leak)) {
					t.Errorf("the answer repeats the request's content %s: %.300s", leak, body)
				}
			}
		})
	}
	if got := vf.calls.Load(); got != calls {
		t.Errorf("verifierd was called %d times for refused or unpaid requests", got-calls)
	}
}

func TestInvalidRequestsServedFreeOrPaidAre422AndCostNothing(t *testing.T) {
	d, fac := sharedDevnet(t)
	vf := startVerifier(t)
	base := startCaddy(t, realSite(vf, fac, 1, ""))
	url := base + "/verify/schema"
	// Valid for the gate's precheck, refused by verifierd's evaluation is
	// not needed: a request the gate does not check at all on the free
	// path is checked once, by verifierd.
	invalid := `{"task_id":"t","expected_schema":{"type":"nope"},"submitted_output":1}`

	resp := post(t, url, invalid, nil)
	if resp.StatusCode != 422 || resp.Header.Get(HeaderFreeRemaining) != "" {
		t.Fatalf("invalid free call: %d, remaining %q", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
	}
	if m := readJSON(t, resp); m["code"] != "invalid_request" || m["charged"] != false {
		t.Fatalf("body %v", m)
	}
	if vf.calls.Load() != 1 {
		t.Fatalf("verifierd calls %d: the free call was not checked by verifierd once", vf.calls.Load())
	}
	// Invalid MCP arguments from the allowance: a tool error, the unit kept.
	s := mcpSession(t, base+"/mcp")
	res := callTool(t, s, "verify_schema", map[string]any{"task_id": "t", "expected_schema": map[string]any{"type": "nope"}, "submitted_output": 1}, nil)
	if !res.IsError || res.Meta[codeFreeTrialExhausted] != nil {
		t.Fatalf("invalid MCP free call: %+v", res)
	}
	if resp := post(t, url, validRequest, nil); resp.StatusCode != 200 || resp.Header.Get(HeaderFreeRemaining) != "0" {
		t.Fatalf("the unit was used by invalid calls: %d %q", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
	}

	// An invalid request carrying a valid payment: 422 from verifierd, not
	// settled; the same payment then buys a valid call.
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[3].Address
	before := balance(t, d, payer)
	sig := signFor(t, pr, 3)
	resp = post(t, url, invalid, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != 422 || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("invalid paid call: %d, PAYMENT-RESPONSE %q", resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse))
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("an invalid request was charged")
	}
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		t.Fatalf("the same payment for a valid request: %d, reason %v", resp.StatusCode, readJSON(t, resp)["reason"])
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want 20000", got)
	}
}

func TestRefusalsAreRateLimitedPerClient(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	mcpUp := newMCPUpstream(t)
	site := strings.Replace(gateSite(up.URL, fac, 1, "rate_limit 3 1m"), ":{port} {", fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %s
			facilitator http {
				url %s
			}
			store badger {data}/gate
			rate_limit 3 1m
		}
		reverse_proxy %s
	}`, payTo.Hex(), fac, strings.TrimPrefix(mcpUp.URL, "http://")), 1)
	site = strings.ReplaceAll(site, "{data}", t.TempDir())
	base := startCaddy(t, site)
	port, _ := strconv.Atoi(base[strings.LastIndex(base, ":")+1:])
	url := base + "/verify/schema"

	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	now = func() time.Time { return t0 }
	t.Cleanup(func() { now = time.Now })

	// A served call never counts.
	if resp := post(t, url, validRequest, nil); resp.StatusCode != 200 {
		t.Fatalf("free call: %d", resp.StatusCode)
	}
	for i := range 3 {
		if resp := post(t, url, "", nil); resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("refusal %d: %d", i+1, resp.StatusCode)
		}
	}
	limited := func(t *testing.T) {
		t.Helper()
		resp := post(t, url, validRequest, nil)
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "20" {
			t.Fatalf("after 3 refusals: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		if m := readJSON(t, resp); m["code"] != "rate_limited" || m["retryable"] != true || m["charged"] != false {
			t.Fatalf("body %v", m)
		}
	}
	limited(t)
	// The priced MCP tool shares the zone: a tool error with Retry-After.
	_, body := postMCP(t, base+"/mcp", hostileEnvelopes[0].body)
	if servedTool(body) || !bytes.Contains(body, []byte(`rate_limited`)) {
		t.Fatalf("MCP after 3 refusals: %.300s", body)
	}
	// A reload keeps the state.
	loadCaddy(t, port, site)
	limited(t)
	// The budget refills across the window: one event every 20 s.
	now = func() time.Time { return t0.Add(20 * time.Second) }
	if resp := post(t, url, "", nil); resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("after the refill: %d", resp.StatusCode)
	}
	limited(t)
	if up.calls.Load() != 1 || mcpUp.calls.Load() != 0 {
		t.Errorf("upstream calls %d and %d, want the one free call", up.calls.Load(), mcpUp.calls.Load())
	}
}

func TestRateLimitCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct{ desc, caddyfile, want string }{
		{"events must be a number", "x402 {\n rate_limit many 1m\n}", "rate_limit events must be a positive number"},
		{"events must be positive", "x402 {\n rate_limit {\n events 0\n }\n}", "rate_limit events must be a positive number"},
		{"the window must be a duration", "x402 {\n rate_limit 5 soon\n}", "rate_limit window must be a positive duration"},
		{"off takes no block", "x402 {\n rate_limit off {\n events 3\n }\n}", "rate_limit off takes no block"},
		{"one argument is not a form", "x402 {\n rate_limit 5\n}", "wrong argument count"},
		{"unknown options are refused", "x402 {\n rate_limit {\n burst 3\n }\n}", "unrecognized rate_limit option 'burst'"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			wantErr(t, adaptSiteError(tc.caddyfile), tc.want)
		})
	}
}

func TestWrongMethodsOfPricedRoutesAre405BeforePayment(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, ""))
	for _, tc := range []struct {
		desc, method, path, allow string
		status                    int
	}{
		{"GET of the verify route is 405", http.MethodGet, "/verify/schema", "POST", 405},
		{"PUT of the verify route is 405", http.MethodPut, "/verify/schema", "POST", 405},
		{"POST of the score route is 405", http.MethodPost, "/score/agent-1", "GET, HEAD", 405},
		{"HEAD of the score route is priced like GET", http.MethodHead, "/score/agent-1", "", 402},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, base+tc.path, strings.NewReader(validRequest))
			resp, err := testClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.status || resp.Header.Get("Allow") != tc.allow {
				t.Fatalf("status %d, Allow %q; want %d, %q", resp.StatusCode, resp.Header.Get("Allow"), tc.status, tc.allow)
			}
			if tc.status == 405 {
				if m := readJSON(t, resp); m["code"] != "method_not_allowed" || m["charged"] != false {
					t.Errorf("body %v", m)
				}
				if resp.Header.Get(x402.HeaderPaymentRequired) != "" {
					t.Error("a request the route cannot serve was offered for sale")
				}
			}
		})
	}
	if up.calls.Load() != 0 {
		t.Errorf("the upstream ran %d times", up.calls.Load())
	}
}

// overIntegrityBudget is a 100 KB request whose hundred unique rules over
// one array of 12,000 numbers need more than the integrity-work budget
// (about 20,000,000 units of verify.DefaultMaxIntegrityWork's 16,777,216).
func overIntegrityBudget() string {
	var b strings.Builder
	b.WriteString(`{"task_id":"t","expected_schema":{},"rules":[`)
	b.WriteString(strings.TrimSuffix(strings.Repeat(`{"type":"unique","field":"a[]"},`, 100), ","))
	b.WriteString(`],"submitted_output":{"a":[0`)
	for i := 1; i < 12000; i++ {
		b.WriteString("," + strconv.Itoa(i))
	}
	b.WriteString(`]}}`)
	return b.String()
}

// TestPaidMCPCallChecksTheNumbersAsSent: a number a double cannot hold
// exactly is refused by verifierd (it would be recorded as another value
// than the one checked), over REST and over a paid MCP call alike. The
// gate takes the payment out of the paid call by cutting its bytes out of
// the message, not by encoding the message again, which would have
// rounded 1.00000000000000000001 to 1 and had a verdict on 1 certified
// and settled.
func TestPaidMCPCallChecksTheNumbersAsSent(t *testing.T) {
	d, fac := sharedDevnet(t)
	vf := startVerifier(t)
	base := startCaddy(t, realSite(vf, fac, 0, "rate_limit off"))
	args := `{"task_id":"t-num","expected_schema":{"type":"object","properties":{"n":{"type":"number","maximum":1}}},"submitted_output":{"n":1.00000000000000000001}}`

	resp := post(t, base+"/verify/schema", args, nil)
	if m := readJSON(t, resp); resp.StatusCode != http.StatusUnprocessableEntity || m["code"] != "invalid_request" {
		t.Fatalf("REST: %d %v", resp.StatusCode, m)
	}

	s := mcpSession(t, base+"/mcp")
	pr := demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil))
	payer := evmfacilitator.DevAccounts()[3].Address
	before := balance(t, d, payer)
	meta, _ := json.Marshal(map[string]any(payMeta(t, pr, 3)))
	// The payment between the arguments and another _meta member: the cut
	// takes it and one comma, and leaves the rest as sent.
	_, raw := postMCP(t, base+"/mcp", `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"verify_schema","arguments":`+args+
		`,"_meta":{"x402/payment":`+string(meta[len(`{"x402/payment":`):len(meta)-1])+` , "progressToken":"p"}}}`)
	var msg struct {
		Result *struct {
			IsError           bool           `json:"isError"`
			StructuredContent map[string]any `json:"structuredContent"`
			Meta              map[string]any `json:"_meta"`
		} `json:"result"`
	}
	if err := json.Unmarshal(raw, &msg); err != nil || msg.Result == nil {
		t.Fatalf("paid MCP: %s", raw)
	}
	if !msg.Result.IsError || msg.Result.StructuredContent["code"] != "invalid_request" || msg.Result.Meta[mcpMetaPaymentResponse] != nil {
		t.Fatalf("paid MCP call with an inexact number: %s; want the invalid_request tool error REST gives, not settled", raw)
	}
	if !strings.Contains(fmt.Sprint(msg.Result.StructuredContent["message"]), "submitted_output.n") {
		t.Fatalf("the refusal does not name submitted_output.n: %v", msg.Result.StructuredContent["message"])
	}
	if balance(t, d, payer).Cmp(before) != 0 {
		t.Fatal("the refused call was charged")
	}
}
