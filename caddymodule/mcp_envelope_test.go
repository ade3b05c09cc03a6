package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// answerFault is a fault injector: the official SDK server (stateless, JSON
// answers) with a verify_schema tool that passes, behind a middleware that
// rewrites the header and body of its answer to a tools/call, or stalls the
// call until the gate gives up on it. It stands for a broken or hostile
// tool server behind the gate; every other message is served as the SDK
// serves it.
type answerFault struct {
	*httptest.Server
	rewrite atomic.Pointer[func(h http.Header, body []byte) []byte] // nil: the SDK's answer
	stall   atomic.Bool
	status  atomic.Int32 // the HTTP status of the tool's answer; 0: the SDK's
}

func newAnswerFault(t *testing.T) *answerFault {
	f := &answerFault{}
	server := mcp.NewServer(&mcp.Implementation{Name: "faulty", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "verify_schema", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: `{"result":"pass"}`}}}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		if !bytes.Contains(body, []byte(`"tools/call"`)) {
			h.ServeHTTP(w, r)
			return
		}
		if f.stall.Load() {
			<-r.Context().Done() // the gate's upstream_timeout
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		out := rec.Body.Bytes()
		if rw := f.rewrite.Load(); rw != nil {
			out = (*rw)(rec.Header(), out)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(out)))
		code := rec.Code
		if s := f.status.Load(); s != 0 {
			code = int(s)
		}
		w.WriteHeader(code)
		w.Write(out)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *answerFault) set(rw func(h http.Header, body []byte) []byte) {
	if rw == nil {
		f.rewrite.Store(nil)
		return
	}
	f.rewrite.Store(&rw)
}

// faultSite prices verify_schema at $0.02 behind the fault injector, with
// extra lines in the gate.
func faultSite(up, fac, extra string) string {
	return ":{port} {\n\t" + faultRoute("/mcp", up, fac, extra) + "\n}\n"
}

// faultRoute is faultSite's route, at path.
func faultRoute(path, up, fac, extra string) string {
	return fmt.Sprintf(`route %[5]s {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			%[4]s
		}
		reverse_proxy %[1]s
	}`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex(), extra, path)
}

// paidAndFreeFault starts a site pricing verify_schema at /mcp and serving
// it with one free call a day at /free, both in front of one answerFault
// upstream (rewriting nothing yet), and returns /mcp's payment demand.
func paidAndFreeFault(t *testing.T) (d *evmfacilitator.Devnet, up *answerFault, paidURL, freeURL string, pr x402.PaymentRequired) {
	return paidAndFreeFaultN(t, 1)
}

// paidAndFreeFaultN is paidAndFreeFault with perDay free calls a day at /free.
func paidAndFreeFaultN(t *testing.T, perDay int) (d *evmfacilitator.Devnet, up *answerFault, paidURL, freeURL string, pr x402.PaymentRequired) {
	d, fac := sharedDevnet(t)
	up = newAnswerFault(t)
	free := fmt.Sprintf("free_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day %d\n\t\t\t}", perDay)
	base := startCaddy(t, ":{port} {\n\t"+faultRoute("/mcp", up.URL, fac, "")+"\n\t"+faultRoute("/free", up.URL, fac, free)+"\n}\n")
	paidURL, freeURL = base+"/mcp", base+"/free"
	up.set(nil)
	pr = demandOf(t, callTool(t, mcpSession(t, paidURL), "verify_schema", verifyArgs, nil))
	return d, up, paidURL, freeURL, pr
}

// setMember rewrites one member of the SDK's answer.
func setMember(k, v string) func(http.Header, []byte) []byte {
	return func(_ http.Header, b []byte) []byte {
		var m map[string]json.RawMessage
		json.Unmarshal(b, &m)
		m[k] = json.RawMessage(v)
		out, _ := json.Marshal(m)
		return out
	}
}

