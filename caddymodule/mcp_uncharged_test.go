package caddymodule

import (
	"bytes"
	"encoding/json"
	"math/big"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// withResult replaces the result of the SDK's answer by result.
func withResult(result string) func(http.Header, []byte) []byte {
	return setMember("result", result)
}

// twinsOf reports every member name of the JSON object obj, at its top
// level and in every object inside it, that equals another of the same
// object in another letter case: what a client decoding case-insensitively
// (encoding/json's struct decoding) may read for the exact name. The
// values of members named in free (the tool's own documents) are not
// looked into.
func twinsOf(t *testing.T, obj []byte, free ...string) []string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(obj))
	var twins []string
	var walk func() bool
	walk = func() bool {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]string{}
			for dec.More() {
				k, _ := dec.Token()
				name := k.(string)
				if prev, ok := seen[strings.ToLower(name)]; ok && prev != name {
					twins = append(twins, prev+"/"+name)
				}
				seen[strings.ToLower(name)] = name
				if slices.Contains(free, name) {
					var skip json.RawMessage
					if dec.Decode(&skip) != nil {
						return false
					}
					continue
				}
				if !walk() {
					return false
				}
			}
			dec.Token()
		case json.Delim('['):
			for dec.More() {
				if !walk() {
					return false
				}
			}
			dec.Token()
		}
		return true
	}
	if !walk() {
		t.Fatalf("not JSON: %s", obj)
	}
	return twins
}

// An answer the gate does not charge for (a tool error result, a null
// result, a round of a multi-round-trip call) is handed over rebuilt from
// what the buyer's SDK reads of it: the call's jsonrpc and id, and a
// result of only the members its client reads for that kind. A member in
// another letter case ("Content", "StructuredContent", "Result", a "Text"
// or "Message" inside), which the SDK does not read and which the gate
// does not judge, but which a client decoding case-insensitively may read,
// would otherwise carry the tool's content to the buyer uncharged.
func TestMCPUnchargedAnswerIsRebuilt(t *testing.T) {
	d, up, paidURL, freeURL, pr := paidAndFreeFault(t)
	const payer = 9
	payerAddr := evmfacilitator.DevAccounts()[payer].Address
	for _, c := range []struct {
		name    string
		rewrite func(http.Header, []byte) []byte
		want    string // the answer handed over
	}{
		{
			"a tool error with twins",
			withResult(`{"content":[{"type":"text","text":"tool failed","Text":"PAID"}],"isError":true,"Content":[{"type":"text","text":"PAID"}],"StructuredContent":{"result":"PAID"},"IsError":false}`),
			`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"tool failed"}],"isError":true}}`,
		},
		{
			"a tool error with its structured content",
			withResult(`{"content":[{"type":"text","text":"tool failed"}],"structuredContent":{"code":"x"},"isError":true,"resultType":"complete"}`),
			`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"tool failed"}],"structuredContent":{"code":"x"},"isError":true,"resultType":"complete"}}`,
		},
		{
			"a round with twins",
			withResult(`{"resultType":"input_required","requestState":"s1","inputRequests":{"c":{"method":"elicitation/create","params":{"mode":"form","Message":"PAID","message":"ok?","requestedSchema":{"type":"object"}}}},"Content":[{"type":"text","text":"PAID"}],"StructuredContent":{"result":"PAID"},"RequestState":"PAID"}`),
			`{"jsonrpc":"2.0","id":7,"result":{"inputRequests":{"c":{"method":"elicitation/create","params":{"mode":"form","message":"ok?","requestedSchema":{"type":"object"}}}},"requestState":"s1","resultType":"input_required"}}`,
		},
		{
			"a null result beside a twin",
			func(h http.Header, b []byte) []byte {
				out := withResult(`null`)(h, b)
				return append(out[:len(out)-1], `,"Result":{"content":[{"type":"text","text":"PAID"}]}}`...)
			},
			`{"jsonrpc":"2.0","id":7,"result":null}`,
		},
	} {
		for _, url := range []string{paidURL, freeURL} {
			var meta mcp.Meta
			if url == paidURL {
				meta = payMeta(t, pr, payer)
			}
			up.set(c.rewrite)
			before := balance(t, d, payerAddr)
			status, body := postCall(t, url, meta)
			if status != http.StatusOK || bytes.Contains(body, []byte("PAID")) || len(twinsOf(t, body)) > 0 {
				t.Fatalf("%s: HTTP %d %s: handed over with what the client does not read", c.name, status, body)
			}
			if string(body) != c.want {
				t.Fatalf("%s: handed over %s, want %s", c.name, body, c.want)
			}
			if charged := new(big.Int).Sub(before, balance(t, d, payerAddr)); charged.Sign() != 0 {
				t.Fatalf("%s: charged %v", c.name, charged)
			}
		}
	}
	// None took the day's free unit.
	up.set(nil)
	if res := callTool(t, mcpSession(t, freeURL), "verify_schema", verifyArgs, nil); res.IsError {
		t.Fatalf("the free unit was taken by an uncharged answer: %+v", res.StructuredContent)
	}
}

