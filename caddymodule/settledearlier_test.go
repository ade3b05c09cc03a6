package caddymodule

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// countedRPC is a proxy in front of the devnet node (the real chain behind
// it) that counts the JSON-RPC calls made through it, a batch's each.
func countedRPC(t *testing.T, target string) (string, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var many []json.RawMessage
		if json.Unmarshal(body, &many) == nil {
			n.Add(int64(len(many)))
		} else {
			n.Add(1)
		}
		relayRPC(w, target, bytes.NewReader(body))
	}))
	t.Cleanup(proxy.Close)
	return proxy.URL, &n
}

// settledElsewhere pays once through another gateway, so that the
// payment's payer and nonce are used on chain (and public), and starts the
// gateway under test: a remote facilitator with an rpc endpoint for
// unknown outcomes, whose chain reads are counted. It returns that
// gateway's route URL, the settled payment and the counter.
func settledElsewhere(t *testing.T) (string, x402.PaymentPayload, x402.ExactEVMPayload, *atomic.Int64, *upstream) {
	t.Helper()
	d, fac := sharedDevnet(t)
	rpcURL, calls := countedRPC(t, d.RPCURL())
	upA := newUpstream(t)
	urlA := startCaddy(t, gateSite(upA.URL, fac, 0, "")) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, urlA, "", nil)), 4)
	if resp := post(t, urlA, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK {
		t.Fatalf("the buyer's payment: %d %s", resp.StatusCode, readAll(t, resp))
	}
	up := newUpstream(t)
	base := startCaddy(t, rpcGateSite(t, up.URL, fac, rpcURL, "5s"))
	var p x402.PaymentPayload
	if err := x402.DecodeHeader(sig, &p); err != nil {
		t.Fatal(err)
	}
	var pl x402.ExactEVMPayload
	if err := json.Unmarshal(p.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	return base + "/verify/schema", p, pl, calls, up
}

// unsignedCopy is the settled payment's authorization (payer, payTo,
// value, nonce) with validAfter va, a validBefore ago in the past, and a
// signature of 65 bytes that signs nothing: what anyone can make of a
// settlement seen on chain.
func unsignedCopy(t *testing.T, p x402.PaymentPayload, pl x402.ExactEVMPayload, va string, ago time.Duration) string {
	t.Helper()
	f := pl
	f.Authorization.ValidAfter = va
	f.Authorization.ValidBefore = fmt.Sprint(time.Now().Add(-ago).Unix())
	f.Signature = "0x" + strings.Repeat("11", 65)
	return withEVMPayload(t, p, f)
}

// withEVMPayload is the PAYMENT-SIGNATURE header of p with its payload
// replaced by f.
func withEVMPayload(t *testing.T, p x402.PaymentPayload, f x402.ExactEVMPayload) string {
	t.Helper()
	var err error
	if p.Payload, err = json.Marshal(f); err != nil {
		t.Fatal(err)
	}
	h, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestSettledEarlierReadsTheChainOnlyForASignedPayment: an expired
// payment the facilitator refuses sends the gate to the chain (did it
// settle earlier?) only when its signature is the payer's. An unsigned copy
// of a settled payment costs no chain read, however its validAfter sends a
// log search back; a signed expired payment whose nonce was never used
// costs one (authorizationState), no log search.
func TestSettledEarlierReadsTheChainOnlyForASignedPayment(t *testing.T) {
	url, p, pl, calls, up := settledElsewhere(t)
	for k, va := range []string{"0", pl.Authorization.ValidAfter} {
		h := unsignedCopy(t, p, pl, va, time.Duration(10+k)*time.Minute)
		calls.Store(0)
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: h})
		reason := reasonOf(t, resp)
		if n := calls.Load(); n != 0 || resp.StatusCode != http.StatusPaymentRequired {
			t.Errorf("an unsigned expired copy (validAfter %s): %d %s, %d chain reads; want 402 and none", va, resp.StatusCode, reason, n)
		}
	}
	pr := paymentRequired(t, post(t, url, "", nil))
	signed, err := x402.SignExactEVM(evmfacilitator.DevKey(5), pr.Accepts[0], &pr.Resource, time.Now().Add(-2*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	h, err := x402.EncodeHeader(signed)
	if err != nil {
		t.Fatal(err)
	}
	calls.Store(0)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: h})
	reason := reasonOf(t, resp)
	if n := calls.Load(); n != 1 || reason != x402.ReasonExactEVMValidBefore {
		t.Errorf("a signed expired payment, its nonce unused: %d %s, %d chain reads; want %s after one read", resp.StatusCode, reason, n, x402.ReasonExactEVMValidBefore)
	}
	if up.calls.Load() != 0 {
		t.Fatalf("the upstream ran %d times", up.calls.Load())
	}
}