// answersTheClientDoesNotTake are answers of a tool server that the
// buyer's MCP client (the official SDK) does not take as its call's
// successful result: it rejects the message, drops it (another id, a
// request), returns the JSON-RPC error, or reads no event in it.
var answersTheClientDoesNotTake = []struct {
	name    string
	rewrite func(http.Header, []byte) []byte
}{
	{"an error beside the result", setMember("error", `{"code":-32603,"message":"tool backend failed"}`)},
	{"jsonrpc 1.0", setMember("jsonrpc", `"1.0"`)},
	{"no jsonrpc", func(h http.Header, b []byte) []byte {
		return bytes.Replace(b, []byte(`"jsonrpc":"2.0",`), nil, 1)
	}},
	{"another id", setMember("id", `999`)},
	{"the id as a string", setMember("id", `"1"`)},
	{"a method member", setMember("method", `"notifications/message"`)},
	{"JSON sent as text/event-stream", func(h http.Header, b []byte) []byte {
		h.Set("Content-Type", "text/event-stream")
		return b
	}},
	{"no content type", func(h http.Header, b []byte) []byte {
		h.Del("Content-Type")
		return b
	}},
	// Results the client's CallToolResult decoding refuses: its CallTool
	// fails, so the call was not served.
	{"content not a list", setMember("result", `{"content":5}`)},
	{"an unknown content type", setMember("result", `{"content":[{"type":"bogus","text":"x"}]}`)},
	{"a text that is not a string", setMember("result", `{"content":[{"type":"text","text":5}]}`)},
	{"image data that is not base64", setMember("result", `{"content":[{"type":"image","data":"%%%","mimeType":"image/png"}]}`)},
}

// An answer the buyer's client does not take as its call's successful
// result is never charged: the paid call is not settled (the payer's
// balance is unchanged) and the client gets an error, not a result.
func TestMCPAnswerTheClientDoesNotTakeIsNotCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newAnswerFault(t)
	base := startCaddy(t, faultSite(up.URL, fac, ""))
	const payer = 3
	for _, c := range answersTheClientDoesNotTake {
		t.Run(c.name, func(t *testing.T) {
			up.set(nil)
			s := mcpSession(t, base+"/mcp") // a client that rejects a message closes its session
			pr := demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil))
			up.set(c.rewrite)
			before := balance(t, d, evmfacilitator.DevAccounts()[payer].Address)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "verify_schema", Arguments: verifyArgs, Meta: payMeta(t, pr, payer)})
			if charged := new(big.Int).Sub(before, balance(t, d, evmfacilitator.DevAccounts()[payer].Address)); charged.Sign() != 0 {
				t.Fatalf("the client got %v, and was charged %v", err, charged)
			}
			if err == nil && !res.IsError {
				t.Fatalf("the client took the answer as a success: %+v", res)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("the client never got an answer to its call: %v", err)
			}
		})
	}
}

// A free call whose answer the client does not take gives its unit back:
// with one free call a day, every such answer leaves the unit for the
// success that follows.
func TestMCPFreeAnswerTheClientDoesNotTakeKeepsTheUnit(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newAnswerFault(t)
	base := startCaddy(t, faultSite(up.URL, fac, "free_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 1\n\t\t\t}"))
	for _, c := range answersTheClientDoesNotTake {
		up.set(c.rewrite)
		s := mcpSession(t, base+"/mcp")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "verify_schema", Arguments: verifyArgs})
		cancel()
		if err == nil && !res.IsError {
			t.Fatalf("%s: the client took the answer as a success: %+v", c.name, res)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: the client never got an answer to its call: %v", c.name, err)
		}
	}
	up.set(nil)
	s := mcpSession(t, base+"/mcp")
	if res := callTool(t, s, "verify_schema", verifyArgs, nil); res.IsError {
		t.Fatalf("the day's free unit was taken by answers the client did not take: %+v", res.StructuredContent)
	}
	if res := callTool(t, s, "verify_schema", verifyArgs, nil); !res.IsError {
		t.Fatal("the success did not take the day's free unit")
	}
}

