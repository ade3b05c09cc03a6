package caddymodule

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	_ "github.com/aovhq/aov/plugins/redisstore" // the redis store module
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// The payment-identifier tests pay for real on the devnet through Caddy in
// process, with the gate's Badger (or Redis) store, and count what moved on
// chain and how often the upstream ran.

// withPaymentID echoes the payment-identifier declaration of pr in p, with
// id added, as the official appendPaymentIdentifierToExtensions does.
func withPaymentID(t *testing.T, pr x402.PaymentRequired, p x402.PaymentPayload, id string) x402.PaymentPayload {
	t.Helper()
	decl, ok := pr.Extensions[x402.PaymentIdentifierExtension].(map[string]any)
	if !ok {
		t.Fatalf("PAYMENT-REQUIRED declares no payment-identifier: %v", pr.Extensions)
	}
	info := map[string]any{"required": decl["info"].(map[string]any)["required"], "id": id}
	p.Extensions = map[string]any{x402.PaymentIdentifierExtension: map[string]any{"info": info, "schema": decl["schema"]}}
	return p
}

// signWithID signs a payment from development account payer (or key, when
// not nil) for the first offer of pr, carrying id.
func signWithID(t *testing.T, pr x402.PaymentRequired, key *ecdsa.PrivateKey, id string) string {
	t.Helper()
	p, err := x402.SignExactEVM(key, pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	h, err := x402.EncodeHeader(withPaymentID(t, pr, p, id))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// idemCode reads the code of an error answer.
func idemCode(t *testing.T, resp *http.Response) string {
	t.Helper()
	m := readJSON(t, resp)
	if m["charged"] != false {
		t.Errorf("error answer without charged false: %v", m)
	}
	code, _ := m["code"].(string)
	return code
}

func readAll(t *testing.T, resp *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func settlementOf(t *testing.T, resp *http.Response) x402.SettleResponse {
	t.Helper()
	var sr x402.SettleResponse
	if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); err != nil || !sr.Success || sr.Transaction == "" {
		t.Fatalf("PAYMENT-RESPONSE %+v (%v)", sr, err)
	}
	return sr
}

func TestPaymentIdentifierIsDeclared(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	for _, c := range []struct {
		option   string
		required bool
	}{{"payment_identifier", false}, {"payment_identifier optional", false}, {"payment_identifier required", true}} {
		base := startCaddy(t, gateSite(up.URL, fac, 0, c.option))
		pr := paymentRequired(t, post(t, base+"/verify/schema", "", nil))
		raw, _ := json.Marshal(pr.Extensions[x402.PaymentIdentifierExtension])
		want := fmt.Sprintf(`{"info":{"required":%v},"schema":{"$schema":"https://json-schema.org/draft/2020-12/schema","properties":{"id":{"maxLength":128,"minLength":16,"pattern":"^[a-zA-Z0-9_-]+$","type":"string"},"required":{"type":"boolean"}},"required":["required"],"type":"object"}}`, c.required)
		if string(raw) != want {
			t.Errorf("%s: declared %s\nwant %s", c.option, raw, want)
		}
		if _, ok := pr.Extensions["bazaar"]; !ok {
			t.Errorf("%s: the bazaar extension is gone: %v", c.option, pr.Extensions)
		}
	}
	base := startCaddy(t, gateSite(up.URL, fac, 0, ""))
	if pr := paymentRequired(t, post(t, base+"/verify/schema", "", nil)); pr.Extensions[x402.PaymentIdentifierExtension] != nil {
		t.Errorf("declared without the option: %v", pr.Extensions)
	}
}

// The same id with the same payment gets the saved answer without a second
// settlement; the same id with a new payment, or with the same payment for
// another request, is 409 and charges nothing.
func TestPaymentIdentifierRetryGetsTheSavedAnswer(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "payment_identifier"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[3]
	before := balance(t, d, payer.Address)
	const id = "pay_7d5d747be160e280504c099d984bcfe0"
	sig := signWithID(t, pr, payer.Key(), id)

	first := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	firstBody := readAll(t, first)
	if first.StatusCode != 200 || !bytes.Contains(firstBody, []byte("paid_content")) {
		t.Fatalf("first call: %d %s", first.StatusCode, firstBody)
	}
	firstTx := settlementOf(t, first).Transaction

	for i := range 3 {
		again := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		body := readAll(t, again)
		if again.StatusCode != 200 || !bytes.Equal(body, firstBody) {
			t.Fatalf("retry %d: %d %s\nwant the saved %s", i+1, again.StatusCode, body, firstBody)
		}
		if tx := settlementOf(t, again).Transaction; tx != firstTx {
			t.Fatalf("retry %d: PAYMENT-RESPONSE names %s, want the first settlement %s", i+1, tx, firstTx)
		}
		if again.Header.Get("Content-Type") != first.Header.Get("Content-Type") || again.Header.Get("Cache-Control") != "no-store" {
			t.Fatalf("retry %d: headers %v", i+1, again.Header)
		}
	}

	// A newly signed payment under the same id, and the same payment for
	// another request body: conflicts.
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signWithID(t, pr, payer.Key(), id)}); resp.StatusCode != http.StatusConflict || idemCode(t, resp) != codePaymentIDConflict {
		t.Fatalf("new payment, same id: %d", resp.StatusCode)
	}
	other := strings.Replace(validRequest, `"t-1"`, `"t-2"`, 1)
	if resp := post(t, url, other, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusConflict || idemCode(t, resp) != codePaymentIDConflict {
		t.Fatalf("same payment, another request: %d", resp.StatusCode)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("payer charged %v, want exactly one payment of 20000", got)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want once", up.calls.Load())
	}
}

// Twenty copies of one payment with one id at once: exactly one settles
// and runs the upstream; every other copy gets the saved answer or a
// retryable in-progress answer, and a retry afterwards gets the answer.
func TestPaymentIdentifierConcurrentCopiesSettleOnce(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	up.during = func() { time.Sleep(100 * time.Millisecond) }
	base := startCaddy(t, gateSite(up.URL, fac, 0, "payment_identifier"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[5]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, pr, payer.Key(), "pay_concurrent_copies_0001")

	const n = 20
	var mu sync.Mutex
	statuses := map[string]int{}
	bodies := map[string]bool{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
			req.Header.Set(x402.HeaderPaymentSignature, sig)
			resp, err := testClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			mu.Lock()
			defer mu.Unlock()
			key := fmt.Sprint(resp.StatusCode)
			if resp.StatusCode == http.StatusConflict {
				var e struct {
					Code      string `json:"code"`
					Retryable bool   `json:"retryable"`
				}
				json.Unmarshal(b, &e)
				key += " " + e.Code
				if !e.Retryable || resp.Header.Get("Retry-After") != "1" {
					t.Errorf("in-progress answer not retryable: %s %v", b, resp.Header)
				}
			}
			statuses[key]++
			if resp.StatusCode == 200 {
				bodies[string(b)] = true
			}
		}()
	}
	close(start)
	wg.Wait()
	if statuses["200"] < 1 || statuses["200"]+statuses["409 "+codePaymentIDInProgress] != n || len(bodies) != 1 {
		t.Fatalf("answers %v, %d distinct bodies; want 200s with one body and in-progress 409s", statuses, len(bodies))
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("payer charged %v, want exactly one payment of 20000", got)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times", up.calls.Load())
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if b := readAll(t, resp); resp.StatusCode != 200 || !bodies[string(b)] {
		t.Fatalf("retry after the copies: %d %s", resp.StatusCode, b)
	}
}

// TestPaymentIdentifierBindsThePathTheClientSent: an id is bound to the
// request as the client sent it, before handle_path strips it. A retry
// through the same public URL gets the saved answer; the same payment and
// id sent to another public URL that strips to the same path (another
// route, another upstream) is a conflict, never the first route's answer.
func TestPaymentIdentifierBindsThePathTheClientSent(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, strippedSite(up.URL, fac, "payment_identifier"))
	url := base + "/api/score/agent-1"
	pr := paymentRequired(t, getWith(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[6]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, pr, payer.Key(), "pay_public_path_binds_0001")

	first := getWith(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig})
	body := readAll(t, first)
	if first.StatusCode != http.StatusOK {
		t.Fatalf("paid call: %d %s", first.StatusCode, body)
	}
	if resp := getWith(t, base+"/v2/score/agent-1", "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusConflict || idemCode(t, resp) != codePaymentIDConflict {
		t.Errorf("the id at another public URL: status %d, want 409 %s", resp.StatusCode, codePaymentIDConflict)
	}
	if resp := getWith(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK || string(readAll(t, resp)) != string(body) {
		t.Errorf("retry through the same URL: status %d, want 200 with the saved answer", resp.StatusCode)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(10000)) != 0 {
		t.Fatalf("payer charged %v, want one payment of 10000", got)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}
}

// A first attempt that was not charged (the upstream refused the request,
// the payment was refused) leaves the id free: a later attempt with the
// same id is served and charged once.
func TestPaymentIdentifierFailedAttemptThenAGoodOne(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "payment_identifier"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[8]
	before := balance(t, d, payer.Address)

	// The upstream answers 422: not charged, not saved; the same payment
	// under the same id then succeeds.
	const id1 = "pay_failed_then_good_00001"
	sig := signWithID(t, pr, payer.Key(), id1)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig, "X-Test-Status": "422"}); resp.StatusCode != 422 || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("failing call: %d, PAYMENT-RESPONSE %q", resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse))
	}
	if balance(t, d, payer.Address).Cmp(before) != 0 {
		t.Fatal("a 422 was charged")
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != 200 {
		t.Fatalf("the same payment after the 422: %d %s", resp.StatusCode, readAll(t, resp))
	}
	tx := settlementOf(t, resp).Transaction

	// A payment the facilitator refuses (an unfunded wallet): the id is
	// free again, and a good payment under it is served.
	const id2 = "pay_failed_then_good_00002"
	broke, _ := crypto.GenerateKey()
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signWithID(t, pr, broke, id2)})
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unfunded payment: %d %s", resp.StatusCode, readAll(t, resp))
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signWithID(t, pr, payer.Key(), id2)})
	if resp.StatusCode != 200 || settlementOf(t, resp).Transaction == tx {
		t.Fatalf("a good payment under the refused one's id: %d", resp.StatusCode)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(40000)) != 0 {
		t.Fatalf("payer charged %v, want two payments of 20000", got)
	}
}

