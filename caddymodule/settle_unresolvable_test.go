package caddymodule

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// TestUnknownOutcomeWithoutRPCNeverAsksToPayAgain: a remote `facilitator
// http` without `rpc` answers the official npm facilitator's failure after
// a send (invalid_exact_evm_transaction_failed naming the transaction that
// did pay payTo). The gate cannot read the chain, so nothing can resolve
// the payment: it is held (503 settlement_pending, saying why it will not
// resolve by itself), and the retry of the same, charged payment once its
// claim has lapsed (validBefore + claimGrace) is still 503 settlement_pending,
// never a 402 asking for a new payment. (Before: once the claim lapsed the
// retry was claimed anew, the remote refused the spent authorization as
// expired, and the charged buyer was told 402 "sign a new payment".)
func TestUnknownOutcomeWithoutRPCNeverAsksToPayAgain(t *testing.T) {
	grace := claimGrace
	claimGrace = 2 * time.Second // a minute by default: no need to wait it out
	t.Cleanup(func() { claimGrace = grace })
	d, fac := sharedDevnet(t)
	remote := fakeFailedAfterSendFacilitator(t, fac, true)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept {
				network devnet
				price $0.01
				pay_to %[3]s
				max_timeout 20s
			}
			upstream_timeout 1s
			facilitator http {
				url %[2]s
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote.URL, payTo.Hex()))
	url := base + "/verify/schema"
	const acct = 7
	payer := evmfacilitator.DevAccounts()[acct].Address
	before := balance(t, d, payer)
	signed := time.Now()
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), acct)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body := readJSON(t, resp)
	paid := new(big.Int).Sub(before, balance(t, d, payer))
	if paid.Sign() <= 0 {
		t.Fatalf("the payer was not charged (first answer %d %v): the fake must let the real settlement through", resp.StatusCode, body)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || body["code"] != x402.ReasonSettlementPending {
		t.Fatalf("charged %s atoms, first answer %d %v; want 503 settlement_pending", paid, resp.StatusCode, body["code"])
	}
	unresolvable := func(what string, resp *http.Response) {
		t.Helper()
		s := readJSONString(t, resp)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(s, `"code":"settlement_pending"`) || !strings.Contains(s, "cannot read the chain") {
			t.Fatalf("%s of a charged payment this gateway cannot resolve: %d %.600s; want 503 settlement_pending saying the gateway cannot read the chain (never a 402 asking for a new payment)", what, resp.StatusCode, s)
		}
		if resp.Header.Get(x402.HeaderPaymentRequired) != "" {
			t.Fatalf("%s carries PAYMENT-REQUIRED: a new offer to a charged buyer", what)
		}
	}
	unresolvable("the retry while the claim lasts", post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	// The claim lapses at validBefore (20 s from signing: the devnet's
	// block time runs ahead of the wall clock after many quick blocks, so
	// a shorter one may expire before it settles) plus claimGrace.
	time.Sleep(time.Until(signed.Add(20*time.Second + claimGrace + 2*time.Second)))
	unresolvable("the retry after the claim lapsed", post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	if n := up.calls.Load(); n != 1 {
		t.Errorf("the upstream ran %d times; want once", n)
	}
}

// fakeRefusedBeforeSendFacilitator forwards every call to the real devnet
// facilitator at real but /settle, which it answers as the official npm
// facilitator answers an estimateGas revert its parseEip3009TransferError
// does not recognise (a blacklisted payer, a contract wallet reverting
// without data): invalid_exact_evm_transaction_failed with transaction "",
// exactly its answer to a send whose RPC call failed. It sends nothing.
func fakeRefusedBeforeSendFacilitator(t *testing.T, real string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/settle" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"success":false,"errorReason":"invalid_exact_evm_transaction_failed","errorMessage":"Execution reverted for an unknown reason.","transaction":"","network":"eip155:1337"}`)
			return
		}
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequest(r.Method, real+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, "unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(s.Close)
	return s
}

// TestFailureNamingNoTransactionIsHeldAndCounted: the remote's failure
// naming no transaction may follow a send whose RPC call failed, and no
// chain read can tell it from a refusal made before sending (the nonce of
// a transaction still in a mempool is unused), so the payment stays held
// (503 settlement_pending) until its authorization can no longer settle,
// an hour here as the reference Go client signs. A payer can cause such a
// refusal at will, so each counts against the client's rate limit like a
// paid call that settled nothing: with a budget of 3, the offer's 402 and
// two such payments leave none, and the next unpaid request is 429.
// (Before: such calls counted nothing, so a payer could have the upstream
// work without bound for payments that never settle.)
func TestFailureNamingNoTransactionIsHeldAndCounted(t *testing.T) {
	d, fac := sharedDevnet(t)
	storeDir := t.TempDir()
	remote := fakeRefusedBeforeSendFacilitator(t, fac)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.01 %[3]s
			rate_limit 3 1m
			facilitator http {
				url %[2]s
				rpc devnet %[4]s
			}
			store badger %[5]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote.URL, payTo.Hex(), d.RPCURL(), storeDir))
	url := base + "/verify/schema"
	t0 := time.Now()
	now = func() time.Time { return t0 } // no refill during the test
	t.Cleanup(func() { now = time.Now })
	pr := paymentRequired(t, post(t, url, "", nil)) // 402: one event
	sign := func() string {
		t.Helper()
		offer := pr.Accepts[0]
		offer.MaxTimeoutSeconds = 3600 // as the reference Go client signs
		p, err := x402.SignExactEVM(evmfacilitator.DevKey(8), offer, &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		p.Accepted = pr.Accepts[0]
		sig, err := x402.EncodeHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		return sig
	}
	pending := func(what, sig string) {
		t.Helper()
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		body := readJSONString(t, resp)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, `"code":"settlement_pending"`) {
			t.Fatalf("%s: %d %.300s; want 503 settlement_pending (a send may have happened)", what, resp.StatusCode, body)
		}
	}
	a := sign()
	pending("a payment the remote failed naming no transaction", a)
	pending("its retry", a)
	pending("a second such payment", sign())
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after the offer's 402 and two paid calls that settled nothing, with a budget of 3: %d, want 429", resp.StatusCode)
	}
	if n := up.calls.Load(); n != 2 {
		t.Errorf("the upstream ran %d times; want once per payment", n)
	}
	// The gate reads the chain (rpc devnet): the held payment is not
	// marked as one it can never resolve. (Before: the hold judged that by
	// an empty offer, marked every held payment unresolvable and logged a
	// Warning telling the operator to configure the rpc it had.)
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	db, err := store.Open(storeDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := db.Claims().Lookup(context.Background(), claimKeyOf(a))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Claims().Lookup(context.Background(), unresolvableKey(decodeOrFail(t, st.Note).Keys)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the held payment's unresolvable mark: %v; want none, the gate reads the chain", err)
	}
}