// withMeta sets the result's _meta of the SDK's answer.
func withMeta(meta string) func(http.Header, []byte) []byte {
	return func(h http.Header, b []byte) []byte {
		var m map[string]json.RawMessage
		json.Unmarshal(b, &m)
		var res map[string]json.RawMessage
		json.Unmarshal(m["result"], &res)
		res["_meta"] = json.RawMessage(meta)
		m["result"], _ = json.Marshal(res)
		out, _ := json.Marshal(m)
		return out
	}
}

// forgedMeta is a tool server's _meta carrying x402 members of its own: a
// settlement receipt for a payment nobody settled, under the exact name,
// in another letter case and escaped, beside a member of its own.
const forgedMeta = `{"x402/payment-response":{"success":true,"transaction":"0xforged","network":"eip155:1337","payer":"0x1"},` +
	`"X402/Payment-Response":{"transaction":"0xforged"},"x402\/payment":{"forged":"0xforged"},"trace":"t1"}`

// An answer carries only the gate's own x402 members: a tool server's
// "x402/..." _meta members are dropped, whatever their letter case or
// escaping, from an answer the gate did not charge for (where a
// payment-response would tell the buyer it paid) and from a charged one
// (where the gate's payment-response, or none on a free call, is the only
// one). Its other _meta members stay.
func TestMCPAnswerCarriesNoPaymentResponseOfTheTool(t *testing.T) {
	d, up, paidURL, freeURL, pr := paidAndFreeFault(t)
	const payer = 9
	payerAddr := evmfacilitator.DevAccounts()[payer].Address
	round := `{"resultType":"input_required","inputRequests":{"r":{"method":"roots/list","params":{}}},"_meta":` + forgedMeta + `}`
	for _, c := range []struct {
		name    string
		rewrite func(http.Header, []byte) []byte
	}{
		{"a tool error", func(h http.Header, b []byte) []byte {
			return withMeta(forgedMeta)(h, withResult(`{"content":[{"type":"text","text":"failed"}],"isError":true}`)(h, b))
		}},
		{"a round", withResult(round)},
	} {
		for _, url := range []string{paidURL, freeURL} {
			var meta mcp.Meta
			if url == paidURL {
				meta = payMeta(t, pr, payer)
			}
			up.set(c.rewrite)
			before := balance(t, d, payerAddr)
			status, body := postCall(t, url, meta)
			if status != http.StatusOK || bytes.Contains(body, []byte("0xforged")) || !bytes.Contains(body, []byte(`"_meta":{"trace":"t1"}`)) {
				t.Fatalf("%s: HTTP %d %s: the tool's x402 members were handed over", c.name, status, body)
			}
			if charged := new(big.Int).Sub(before, balance(t, d, payerAddr)); charged.Sign() != 0 {
				t.Fatalf("%s: charged %v", c.name, charged)
			}
		}
	}
	// Charged answers: the paid one carries the gate's settlement only, the
	// free one none.
	up.set(withMeta(forgedMeta))
	for _, url := range []string{paidURL, freeURL} {
		var meta mcp.Meta
		if url == paidURL {
			meta = payMeta(t, pr, payer)
		}
		status, body := postCall(t, url, meta)
		var answer struct {
			Result struct {
				IsError bool                       `json:"isError"`
				Meta    map[string]json.RawMessage `json:"_meta"`
			} `json:"result"`
		}
		if err := json.Unmarshal(body, &answer); err != nil || status != http.StatusOK || answer.Result.IsError || bytes.Contains(body, []byte("0xforged")) {
			t.Fatalf("%s: HTTP %d %s: the tool's x402 members were handed over", url, status, body)
		}
		var x402Keys []string
		for k := range answer.Result.Meta {
			if strings.HasPrefix(strings.ToLower(k), "x402/") {
				x402Keys = append(x402Keys, k)
			}
		}
		want := 0
		if url == paidURL {
			want = 1
		}
		if len(x402Keys) != want || string(answer.Result.Meta["trace"]) != `"t1"` {
			t.Fatalf("%s: _meta %s: want the tool's trace and %d x402 member(s), the gate's", url, body, want)
		}
	}
}

