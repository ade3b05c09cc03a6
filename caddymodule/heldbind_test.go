package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// forgedSignature is payment header sig with the same EIP-3009
// authorization (payer, nonce, amount, validity: public on chain once the
// transfer is mined) under a signature that is not the payer's.
func forgedSignature(t *testing.T, sig string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := x402.DecodeHeader(sig, &m); err != nil {
		t.Fatal(err)
	}
	m["payload"] = forgedPayload(t, m["payload"])
	h, err := x402.EncodeHeader(m)
	if err != nil || h == sig {
		t.Fatalf("forging: %v", err)
	}
	return h
}

// forgedPayload is an exact EVM scheme payload with its signature replaced.
func forgedPayload(t *testing.T, payload json.RawMessage) json.RawMessage {
	t.Helper()
	var p map[string]json.RawMessage
	if err := json.Unmarshal(payload, &p); err != nil {
		t.Fatal(err)
	}
	p["signature"] = json.RawMessage(`"0x` + strings.Repeat("ab", 65) + `"`)
	b, _ := json.Marshal(p)
	return b
}

// wantNothingServed checks a retry that is not the buyer's: 402
// payment_already_used, no settlement and nothing of the paid answer.
func wantNothingServed(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get(x402.HeaderPaymentResponse) != "" ||
		strings.Contains(string(b), "paid_content") {
		t.Fatalf("%s: %d PAYMENT-RESPONSE=%q %s; want 402 and nothing of the answer", what, resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse), b)
	}
	if !strings.Contains(string(b), x402.ReasonPaymentAlreadyUsed) {
		t.Fatalf("%s: %s; want %s", what, b, x402.ReasonPaymentAlreadyUsed)
	}
}

// wantHeldAnswer checks the buyer's retry: 200, the held paid answer, with
// the settlement.
func wantHeldAnswer(t *testing.T, what string, resp *http.Response) {
	t.Helper()
	var sr x402.SettleResponse
	if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); resp.StatusCode != http.StatusOK || err != nil || !sr.Success {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %d (%v) %s; want the held answer with its settlement", what, resp.StatusCode, err, b)
	}
	if m := readJSON(t, resp); m["paid_content"] != true || m["payment"] != "paid" {
		t.Fatalf("%s: body %v", what, m)
	}
}

// A settlement kept unrecorded (the store was wiped under the paid call)
// is named by its claim keys, and the EVM one holds only what the settled
// transfer made public. A payment with the same authorization and a forged
// signature, and the buyer's own payment with another request, are refused
// as a used payment, from memory and then from the store's record, and see
// nothing of the answer; the buyer's own retry of the same request is
// served it, from memory (a second payment) and from the store. Nothing
// runs again and nothing more is charged. Before, the forgery was served
// the buyer's answer.
func TestHeldAnswerOnlyForItsPaymentAndRequestUnrecorded(t *testing.T) {
	defer func(w []time.Duration) { unrecordedWaits = w }(unrecordedWaits)
	unrecordedWaits = []time.Duration{time.Hour}
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	srv := servers.StartRedis(t)
	base := startCaddy(t, strings.Replace(landedSite(up.URL, "redis "+srv.Addr+" {\n\t\t\t\tprefix heldbind\n\t\t\t}", "after"), ":{port}", "http://a.test:{port}", 1))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[5].Address
	before := balance(t, d, payer)

	sig := wipedUnderPaidCall(t, srv, up, base, "a.test", 5)
	calls := up.calls.Load()
	wantNothingServed(t, "forged signature (memory)", postPaidOn(t, url, "a.test", forgedSignature(t, sig)))
	wantNothingServed(t, "another request (store)", postPaidOn(t, url+"?other=1", "a.test", sig))
	wantNothingServed(t, "forged signature (store)", postPaidOn(t, url, "a.test", forgedSignature(t, sig)))
	wantHeldAnswer(t, "the buyer's retry (store)", postPaidOn(t, url, "a.test", sig))

	sig = wipedUnderPaidCall(t, srv, up, base, "a.test", 5)
	calls++ // the second paid call ran
	wantHeldAnswer(t, "the buyer's retry (memory)", pastReconnect(t, func() *http.Response { return postPaidOn(t, url, "a.test", sig) }))
	wantNothingServed(t, "another request after (store)", postPaidOn(t, url+"?other=1", "a.test", sig))

	if n := up.calls.Load(); n != calls {
		t.Fatalf("the upstream ran %d more times", n-calls)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(40000)) != 0 {
		t.Fatalf("charged %v, want the two transfers", got)
	}
}