// TestFailureNamingNoTransactionKeepsNoAnswer measures what such a hold
// keeps in the store: the record (payment, offer, request name: a few
// KiB), not the upstream's answer, which a payer causing such refusals at
// will could otherwise park at maxHeldAnswer bytes per authorization for as
// long as it made it valid. A settlement_pending reply keeps the answer,
// as before.
func TestFailureNamingNoTransactionKeepsNoAnswer(t *testing.T) {
	for _, c := range []struct {
		name   string
		reply  x402.SettleResponse
		answer bool
	}{
		{"failure naming no transaction", x402.SettleResponse{ErrorReason: x402.ReasonExactEVMTransactionFailed}, false},
		{"settlement pending", x402.SettleResponse{ErrorReason: x402.ReasonSettlementPending}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			g, offer := directGate(t, store.Options{NoSync: true}, nil)
			p, err := x402.SignExactEVM(evmfacilitator.DevKey(1), offer, &x402.Resource{URL: "http://example.com/verify/schema"}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			sc := claimSigned(t, g, offer, p)
			req, claim, pay, keys := sc.req, sc.claim, sc.pay, sc.keys
			answer := bytes.Repeat([]byte("a"), maxHeldAnswer/2) // with its header, within what a record holds
			bw := &bufferedWriter{header: http.Header{"Content-Type": {"application/json"}}, buf: bytes.NewBuffer(answer), code: http.StatusOK, limit: int64(len(answer))}
			reply := c.reply
			g.holdUnknown(req, claim, pay.JSON, g.liveOffers().offerJSON(0), g.liveOffers().offers[0], nil, now(), bw, &x402.UnknownOutcomeError{Op: "settle", Reply: &reply, Err: io.EOF})
			st, err := g.state.Claims().Lookup(context.Background(), keys[0])
			if err != nil {
				t.Fatal(err)
			}
			h := decodeOrFail(t, st.Note)
			t.Logf("record kept: %d bytes", len(st.Note))
			if h.Held != c.answer {
				t.Fatalf("answer kept %v (record of %d bytes); want %v", h.Held, len(st.Note), c.answer)
			}
			if !c.answer && len(st.Note) > 4<<10 {
				t.Fatalf("the record without an answer is %d bytes; want a few KiB at most", len(st.Note))
			}
		})
	}
}
