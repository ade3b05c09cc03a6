package caddymodule

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/aovhq/aov/x402"
)

// deliver adds the settlement to result._meta and keeps everything else
// of the answer as it was: every member at every level reads back the
// same, whatever order, spacing, escapes or _meta the upstream sent.
func TestMCPDeliverAddsOnlyThePaymentResponse(t *testing.T) {
	sr := x402.SettleResponse{Success: true, Transaction: "0x0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", Network: x402.NetworkBase, Payer: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"}
	srJSON, _ := json.Marshal(sr)
	var srTree any
	json.Unmarshal(srJSON, &srTree)
	for _, c := range []struct {
		name, answer string
		keptMeta     map[string]any // the members of _meta besides the payment response
	}{
		{"verifierd's verify_schema answer", string(mcpBenchAnswer), nil},
		{"members out of order, spaces, escapes and a _meta of its own",
			"{ \"result\" : {\"isError\":false, \"content\":[{\"type\":\"text\",\"text\":\"<a href=\\\"x\\\">&amp;</a> \\u00e9\\n\"}],\n \"_meta\":{\"progressToken\":7,\"x\":{\"a\":\"<&>\"}}, \"structuredContent\":{\"ok\":true,\"n\":1.50}} , \"id\" : \"call-1\", \"jsonrpc\":\"2.0\" }",
			map[string]any{"progressToken": 7.0, "x": map[string]any{"a": "<&>"}}},
		{"a _meta that is not an object is replaced",
			`{"jsonrpc":"2.0","id":1,"result":{"content":[],"_meta":5}}`, nil},
		{"a _meta of null is replaced (it made deliver panic after settling)",
			`{"jsonrpc":"2.0","id":1,"result":{"content":[],"_meta":null}}`, nil},
		{"an earlier payment response is replaced",
			`{"jsonrpc":"2.0","id":1,"result":{"content":[],"_meta":{"x402/payment-response":{"success":false},"k":"v"}}}`,
			map[string]any{"k": "v"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := deliverOnce(t, []byte(c.answer), sr)
			if !json.Valid(out) {
				t.Fatalf("not JSON: %s", out)
			}
			var got, want map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			json.Unmarshal([]byte(c.answer), &want)
			meta := map[string]any{mcpMetaPaymentResponse: srTree}
			for k, v := range c.keptMeta {
				meta[k] = v
			}
			want["result"].(map[string]any)["_meta"] = meta
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("delivered\n%s\nwant the answer with result._meta %v", out, meta)
			}
		})
	}
	for _, bad := range []string{`{"jsonrpc":"2.0","id":1,"result":null}`, `{"jsonrpc":"2.0","id":1}`, `not json`} {
		if out := deliverOnce(t, []byte(bad), sr); !bytes.Equal(out, []byte(bad)) {
			t.Errorf("%s delivered as %s, want it unchanged", bad, out)
		}
	}
}

func deliverOnce(t *testing.T, answer []byte, sr x402.SettleResponse) []byte {
	t.Helper()
	e := &mcpExchange{g: &Gate{}}
	bw := &bufferedWriter{header: http.Header{"Content-Type": {"application/json"}}, code: 200,
		buf: bytes.NewBuffer(append([]byte(nil), answer...)), limit: 1 << 20, held: true}
	w := httptest.NewRecorder()
	e.deliver(w, bw, sr)
	if w.Code != 200 || w.Header().Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("status %d, headers %v", w.Code, w.Header())
	}
	return w.Body.Bytes()
}

// FuzzMCPDeliver: for any answer encoding/json reads as an object with a
// result object, the delivered answer is JSON that reads back as the same
// answer with result._meta holding the upstream's members and the
// settlement; any other answer is delivered unchanged.
func FuzzMCPDeliver(f *testing.F) {
	for _, s := range []string{
		string(mcpBenchAnswer),
		`{"jsonrpc":"2.0","id":1,"result":{"content":[],"_meta":{"k":[1,2.50,{"\u00e9":null}]}}}`,
		`{"result":{"_meta":5,"a":"\ud83d\ude00<>&"},"result":{"b":true}}`,
		`{"jsonrpc":"2.0","id":1,"result":null}`,
		`{"Result":{},"result":{"x":"\xff"}}`,
		`{"jsonrpc":"2.0","id":1,"result":{"content":[],"_meta":null}}`,
		`[1]`,
	} {
		f.Add([]byte(s))
	}
	sr := x402.SettleResponse{Success: true, Transaction: "0x01", Network: x402.NetworkBase}
	srJSON, _ := json.Marshal(sr)
	var srTree any
	json.Unmarshal(srJSON, &srTree)
	f.Fuzz(func(t *testing.T, answer []byte) {
		out := deliverOnce(t, answer, sr)
		var want map[string]any
		result, ok := any(nil), json.Unmarshal(answer, &want) == nil
		if ok {
			result, ok = want["result"].(map[string]any)
		}
		if !ok {
			if !bytes.Equal(out, answer) {
				t.Fatalf("%q delivered as %q, want it unchanged", answer, out)
			}
			return
		}
		meta, _ := result.(map[string]any)["_meta"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
		}
		meta[mcpMetaPaymentResponse] = srTree
		result.(map[string]any)["_meta"] = meta
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("%q delivered as %q (%v), want it with result._meta %v", answer, out, err, meta)
		}
	})
}
