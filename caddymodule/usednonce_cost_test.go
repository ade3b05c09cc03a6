package caddymodule

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// signNonce signs an EIP-3009 authorization from key to `to` of value,
// with the given nonce, valid for `valid` from now, for req's token.
func signNonce(t *testing.T, key *ecdsa.PrivateKey, req x402.PaymentRequirements, to common.Address, value string, nonce [32]byte, valid time.Duration) x402.ExactEVMPayload {
	t.Helper()
	chainID, name, version, token, err := x402.ExactEVMDomain(req)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	auth := x402.Authorization{From: crypto.PubkeyToAddress(key.PublicKey).Hex(), To: to.Hex(), Value: value,
		ValidAfter: fmt.Sprint(now.Add(-time.Minute).Unix()), ValidBefore: fmt.Sprint(now.Add(valid).Unix()), Nonce: "0x" + hex.EncodeToString(nonce[:])}
	digest, err := x402.TransferWithAuthorizationDigest(chainID, name, version, token, auth)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := crypto.Sign(digest[:], key)
	if err != nil {
		t.Fatal(err)
	}
	sig[64] += 27
	return x402.ExactEVMPayload{Signature: "0x" + hex.EncodeToString(sig), Authorization: auth}
}

// gatedSite is a gated route on the devnet whose facilitator is fac
// (`facilitator http`); it returns the route's URL.
func gatedSite(t *testing.T, fac string) string {
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex()))
	return base + "/verify/schema"
}

// TestRefusedSettlesOfASpentNonceReadNoBigReceipt: a payer spends a nonce
// of their own on a worthless transfer to themselves, in a transaction
// that also emits 5000 logs (a receipt of 1.8 MiB). Then, paying nothing,
// they ask the embedded evm facilitator, on a chain client dialed as
// rpc_url is (settlementChain), to settle distinct authorizations of that
// nonce to payTo. Each is refused nonce_already_used; none reads a reply
// over maxChainReply (the nonce's user is judged by its logs, not its
// receipt), and the search for the nonce's user runs once for all of
// them (usedCache keeps it by token, payer and nonce, not by the
// authorization, which the payer varies for free).
func TestRefusedSettlesOfASpentNonceReadNoBigReceipt(t *testing.T) {
	d, fac := sharedDevnet(t)
	// Not a fake: a proxy in front of the devnet node that measures the
	// replies the facilitator reads.
	var receiptBytes, biggest, getLogs atomic.Int64
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		resp, err := http.Post(d.RPCURL(), "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, "devnet unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(body), "eth_getTransactionReceipt") {
			receiptBytes.Add(int64(len(raw)))
		}
		if strings.Contains(string(body), "eth_getLogs") {
			getLogs.Add(1)
		}
		for n := int64(len(raw)); ; {
			if b := biggest.Load(); n <= b || biggest.CompareAndSwap(b, n) {
				break
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(raw)
	}))
	t.Cleanup(proxy.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	chain, err := dialSettlementChain(ctx, proxy.URL, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(chain.Close)
	f, err := evmfacilitator.New(evmfacilitator.Config{Chain: chain, Network: x402.NetworkDevnet, RelayerKey: evmfacilitator.DevKey(9)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	req := paymentRequired(t, post(t, gatedSite(t, fac), "", nil)).Accepts[0]

	// The payer's own transaction: the nonce spent on a 1-unit transfer to
	// themselves, through a relay that then emits 5000 logs.
	payer := evmfacilitator.DevKey(2)
	payerAddr := crypto.PubkeyToAddress(payer.PublicKey)
	dep, err := d.SendTx(ctx, evmfacilitator.DevKey(0), nil, batchRelayCode(d.Token(), 5000))
	if err != nil {
		t.Fatal(err)
	}
	var nonce [32]byte
	copy(nonce[:], crypto.Keccak256([]byte(t.Name()+fmt.Sprint(time.Now().UnixNano()))))
	self := signNonce(t, payer, req, payerAddr, "1", nonce, 10*time.Minute)
	parsed, err := abi.JSON(strings.NewReader(twaVRSABI))
	if err != nil {
		t.Fatal(err)
	}
	sig := common.FromHex(self.Signature)
	num := func(s string) *big.Int { n, _ := new(big.Int).SetString(s, 10); return n }
	data, err := parsed.Pack("transferWithAuthorization", payerAddr, payerAddr, big.NewInt(1), num(self.Authorization.ValidAfter), num(self.Authorization.ValidBefore),
		common.Hash(nonce), sig[64], common.BytesToHash(sig[:32]), common.BytesToHash(sig[32:64]))
	if err != nil {
		t.Fatal(err)
	}
	rcpt, err := d.SendTx(ctx, payer, &dep.ContractAddress, data)
	if err != nil || len(rcpt.Logs) < 5000 {
		t.Fatalf("the payer's transaction: %v (%d logs)", err, len(rcpt.Logs))
	}
	if n := receiptSize(t, ctx, d.RPCURL(), rcpt.TxHash); n <= maxChainReply {
		t.Fatalf("the payer's receipt is %d bytes; the test needs one over %d", n, maxChainReply)
	}

	const K = 6
	receiptBytes.Store(0)
	biggest.Store(0)
	var searches int64
	for k := 0; k < K; k++ {
		// Each a different authorization (its validBefore): a digest of its own.
		a := signNonce(t, payer, req, common.HexToAddress(req.PayTo), req.Amount, nonce, time.Duration(10+k)*time.Minute)
		raw, _ := json.Marshal(a)
		before := getLogs.Load()
		sr, err := f.Settle(ctx, x402.PaymentPayload{X402Version: x402.Version, Accepted: req, Payload: raw}, req)
		if err != nil || sr.Success || sr.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || sr.Transaction != "" {
			t.Fatalf("settle %d: %+v, %v; want the plain refusal %s", k, sr, err, x402.ReasonExactEVMNonceAlreadyUsed)
		}
		if getLogs.Load() > before {
			searches++
		}
	}
	if got, big := receiptBytes.Load(), biggest.Load(); big > maxChainReply {
		t.Errorf("%d refused settles of a spent nonce read %d bytes of receipts, the biggest reply %d bytes; want none over maxChainReply (%d)", K, got, big, maxChainReply)
	}
	if searches != 1 {
		t.Errorf("%d refused settles of one spent nonce searched its logs %d times; want once in usedCacheTTL", K, searches)
	}
}