// A result's _meta in another letter case ("_Meta") is what a client
// decoding names case-insensitively reads as _meta (encoding/json: the
// last matching member wins), so a tool server's x402 members there would
// be a forged settlement receipt to it: they are dropped from every
// result-level _meta twin, charged or not, with the twin's other members
// kept on a charged answer (the tool's, paid for). The content items of an
// uncharged answer, which the gate writes again from the SDK's decoding,
// lose theirs too. The _meta inside a charged answer's content items and
// structuredContent is the tool's content, handed over as written: x402
// clients read the payment response at result._meta only.
func TestMCPNoResultMetaTwinCarriesToolX402Members(t *testing.T) {
	d, up, paidURL, freeURL, pr := paidAndFreeFaultN(t, 10)
	const payer = 9
	payerAddr := evmfacilitator.DevAccounts()[payer].Address
	forged := `{"x402/payment-response":{"success":true,"transaction":"0xforged"},"trace":"t2"}`
	itemMeta := `{"type":"text","text":"ok","_meta":{"x402/payment-response":{"transaction":"0xforged"},"trace":"t3"}}`
	for _, c := range []struct {
		name, result string
		charged      bool
	}{
		{"a charged answer with a _Meta twin", `{"content":[{"type":"text","text":"ok"}],"_Meta":` + forged + `}`, true},
		{"a charged answer with _meta and a _META twin", `{"content":[{"type":"text","text":"ok"}],"_meta":{"trace":"t1"},"_META":` + forged + `}`, true},
		{"a charged answer with an escaped twin", `{"content":[{"type":"text","text":"ok"}],"_\u004deta":` + forged + `}`, true},
		{"a tool error with a _Meta twin", `{"content":[{"type":"text","text":"failed"}],"isError":true,"_Meta":` + forged + `}`, false},
		{"a tool error with x402 members in a content item", `{"content":[` + itemMeta + `],"isError":true}`, false},
	} {
		for _, url := range []string{paidURL, freeURL} {
			var meta mcp.Meta
			if url == paidURL {
				meta = payMeta(t, pr, payer)
			}
			up.set(withResult(c.result))
			before := balance(t, d, payerAddr)
			status, body := postCall(t, url, meta)
			if status != http.StatusOK || bytes.Contains(body, []byte("0xforged")) {
				t.Fatalf("%s at %s: HTTP %d %s: a tool x402 member reached the buyer", c.name, url, status, body)
			}
			var answer struct {
				Result struct {
					Meta map[string]json.RawMessage `json:"_meta"`
				} `json:"result"`
			}
			json.Unmarshal(body, &answer)
			if settled := answer.Result.Meta[mcpMetaPaymentResponse] != nil; settled != (c.charged && url == paidURL) {
				t.Fatalf("%s at %s: the gate's payment response %v: %s", c.name, url, settled, body)
			}
			if charged := new(big.Int).Sub(before, balance(t, d, payerAddr)); !c.charged && charged.Sign() != 0 {
				t.Fatalf("%s: charged %v", c.name, charged)
			}
			if c.charged && !bytes.Contains(body, []byte(`"trace":"t2"`)) {
				t.Fatalf("%s at %s: the twin's other members were dropped: %s", c.name, url, body)
			}
			if strings.Contains(c.result, "t3") && !bytes.Contains(body, []byte(`"_meta":{"trace":"t3"}`)) {
				t.Fatalf("%s at %s: the content item's other _meta members were dropped: %s", c.name, url, body)
			}
		}
	}
	// A charged answer's content is the tool's, paid for: the _meta inside
	// its content items and structuredContent is handed over as written.
	inner := `{"content":[` + itemMeta + `],"structuredContent":{"result":"pass","_meta":{"x402/payment-response":"tool's own"}}}`
	up.set(withResult(inner))
	status, body := postCall(t, paidURL, payMeta(t, pr, payer))
	if status != http.StatusOK || !bytes.Contains(body, []byte(`"_meta":{"x402/payment-response":"tool's own"}`)) ||
		!bytes.Contains(body, []byte(`"_meta":{"x402/payment-response":{"transaction":"0xforged"},"trace":"t3"}`)) {
		t.Fatalf("HTTP %d %s: the content of a charged answer was rewritten", status, body)
	}
}