// TestUnsignedCopyOfASettledPaymentGetsTheRefusal: a copy of a settled
// payment's authorization that its payer never signed is not "this
// payment": it gets the facilitator's own refusal (expired), never
// payment_already_used or a PAYMENT-RESPONSE naming the payer's
// transaction.
func TestUnsignedCopyOfASettledPaymentGetsTheRefusal(t *testing.T) {
	url, p, pl, _, up := settledElsewhere(t)
	h := unsignedCopy(t, p, pl, pl.Authorization.ValidAfter, 10*time.Minute)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: h})
	pr := resp.Header.Get(x402.HeaderPaymentResponse)
	if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != x402.ReasonExactEVMValidBefore || pr != "" {
		t.Errorf("an unsigned copy of a settled payment: %d %s, PAYMENT-RESPONSE %q; want 402 %s and none",
			resp.StatusCode, reason, pr, x402.ReasonExactEVMValidBefore)
	}
	if up.calls.Load() != 0 {
		t.Fatalf("the upstream ran %d times", up.calls.Load())
	}
}

// resignUsed is the settled payment p (payload pl) signed again by its
// payer (dev account payer) with another validity window: an authorization
// of the same payer, payTo, value and nonce, the payer's own signature, as
// anyone holding the key can make any number of.
func resignUsed(t *testing.T, offer x402.PaymentRequirements, p x402.PaymentPayload, pl x402.ExactEVMPayload, payer int, validAfter, validBefore string) string {
	t.Helper()
	a := pl.Authorization
	a.ValidAfter, a.ValidBefore = validAfter, validBefore
	chainID, name, version, token, err := x402.ExactEVMDomain(offer)
	if err != nil {
		t.Fatal(err)
	}
	d, err := x402.TransferWithAuthorizationDigest(chainID, name, version, token, a)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := crypto.Sign(d[:], evmfacilitator.DevKey(payer))
	if err != nil {
		t.Fatal(err)
	}
	sig[64] += 27
	return withEVMPayload(t, p, x402.ExactEVMPayload{Signature: "0x" + hex.EncodeToString(sig), Authorization: a})
}

// TestSettledEarlierRemembersAUsedNoncesSearch: the settled payment is
// public (its signature is in the transfer's calldata), and its payer can
// sign any number of authorizations of the nonce they spent, so the
// settled-earlier check of a used nonce is asked again and again. The
// search for the transaction that used the nonce (the head, header
// bisections to the validity window, eth_getLogs) runs once a minute per
// token, payer and nonce once it found the nonce's log: every repeat after
// the first costs at most one chain read (authorizationState). The settled
// payment itself is told it settled earlier; an authorization re-signed
// with another window, whether it holds the settlement's block or closed
// before, gets the facilitator's refusal: the nonce is used, by a
// transaction that executed the settled payment, not it (the facilitator
// reads the nonce of an expired authorization before refusing it for
// time, as a retry of its own landed settlement is answered so). (Before:
// one whose window held the block was told it settled earlier, by the
// other authorization's transfer.)
func TestSettledEarlierRemembersAUsedNoncesSearch(t *testing.T) {
	url, p, pl, calls, up := settledElsewhere(t)
	pr := paymentRequired(t, post(t, url, "", nil))
	orig, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		hdr    func(i int) string
		reason string
	}{
		{"the settled payment itself, replayed", func(int) string { return orig }, x402.ReasonPaymentAlreadyUsed},
		{"the payer's re-signed authorization of the used nonce, validAfter 0, its window holding the settlement", func(i int) string {
			return resignUsed(t, pr.Accepts[0], p, pl, 4, "0", fmt.Sprint(time.Now().Add(time.Duration(60+i)*time.Second).Unix()))
		}, x402.ReasonExactEVMNonceAlreadyUsed},
		{"the payer's re-signed authorization of the used nonce, its window closed before the settlement", func(i int) string {
			return resignUsed(t, pr.Accepts[0], p, pl, 4, "0", fmt.Sprint(time.Now().Add(-time.Duration(10+i)*time.Minute).Unix()))
		}, x402.ReasonExactEVMNonceAlreadyUsed},
	}
	for _, c := range cases {
		var reads []int64
		for i := 0; i < 4; i++ {
			calls.Store(0)
			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: c.hdr(i)})
			if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != c.reason {
				t.Errorf("%s, request %d: %d %s; want 402 %s", c.name, i+1, resp.StatusCode, reason, c.reason)
			}
			reads = append(reads, calls.Load())
		}
		t.Logf("%s: chain reads per request %v", c.name, reads)
		for i, n := range reads[1:] {
			if n > 1 {
				t.Errorf("%s: request %d cost %d chain reads (all: %v); want at most one after the first", c.name, i+2, n, reads)
				break
			}
		}
	}
	if up.calls.Load() != 0 {
		t.Fatalf("the upstream ran %d times", up.calls.Load())
	}
}