// Past the window the saved answer is gone: the same payment is refused as
// used (never charged twice), and a new payment under the id is a new call.
func TestPaymentIdentifierWindowExpires(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	const window = 3 * time.Second
	base := startCaddy(t, gateSite(up.URL, fac, 0, "payment_identifier {\n\t\t\t\twindow 3s\n\t\t\t}"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[1]
	before := balance(t, d, payer.Address)
	const id = "pay_window_expires_000001"
	sig := signWithID(t, pr, payer.Key(), id)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		t.Fatalf("first call: %d", resp.StatusCode)
	}
	saved := time.Now() // the answer was saved before it was sent
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != 200 {
		if time.Since(saved) < window {
			t.Fatalf("retry within the window: %d", resp.StatusCode)
		}
		t.Logf("the machine is too slow to retry within %v", window)
	}
	time.Sleep(time.Until(saved.Add(window + 200*time.Millisecond)))
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if m := readJSON(t, resp); resp.StatusCode != http.StatusPaymentRequired || m["reason"] != x402.ReasonPaymentAlreadyUsed {
		t.Fatalf("the same payment after the window: %d %v", resp.StatusCode, m["reason"])
	}
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signWithID(t, pr, payer.Key(), id)}); resp.StatusCode != 200 {
		t.Fatalf("a new payment under the expired id: %d", resp.StatusCode)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(40000)) != 0 {
		t.Fatalf("payer charged %v, want two payments of 20000", got)
	}
	if up.calls.Load() != 2 {
		t.Fatalf("upstream ran %d times, want 2", up.calls.Load())
	}
}

