package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verify"
)

// headerTransport adds the gateway's headers to every request, as the
// gateway does when it forwards /mcp.
type headerTransport struct {
	hdr  map[string]string
	base http.RoundTripper
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.hdr {
		r.Header.Set(k, v)
	}
	return h.base.RoundTrip(r)
}

// serve puts the fixture's handler on a real loopback listener.
func (f *fixture) serve(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(f.h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// mcpSession connects the official Go SDK client to /mcp.
func mcpSession(t testing.TB, base string, hdr map[string]string) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: "aov-test", Version: "1"}, nil)
	tr := &mcp.StreamableClientTransport{Endpoint: base + "/mcp", DisableStandaloneSSE: true,
		HTTPClient: &http.Client{Transport: headerTransport{hdr: hdr, base: http.DefaultTransport}, Timeout: 30 * time.Second}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, tr, nil)
	if err != nil {
		t.Fatalf("connecting to /mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// call calls a tool and returns the result with its text content, which
// must be the same JSON as its structured content.
func call(t testing.TB, cs *mcp.ClientSession, tool string, args any) (*mcp.CallToolResult, []byte, map[string]any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("calling %s: %v", tool, err)
	}
	if len(res.Content) != 1 {
		t.Fatalf("%d content items, want 1", len(res.Content))
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("content is %T, want text", res.Content[0])
	}
	var fromText map[string]any
	if err := json.Unmarshal([]byte(tc.Text), &fromText); err != nil {
		t.Fatalf("text content is not JSON: %v", err)
	}
	sc, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	var structured map[string]any
	if err := json.Unmarshal(sc, &structured); err != nil {
		t.Fatalf("structuredContent is not an object: %v", err)
	}
	if !reflect.DeepEqual(structured, fromText) {
		t.Fatalf("structuredContent and text content differ:\n%v\n%v", structured, fromText)
	}
	return res, []byte(tc.Text), structured
}

func TestMCPListTools(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	cs := mcpSession(t, f.serve(t), nil)
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		tools[tl.Name] = tl
	}
	for _, c := range []struct {
		desc     string
		tool     string
		required []any
		props    []string
		readOnly bool
	}{
		{"verify_schema takes the fields of POST /verify/schema", "verify_schema", []any{"task_id", "expected_schema", "submitted_output"},
			[]string{"agent_id", "bounds", "detail", "enforce_rules", "expected_schema", "rules", "strict_content_check", "submitted_output", "task_id"}, false},
		{"get_verification_record takes an agent_id", "get_verification_record", []any{"agent_id"}, []string{"agent_id"}, true},
	} {
		t.Run(c.desc, func(t *testing.T) {
			tl := tools[c.tool]
			if tl == nil {
				t.Fatalf("no tool %s among %v", c.tool, res.Tools)
			}
			if tl.Description == "" || tl.Title == "" {
				t.Error("no description or title")
			}
			if tl.Annotations == nil || tl.Annotations.ReadOnlyHint != c.readOnly {
				t.Errorf("annotations %+v", tl.Annotations)
			}
			raw, _ := json.Marshal(tl.InputSchema)
			var sch map[string]any
			if err := json.Unmarshal(raw, &sch); err != nil {
				t.Fatal(err)
			}
			if sch["type"] != "object" || sch["additionalProperties"] != false || !reflect.DeepEqual(sch["required"], c.required) {
				t.Errorf("schema head %v %v %v", sch["type"], sch["additionalProperties"], sch["required"])
			}
			props := sch["properties"].(map[string]any)
			if got := keysOf(props); !reflect.DeepEqual(got, c.props) {
				t.Errorf("properties %v, want %v", got, c.props)
			}
			for name, p := range props {
				if p.(map[string]any)["description"] == nil {
					t.Errorf("property %s has no description", name)
				}
			}
		})
	}
}