// A paid or free tool call whose tool fails before answering (stalled past
// upstream_timeout, or an upstream that is down) is answered as the call's
// tool error in the SPEC §6 shape, upstream_unavailable, retryable and
// charged false: the client reads it (a bare HTTP 504 or 502 fails the
// call in its transport). Nothing is charged, and the free unit and the
// payment can be used again.
func TestMCPFailedToolIsARetryableToolError(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newAnswerFault(t)
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	gate := func(route, upstream, extra string) string {
		return fmt.Sprintf(`route %[1]s {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[4]s
			}
			store badger {data}/gate
			upstream_timeout 300ms
			%[5]s
		}
		reverse_proxy %[2]s
	}`, route, strings.TrimPrefix(upstream, "http://"), payTo.Hex(), fac, extra)
	}
	free := "free_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 1\n\t\t\t}"
	base := startCaddy(t, ":{port} {\n\t"+gate("/mcp", up.URL, "")+"\n\t"+gate("/free", up.URL, free)+"\n\t"+gate("/dead", dead.URL, "")+"\n}\n")
	wantToolError := func(t *testing.T, res *mcp.CallToolResult, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("the call failed in the client's transport: %v", err)
		}
		b, _ := json.Marshal(res.StructuredContent)
		var e struct {
			Code       string `json:"code"`
			Retryable  bool   `json:"retryable"`
			Charged    *bool  `json:"charged"`
			RetryAfter int    `json:"retry_after"`
		}
		json.Unmarshal(b, &e)
		if !res.IsError || e.Code != "upstream_unavailable" || !e.Retryable || e.RetryAfter != 1 || e.Charged == nil || *e.Charged {
			t.Fatalf("not a retryable, uncharged tool error: isError %v, %s", res.IsError, b)
		}
	}
	const payer = 4
	payerAddr := evmfacilitator.DevAccounts()[payer].Address

	t.Run("paid, stalled", func(t *testing.T) {
		s := mcpSession(t, base+"/mcp")
		meta := payMeta(t, demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil)), payer)
		before := balance(t, d, payerAddr)
		up.stall.Store(true)
		res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: verifyArgs, Meta: meta})
		up.stall.Store(false)
		wantToolError(t, res, err)
		if balance(t, d, payerAddr).Cmp(before) != 0 {
			t.Fatal("a stalled tool was charged")
		}
		if res := callTool(t, s, "verify_schema", verifyArgs, meta); res.IsError {
			t.Fatalf("the same payment after the stall was refused: %+v", res.StructuredContent)
		}
	})
	t.Run("free, stalled", func(t *testing.T) {
		s := mcpSession(t, base+"/free")
		up.stall.Store(true)
		res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: verifyArgs})
		up.stall.Store(false)
		wantToolError(t, res, err)
		if res := callTool(t, s, "verify_schema", verifyArgs, nil); res.IsError {
			t.Fatalf("the free unit was used by the stalled call: %+v", res.StructuredContent)
		}
	})
	t.Run("paid, upstream down", func(t *testing.T) {
		s := mcpSession(t, base+"/mcp")
		meta := payMeta(t, demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil)), payer)
		before := balance(t, d, payerAddr)
		// The endpoint's upstream is down, so no session can be set up
		// with it: the call is sent as a stateless client sends it.
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call",
			"params": map[string]any{"name": "verify_schema", "arguments": verifyArgs, "_meta": meta}})
		req, _ := http.NewRequest(http.MethodPost, base+"/dead", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var answer struct {
			ID     json.RawMessage    `json:"id"`
			Result mcp.CallToolResult `json:"result"`
		}
		raw, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &answer) != nil || string(answer.ID) != "7" {
			t.Fatalf("HTTP %d %q: not the call's JSON-RPC answer", resp.StatusCode, raw)
		}
		wantToolError(t, &answer.Result, nil)
		if balance(t, d, payerAddr).Cmp(before) != 0 {
			t.Fatal("a call to a dead upstream was charged")
		}
	})
}