// TestSettledEarlierUnreadableChainIsPending: the buyer's own settled
// payment (no payment identifier), retried once the gate keeps nothing of
// it, is refused by the facilitator (its nonce is used) and the gate asks
// the chain. When the chain cannot be read (the gate's rpc endpoint
// answers errors, or does not answer), whether the buyer was charged is
// unknown: the answer is 503 settlement_pending, retryable, with no
// PAYMENT-REQUIRED, never the facilitator's refusal, which an x402 client
// answers with a second payment. The wait is bounded by the facilitator's
// timeout. A failed read is not remembered: once the chain answers again,
// the retry is told the payment settled earlier.
func TestSettledEarlierUnreadableChainIsPending(t *testing.T) {
	for _, mode := range []string{"error", "stall"} {
		t.Run(mode, func(t *testing.T) {
			d, fac := sharedDevnet(t)
			var down atomic.Bool
			down.Store(true)
			back := make(chan struct{}) // closed when the outage ends
			// A proxy in front of the devnet node that, while down, answers
			// every call with an error or holds it unanswered: a provider's
			// outage, which the devnet itself cannot be made to have.
			rpc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if down.Load() {
					if mode == "stall" {
						select {
						case <-r.Context().Done():
						case <-back:
						}
						return
					}
					http.Error(w, "provider down", http.StatusBadGateway)
					return
				}
				relayRPC(w, d.RPCURL(), r.Body)
			}))
			t.Cleanup(rpc.Close)
			var once sync.Once
			end := func() { once.Do(func() { down.Store(false); close(back) }) }
			t.Cleanup(end) // before rpc.Close, which waits for the calls held
			upA := newUpstream(t)
			urlA := startCaddy(t, gateSite(upA.URL, fac, 0, "")) + "/verify/schema"
			sig := signFor(t, paymentRequired(t, post(t, urlA, "", nil)), 4)
			if resp := post(t, urlA, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK {
				t.Fatalf("the buyer's payment: %d %s", resp.StatusCode, readAll(t, resp))
			}
			up := newUpstream(t)
			url := startCaddy(t, rpcGateSite(t, up.URL, fac, rpc.URL, "3s")) + "/verify/schema"
			for i := 0; i < 2; i++ {
				start := time.Now()
				resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
				took := time.Since(start)
				preq := resp.Header.Get(x402.HeaderPaymentRequired)
				e := readJSON(t, resp)
				if resp.StatusCode != http.StatusServiceUnavailable || e["code"] != codeSettlementPending || e["retryable"] != true || preq != "" {
					t.Errorf("the buyer's settled payment, chain unreadable (try %d): %d %v, PAYMENT-REQUIRED %q; want 503 %s, retryable, and none",
						i+1, resp.StatusCode, e, preq, codeSettlementPending)
				}
				if took > 10*time.Second {
					t.Errorf("the answer took %v; want it within the facilitator's timeout", took)
				}
			}
			end()
			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != x402.ReasonPaymentAlreadyUsed || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
				t.Errorf("the chain readable again: %d %s; want 402 %s with PAYMENT-RESPONSE", resp.StatusCode, reason, x402.ReasonPaymentAlreadyUsed)
			}
			if up.calls.Load() != 0 {
				t.Fatalf("the upstream ran %d times", up.calls.Load())
			}
		})
	}
}

// TestSettledEarlierNonceSpentBeforeValidAfterIsRefused: an authorization
// whose nonce was spent before its validAfter, by the buyer's settled
// payment, can never execute. The gate's settled-earlier check searches its
// validity window, finds no use of the nonce there and answers the
// facilitator's refusal (402, a new payment asked for), not 503
// settlement_pending on every retry. That "not found" is for that window
// only: the settled payment itself, retried right after, is still 402
// payment_already_used with its PAYMENT-RESPONSE.
func TestSettledEarlierNonceSpentBeforeValidAfterIsRefused(t *testing.T) {
	url, p, pl, _, up := settledElsewhere(t)
	d, _ := sharedDevnet(t)
	ctx := context.Background()
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	after := head.Time + 1 // after the settlement's block
	to := common.HexToAddress("0x000000000000000000000000000000000000dEaD")
	for {
		if _, err := d.SendTx(ctx, evmfacilitator.DevKey(7), &to, nil); err != nil {
			t.Fatal(err)
		}
		h, err := d.Client().HeaderByNumber(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if h.Time > after+1 {
			break // blocks past the window below: its whole is on chain
		}
		time.Sleep(500 * time.Millisecond)
	}
	pr := paymentRequired(t, post(t, url, "", nil))
	h := resignUsed(t, pr.Accepts[0], p, pl, 4, fmt.Sprint(after), fmt.Sprint(after+1))
	for i := 0; i < 2; i++ {
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: h})
		preq := resp.Header.Get(x402.HeaderPaymentRequired)
		if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != x402.ReasonExactEVMValidBefore || preq == "" {
			t.Errorf("try %d, the nonce spent before validAfter: %d %s, PAYMENT-REQUIRED %v; want 402 %s asking for a new payment",
				i+1, resp.StatusCode, reason, preq != "", x402.ReasonExactEVMValidBefore)
		}
	}
	orig, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: orig})
	prh := resp.Header.Get(x402.HeaderPaymentResponse)
	if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != x402.ReasonPaymentAlreadyUsed || prh == "" {
		t.Errorf("the settled payment retried right after: %d %s, PAYMENT-RESPONSE %q; want 402 %s with it",
			resp.StatusCode, reason, prh, x402.ReasonPaymentAlreadyUsed)
	}
	if up.calls.Load() != 0 {
		t.Fatalf("the upstream ran %d times", up.calls.Load())
	}
}