// An answer over max_answer is delivered but not saved: the retry is told
// so, with the first settlement, and nothing is charged again.
func TestPaymentIdentifierOversizeAnswerIsServedNotSaved(t *testing.T) {
	d, fac := sharedDevnet(t)
	var calls int
	big4k := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.Header().Set("Content-Type", "text/plain")
		w.Write(bytes.Repeat([]byte("x"), 4<<10))
	}))
	defer big4k.Close()
	base := startCaddy(t, gateSite(big4k.URL, fac, 0, "payment_identifier {\n\t\t\t\tmax_answer 1KiB\n\t\t\t}"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[7]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, pr, payer.Key(), "pay_oversize_answer_000001")
	first := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if b := readAll(t, first); first.StatusCode != 200 || len(b) != 4<<10 {
		t.Fatalf("first call: %d, %d bytes", first.StatusCode, len(b))
	}
	tx := settlementOf(t, first).Transaction
	again := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if again.StatusCode != http.StatusConflict || idemCode(t, again) != codePaymentIDAnswerNotKept {
		t.Fatalf("retry: %d", again.StatusCode)
	}
	if settlementOf(t, again).Transaction != tx {
		t.Fatal("the retry does not name the first settlement")
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(20000)) != 0 || calls != 1 {
		t.Fatalf("payer charged %v, upstream ran %d times; want one payment and one run", got, calls)
	}
}