// An unknown settlement outcome (the facilitator's reply lost after the
// transfer) held with its answer in the Badger store, on a route that
// reads and validates the body: the record names the request, body
// included. A forged signature over the same authorization is refused
// before the chain is read; the buyer's payment with another body, and
// the same body under another query, are refused once the chain shows the
// transfer; the buyer's own retry is served the held answer, also after a
// restart, and runs nothing again.
func TestHeldAnswerOnlyForItsPaymentAndRequestUnknownOutcome(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := gateDir(t)
	site := pendingSite(up.URL, "lose_reply", storeDir, "validate verify_request")
	url := startCaddy(t, site) + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[7].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 7)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d", resp.StatusCode)
	}
	calls := up.calls.Load()
	other := strings.Replace(validRequest, `"t-1"`, `"t-other"`, 1)

	wantNothingServed(t, "forged signature", post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: forgedSignature(t, sig)}))
	wantNothingServed(t, "another body", post(t, url, other, map[string]string{x402.HeaderPaymentSignature: sig}))
	wantNothingServed(t, "another query", post(t, url+"?x=1", validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	wantHeldAnswer(t, "the buyer's retry", post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))

	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	url = startCaddy(t, site) + "/verify/schema"
	wantNothingServed(t, "another body after a restart", post(t, url, other, map[string]string{x402.HeaderPaymentSignature: sig}))
	wantHeldAnswer(t, "the buyer's retry after a restart", post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))

	if n := up.calls.Load(); n != calls {
		t.Fatalf("the upstream ran %d more times", n-calls)
	}
	if got := charged(t, d, payer, before); got.Int64() != 20000 {
		t.Fatalf("charged %v, want the one transfer", got)
	}
}

// Over MCP the record names the tool and its canonical arguments: the
// buyer's payment with other arguments, or a forged signature over the
// same authorization, gets a payment_already_used demand and nothing of
// the result; the buyer's retry under a new JSON-RPC id (arguments in
// another order) gets the held result.
func TestHeldMCPAnswerOnlyForItsPaymentAndRequest(t *testing.T) {
	d, _ := sharedDevnet(t)
	vf := startVerifier(t)
	url := startCaddy(t, mcpHistorySite(vf, "lose_reply", gateDir(t))) + "/mcp"
	args := map[string]any{"task_id": "t-mcp-bind", "agent_id": "seller-mcp-bind",
		"expected_schema": map[string]any{"type": "object"}, "submitted_output": map[string]any{"ok": true}}
	postMCP(t, url, toolCall(t, "verify_schema", map[string]any{"task_id": "t-free", "expected_schema": map[string]any{}, "submitted_output": 1}, nil)) // the free call of the day
	_, body := postMCP(t, url, toolCall(t, "verify_schema", args, nil))
	payer := evmfacilitator.DevAccounts()[3].Address
	before := balance(t, d, payer)
	p := payDemand(t, body, 3)
	if _, body = postMCP(t, url, toolCall(t, "verify_schema", args, &p)); !strings.Contains(string(body), "settlement_pending") {
		t.Fatalf("first try: %s", body)
	}

	refused := func(what string, body []byte) {
		t.Helper()
		doc, isErr := toolResultOf(t, body)
		if !isErr || !strings.Contains(string(body), x402.ReasonPaymentAlreadyUsed) || strings.Contains(string(body), "t-mcp-bind") || doc["verification_id"] != nil {
			t.Fatalf("%s: %s; want a payment_already_used demand and nothing of the result", what, body)
		}
	}
	forged := p
	forged.Payload = forgedPayload(t, p.Payload)
	_, body = postMCP(t, url, toolCall(t, "verify_schema", args, &forged))
	refused("forged signature", body)
	otherArgs := map[string]any{"task_id": "t-mcp-other", "agent_id": "seller-mcp-bind",
		"expected_schema": map[string]any{"type": "object"}, "submitted_output": map[string]any{"ok": true}}
	_, body = postMCP(t, url, toolCall(t, "verify_schema", otherArgs, &p))
	refused("other arguments", body)

	call := strings.Replace(toolCall(t, "verify_schema", args, &p), `"id":1,`, `"id":"retry-1",`, 1)
	call = strings.Replace(call, `"arguments":{"agent_id":"seller-mcp-bind","expected_schema":{"type":"object"}`,
		`"arguments":{"expected_schema":{"type":"object"},"agent_id":"seller-mcp-bind"`, 1)
	_, body = postMCP(t, url, call)
	if doc, isErr := toolResultOf(t, body); isErr || doc["task_id"] != "t-mcp-bind" || !strings.Contains(string(body), `"id":"retry-1"`) {
		t.Fatalf("the buyer's retry: %s; want the held result", body)
	}
	if got := charged(t, d, payer, before); got.Int64() != 20000 {
		t.Fatalf("charged %s", got)
	}
}

// pastReconnect is call's answer once the gateway's Redis client reaches
// the restarted server again: while it does not, the kept settlement cannot
// be written and the retry is settlement_pending (charged), as it should.
func pastReconnect(t *testing.T, call func() *http.Response) *http.Response {
	t.Helper()
	for range 40 {
		resp := call()
		if resp.StatusCode != http.StatusServiceUnavailable {
			return resp
		}
		wantSettledUnrecorded(t, resp)
		time.Sleep(250 * time.Millisecond)
	}
	t.Fatal("the kept settlement was never written")
	return nil
}

