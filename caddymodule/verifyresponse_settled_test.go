package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// wantSettledRefusal fails t unless body is the refusal of an answer whose
// payment was settled before it: 500 internal_error that says the buyer was
// charged, without inviting a retry of the spent payment.
func wantSettledRefusal(t *testing.T, what string, status int, body []byte, retryAfter string) {
	t.Helper()
	var e apierr.Error
	if status != http.StatusInternalServerError || json.Unmarshal(body, &e) != nil || e.Code != apierr.CodeInternal || !e.Charged || e.Retryable || retryAfter != "" ||
		strings.Contains(e.Message, "nothing was charged") || !strings.Contains(e.Message, "not refunded") {
		t.Fatalf("%s: status %d, Retry-After %q: %.300s", what, status, retryAfter, body)
	}
}

// verify_response refuses a misplaced request (a second verify_response on
// it, or an MCP gate's message) with 500 internal_error. It wrote that
// refusal straight out, "nothing was charged", "charged": false, also when
// the gate had settled the payment before its upstream ran (settle before)
// and PAYMENT-RESPONSE named the transfer. It now goes through the same
// settle-before wording as verify_response's other refusals: charged true,
// not refunded, no retry.
func TestVerifyResponseMisplacedAfterSettleBeforeSaysCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	vr := "verify_response {\n\t\t\tschema `{\"type\":\"object\"}`\n\t\t\tverifier_url http://127.0.0.1:1\n\t\t}"
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /twice/* {
		x402 {
			accept devnet $0.05 %[1]s
			facilitator http %[2]s
			store badger {data}/gate
			settle before
		}
		%[3]s
		%[3]s
		reverse_proxy %[4]s
	}
}`, payTo.Hex(), fac, vr, strings.TrimPrefix(up.URL, "http://")))
	payerIdx := 6
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	before := balance(t, d, payer)
	resp, _ := getBody(t, base+"/twice/thing", nil)
	sig := signFor(t, paymentRequired(t, resp), payerIdx)
	resp, body := getBody(t, base+"/twice/thing", map[string]string{x402.HeaderPaymentSignature: sig})
	wantSettledRefusal(t, "two verify_response after settle before", resp.StatusCode, body, resp.Header.Get("Retry-After"))
	if resp.Header.Get(x402.HeaderPaymentResponse) == "" || strings.Contains(string(body), "paid_content") || up.calls.Load() != 0 {
		t.Fatalf("no PAYMENT-RESPONSE, or the upstream was reached (%d): %.300s", up.calls.Load(), body)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(50000)) != 0 {
		t.Fatalf("charged %v, want 50000 (the answer must say what happened)", got)
	}
}

// bigToolUpstream is an MCP tool that answers every call with a result
// over maxHeldAnswer, so that a payment whose settlement is unknown keeps
// the name of the request, not the answer, and its retry runs the tool
// again (pending.go).
func bigToolUpstream(t *testing.T) (*httptest.Server, *int) {
	calls := new(int)
	big := strings.Repeat("x", maxHeldAnswer+1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		*calls++
		var msg struct {
			ID json.RawMessage `json:"id"`
		}
		body, _ := io.ReadAll(r.Body)
		json.Unmarshal(body, &msg)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":%q}]}}`, msg.ID, big)
	}))
	t.Cleanup(srv.Close)
	return srv, calls
}

// rpcCall posts one tools/call of verify_schema carrying payment (nil: none)
// and returns the HTTP status, the tool result and the answer's headers.
func rpcCall(t *testing.T, url string, payment any) (int, map[string]any, http.Header) {
	t.Helper()
	params := map[string]any{"name": "verify_schema", "arguments": map[string]any{}}
	if payment != nil {
		params["_meta"] = map[string]any{mcpMetaPayment: payment}
	}
	msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
	resp := post(t, url, string(msg), map[string]string{"Accept": "application/json, text/event-stream"})
	body, _ := io.ReadAll(resp.Body)
	var ans struct {
		Result map[string]any `json:"result"`
	}
	json.Unmarshal(body, &ans)
	if ans.Result == nil {
		ans.Result = map[string]any{"body": string(body[:min(len(body), 300)])}
	}
	return resp.StatusCode, ans.Result, resp.Header
}

// Behind an mcp_tool gate, verify_response refuses every request
// (errVerifyMCP), so such a route never settles an MCP call: the refusal
// is an error answer, never charged. It can follow a settlement all the
// same: a payment whose settlement was unknown on a route without
// verify_response, resolved as made on the buyer's retry after a reload
// added verify_response, runs the tool again behind the settled payment
// (no answer was kept: it was over maxHeldAnswer). That refusal said
// "nothing was charged" while the transfer was made; it now says charged,
// not refunded, as over REST. (It stays a plain HTTP 500, as every
// verify_response refusal does: verify_response does not speak MCP, and
// this route is the operator's error, logged.) faulty_devnet is the fake
// that loses the facilitator's reply to a settlement it made.
func TestVerifyResponseMisplacedOverMCPAfterARunAgainSaysCharged(t *testing.T) {
	d, _ := sharedDevnet(t)
	up, calls := bigToolUpstream(t)
	storeDir := gateDir(t)
	site := func(vr string) string {
		return fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply
			store badger %[2]s
		}
		%[3]s
		reverse_proxy %[4]s
	}
}`, payTo.Hex(), storeDir, vr, strings.TrimPrefix(up.URL, "http://"))
	}
	base := startCaddy(t, site(""))
	url := base + "/mcp"
	_, demand, _ := rpcCall(t, url, nil)
	var pr x402.PaymentRequired
	if b, _ := json.Marshal(demand["structuredContent"]); json.Unmarshal(b, &pr) != nil || len(pr.Accepts) == 0 {
		t.Fatalf("no demand: %v", demand)
	}
	payerIdx := 6
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	before := balance(t, d, payer)
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(payerIdx), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(p)
	var payment map[string]any
	json.Unmarshal(b, &payment)
	if _, res, _ := rpcCall(t, url, payment); res["structuredContent"].(map[string]any)["code"] != codeSettlementPending {
		t.Fatalf("the paid call, its settlement's reply lost: %v", res)
	}

	var port int
	fmt.Sscanf(base, "http://127.0.0.1:%d", &port)
	loadCaddy(t, port, site("verify_response {\n\t\t\tschema `{\"type\":\"object\"}`\n\t\t\tverifier_url http://127.0.0.1:1\n\t\t}"))
	status, res, h := rpcCall(t, url, payment)
	body, _ := json.Marshal(res)
	if b, ok := res["body"].(string); ok {
		body = []byte(b)
	}
	wantSettledRefusal(t, "the retry run again behind verify_response", status, body, h.Get("Retry-After"))
	if h.Get(x402.HeaderPaymentResponse) == "" || *calls != 1 {
		t.Fatalf("no PAYMENT-RESPONSE, or the tool ran again behind verify_response (%d calls)", *calls)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want 20000", got)
	}
}