func TestMCPVerifySchema(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	keys := f.keySet(t)
	hdr := map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "free"}
	cs := mcpSession(t, f.serve(t), hdr)

	for _, c := range []struct {
		desc   string
		total  string
		result string
	}{
		{"the draft invoice of SPEC §10 fails with the exact error", "135.0", "fail"},
		{"the fixed invoice passes", "129.5", "pass"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			body := invoice(c.total, "")
			res, text, doc := call(t, cs, "verify_schema", json.RawMessage(body))
			if res.IsError {
				t.Fatalf("isError: %s", text)
			}
			if doc["result"] != c.result {
				t.Fatalf("result %v, want %s", doc["result"], c.result)
			}
			if sc := doc["schema_compliance"].(map[string]any); sc["passed"] != 22.0 || sc["total"] != 22.0 {
				t.Errorf("schema_compliance %v", sc)
			}
			if c.result == "fail" {
				want := "enforce_rules: consistency:sum_equals at 'line_items[].line_total': values sum to 129.5, expected total (135.0)"
				if errs := doc["errors"].([]any); len(errs) != 1 || errs[0] != want {
					t.Errorf("errors %q", errs)
				}
				if b := doc["summary"].(map[string]any)["blocking_checks"].([]any); len(b) != 1 || b[0] != "consistency:sum_equals" {
					t.Errorf("blocking_checks %v", b)
				}
			}
			if err := receipt.VerifyReceipt(text, keys, receipt.ContextVerify); err != nil {
				t.Fatalf("receipt from the text content: %v", err)
			}
			sc, _ := json.Marshal(res.StructuredContent)
			if err := receipt.VerifyReceipt(sc, keys, ""); err != nil {
				t.Fatalf("receipt from structuredContent (context inferred): %v", err)
			}
			want, err := verify.ComputeHashes(body)
			if err != nil {
				t.Fatal(err)
			}
			if err := receipt.CheckHashes(text, want); err != nil {
				t.Fatalf("hashes differ from the REST twin's: %v", err)
			}
			rec, err := f.db.Verification(context.Background(), doc["verification_id"].(string))
			if err != nil {
				t.Fatalf("an MCP verification was not recorded: %v", err)
			}
			if rec.Result != c.result || rec.AgentID != "seller-7" || rec.RequestHash != want.Request || rec.Payment != store.PaymentFree {
				t.Errorf("record %+v", rec)
			}
		})
	}

	t.Run("compact detail works over MCP as over REST", func(t *testing.T) {
		_, text, doc := call(t, cs, "verify_schema", json.RawMessage(invoice("129.5", `,"detail":"compact"`)))
		if _, ok := doc["request_hash"]; ok || doc["result"] != "pass" {
			t.Fatalf("compact answer %v", doc)
		}
		if err := receipt.VerifyReceipt(text, keys, receipt.ContextVerify); err != nil {
			t.Fatal(err)
		}
	})

	before := len(f.allRecords(t))
	const secret = "SECRET-CONTENT-7f3a"
	for _, c := range []struct {
		desc   string
		args   any
		code   string
		fields []string
	}{
		{"an unknown rule type is an isError result naming rules[0].type", json.RawMessage(`{"task_id":"` + secret + `","expected_schema":{},"submitted_output":1,"rules":[{"type":"` + secret + `","field":"a"}]}`),
			"invalid_request", []string{"rules[0].type"}},
		{"missing arguments list every required field", nil, "invalid_request", []string{"task_id", "expected_schema", "submitted_output"}},
		{"a duplicate key is refused as over REST", json.RawMessage(`{"task_id":"a","task_id":"b","expected_schema":{},"submitted_output":1}`), "invalid_request", nil},
		{"a schema that does not compile is refused before any payment", json.RawMessage(`{"task_id":"a","expected_schema":{"type":7},"submitted_output":1}`), "invalid_request", nil},
	} {
		t.Run(c.desc, func(t *testing.T) {
			res, text, doc := call(t, cs, "verify_schema", c.args)
			if !res.IsError {
				t.Fatalf("not an error: %s", text)
			}
			if doc["code"] != c.code || doc["status"] != 422.0 || doc["charged"] != false || doc["retryable"] != false || doc["message"] == "" {
				t.Fatalf("error %v", doc)
			}
			var got []string
			for _, fl := range doc["fields"].([]any) {
				m := fl.(map[string]any)
				if m["problem"] == "" || m["fix"] == "" {
					t.Errorf("field without problem or fix: %v", m)
				}
				got = append(got, m["field"].(string))
			}
			for _, want := range c.fields {
				if !strings.Contains(strings.Join(got, ","), want) {
					t.Errorf("fields %v lack %s", got, want)
				}
			}
			if na := doc["next_actions"].([]any); len(na) == 0 || na[0].(map[string]any)["action"] != "fix_request_fields" {
				t.Errorf("next_actions %v", na)
			}
			if strings.Contains(string(text), secret) {
				t.Error("the error echoes the input")
			}
		})
	}
	if after := len(f.allRecords(t)); after != before {
		t.Errorf("refused calls were recorded: %d records, had %d", after, before)
	}
}