// On a route that does not read the body (no validate), the upstream
// alone reads it: the gate hashes it as it is read, and the held answer is
// bound to it all the same. The buyer's payment (the real one, as a chain
// observer can copy it from the transfer's calldata) with the same method
// and URL and another body is refused; the buyer's own retry is served.
func TestHeldAnswerBoundToABodyOnlyTheUpstreamRead(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	url := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "")) + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[7].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 7)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d", resp.StatusCode)
	}
	calls := up.calls.Load()
	wantNothingServed(t, "another body", post(t, url, `{"task_id":"mine"}`, map[string]string{x402.HeaderPaymentSignature: sig}))
	wantNothingServed(t, "no body", post(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig}))
	wantHeldAnswer(t, "the buyer's retry", post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	if n := up.calls.Load(); n != calls {
		t.Fatalf("the upstream ran %d more times", n-calls)
	}
	if got := charged(t, d, payer, before); got.Int64() != 20000 {
		t.Fatalf("charged %v, want the one transfer", got)
	}
}

// On Solana the payment is claimed by its own keys (svmClaimKey) and the
// landed transaction is public, the buyer's signature in it: a remote
// facilitator's lost reply leaves the answer held, and the buyer's
// payment with another body or query is refused as used, seeing nothing;
// the buyer's own retry gets the held answer, charged once.
func TestHeldSolanaAnswerOnlyForItsRequest(t *testing.T) {
	e := newSolanaEnv(t)
	up := newReportingUpstream(t)
	proxy := newLossyProxy(t, remoteSVMFacilitator(t, e), "lose_reply")
	fac := fmt.Sprintf("http %s {\n\t\t\t\ttimeout 5s\n\t\t\t\trpc solana-devnet %s\n\t\t\t}", proxy.URL, e.chain.URL)
	url := startCaddy(t, solanaSite(up.URL, fac, e, gateDir(t))) + "/verify/schema"
	payerBefore := e.usdc(t, e.payer.Address)
	sig, txid := signSolana(t, e, url)
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), "the payment")

	wantNothingServed(t, "another body", post(t, url, `{"task_id":"mine"}`, map[string]string{x402.HeaderPaymentSignature: sig}))
	wantNothingServed(t, "another query", post(t, url+"?x=1", validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	wantPaidWith(t, e, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), txid)
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("payer charged %d, want 20000", got)
	}
	if up.n.Load() != 1 {
		t.Fatalf("the upstream ran %d times", up.n.Load())
	}
}

// A gateway killed mid-settlement on a route without validate leaves only
// the record written with the claim. It names the request with its body,
// which the gate read before claiming: after the restart a chain observer
// who copies the buyer's payment from the transfer's calldata and posts the
// same URL with another body gets 402 and not the one run the buyer paid
// for; the buyer's own retry gets it, charged once.
func TestKilledMidSettlementRunOnlyForTheBuyersBody(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := gateDir(t)
	p := payThenRestart(t, d, killSite(up.URL, "killed_devnet", storeDir), 8, killedMidSettlement,
		func() string { return startCaddy(t, killSite(up.URL, "faulty_devnet none", storeDir)) })
	url, sig := p.url, p.sig
	calls := up.calls.Load()

	resp := post(t, url, `{"task_id":"attacker"}`, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), x402.ReasonPaymentAlreadyUsed) || up.calls.Load() != calls {
		t.Fatalf("another body with the buyer's payment: %d %s, upstream ran %d more; want 402 payment_already_used and no run", resp.StatusCode, b, up.calls.Load()-calls)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || up.calls.Load() != calls+1 {
		t.Fatalf("the buyer's retry: %d %s, upstream ran %d more; want the paid run, once", resp.StatusCode, b, up.calls.Load()-calls)
	}
	if got := charged(t, d, p.payer, p.before); got.Int64() != 20000 {
		t.Fatalf("charged %v, want 20000 once", got)
	}
}

// Every paid call's body is read before its payment is claimed, so
// max_body bounds it on any route, validate or not: a body over it is 413,
// never offered for sale (not even unpaid), never claimed or charged, and
// the same payment then pays for a smaller body, once.
func TestPaidBodyOverMaxBodyIsNeverForSale(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	url := startCaddy(t, pendingSite(up.URL, "none", gateDir(t), "max_body 1KiB")) + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	large := `{"pad":"` + strings.Repeat("x", 2048) + `"}`
	unpaid := post(t, url, large, nil)
	b, _ := io.ReadAll(unpaid.Body)
	if unpaid.StatusCode != http.StatusRequestEntityTooLarge || unpaid.Header.Get(x402.HeaderPaymentRequired) != "" {
		t.Fatalf("unpaid over max_body: %d %s; want 413 without an offer", unpaid.StatusCode, b)
	}
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 6)
	resp := post(t, url, large, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(string(b), `"payload_too_large"`) || up.calls.Load() != 0 {
		t.Fatalf("paid over max_body: %d %s, upstream ran %d", resp.StatusCode, b, up.calls.Load())
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("the same payment with a body under max_body: %d %s", resp.StatusCode, b)
	}
	if got := charged(t, d, payer, before); got.Int64() != 20000 {
		t.Fatalf("charged %v, want 20000 once", got)
	}
}