// A route that requires an id refuses a payment without one, and a
// malformed id is refused on any route that enables the extension: 400,
// nothing claimed or charged, so the same authorization works afterwards.
func TestPaymentIdentifierRequiredAndMalformed(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "payment_identifier required"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[2]
	before := balance(t, d, payer.Address)
	p, err := x402.SignExactEVM(payer.Key(), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		desc string
		p    x402.PaymentPayload
		code string
	}{
		{"no extension", p, codePaymentIDRequired},
		{"the declaration echoed without an id", func() x402.PaymentPayload {
			q := withPaymentID(t, pr, p, "x")
			delete(q.Extensions[x402.PaymentIdentifierExtension].(map[string]any)["info"].(map[string]any), "id")
			return q
		}(), codePaymentIDRequired},
		{"too short", withPaymentID(t, pr, p, "pay_short"), codeInvalidPaymentID},
		{"too long", withPaymentID(t, pr, p, "pay_"+strings.Repeat("a", 125)), codeInvalidPaymentID},
		{"a character outside the set", withPaymentID(t, pr, p, "pay_7d5d747be160e2.05"), codeInvalidPaymentID},
	} {
		h, _ := x402.EncodeHeader(c.p)
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: h})
		if resp.StatusCode != http.StatusBadRequest || idemCode(t, resp) != c.code {
			t.Errorf("%s: %d, want 400 %s", c.desc, resp.StatusCode, c.code)
		}
	}
	if up.calls.Load() != 0 || balance(t, d, payer.Address).Cmp(before) != 0 {
		t.Fatalf("a refused id ran the upstream (%d) or charged", up.calls.Load())
	}
	h, _ := x402.EncodeHeader(withPaymentID(t, pr, p, "pay_required_and_good_001"))
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: h}); resp.StatusCode != 200 {
		t.Fatalf("the same authorization with a good id: %d", resp.StatusCode)
	}
}

