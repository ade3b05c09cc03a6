package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// sendAtOnce sends n requests together (request(i) says what each is) and
// returns how many got each status.
func sendAtOnce(t *testing.T, n int, request func(i int) (method, url, body string, hdr map[string]string)) map[int]int {
	t.Helper()
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		method, url, body, hdr := request(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, _ := send(t, method, url, body, hdr)
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return statuses
}

// unfundedPayments signs n payments for pr's first offer, each by a new
// wallet that holds nothing: the facilitator's /verify refuses them.
func unfundedPayments(t *testing.T, pr x402.PaymentRequired, n int) []x402.PaymentPayload {
	t.Helper()
	ps := make([]x402.PaymentPayload, n)
	for i := range ps {
		key, _ := crypto.GenerateKey()
		p, err := x402.SignExactEVM(key, pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = p
	}
	return ps
}

// One client sends many refused payments at once (unfunded wallets, each
// a facilitator /verify): the rate limit bounds the /verify calls to its
// events per window, concurrent or not, and the rest are 429 before any
// work. A second wave once one event has refilled gets one /verify. (From
// the audit: the budget was checked before the work and counted after it,
// so all 16 in flight passed the check: 16 /verify calls.)
func TestConcurrentRefusedPaymentsAreBoundedByTheRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, verifies := countingFacilitator(t, fac, 400*time.Millisecond)
	up := newUpstream(t)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32\n\t\ttrusted_proxies_strict", "", gateSite(up.URL, facURL, 0, "rate_limit 2 4s"))
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.200")))

	const n = 16
	wave := func() (map[int]int, int64) {
		hdrs := make([]map[string]string, n)
		for i, p := range unfundedPayments(t, pr, n) {
			h, _ := x402.EncodeHeader(p)
			hdrs[i] = map[string]string{"X-Forwarded-For": "198.51.100.9", x402.HeaderPaymentSignature: h}
		}
		before := verifies.Load()
		st := sendAtOnce(t, n, func(i int) (string, string, string, map[string]string) {
			return http.MethodPost, u, validRequest, hdrs[i]
		})
		return st, verifies.Load() - before
	}
	s1, v1 := wave()
	// One event refills in 2 s; the whole window is 4 s.
	time.Sleep(2100 * time.Millisecond)
	s2, v2 := wave()
	if v1 != 2 || v2 != 1 || s1[http.StatusTooManyRequests] != n-2 || s2[http.StatusTooManyRequests] != n-1 {
		t.Errorf("one client, rate_limit 2 4s, two waves of %d concurrent refused payments 2.1 s apart: %d then %d /verify calls (statuses %v, %v); want 2 then 1, the rest 429", n, v1, v2, s1, s2)
	}
}

// The same over MCP: concurrent tools/call messages of one client, each
// with an unfunded payment in _meta, cost at most rate_limit's events
// /verify calls; the rest are rate_limited tool results.
func TestConcurrentRefusedToolCallPaymentsAreBoundedByTheRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, verifies := countingFacilitator(t, fac, 400*time.Millisecond)
	up := newMCPUpstream(t)
	site := strings.Replace(mcpSite(up.URL, facURL, 0), "validate verify_request", "validate verify_request\n\t\t\trate_limit 2 1m", 1)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32\n\t\ttrusted_proxies_strict", "", site)
	u := base + "/mcp"
	pr := demandOf(t, callTool(t, mcpSession(t, u), "verify_schema", verifyArgs, nil))

	const n = 12
	bodies := make([]string, n)
	for i, p := range unfundedPayments(t, pr, n) {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": map[string]any{
			"name": "verify_schema", "arguments": verifyArgs, "_meta": mcp.Meta{mcpMetaPayment: p},
		}})
		bodies[i] = string(b)
	}
	before := verifies.Load()
	st := sendAtOnce(t, n, func(i int) (string, string, string, map[string]string) {
		return http.MethodPost, u, bodies[i], from("198.51.100.9")
	})
	if got := verifies.Load() - before; got != 2 {
		t.Errorf("%d concurrent tool calls of one client with unfunded payments (rate_limit 2 1m): %d /verify calls (statuses %v); want 2", n, got, st)
	}
}

