package caddymodule

import (
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// An mcp_tool gate in front of a seller's own MCP tool server built with
// the official TypeScript SDK (createMcpExpressApp: express.json(), whose
// body-parser decodes the body by the charset its Content-Type declares,
// any "utf-*" label, UTF-7 included). A message declared in a charset other
// than UTF-8 is refused as a message (400, -32700, invalid_message naming
// Content-Type) before any gate prices it, and never reaches the tool;
// every label of UTF-8 still passes. (Before: the gate read the bytes as
// UTF-8, where "+AHQ-ools/call" is an unpriced method and "+AHY-erify_schema"
// an unpriced tool, while the tool server decoded UTF-7 and ran the priced
// tool with no payment.)
func TestMCPToolRefusesMessageInAnotherCharset(t *testing.T) {
	interop.Dir(t, "@modelcontextprotocol/sdk", "express")
	var ready struct{ URL string }
	interop.Start(t, "mcp-express-seller.mjs", nil, &ready)
	_, fac := sharedDevnet(t)
	base := startCaddy(t, faultSite(ready.URL, fac, ""))

	send := func(ct, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(body))
		for _, v := range strings.Split(ct, "\n") {
			req.Header.Add("Content-Type", v)
		}
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	runs := func() int {
		t.Helper()
		resp, err := http.Get(ready.URL + "/runs")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v struct{ Runs int }
		if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v.Runs
	}
	const call = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{}}}`
	// Control: the plain call is priced, the tool does not run.
	if code, body := send("application/json", call); strings.Contains(body, "PAID-CONTENT") {
		t.Fatalf("control: unpaid plain call ran the tool: %d %s", code, body)
	}
	for _, c := range []struct{ desc, ct, body string }{
		{"method in UTF-7", "application/json; charset=utf-7", `{"jsonrpc":"2.0","id":1,"method":"+AHQ-ools/call","params":{"name":"verify_schema","arguments":{}}}`},
		{"tool name in UTF-7", "application/json; charset=UTF-7", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"+AHY-erify_schema","arguments":{}}}`},
		// npm's content-type takes the last of two charset parameters; Go's
		// parser refuses the value.
		{"UTF-7 after UTF-8", "application/json; charset=utf-8; charset=utf-7", `{"jsonrpc":"2.0","id":1,"method":"+AHQ-ools/call","params":{"name":"verify_schema","arguments":{}}}`},
		{"a priced call in latin1", "application/json; charset=iso-8859-1", call},
		// Readers differ on which of two headers counts.
		{"two Content-Types", "application/json\napplication/json; charset=utf-7", `{"jsonrpc":"2.0","id":1,"method":"+AHQ-ools/call","params":{"name":"verify_schema","arguments":{}}}`},
	} {
		code, body := send(c.ct, c.body)
		if code != http.StatusBadRequest || !strings.Contains(body, `"code":-32700`) || !strings.Contains(body, `"code":"invalid_message"`) || !strings.Contains(body, `"field":"Content-Type"`) {
			t.Errorf("%s: HTTP %d %.400s; want 400, -32700 invalid_message naming Content-Type", c.desc, code, body)
		}
	}
	if n := runs(); n != 0 {
		t.Errorf("the priced tool ran %d times with no payment", n)
	}
	// Every label of UTF-8 is read as the gate reads it: a free method
	// passes, the priced call is still priced (this seller's body-parser
	// itself takes only "utf-8" of them).
	if code, body := send("application/json; charset=utf-8", `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); code != http.StatusOK || !strings.Contains(body, "verify_schema") {
		t.Errorf("charset=utf-8: tools/list answered %d %.300s; want the tool server's list", code, body)
	}
	for _, ct := range []string{"application/json; charset=utf-8", "application/json; charset=UTF8", `application/json; charset="unicode-1-1-utf-8"`} {
		if code, body := send(ct, call); code != http.StatusOK || !strings.Contains(body, "Payment required") {
			t.Errorf("%s: the priced call answered %d %.300s; want its payment demand", ct, code, body)
		}
	}
}

// A gate with validate verify_request reads the body to decide whether the
// request is offered, free or paid: one declared in a charset other than
// UTF-8 is 415 unsupported_media_type naming Content-Type before anything
// else, with no free call counted, no payment claimed or settled and the
// upstream not run; the same payment then buys the request sent as UTF-8.
// (Before: the gate read the bytes as UTF-8 whatever the label said and
// offered, counted and charged for a request another reader decodes as
// other text.)
func TestValidateRefusesBodyInAnotherCharset(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 1, ""))
	url := base + "/verify/schema"
	utf7 := map[string]string{"Content-Type": "application/json; charset=utf-7"}

	refused := func(desc string, resp *http.Response) {
		t.Helper()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusUnsupportedMediaType || !strings.Contains(string(b), `"code":"unsupported_media_type"`) || !strings.Contains(string(b), `"field":"Content-Type"`) {
			t.Errorf("%s: HTTP %d %.300s; want 415 unsupported_media_type naming Content-Type", desc, resp.StatusCode, b)
		}
	}
	refused("free", post(t, url, validRequest, utf7))
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[8].Address
	before := balance(t, d, payer)
	sig := signFor(t, pr, 8)
	refused("paid", post(t, url, validRequest, map[string]string{"Content-Type": "application/json; charset=utf-16le", x402.HeaderPaymentSignature: sig}))
	if n := up.calls.Load(); n != 0 {
		t.Fatalf("the upstream ran %d times for refused requests", n)
	}
	// The free call was not counted: the day's one is still there.
	if resp := post(t, url, validRequest, map[string]string{"Content-Type": "application/json; charset=utf-8"}); resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("the day's free call after the refusals: HTTP %d; want 200 free", resp.StatusCode)
	}
	// The payment was not claimed: it buys the request sent as UTF-8.
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("the payment sent again as UTF-8: HTTP %d; want 200 settled", resp.StatusCode)
	}
	if charged := new(big.Int).Sub(before, balance(t, d, payer)); charged.Sign() <= 0 {
		t.Errorf("charged %v for the request it bought", charged)
	}
}
