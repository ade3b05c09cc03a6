package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// mcpPost POSTs one JSON-RPC message (stateless, as a raw client does)
// with extra headers, and returns the answer.
func mcpPost(t *testing.T, url string, msg []byte, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(string(msg)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp, raw
}

// mcpRawCall POSTs one tools/call of tool (mcpPost) and returns its result.
func mcpRawCall(t *testing.T, url, tool string, args map[string]any, meta mcp.Meta, hdr map[string]string) (map[string]any, []byte) {
	t.Helper()
	params := map[string]any{"name": tool, "arguments": args}
	if meta != nil {
		params["_meta"] = meta
	}
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
	_, raw := mcpPost(t, url, body, hdr)
	var out struct {
		Result map[string]any `json:"result"`
	}
	json.Unmarshal(raw, &out)
	return out.Result, raw
}

// A settled payment over MCP pays for one call of one tool; sign-in-with-x
// access is recorded per path, and every tool of the endpoint shares its
// path. So no payment over MCP records access: not an honest one, and not
// one sent beside a PAYMENT-SIGNATURE header (which the MCP gate drops
// unread, and on which wallet_auth waits for a settlement). Before, such
// a header made one $0.01 payment for get_verification_record record
// access to the whole /mcp path, and with the documented `@unpaid not
// vars {http.auth.wallet.paid_access} true` every tool, verify_schema at
// $0.02 among them, ran free for the payer's sign-ins for 30 days.
func TestMCPToolPaymentGrantsNoSignInWithXAccess(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /mcp {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			siwx
		}
		@unpaid not vars {http.auth.wallet.paid_access} true
		x402 @unpaid {
			mcp_tool get_verification_record
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		x402 @unpaid {
			mcp_tool verify_schema
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	url := base + "/mcp"
	host := strings.TrimPrefix(base, "http://")
	const payer = 6
	signIn := func() map[string]string {
		s := walletauth.SIWXFromChallenge(walletauth.SIWXChallenge(host, url, []string{x402.NetworkDevnet}, time.Now())["info"].(map[string]any), x402.NetworkDevnet)
		if err := s.Sign(walletKey(payer)); err != nil {
			t.Fatal(err)
		}
		h, err := s.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return map[string]string{walletauth.SIWXHeaderName: h}
	}
	demand := func(tool string, args map[string]any) x402.PaymentRequired {
		res, raw := mcpRawCall(t, url, tool, args, nil, nil)
		b, _ := json.Marshal(res["structuredContent"])
		var pr x402.PaymentRequired
		if res["isError"] != true || json.Unmarshal(b, &pr) != nil || len(pr.Accepts) == 0 {
			t.Fatalf("no demand for %s: %s", tool, raw)
		}
		if _, ok := pr.Extensions[walletauth.SIWXExtension]; ok {
			t.Fatalf("an MCP demand offers a sign-in-with-x challenge: %s", raw)
		}
		return pr
	}
	for _, hdr := range []map[string]string{
		{x402.HeaderPaymentSignature: "x"}, // dropped unread by the MCP gate
		nil,                                // an honest MCP payer
	} {
		pr := demand("get_verification_record", map[string]any{})
		if res, raw := mcpRawCall(t, url, "get_verification_record", map[string]any{}, payMeta(t, pr, payer), hdr); res["isError"] == true {
			t.Fatalf("paid call refused: %s", raw)
		}
	}
	runs := up.calls.Load()
	for _, tool := range []string{"verify_schema", "get_verification_record"} {
		res, raw := mcpRawCall(t, url, tool, verifyArgs, nil, signIn())
		b, _ := json.Marshal(res["structuredContent"])
		var pr x402.PaymentRequired
		if res["isError"] != true || json.Unmarshal(b, &pr) != nil || len(pr.Accepts) == 0 {
			t.Fatalf("%s served to a sign-in after two payments for get_verification_record over MCP: %s", tool, raw)
		}
	}
	if n := up.calls.Load() - runs; n != 0 {
		t.Fatalf("the tools ran %d times for sign-ins alone", n)
	}
}

// siwx on an mcp_tool gate would promise what a payment over MCP never
// grants: the config does not load.
func TestMCPToolGateRefusesSIWX(t *testing.T) {
	err := cfgLoad(t, cfgGate("accept base $0.01 "+cfgPayTo, "mcp_tool verify_schema\n\t\t\tsiwx"))
	if err == nil || !strings.Contains(err.Error(), "siwx cannot be set with mcp_tool") {
		t.Fatalf("loaded, or refused for another reason: %v", err)
	}
}

// A gate that prices a whole MCP endpoint (a pass to it, paid with
// PAYMENT-SIGNATURE) with siwx records its payer as any gate does, also
// when an mcp_tool gate in the same route prices one tool on top and so
// reads every message: what paid for the path is the payment, whichever
// gates read the request, in either order. Before, a settlement on any
// request an MCP gate had read was dropped, and the wallet that had just
// paid the endpoint's price, offered the sign-in, was refused it; and an
// mcp_tool gate written first took the payment off the request unread, so
// the endpoint gate after it answered its own buyer 402 for ever.
func TestEndpointPaymentBesideMCPToolGateRecordsPaidAccess(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	endpoint := fmt.Sprintf(`@unpaid not vars {http.auth.wallet.paid_access} true
		x402 @unpaid {
			accept devnet $0.05 %[2]s
			siwx 127.0.0.1:{port}
			facilitator http {
				url %[1]s
			}
			store badger {data}/gate
		}`, fac, payTo.Hex())
	tool := fmt.Sprintf(`x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[2]s
			facilitator http {
				url %[1]s
			}
			store badger {data}/gate
		}`, fac, payTo.Hex())
	for _, tc := range []struct {
		name        string
		first, then string
		payer       int
	}{
		{"endpoint gate first", endpoint, tool, 9},
		{"mcp_tool gate first", tool, endpoint, 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /mcp {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
			siwx
		}
		%[2]s
		%[3]s
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), tc.first, tc.then))
			url := base + "/mcp"
			list := []byte(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{}}`)
			resp, raw := mcpPost(t, url, list, nil)
			if resp.StatusCode != http.StatusPaymentRequired {
				t.Fatalf("unpaid tools/list: %d %s", resp.StatusCode, raw)
			}
			pr := paymentRequired(t, resp)
			if _, ok := pr.Extensions[walletauth.SIWXExtension]; !ok {
				t.Fatal("no sign-in-with-x challenge offered")
			}
			host := strings.TrimPrefix(base, "http://")
			signIn := func() map[string]string { // a fresh nonce each time
				s := walletauth.SIWXFromChallenge(walletauth.SIWXChallenge(host, url, []string{x402.NetworkDevnet}, time.Now())["info"].(map[string]any), x402.NetworkDevnet)
				if err := s.Sign(walletKey(tc.payer)); err != nil {
					t.Fatal(err)
				}
				h, err := s.Encode()
				if err != nil {
					t.Fatal(err)
				}
				return map[string]string{walletauth.SIWXHeaderName: h}
			}
			if resp, raw := mcpPost(t, url, list, signIn()); resp.StatusCode != http.StatusPaymentRequired {
				t.Fatalf("a sign-in before any payment: %d %s", resp.StatusCode, raw)
			}
			p, err := x402.SignExactEVM(walletKey(tc.payer), pr.Accepts[0], &pr.Resource, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			sig, _ := x402.EncodeHeader(p)
			resp, raw = mcpPost(t, url, list, map[string]string{x402.HeaderPaymentSignature: sig})
			if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
				t.Fatalf("tools/list paid with the PAYMENT-SIGNATURE the endpoint gate's 402 asked for: %d %.300s, want 200 with PAYMENT-RESPONSE", resp.StatusCode, raw)
			}
			if resp, raw := mcpPost(t, url, list, signIn()); resp.StatusCode != http.StatusOK {
				t.Fatalf("a sign-in by the wallet that paid the endpoint: %d, want 200: %.200s", resp.StatusCode, raw)
			}
		})
	}
}