// wallet_auth spends its server's gates' budgets before it checks a proof:
// concurrent contract-wallet proofs of one client whose check fails at the
// chain cost at most rate_limit's events chain checks, the rest 429. (From
// the audit: 12 proofs at once, 12 chain checks with rate_limit 3 1m.)
func TestConcurrentWalletChecksAreBoundedByTheRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	var checks atomic.Int64
	rpc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID     json.RawMessage `json:"id"`
			Method string          `json:"method"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		switch req.Method {
		case "eth_chainId":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"0x2105"}`, req.ID)
		case "eth_getCode":
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":"0x6001"}`, req.ID)
		default: // the signature check: a node that cannot answer
			checks.Add(1)
			time.Sleep(300 * time.Millisecond)
			fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"error":{"code":-32000,"message":"header not found"}}`, req.ID)
		}
	}))
	t.Cleanup(rpc.Close)
	up := walletUpstream(t)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32\n\t\ttrusted_proxies_strict", "", rateLimitedWalletSite(up.URL, fac, rpc.URL))
	u := base + "/api/x"
	const n = 12
	hdrs := make([]map[string]string, n)
	for i := range n {
		e, err := walletauth.Parse(walletProof(t, walletKey(1), "GET", u, func(r *walletauth.Request) { r.ChainID = "eip155:8453" }))
		if err != nil {
			t.Fatal(err)
		}
		e.Address = walletAddr(2) // a contract wallet: checked at the chain
		h, _ := e.Encode()
		hdrs[i] = map[string]string{"X-Forwarded-For": "198.51.100.9", walletauth.HeaderName: h}
	}
	st := sendAtOnce(t, n, func(i int) (string, string, string, map[string]string) {
		return http.MethodGet, u, "", hdrs[i]
	})
	if got := checks.Load(); got != 3 || st[http.StatusTooManyRequests] != n-3 {
		t.Errorf("%d concurrent failing contract-wallet proofs of one client (rate_limit 3 1m): %d chain checks, statuses %v; want 3, the rest 429", n, got, st)
	}
}

// A newcomer to a full table has its 402 counted in its network's budget;
// room appears in the table of clients before its payment arrives, whose
// request then holds an event of a bucket of its own. The settled payment
// gives that event back and the 402's to the network's budget, where it
// was counted. (From the audit: the credit looked only for a bucket of the
// client's own once the table had room, and was lost.)
func TestSettledPaymentCreditsTheBudgetIts402WasCountedIn(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := t0
	stubNow(t, &at)
	z := fullZone(t, 8, 2, 24*time.Hour)
	const newcomer = "203.0.113.1"
	z.note(newcomer) // its 402, counted in 203.0.113.0/24
	at = t0.Add(time.Second)
	z.credit("c0") // a tracked client's payment settles: c0 has refilled
	at = t0.Add(2 * time.Second)
	// The newcomer's payment, through the gate.
	g := &Gate{rates: z}
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r = r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, map[string]any{caddyhttp.ClientIPVarKey: newcomer}))
	prev, wait := g.holdRate(r)
	if wait != 0 {
		t.Fatalf("the newcomer's payment waits %d s", wait)
	}
	if !tracks(z, &z.clients, newcomer) {
		t.Fatal("with room in the table, the payment's request held no event of a bucket of its own")
	}
	g.creditSettled(r)
	g.endRateHold(r, prev)
	z.mu.Lock()
	p, own := z.prefixes.buckets["203.0.113.0/24"], z.clients.buckets[newcomer]
	z.mu.Unlock()
	if p == nil {
		t.Fatal("no bucket for the newcomer's /24")
	}
	if tp, to := p.TokensAt(at), own.TokensAt(at); tp < 2 || to < 2 {
		t.Errorf("after the newcomer's 402 and its settled payment: its /24 holds %.3f events, its own bucket %.3f; want both full (2)", tp, to)
	}
}
