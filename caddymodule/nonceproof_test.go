package caddymodule

import (
	"context"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// spendNonce marks the payment's EIP-3009 nonce used on chain the way a
// buyer can without paying, sending the transaction from the payer itself:
// "burn" executes a worthless authorization of the same nonce (0 units, to
// itself); "cancel" calls the token's cancelAuthorization. Either way the
// token's authorizationState(payer, nonce) turns true and nothing reaches
// payTo.
func spendNonce(t *testing.T, d *evmfacilitator.Devnet, how string, payer int, offer x402.PaymentRequirements, sig string) {
	t.Helper()
	p, err := x402.DecodePaymentSignature(sig)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := x402.ParseExactEVMPayload(p.Payload)
	if err != nil {
		t.Fatal(err)
	}
	key := evmfacilitator.DevKey(payer)
	from := crypto.PubkeyToAddress(key.PublicKey)
	chainID, name, version, token, err := x402.ExactEVMDomain(offer)
	if err != nil {
		t.Fatal(err)
	}
	nonce := common.HexToHash(ep.Authorization.Nonce)
	word := func(b []byte) []byte { return common.LeftPadBytes(b, 32) }
	vrs := func(digest [32]byte) []byte {
		s, err := crypto.Sign(digest[:], key)
		if err != nil {
			t.Fatal(err)
		}
		return append(append(word([]byte{s[64] + 27}), s[:32]...), s[32:64]...)
	}
	var data []byte
	switch how {
	case "burn":
		auth := x402.Authorization{From: from.Hex(), To: from.Hex(), Value: "0", ValidAfter: "0",
			ValidBefore: big.NewInt(time.Now().Unix() + 3600).String(), Nonce: ep.Authorization.Nonce}
		digest, err := x402.TransferWithAuthorizationDigest(chainID, name, version, token, auth)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := auth.Values()
		data = crypto.Keccak256([]byte("transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)"))[:4]
		for _, w := range [][]byte{v.From.Bytes(), v.To.Bytes(), v.Value.Bytes(), v.ValidAfter.Bytes(), v.ValidBefore.Bytes()} {
			data = append(data, word(w)...)
		}
		data = append(append(data, nonce[:]...), vrs(digest)...)
	case "cancel":
		typeHash := crypto.Keccak256([]byte("CancelAuthorization(address authorizer,bytes32 nonce)"))
		structHash := crypto.Keccak256Hash(typeHash, word(from.Bytes()), nonce[:])
		digest := x402.TypedDataDigest(x402.DomainSeparator(chainID, name, version, token), structHash)
		data = crypto.Keccak256([]byte("cancelAuthorization(address,bytes32,uint8,bytes32,bytes32)"))[:4]
		data = append(append(append(data, word(from.Bytes())...), nonce[:]...), vrs(digest)...)
	default:
		t.Fatalf("spendNonce %q", how)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := d.SendTx(ctx, key, &token, data)
	if err != nil || r.Status != 1 {
		t.Fatalf("%s the nonce: %v (receipt %+v)", how, err, r)
	}
}

// A settlement whose outcome is unknown and which never went out, after
// which the buyer spends the authorization's nonce without paying (a
// worthless authorization of the same nonce, or cancelAuthorization) and
// retries the same payment: a used nonce is no payment, so the gate finds
// the transaction that used it, sees no Transfer to payTo, releases the
// claim and tells the buyer this payment can never settle (402,
// invalid_exact_evm_nonce_already_used). Nothing is served, nothing is
// charged, the upstream is not run again. With the embedded facilitator and
// with a remote one read through `rpc` alike.
func TestUnknownSettlementWithTheNonceSpentUnpaidIsReleased(t *testing.T) {
	d, facURL := sharedDevnet(t)
	for _, tc := range []struct {
		name, how string
		remote    bool
	}{
		{"embedded, burned", "burn", false},
		{"embedded, cancelled", "cancel", false},
		{"remote, burned", "burn", true},
		{"remote, cancelled", "cancel", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			dir := gateDir(t)
			var site string
			if tc.remote {
				proxy := newLossyProxy(t, facURL, "lose_request")
				site = remoteSite(up.URL, proxy.URL, "rpc devnet "+d.RPCURL(), dir)
			} else {
				site = pendingSite(up.URL, "lose_request", dir, "")
			}
			url := startCaddy(t, site) + "/verify/schema"
			const payerIdx = 8
			payer := evmfacilitator.DevAccounts()[payerIdx].Address
			before := balance(t, d, payer)
			pr := paymentRequired(t, post(t, url, "", nil))
			sig := signFor(t, pr, payerIdx)

			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || e["code"] != "settlement_pending" {
				t.Fatalf("first try: status %d %v", resp.StatusCode, e)
			}
			calls := up.calls.Load()
			spendNonce(t, d, tc.how, payerIdx, pr.Accepts[0], sig)

			for i := range 2 {
				resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
				body := readJSONString(t, resp)
				if resp.StatusCode != http.StatusPaymentRequired || strings.Contains(body, "paid_content") ||
					!strings.Contains(body, x402.ReasonExactEVMNonceAlreadyUsed) || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
					t.Fatalf("retry %d: status %d, PAYMENT-RESPONSE %q: %s", i+1, resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse), body)
				}
			}
			if got := charged(t, d, payer, before); got.Sign() != 0 {
				t.Fatalf("charged %v", got)
			}
			if n := up.calls.Load(); n != calls {
				t.Fatalf("the upstream ran %d more times for a payment that never paid", n-calls)
			}
		})
	}
}