// Two gates of one route pricing the same tool gate each call once: the
// first in route order prices it (its price, its allowance) and the second
// passes it on. A free call takes one unit of per_day 2, not two; a paid
// call is served and charged the first gate's price once, not refused as a
// payment already in flight.
func TestMCPToolPricedTwiceInARouteIsGatedOnce(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newAnswerFault(t)
	gate := func(price, extra string) string {
		return fmt.Sprintf(`x402 {
			mcp_tool verify_schema
			accept devnet %[1]s %[2]s
			facilitator http {
				url %[3]s
			}
			store badger {data}/gate
			%[4]s
		}`, price, payTo.Hex(), fac, extra)
	}
	free := "free_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 2\n\t\t\t}"
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /free {
		%[1]s
		%[1]s
		reverse_proxy %[4]s
	}
	route /paid {
		%[2]s
		%[3]s
		reverse_proxy %[4]s
	}
}
`, gate("$0.02", free), gate("$0.02", ""), gate("$0.05", ""), strings.TrimPrefix(up.URL, "http://")))

	t.Run("free", func(t *testing.T) {
		s := mcpSession(t, base+"/free")
		for i := range 2 {
			if res := callTool(t, s, "verify_schema", verifyArgs, nil); res.IsError {
				t.Fatalf("per_day 2, free call %d refused: %+v", i+1, res.StructuredContent)
			}
		}
		if res := callTool(t, s, "verify_schema", verifyArgs, nil); !res.IsError {
			t.Fatal("a third free call was served with per_day 2")
		}
	})
	t.Run("paid", func(t *testing.T) {
		const payer = 5
		s := mcpSession(t, base+"/paid")
		pr := demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil))
		if pr.Accepts[0].Amount != "20000" {
			t.Fatalf("demanded %s, not the first gate's price", pr.Accepts[0].Amount)
		}
		before := balance(t, d, evmfacilitator.DevAccounts()[payer].Address)
		res := callTool(t, s, "verify_schema", verifyArgs, payMeta(t, pr, payer))
		if res.IsError || res.Meta[mcpMetaPaymentResponse] == nil {
			b, _ := json.Marshal(res)
			t.Fatalf("a paid call of a tool priced by two gates was not served and settled: %s", b)
		}
		if charged := new(big.Int).Sub(before, balance(t, d, evmfacilitator.DevAccounts()[payer].Address)); charged.Cmp(big.NewInt(20000)) != 0 {
			t.Fatalf("charged %v, want the first gate's price once (20000)", charged)
		}
	})
}

// postCall sends a tools/call of verify_schema as a raw HTTP client does
// (no MCP client reading the answer), with meta as its _meta, and returns
// the HTTP status and body of the answer.
func postCall(t *testing.T, url string, meta mcp.Meta) (int, []byte) {
	t.Helper()
	return postCallAs(t, url, meta, "")
}

// multiRoundTripVersion is the MCP protocol version whose clients take a
// round of a multi-round-trip call (SEP-2322) themselves: to an older
// one, the SDK's server answers the tool's input requests on its own.
const multiRoundTripVersion = "2026-07-28"

// postCallAs is postCall from a client of MCP protocol version (none when
// it is "").
func postCallAs(t *testing.T, url string, meta mcp.Meta, version string) (int, []byte) {
	t.Helper()
	params := map[string]any{"name": "verify_schema", "arguments": verifyArgs}
	if version != "" {
		// A client of this version says who it is on every call.
		meta = maps.Clone(meta)
		if meta == nil {
			meta = mcp.Meta{}
		}
		meta[mcp.MetaKeyProtocolVersion] = version
		meta[mcp.MetaKeyClientInfo] = map[string]any{"name": "raw", "version": "1"}
		meta[mcp.MetaKeyClientCapabilities] = map[string]any{}
	}
	if meta != nil {
		params["_meta"] = meta
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if version != "" {
		req.Header.Set("Mcp-Protocol-Version", version)
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", "verify_schema")
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// withoutResult drops the result of the SDK's answer and sets its error.
func withoutResult(errValue string) func(http.Header, []byte) []byte {
	return func(_ http.Header, b []byte) []byte {
		var m map[string]json.RawMessage
		json.Unmarshal(b, &m)
		delete(m, "result")
		m["error"] = json.RawMessage(errValue)
		out, _ := json.Marshal(m)
		return out
	}
}

// wantUnreadable fails unless body is the gate's JSON-RPC error
// upstream_answer_unreadable for call 7 in the SPEC §6 shape, carrying
// nothing of the tool's answer.
func wantUnreadable(t *testing.T, status int, body []byte) {
	t.Helper()
	var answer struct {
		ID     json.RawMessage `json:"id"`
		Result json.RawMessage `json:"result"`
		Error  struct {
			Code int `json:"code"`
			Data struct {
				Code    string `json:"code"`
				Charged *bool  `json:"charged"`
			} `json:"data"`
		} `json:"error"`
	}
	if status != http.StatusOK || json.Unmarshal(body, &answer) != nil || string(answer.ID) != "7" || answer.Result != nil ||
		answer.Error.Data.Code != "upstream_answer_unreadable" || answer.Error.Data.Charged == nil || *answer.Error.Data.Charged {
		t.Fatalf("HTTP %d %s: not the call's upstream_answer_unreadable", status, body)
	}
	if bytes.Contains(body, []byte("pass")) {
		t.Fatalf("the tool's result was handed over: %s", body)
	}
}

// An error answer is handed over as the tool server wrote it only when
// it is one: no result member, and an error the client decodes (an object,
// an integer code, a string message). An error beside a result, or an
// error the client cannot read, carries the tool's paid content to a
// client reading the raw answer: it is replaced by upstream_answer_unreadable,
// paid or free, and nothing is charged.
func TestMCPErrorAnswerCarriesNoResult(t *testing.T) {
	d, up, paidURL, freeURL, pr := paidAndFreeFault(t)
	const payer = 6
	payerAddr := evmfacilitator.DevAccounts()[payer].Address

	for _, c := range []struct {
		name    string
		rewrite func(http.Header, []byte) []byte
	}{
		{"an error object beside the result", setMember("error", `{"code":-32603,"message":"x"}`)},
		{"an empty error object beside the result", setMember("error", `{}`)},
		{"an error list beside the result", setMember("error", `[]`)},
		{"an error number beside the result", setMember("error", `5`)},
		{"an error string beside the result", setMember("error", `"x"`)},
		{"an error list alone", withoutResult(`[]`)},
		{"an error whose code is not an integer", withoutResult(`{"code":1.5,"message":"x"}`)},
		{"an error whose message is not a string", withoutResult(`{"code":1,"message":5}`)},
		{"an error beside a null result", func(h http.Header, b []byte) []byte {
			return setMember("result", `null`)(h, withoutResult(`{"code":1,"message":"x"}`)(h, b))
		}},
	} {
		t.Run("paid, "+c.name, func(t *testing.T) {
			up.set(c.rewrite)
			before := balance(t, d, payerAddr)
			status, body := postCall(t, paidURL, payMeta(t, pr, payer))
			wantUnreadable(t, status, body)
			if charged := new(big.Int).Sub(before, balance(t, d, payerAddr)); charged.Sign() != 0 {
				t.Fatalf("charged %v", charged)
			}
		})
		t.Run("free, "+c.name, func(t *testing.T) {
			up.set(c.rewrite)
			status, body := postCall(t, freeURL, nil)
			wantUnreadable(t, status, body)
		})
	}
	// A JSON-RPC error the client reads is the tool server's to give:
	// handed over byte for byte, and nothing is charged.
	upstreamError := withoutResult(`{"code":-32603,"message":"tool backend failed"}`)
	up.set(upstreamError)
	before := balance(t, d, payerAddr)
	for _, url := range []string{paidURL, freeURL} {
		var meta mcp.Meta
		if url == paidURL {
			meta = payMeta(t, pr, payer)
		}
		status, body := postCall(t, url, meta)
		if status != http.StatusOK || !bytes.Contains(body, []byte(`"message":"tool backend failed"`)) || bytes.Contains(body, []byte(`"result"`)) {
			t.Fatalf("HTTP %d %s: the tool server's error was not handed over", status, body)
		}
	}
	if balance(t, d, payerAddr).Cmp(before) != 0 {
		t.Fatal("an error answer was charged")
	}
	// None of these answers took the day's free unit.
	up.set(nil)
	if res := callTool(t, mcpSession(t, freeURL), "verify_schema", verifyArgs, nil); res.IsError {
		t.Fatalf("the free unit was taken by an answer handed over uncharged: %+v", res.StructuredContent)
	}
}

// An answer the gate cannot hand over (upstream_answer_unreadable) is
// replaced and never charged, but the tool ran for it: the call counts as
// any unsettled call the upstream worked for does (workRan), so a client
// that can steer the tool to such answers is bounded by rate_limit (a free
// one by its free budget: past it, a demand for payment).
func TestMCPUnreadableAnswersCountAgainstRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newAnswerFault(t)
	base := startCaddy(t, faultSite(up.URL, fac, "rate_limit 2 1m\n\t\t\tfree_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 100\n\t\t\t}"))
	t0 := time.Now()
	now = func() time.Time { return t0 } // no refill during the test
	t.Cleanup(func() { now = time.Now })
	up.set(setMember("result", `{"content":5}`))
	for range 2 {
		status, body := postCall(t, base+"/mcp", nil)
		wantUnreadable(t, status, body)
	}
	if _, body := postCall(t, base+"/mcp", nil); !bytes.Contains(body, []byte(`free calls are used for now`)) {
		t.Fatalf("after two free unreadable answers with rate_limit 2: %s, want a demand for payment", body)
	}
}

// mrtrUpstream is the official SDK server with a verify_schema tool that
// needs the client's input (a multi-round-trip call, SEP-2322, the SDK's
// default protocol): its first round asks the client to confirm
// (elicitation) and answers resultType "input_required" with no content;
// the client's retry, the same call with inputResponses and
// requestState, gets the answer. shed makes every round an empty
// inputRequests (the server shedding load): the call never ends.
type mrtrUpstream struct {
	*httptest.Server
	rounds, finals atomic.Int64
	shed           atomic.Bool
}

func newMRTRUpstream(t *testing.T) *mrtrUpstream {
	u := &mrtrUpstream{}
	server := mcp.NewServer(&mcp.Implementation{Name: "mrtr", Version: "1"}, nil)
	server.AddTool(&mcp.Tool{Name: "verify_schema", InputSchema: json.RawMessage(`{"type":"object"}`)}, func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		u.rounds.Add(1)
		if u.shed.Load() {
			return &mcp.CallToolResult{InputRequests: mcp.InputRequestMap{}}, nil
		}
		if req.Params.InputResponses == nil {
			return &mcp.CallToolResult{
				InputRequests: mcp.InputRequestMap{"confirm": &mcp.ElicitParams{Mode: "form", Message: "Verify?", RequestedSchema: map[string]any{"type": "object"}}},
				RequestState:  "round-1",
			}, nil
		}
		if r, ok := req.Params.InputResponses["confirm"].(*mcp.ElicitResult); !ok || r.Action != "accept" || req.Params.RequestState != "round-1" {
			return nil, fmt.Errorf("the retry lost its input: %#v, state %q", req.Params.InputResponses, req.Params.RequestState)
		}
		u.finals.Add(1)
		return &mcp.CallToolResult{
			Content:           []mcp.Content{&mcp.TextContent{Text: `{"result":"pass"}`}},
			StructuredContent: map[string]any{"result": "pass"},
		}, nil
	})
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{Stateless: true, JSONResponse: true})
	u.Server = httptest.NewServer(h)
	t.Cleanup(u.Close)
	return u
}

// mrtrSession is a buyer's client that confirms every elicitation, so the
// SDK's multi-round-trip middleware answers the tool's input requests.
func mrtrSession(t *testing.T, url string) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "buyer", Version: "1"}, &mcp.ClientOptions{
		ElicitationHandler: func(context.Context, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			return &mcp.ElicitResult{Action: "accept", Content: map[string]any{}}, nil
		},
	})
	s, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url}, nil)
	if err != nil {
		t.Fatalf("connecting through the gate: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// mrtrSite prices verify_schema at /mcp in front of up, with extra lines
// in the gate and room in its rate_limit for the rounds of a few calls
// (each round counts as a refusal does).
func mrtrSite(up, fac, extra string) string {
	return ":{port} {\n\t" + faultRoute("/mcp", up, fac, extra+"\n\t\t\trate_limit 20 1m") + "\n}\n"
}

// A paid call of a tool that needs the client's input is charged once, for
// its answer: the input_required round is handed over uncharged (the SDK's
// client never returns it; it answers the input requests and retries the
// call with the same payment, inputResponses and requestState), and the
// retry is verified, claimed and settled.
func TestMCPMultiRoundTripCallIsChargedOnceForItsAnswer(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newMRTRUpstream(t)
	base := startCaddy(t, mrtrSite(up.URL, fac, ""))
	const payer = 7
	payerAddr := evmfacilitator.DevAccounts()[payer].Address
	s := mrtrSession(t, base+"/mcp")
	pr := demandOf(t, callTool(t, s, "verify_schema", map[string]any{}, nil))
	price, _ := new(big.Int).SetString(pr.Accepts[0].Amount, 10)
	before := balance(t, d, payerAddr)
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: map[string]any{}, Meta: payMeta(t, pr, payer)})
	if err != nil || res.IsError || res.Meta[mcpMetaPaymentResponse] == nil {
		t.Fatalf("the paid call did not get its answer: %v, %+v", err, res)
	}
	if up.finals.Load() != 1 || up.rounds.Load() != 2 {
		t.Fatalf("rounds %d, answers %d; want 2 and 1", up.rounds.Load(), up.finals.Load())
	}
	if charged := new(big.Int).Sub(before, balance(t, d, payerAddr)); charged.Cmp(price) != 0 {
		t.Fatalf("charged %v for one call of price %v", charged, price)
	}
}

// A free call of a tool that needs the client's input takes one unit, for
// its answer: with one free call a day, the call is answered and the next
// one is asked to pay.
func TestMCPFreeMultiRoundTripCallTakesOneUnit(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMRTRUpstream(t)
	base := startCaddy(t, mrtrSite(up.URL, fac, "free_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 1\n\t\t\t}"))
	s := mrtrSession(t, base+"/mcp")
	if res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: map[string]any{}}); err != nil || res.IsError {
		t.Fatalf("one call with one free unit was not answered: %v, %+v", err, res)
	}
	if up.finals.Load() != 1 {
		t.Fatalf("the tool answered %d times", up.finals.Load())
	}
	demandOf(t, callTool(t, s, "verify_schema", map[string]any{}, nil))
}

// A tool server that answers input_required on every round (shedding
// load) never gets the buyer charged: no round is the call's answer, so
// the payment is not settled and the free unit is kept.
func TestMCPInputRequiredIsNeverCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newMRTRUpstream(t)
	up.shed.Store(true)
	base := startCaddy(t, mrtrSite(up.URL, fac, "free_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 1\n\t\t\t}"))
	const payer = 8
	payerAddr := evmfacilitator.DevAccounts()[payer].Address
	s := mrtrSession(t, base+"/mcp")
	if _, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: map[string]any{}}); err == nil {
		t.Fatal("a call the tool never answered succeeded")
	}
	up.shed.Store(false)
	if res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: map[string]any{}}); err != nil || res.IsError {
		t.Fatalf("the free unit was taken by rounds that were not the call's answer: %v, %+v", err, res)
	}
	pr := demandOf(t, callTool(t, s, "verify_schema", map[string]any{}, nil))
	up.shed.Store(true)
	before := balance(t, d, payerAddr)
	if _, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: "verify_schema", Arguments: map[string]any{}, Meta: payMeta(t, pr, payer)}); err == nil {
		t.Fatal("a paid call the tool never answered succeeded")
	}
	if charged := new(big.Int).Sub(before, balance(t, d, payerAddr)); charged.Sign() != 0 {
		t.Fatalf("charged %v for a call the tool never answered", charged)
	}
}

// An error answer is handed over uncharged as its jsonrpc, its id and its
// error, and nothing else the tool server wrote: a result beside it under
// a name toolSucceeded does not read as result (a case twin "Result",
// which encoding/json's struct decoding takes for result) or a duplicate
// result whose last is null would otherwise carry the tool's content to a
// client that reads the raw answer, unpaid.
func TestMCPErrorAnswerIsHandedOverAlone(t *testing.T) {
	d, up, paidURL, freeURL, pr := paidAndFreeFault(t)
	const payer = 6
	payerAddr := evmfacilitator.DevAccounts()[payer].Address
	rpcErr := `{"code":-32603,"message":"tool backend failed","data":{"retry":true}}`
	beside := func(name string) func(http.Header, []byte) []byte {
		return func(h http.Header, b []byte) []byte {
			var m map[string]json.RawMessage
			json.Unmarshal(b, &m)
			out := withoutResult(rpcErr)(h, b)
			return append(append(append(out[:len(out)-1], `,"`+name+`":`...), m["result"]...), '}')
		}
	}
	for _, c := range []struct {
		name    string
		rewrite func(http.Header, []byte) []byte
	}{
		{"a case twin Result", beside("Result")},
		{"a case twin RESULT", beside("RESULT")},
		{"a duplicate result, the last null", func(h http.Header, b []byte) []byte {
			out := beside("result")(h, b)
			return append(out[:len(out)-1], `,"result":null}`...)
		}},
	} {
		for _, url := range []string{paidURL, freeURL} {
			var meta mcp.Meta
			if url == paidURL {
				meta = payMeta(t, pr, payer)
			}
			up.set(c.rewrite)
			before := balance(t, d, payerAddr)
			status, body := postCall(t, url, meta)
			var read struct {
				Result json.RawMessage `json:"result"`
			}
			json.Unmarshal(body, &read)
			if status != http.StatusOK || read.Result != nil || bytes.Contains(body, []byte("pass")) {
				t.Fatalf("%s: HTTP %d %s: the tool's content was handed over beside the error", c.name, status, body)
			}
			if charged := new(big.Int).Sub(before, balance(t, d, payerAddr)); charged.Sign() != 0 {
				t.Fatalf("%s: charged %v", c.name, charged)
			}
		}
	}
	// The error the client reads is the tool server's, and only it.
	up.set(beside("Result"))
	_, body := postCall(t, freeURL, nil)
	if want := `{"jsonrpc":"2.0","id":7,"error":` + rpcErr + `}`; string(body) != want {
		t.Fatalf("handed over %s, want %s", body, want)
	}
	up.set(nil)
	if res := callTool(t, mcpSession(t, freeURL), "verify_schema", verifyArgs, nil); res.IsError {
		t.Fatalf("the free unit was taken by an error answer: %+v", res.StructuredContent)
	}
}