func TestMCPGetVerificationRecord(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	keys := f.keySet(t)
	for _, total := range []string{"129.5", "129.5", "135.0"} {
		f.verifyAs(t, wallet, total, viaWallet)
	}
	f.verifyAs(t, "test-demo", "129.5", nil)
	cs := mcpSession(t, f.serve(t), viaGateway)

	t.Run("the tool answers the signed score document of GET /score/{agent_id}", func(t *testing.T) {
		res, text, doc := call(t, cs, "get_verification_record", map[string]any{"agent_id": wallet})
		if res.IsError {
			t.Fatalf("isError: %s", text)
		}
		v, err := receipt.Verify(text, keys, "")
		if err != nil || v.Context != receipt.ContextScore {
			t.Fatalf("score receipt: context %q, %v", v.Context, err)
		}
		rest := decode(t, f.do(http.MethodGet, "/score/"+wallet, nil, viaGateway))
		for _, k := range []string{"agent_id", "score", "method", "counts"} {
			if !reflect.DeepEqual(doc[k], rest[k]) {
				t.Errorf("%s: MCP %v, REST %v", k, doc[k], rest[k])
			}
		}
		if c := doc["counts"].(map[string]any)["authenticated"].(map[string]any); c["pass"] != 2.0 || c["fail"] != 1.0 {
			t.Errorf("authenticated counts %v", c)
		}
	})

	for _, c := range []struct {
		desc  string
		args  any
		field string
	}{
		{"a test- agent never gets a score", map[string]any{"agent_id": "test-demo"}, "agent_id"},
		{"agent_id is required", map[string]any{}, "agent_id"},
		{"agent_id must be a string", map[string]any{"agent_id": 7}, "agent_id"},
		{"an empty agent_id is refused", map[string]any{"agent_id": ""}, "agent_id"},
		{"other arguments are refused", map[string]any{"agent_id": "seller-7", "window": 3}, "arguments"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			res, text, doc := call(t, cs, "get_verification_record", c.args)
			if !res.IsError || doc["code"] != "invalid_request" || doc["charged"] != false {
				t.Fatalf("answer %s", text)
			}
			if fl := doc["fields"].([]any)[0].(map[string]any); fl["field"] != c.field {
				t.Fatalf("fields %v, want %s", doc["fields"], c.field)
			}
		})
	}
}

func TestMCPGatewayHeaders(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	base := f.serve(t)
	for _, c := range []struct {
		desc    string
		hdr     map[string]string
		payment string
		authn   bool
	}{
		{"with the gateway token a paid, wallet-bound call is recorded as paid and authenticated", viaWallet, "paid", true},
		{"without the token the same headers are ignored", map[string]string{"X-Aov-Payment": "paid", "X-Aov-Wallet": wallet}, "unknown", false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			cs := mcpSession(t, base, c.hdr)
			body := bytes.Replace(invoice("129.5", ""), []byte(`"seller-7"`), []byte(`"`+wallet+`"`), 1)
			_, _, doc := call(t, cs, "verify_schema", json.RawMessage(body))
			rec, err := f.db.Verification(context.Background(), doc["verification_id"].(string))
			if err != nil {
				t.Fatal(err)
			}
			if rec.Payment != c.payment || rec.Authenticated != c.authn {
				t.Fatalf("recorded payment %q authenticated %v, want %q %v", rec.Payment, rec.Authenticated, c.payment, c.authn)
			}
		})
	}
}

