package caddymodule

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// A paid tool call's answer is judged with exact member names, as the
// buyer's client reads it. The upstream here is a raw HTTP handler (no MCP
// SDK writes such an answer; a broken or hostile one can): a result with
// both "isError": true and "IsError": false is an error to the client, and
// must not be settled. With "isError" alone false, the same call is.
func TestMCPPaidAnswerIsReadWithExactNames(t *testing.T) {
	d, fac := sharedDevnet(t)
	var answer atomic.Value
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer.Load().(string))
	}))
	t.Cleanup(up.Close)
	base := startCaddy(t, mcpSite(up.URL, fac, 0))
	args, _ := json.Marshal(verifyArgs)
	call := func(meta mcp.Meta) map[string]any {
		t.Helper()
		params := map[string]any{"name": "verify_schema", "arguments": json.RawMessage(args)}
		if meta != nil {
			params["_meta"] = meta
		}
		body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
		resp := post(t, base+"/mcp", string(body), map[string]string{"Accept": "application/json, text/event-stream"})
		defer resp.Body.Close()
		var out struct {
			Result map[string]any `json:"result"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || out.Result == nil {
			t.Fatalf("status %d, %v, result %v", resp.StatusCode, err, out.Result)
		}
		return out.Result
	}
	demand := call(nil)
	b, _ := json.Marshal(demand["structuredContent"])
	var pr x402.PaymentRequired
	if err := json.Unmarshal(b, &pr); err != nil || len(pr.Accepts) == 0 {
		t.Fatalf("no payment demanded: %v", demand)
	}
	payer := evmfacilitator.DevAccounts()[3].Address
	for _, c := range []struct {
		name, result string
		charged      bool
	}{
		{"isError true and a case twin IsError false", `{"content":[{"type":"text","text":"failed"}],"isError":true,"IsError":false}`, false},
		{"isError false", `{"content":[{"type":"text","text":"ok"}],"isError":false}`, true},
	} {
		answer.Store(`{"jsonrpc":"2.0","id":1,"result":` + c.result + `}`)
		before := balance(t, d, payer)
		res := call(payMeta(t, pr, 3))
		meta, _ := res["_meta"].(map[string]any)
		settled := meta != nil && meta[mcpMetaPaymentResponse] != nil
		if charged := balance(t, d, payer).Cmp(before) != 0; charged != c.charged || settled != c.charged {
			t.Errorf("%s: charged %v, payment response %v, want %v: %v", c.name, charged, settled, c.charged, res)
		}
		if !c.charged && !strings.Contains(string(mustJSON(res)), `"isError":true`) {
			t.Errorf("%s: the answer reached the buyer as %s", c.name, mustJSON(res))
		}
	}
}

func mustJSON(v any) []byte { b, _ := json.Marshal(v); return b }
