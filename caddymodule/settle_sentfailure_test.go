package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// fakeFailedAfterSendFacilitator forwards every call to the real devnet
// facilitator at real; a /settle that succeeded is answered the way the
// official npm facilitator (@x402/evm exact, settleEIP3009) answers a
// settlement whose transaction it sent but could not see through: success
// false, errorReason invalid_exact_evm_transaction_failed and, with
// nameTx, the transaction named (its receipt wait failed and its pending
// settlement store could not keep it: "settlement_pending, but failed to
// persist for retry"), or, without, transaction "" (the send's RPC call
// failed after the node took the transaction). No real facilitator can be
// made to fail that way on cue, so the real reply is rewritten: the
// transaction is on chain, the money moved.
func fakeFailedAfterSendFacilitator(t *testing.T, real string, nameTx bool) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequest(r.Method, real+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, "unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if r.URL.Path == "/settle" {
			var sr x402.SettleResponse
			if json.Unmarshal(raw, &sr) == nil && sr.Success {
				tx, msg := sr.Transaction, "settlement_pending, but failed to persist for retry: store down"
				if !nameTx {
					tx, msg = "", "HTTP request failed. Status: 504"
				}
				raw, _ = json.Marshal(map[string]any{
					"success":      false,
					"errorReason":  x402.ReasonExactEVMTransactionFailed,
					"errorMessage": msg,
					"transaction":  tx,
					"network":      sr.Network,
					"payer":        sr.Payer,
				})
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		w.Write(raw)
	}))
	t.Cleanup(s.Close)
	return s
}

// TestSettleFailureNamingItsTransactionIsPending: a remote facilitator (the
// official npm one) answers /settle success:false naming the transaction
// that in fact paid payTo. The buyer is told 503 settlement_pending, and
// the retry of the same payment, once the gate's rpc finds the transfer,
// gets the answer it paid for. (Before: 402 "nothing was charged, sign a
// new payment", the answer dropped, and the retry refused
// payment_already_used.)
func TestSettleFailureNamingItsTransactionIsPending(t *testing.T) {
	settleFailedAfterSend(t, true, 4)
}

// TestSettleFailureAfterBroadcastIsPending: the same with the official
// facilitator's answer for a send whose RPC call failed after the node took
// the transaction (transaction ""): the gate searches the chain for it.
func TestSettleFailureAfterBroadcastIsPending(t *testing.T) {
	settleFailedAfterSend(t, false, 5)
}

func settleFailedAfterSend(t *testing.T, nameTx bool, acct int) {
	d, fac := sharedDevnet(t)
	remote := fakeFailedAfterSendFacilitator(t, fac, nameTx)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
				rpc devnet %[4]s
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote.URL, payTo.Hex(), d.RPCURL()))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[acct].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), acct)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body := readJSON(t, resp)
	paid := new(big.Int).Sub(before, balance(t, d, payer))
	if paid.Sign() <= 0 {
		t.Fatalf("the payer was not charged (%s atoms): the fake must let the real settlement through", paid)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || body["code"] != x402.ReasonSettlementPending {
		t.Fatalf("charged %s atoms on chain, the gate answered %d %v; want 503 settlement_pending (never 'nothing was charged')", paid, resp.StatusCode, body["code"])
	}
	resp2 := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body2 := readJSONString(t, resp2)
	if resp2.StatusCode != http.StatusOK || resp2.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("retry of the paid payment: %d %s; want 200 with the answer it paid for and its PAYMENT-RESPONSE", resp2.StatusCode, body2)
	}
	var sr x402.SettleResponse
	if err := x402.DecodeHeader(resp2.Header.Get(x402.HeaderPaymentResponse), &sr); err != nil || !sr.Success || sr.Transaction == "" {
		t.Fatalf("retry's PAYMENT-RESPONSE %+v (%v); want the settlement and its transaction", sr, err)
	}
}