// Two gates that share only a Redis store (two sites of one Caddy, as two
// instances behind a load balancer would): a call paid through one is
// answered from its saved answer by the other.
func TestPaymentIdentifierAcrossGatesSharingRedis(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	srv := servers.StartRedis(t)
	site := func(host string) string {
		return fmt.Sprintf(`http://%[1]s:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store redis %[4]s {
				prefix idem
			}
			payment_identifier
		}
		reverse_proxy %[5]s
	}
}
`, host, fac, payTo.Hex(), srv.Addr, strings.TrimPrefix(up.URL, "http://"))
	}
	base := startCaddy(t, site("a.test")+site("b.test"))
	on := func(host, sig string) *http.Response { return postPaidOn(t, base+"/verify/schema", host, sig) }
	pr := paymentRequired(t, on("a.test", ""))
	payer := evmfacilitator.DevAccounts()[6]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, pr, payer.Key(), "pay_across_gates_redis_01")
	first := on("a.test", sig)
	firstBody := readAll(t, first)
	if first.StatusCode != 200 {
		t.Fatalf("through a: %d %s", first.StatusCode, firstBody)
	}
	second := on("b.test", sig)
	if b := readAll(t, second); second.StatusCode != 200 || !bytes.Equal(b, firstBody) {
		t.Fatalf("through b: %d %s", second.StatusCode, b)
	}
	if resp := on("b.test", signWithID(t, pr, payer.Key(), "pay_across_gates_redis_01")); resp.StatusCode != http.StatusConflict {
		t.Fatalf("a new payment under the id through b: %d", resp.StatusCode)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
		t.Fatalf("payer charged %v, upstream ran %d times", got, up.calls.Load())
	}
}