// TestMCPWire pins the JSON-RPC exchange the gateway parses: one POST, one
// application/json answer, no session, no initialize needed.
func TestMCPWire(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	base := f.serve(t)
	keys := f.keySet(t)
	post := func(t *testing.T, body []byte, hdr map[string]string) *http.Response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/mcp", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		for k, v := range hdr {
			switch {
			case k == "Host":
				req.Host = v
			case v == "":
				req.Header.Del(k)
			default:
				req.Header.Set(k, v)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	callBody := func(args []byte) []byte {
		return []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"verify_schema","arguments":` + string(args) +
			`,"_meta":{"x402/payment":{"x402Version":2}}}}`)
	}

	t.Run("a lone tools/call POST, forwarded with the public Host, is answered with one JSON-RPC response as application/json", func(t *testing.T) {
		resp := post(t, callBody(invoice("129.5", "")), map[string]string{"Host": "verify.example.test"})
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
			t.Fatalf("%d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), raw)
		}
		if resp.Header.Get("Mcp-Session-Id") != "" {
			t.Error("a stateless server handed out a session")
		}
		var msg struct {
			JSONRPC string          `json:"jsonrpc"`
			ID      int             `json:"id"`
			Result  json.RawMessage `json:"result"`
			Error   any             `json:"error"`
		}
		if err := json.Unmarshal(raw, &msg); err != nil || msg.JSONRPC != "2.0" || msg.ID != 7 || msg.Error != nil {
			t.Fatalf("not one JSON-RPC result: %v %s", err, raw)
		}
		var result struct {
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
			StructuredContent json.RawMessage `json:"structuredContent"`
			IsError           *bool           `json:"isError"`
		}
		if err := json.Unmarshal(msg.Result, &result); err != nil {
			t.Fatal(err)
		}
		if len(result.Content) != 1 || result.Content[0].Type != "text" || result.IsError != nil {
			t.Fatalf("result %s", msg.Result)
		}
		if err := receipt.VerifyReceipt(result.StructuredContent, keys, receipt.ContextVerify); err != nil {
			t.Fatalf("structuredContent receipt: %v", err)
		}
	})

	t.Run("a client that accepts only application/json is served", func(t *testing.T) {
		resp := post(t, callBody(invoice("129.5", "")), map[string]string{"Accept": "application/json"})
		if resp.StatusCode != 200 {
			raw, _ := io.ReadAll(resp.Body)
			t.Fatalf("%d: %s", resp.StatusCode, raw)
		}
	})

	t.Run("a refused tool call is HTTP 200 with isError true, so the gateway settles nothing", func(t *testing.T) {
		resp := post(t, callBody([]byte(`{"task_id":"a"}`)), nil)
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !bytes.Contains(raw, []byte(`"isError":true`)) || !bytes.Contains(raw, []byte(`"code":"invalid_request"`)) {
			t.Fatalf("%d: %s", resp.StatusCode, raw)
		}
	})

	big := append([]byte(`{"task_id":"big","submitted_output":"`), bytes.Repeat([]byte("x"), 2<<20)...)
	big = append(big, `"}`...)
	for _, c := range []struct {
		desc   string
		method string
		body   []byte
		hdr    map[string]string
		status int
		code   string
	}{
		{"GET /mcp is 405 with Allow: POST (stateless: no event stream)", "GET", nil, nil, 405, "method_not_allowed"},
		{"a body not declared as JSON is 415", "POST", callBody(invoice("129.5", "")), map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type"},
		{"a body over the limit is 413 naming it", "POST", callBody(big), nil, 413, "payload_too_large"},
		{"a body that is not JSON-RPC is 400 invalid_message, never the SDK's text quoting it", "POST", []byte(`{"jsonrpc":"2.0","id":1,SECRET}`), nil, 400, "invalid_message"},
		{"an unsupported MCP-Protocol-Version is 400 invalid_message", "POST", callBody(invoice("129.5", "")), map[string]string{"MCP-Protocol-Version": "1999-01-01"}, 400, "invalid_message"},
	} {
		t.Run(c.desc, func(t *testing.T) {
			req, _ := http.NewRequest(c.method, base+"/mcp", bytes.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			for k, v := range c.hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var e map[string]any
			if err := json.Unmarshal(raw, &e); err != nil || resp.StatusCode != c.status || e["code"] != c.code || e["charged"] != false {
				t.Fatalf("%d %s %v", resp.StatusCode, raw, err)
			}
			if bytes.Contains(raw, []byte("SECRET")) {
				t.Fatal("the refusal quotes the request")
			}
		})
	}
}

func TestMCPMetricsAndLogs(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	cs := mcpSession(t, f.serve(t), map[string]string{"X-Aov-Gateway-Token": gatewayToken, "X-Aov-Payment": "paid"})
	call(t, cs, "verify_schema", json.RawMessage(invoice("135.0", "")))
	call(t, cs, "verify_schema", json.RawMessage(`{}`))
	for _, c := range []struct {
		desc   string
		name   string
		labels map[string]string
		want   float64
	}{
		{"an MCP verification is counted like a REST one", "aov_verifierd_verifications_total", map[string]string{"result": "fail", "payment": "paid"}, 1},
		{"a successful tool call is counted as ok", "aov_verifierd_mcp_tool_calls_total", map[string]string{"tool": "verify_schema", "outcome": "ok"}, 1},
		{"a refused tool call is counted by its error code", "aov_verifierd_mcp_tool_calls_total", map[string]string{"tool": "verify_schema", "outcome": "invalid_request"}, 1},
	} {
		if got := counter(t, f, c.name, c.labels); got != c.want {
			t.Errorf("%s: %s%v = %v, want %v", c.desc, c.name, c.labels, got, c.want)
		}
	}
	logs := f.logs.String()
	for _, want := range []string{`"route":"mcp"`, `"tool":"verify_schema"`, `"tool_error":"invalid_request"`, `"verification_id":`} {
		if !strings.Contains(logs, want) {
			t.Errorf("log lacks %s:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, "INV-7731") {
		t.Error("logs contain request content")
	}
}

// TestMCPConcurrentCalls: one shared MCP server answers many clients at
// once, each call with its own verification, record and receipt.
func TestMCPConcurrentCalls(t *testing.T) {
	f := newFixture(t, fixtureOpts{noSync: true})
	keys := f.keySet(t)
	base := f.serve(t)
	const clients, calls = 6, 4
	ids := make(chan string, clients*calls)
	errs := make(chan error, clients*calls)
	done := make(chan struct{})
	for c := range clients {
		cs := mcpSession(t, base, nil) // here: t.Fatal only on the test's goroutine
		go func() {
			defer func() { done <- struct{}{} }()
			for range calls {
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: json.RawMessage(invoice([]string{"129.5", "135.0"}[c%2], ""))})
				if err != nil || res.IsError {
					errs <- err
					continue
				}
				text := res.Content[0].(*mcp.TextContent).Text
				if err := receipt.VerifyReceipt([]byte(text), keys, receipt.ContextVerify); err != nil {
					errs <- err
					continue
				}
				var doc map[string]any
				json.Unmarshal([]byte(text), &doc)
				ids <- doc["verification_id"].(string)
			}
		}()
	}
	for range clients {
		<-done
	}
	close(ids)
	close(errs)
	for err := range errs {
		t.Errorf("call failed: %v", err)
	}
	seen := map[string]bool{}
	for id := range ids {
		if seen[id] {
			t.Errorf("verification id %s answered twice", id)
		}
		seen[id] = true
		if _, err := f.db.Verification(context.Background(), id); err != nil {
			t.Errorf("verification %s not recorded: %v", id, err)
		}
	}
	if len(seen) != clients*calls {
		t.Errorf("%d verifications, want %d", len(seen), clients*calls)
	}
}
