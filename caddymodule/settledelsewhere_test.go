package caddymodule

import (
	"bytes"
	"context"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// frontRunProxy is a FAKE standing for a network race that cannot otherwise
// be timed: a path to a real remote facilitator (the devnet facilitator's
// x402 HTTP API) that, before forwarding the gate's first /settle, runs
// front (a third party's transaction of the buyer's authorization, mined).
// Everything is forwarded unchanged, the facilitator's answers included.
func frontRunProxy(t *testing.T, facURL string, front func()) *httptest.Server {
	t.Helper()
	var once sync.Once
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.HasSuffix(r.URL.Path, "/settle") {
			once.Do(front)
		}
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, facURL+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(s.Close)
	return s
}

// relayAuthorization sends the buyer's own authorization (its signature as
// signed) to the token's transferWithAuthorization from another account,
// as anyone who saw it may: the public x402_facilitator, a front-runner.
func relayAuthorization(t *testing.T, d *evmfacilitator.Devnet, sender int, sig string) {
	t.Helper()
	p, err := x402.DecodePaymentSignature(sig)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := x402.ParseExactEVMPayload(p.Payload)
	if err != nil {
		t.Fatal(err)
	}
	v, err := ep.Authorization.Values()
	if err != nil {
		t.Fatal(err)
	}
	rsv := common.FromHex(ep.Signature)
	if len(rsv) != 65 {
		t.Fatalf("signature of %d bytes", len(rsv))
	}
	word := func(b []byte) []byte { return common.LeftPadBytes(b, 32) }
	data := crypto.Keccak256([]byte("transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)"))[:4]
	for _, w := range [][]byte{v.From.Bytes(), v.To.Bytes(), v.Value.Bytes(), v.ValidAfter.Bytes(), v.ValidBefore.Bytes(), v.Nonce[:], {rsv[64]}, rsv[:32], rsv[32:64]} {
		data = append(data, word(w)...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	token := d.Token()
	r, err := d.SendTx(ctx, evmfacilitator.DevKey(sender), &token, data)
	if err != nil || r.Status != 1 {
		t.Fatalf("relaying the authorization: %v (receipt %+v)", err, r)
	}
}

// When a third party settles the buyer's authorization between the gate's
// verify and its settle, the gate's settle is refused as already used
// (invalid_exact_evm_nonce_already_used): the buyer may have paid, so the
// gate neither releases the claim and asks for another payment, nor takes
// the refusal for a success; it answers 503 settlement_pending and reads
// the chain for this authorization's transfer to payTo. Relayed: the
// buyer's retry gets the held answer with PAYMENT-RESPONSE, charged once,
// the upstream run once. Cancelled by the buyer instead: the retry is
// released (402), nothing charged.
func TestSettlementUsedByAThirdPartyIsResolvedFromTheChain(t *testing.T) {
	d, facURL := sharedDevnet(t)
	for _, tc := range []struct {
		name string
		paid bool
	}{{"relayed by a third party", true}, {"cancelled by the buyer", false}} {
		t.Run(tc.name, func(t *testing.T) {
			const payerIdx = 8
			up := newUpstream(t)
			var pr x402.PaymentRequired
			var sig string // the buyer's payment, set before the gate settles it
			proxy := frontRunProxy(t, facURL, func() {
				if tc.paid {
					relayAuthorization(t, d, 9, sig)
					return
				}
				spendNonce(t, d, "cancel", payerIdx, pr.Accepts[0], sig)
			})
			site := remoteSite(up.URL, proxy.URL, "rpc devnet "+d.RPCURL(), filepath.Join(t.TempDir(), "gate"))
			url := startCaddy(t, site) + "/verify/schema"
			payer := evmfacilitator.DevAccounts()[payerIdx].Address
			before := balance(t, d, payer)
			pr = paymentRequired(t, post(t, url, "", nil))
			sig = signFor(t, pr, payerIdx)

			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || e["code"] != "settlement_pending" {
				t.Fatalf("the settle refused as already used: status %d %v; want 503 settlement_pending", resp.StatusCode, e)
			}
			calls := up.calls.Load()
			for i := range 2 {
				resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
				body := readJSONString(t, resp)
				if tc.paid {
					if resp.StatusCode != http.StatusOK || !strings.Contains(body, "paid_content") || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
						t.Fatalf("retry %d: status %d, PAYMENT-RESPONSE %q: %s; want the held answer", i+1, resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse), body)
					}
				} else if resp.StatusCode != http.StatusPaymentRequired || strings.Contains(body, "paid_content") || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
					t.Fatalf("retry %d: status %d, PAYMENT-RESPONSE %q: %s; want released (402)", i+1, resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse), body)
				}
			}
			want := big.NewInt(0)
			if tc.paid {
				want = big.NewInt(20000) // $0.02, once
			}
			if got := charged(t, d, payer, before); got.Cmp(want) != 0 {
				t.Fatalf("charged %v, want %v", got, want)
			}
			if n := up.calls.Load(); n != calls {
				t.Fatalf("the upstream ran %d more times", n-calls)
			}
		})
	}
}