// An MCP tool call carries its payment in _meta: the same hook applies. The
// retry (a new JSON-RPC call) gets the saved result, named by its own id,
// with the first settlement in _meta; another payment under the id is a
// tool error with the conflict code.
func TestPaymentIdentifierOverMCP(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newMCPUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /mcp {
		x402 {
			mcp_tool verify_schema
			accept devnet $0.02 %[2]s
			facilitator http {
				url %[1]s
			}
			store badger {data}/gate
			payment_identifier
		}
		reverse_proxy %[3]s
	}
}
`, fac, payTo.Hex(), strings.TrimPrefix(up.URL, "http://")))
	s := mcpSession(t, base+"/mcp")
	pr := demandOf(t, callTool(t, s, "verify_schema", verifyArgs, nil))
	if pr.Extensions[x402.PaymentIdentifierExtension] == nil {
		t.Fatalf("the MCP demand declares no payment-identifier: %v", pr.Extensions)
	}
	payer := evmfacilitator.DevAccounts()[3]
	before := balance(t, d, payer.Address)
	meta := func() mcp.Meta {
		p, err := x402.SignExactEVM(payer.Key(), pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(withPaymentID(t, pr, p, "pay_mcp_tool_call_000001"))
		var obj map[string]any
		json.Unmarshal(b, &obj)
		return mcp.Meta{mcpMetaPayment: obj}
	}
	m := meta()
	first := callTool(t, s, "verify_schema", verifyArgs, m)
	second := callTool(t, s, "verify_schema", verifyArgs, m)
	for i, res := range []*mcp.CallToolResult{first, second} {
		if res.IsError {
			t.Fatalf("call %d: %+v", i+1, res)
		}
	}
	tx := func(res *mcp.CallToolResult) any {
		sr, _ := res.Meta[mcpMetaPaymentResponse].(map[string]any)
		return sr["transaction"]
	}
	if tx(first) == nil || tx(first) != tx(second) {
		t.Fatalf("settlements %v and %v, want the first one twice", tx(first), tx(second))
	}
	conflict := callTool(t, s, "verify_schema", verifyArgs, meta())
	if sc, _ := conflict.StructuredContent.(map[string]any); !conflict.IsError || sc["code"] != codePaymentIDConflict {
		t.Fatalf("another payment under the id: %+v", conflict.StructuredContent)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
		t.Fatalf("payer charged %v, tool ran %d times", got, up.calls.Load())
	}
}

func TestPaymentIdentifierCaddyfile(t *testing.T) {
	for _, c := range []struct{ in, err string }{
		{"payment_identifier", ""},
		{"payment_identifier required {\n window 10m\n max_answer 64KiB\n}", ""},
		{"payment_identifier sometimes", "neither optional nor required"},
		{"payment_identifier optional extra", "argument"},
		{"payment_identifier {\n window -1s\n}", "positive duration"},
		{"payment_identifier {\n window soon\n}", "positive duration"},
		{"payment_identifier {\n max_answer lots\n}", "bad size"},
		{"payment_identifier {\n keep 1h\n}", "unknown option"},
	} {
		err := adaptSiteError("x402 {\n accept devnet $0.02 " + payTo.Hex() + "\n " + c.in + "\n}")
		wantErr(t, err, c.err)
	}
	var g Gate
	g.PaymentIdentifier = &PaymentIdentifier{Window: -1}
	if err := g.PaymentIdentifier.provision(&g); err == nil {
		t.Error("a negative window was provisioned")
	}
	g.PaymentIdentifier = &PaymentIdentifier{Window: caddy.Duration(8 * 24 * time.Hour)}
	if err := g.PaymentIdentifier.provision(&g); err == nil {
		t.Error("a window over 7 days was provisioned")
	}
}

// A settlement whose outcome is unknown keeps the id bound: another
// payment under it is a conflict (the first may have moved the money),
// while the same payment's retry is resolved as without an id (pending.go)
// and gets the held answer, charged once.
func TestPaymentIdentifierWithAnUnknownSettlement(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := gateDir(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", storeDir, "payment_identifier"))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[7]
	before := balance(t, d, payer.Address)
	pr := paymentRequired(t, post(t, url, "", nil))
	const id = "pay_unknown_settlement_001"
	sig := signWithID(t, pr, payer.Key(), id)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %d", resp.StatusCode)
	}
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signWithID(t, pr, payer.Key(), id)}); resp.StatusCode != http.StatusConflict || idemCode(t, resp) != codePaymentIDConflict {
		t.Fatalf("another payment under the id: %d", resp.StatusCode)
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if m := readJSON(t, resp); resp.StatusCode != 200 || m["paid_content"] != true {
		t.Fatalf("the same payment's retry: %d %v", resp.StatusCode, m)
	}
	if got := charged(t, d, payer.Address, before); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
		t.Fatalf("charged %v, upstream ran %d times", got, up.calls.Load())
	}
	// The resolved answer is now the id's saved answer too, for the retries
	// that come after the claim and its held record have lapsed.
	db, err := store.Shared(storeDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := db.PaymentIDs().Lookup(context.Background(), id)
	if err != nil || !st.Done || !bytes.Contains(st.Answer, []byte(`"kept":true`)) {
		t.Fatalf("binding after the resolution: %+v, %v", st, err)
	}
}

// In settle before mode the answer is streamed, so it is never saved: the
// retry is told it was paid and answered, and is not charged again.
func TestPaymentIdentifierSettleBeforeIsNotKept(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "settle before\n\t\t\tpayment_identifier"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[8]
	before := balance(t, d, payer.Address)
	sig := signWithID(t, pr, payer.Key(), "pay_settle_before_0000001")
	first := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if first.StatusCode != 200 {
		t.Fatalf("first call: %d", first.StatusCode)
	}
	tx := settlementOf(t, first).Transaction
	again := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if again.StatusCode != http.StatusConflict || idemCode(t, again) != codePaymentIDAnswerNotKept || settlementOf(t, again).Transaction != tx {
		t.Fatalf("retry: %d", again.StatusCode)
	}
	if got := charged(t, d, payer.Address, before); got.Cmp(big.NewInt(20000)) != 0 || up.calls.Load() != 1 {
		t.Fatalf("charged %v, upstream ran %d times", got, up.calls.Load())
	}
}