// relayRPC posts a JSON-RPC request body to the node at target and copies
// its answer to w: the relay of the test proxies in front of the devnet.
func relayRPC(w http.ResponseWriter, target string, body io.Reader) {
	resp, err := http.Post(target, "application/json", body)
	if err != nil {
		http.Error(w, "devnet unreachable", http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", "application/json")
	io.Copy(w, resp.Body)
}

// rpcGateSite is a gate at /verify/schema in front of upstream, whose
// remote facilitator fac answers within timeout and whose chain reads go
// to rpc: the site of the settled-earlier tests.
func rpcGateSite(t *testing.T, upstream, fac, rpc, timeout string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator http %[2]s {
				timeout %[6]s
				rpc devnet %[4]s
			}
			store badger %[5]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(upstream, "http://"), fac, payTo.Hex(), rpc, gateDir(t), timeout)
}

// TestSettledEarlierNewWindowsOfAUsedNonceCostOneRead: the payer of a used
// nonce can sign any number of authorizations of it, each with a new
// validity window that excludes the nonce's use (validAfter 0, validBefore
// before the settlement: never executable). The blocks a search covered
// without finding the nonce's log are remembered per token, payer and
// nonce, so a new window within them costs no search: every request after
// the first costs at most the one authorizationState read.
func TestSettledEarlierNewWindowsOfAUsedNonceCostOneRead(t *testing.T) {
	url, p, pl, calls, up := settledElsewhere(t)
	pr := paymentRequired(t, post(t, url, "", nil))
	var reads []int64
	for i := 0; i < 6; i++ {
		// validAfter 0, validBefore before the settlement: never executable,
		// the nonce's use is outside the window.
		h := resignUsed(t, pr.Accepts[0], p, pl, 4, "0", fmt.Sprint(time.Now().Add(-time.Duration(10+i)*time.Minute).Unix()))
		calls.Store(0)
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: h})
		reason := reasonOf(t, resp)
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Errorf("request %d: %d %s; want 402, the authorization never executed", i+1, resp.StatusCode, reason)
		}
		reads = append(reads, calls.Load())
	}
	t.Logf("chain reads per request: %v", reads)
	for i, n := range reads[1:] {
		if n > 1 {
			t.Errorf("request %d cost %d chain reads (all: %v); README: each repeat within the minute costs the one authorizationState read", i+2, n, reads)
			break
		}
	}
	if up.calls.Load() != 0 {
		t.Fatalf("the upstream ran %d times", up.calls.Load())
	}
}

// A payment whose facilitator answers Verify that a settlement of it is
// pending there (settlement_pending: another gate or client settled it
// and its outcome is not known yet) is answered 503 settlement_pending,
// nothing served: the payment may still land, so the buyer is not asked
// for another. Its retry gets the same answer. (Before: it was a 402 with
// a fresh PAYMENT-REQUIRED, which an x402 client reads as "sign again".)
func TestVerifySayingASettlementIsPendingIsNotAskedToPayAgain(t *testing.T) {
	sharedDevnet(t)
	up := newUpstream(t)
	url := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator faulty_devnet verify_pending
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, up.URL, payTo.Hex())) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 4)
	for try := range 2 {
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		body := readAll(t, resp)
		if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(body, []byte(`"code":"settlement_pending"`)) {
			t.Fatalf("try %d: %d %s, want 503 settlement_pending", try, resp.StatusCode, body)
		}
		if h := resp.Header.Get(x402.HeaderPaymentRequired); h != "" {
			t.Errorf("try %d: a fresh offer (PAYMENT-REQUIRED) with the pending answer", try)
		}
	}
	if n := up.calls.Load(); n != 0 {
		t.Errorf("the upstream ran %d times for a payment not settled", n)
	}
}
