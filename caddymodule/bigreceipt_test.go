package caddymodule

import (
	"context"
	"encoding/json"
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

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// batchRelayCode is the init code of a relay contract: its runtime forwards
// its calldata to token (reverting when that call fails), then emits n
// empty LOG0s: the receipt of a settlement made in a transaction that does
// other work (a batch of settlements, a smart-wallet bundle) and so carries
// many logs. Hand-assembled, no PUSH0.
func batchRelayCode(token common.Address, n uint16) []byte {
	rt := []byte{0x36, 0x60, 0x00, 0x60, 0x00, 0x37, // CALLDATACOPY(0,0,cds)
		0x60, 0x00, 0x60, 0x00, 0x36, 0x60, 0x00, 0x60, 0x00, 0x73} // ret 0,0 args 0,cds value 0, PUSH20
	rt = append(rt, token.Bytes()...)
	rt = append(rt, 0x5a, 0xf1, 0x15, 0x60, 0x41, 0x57, // GAS CALL ISZERO PUSH1 fail JUMPI
		0x61, byte(n>>8), byte(n), // PUSH2 n
		0x5b, 0x80, 0x15, 0x60, 0x3f, 0x57, // loop: DUP1 ISZERO PUSH1 end JUMPI
		0x60, 0x00, 0x60, 0x00, 0xa0, // LOG0(0,0)
		0x60, 0x01, 0x90, 0x03, 0x60, 0x2d, 0x56, // n-1, JUMP loop
		0x5b, 0x00, // end: STOP
		0x5b, 0x60, 0x00, 0x60, 0x00, 0xfd) // fail: REVERT(0,0)
	if rt[0x2d] != 0x5b || rt[0x3f] != 0x5b || rt[0x41] != 0x5b {
		panic("bad jump layout")
	}
	l := len(rt)
	init := []byte{0x61, byte(l >> 8), byte(l), 0x80, 0x60, 0x0c, 0x60, 0x00, 0x39, 0x60, 0x00, 0xf3}
	return append(init, rt...)
}

const twaVRSABI = `[{"type":"function","name":"transferWithAuthorization","inputs":[{"name":"from","type":"address"},{"name":"to","type":"address"},{"name":"value","type":"uint256"},{"name":"validAfter","type":"uint256"},{"name":"validBefore","type":"uint256"},{"name":"nonce","type":"bytes32"},{"name":"v","type":"uint8"},{"name":"r","type":"bytes32"},{"name":"s","type":"bytes32"}],"outputs":[]}]`

// batchingFacilitator (FAULT: a remote facilitator whose /settle reply is
// lost) forwards every call to the real devnet facilitator except /settle,
// which it performs itself, as a batching facilitator does: it submits the
// payment's authorization through relay (a transaction that also emits
// many logs), waits for it to be mined (the money moves), sends the size of
// its receipt's JSON on size, and then drops the connection instead of
// answering.
func batchingFacilitator(t *testing.T, d *evmfacilitator.Devnet, facURL string, relay common.Address, size chan<- int) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	parsed, err := abi.JSON(strings.NewReader(twaVRSABI))
	if err != nil {
		t.Fatal(err)
	}
	var settled atomic.Int64
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.HasSuffix(r.URL.Path, "/settle") {
			var req struct {
				PaymentPayload x402.PaymentPayload `json:"paymentPayload"`
			}
			var ev x402.ExactEVMPayload
			if json.Unmarshal(body, &req) != nil || json.Unmarshal(req.PaymentPayload.Payload, &ev) != nil {
				http.Error(w, "bad settle", 400)
				return
			}
			a := ev.Authorization
			sig := common.FromHex(ev.Signature)
			v := sig[64]
			if v < 27 {
				v += 27
			}
			num := func(s string) *big.Int { n, _ := new(big.Int).SetString(s, 10); return n }
			data, err := parsed.Pack("transferWithAuthorization", common.HexToAddress(a.From), common.HexToAddress(a.To),
				num(a.Value), num(a.ValidAfter), num(a.ValidBefore), common.HexToHash(a.Nonce), v,
				common.BytesToHash(sig[:32]), common.BytesToHash(sig[32:64]))
			if err != nil {
				t.Errorf("packing: %v", err)
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			rcpt, err := d.SendTx(ctx, evmfacilitator.DevKey(0), &relay, data)
			if err != nil {
				t.Errorf("relaying the authorization: %v", err)
				return
			}
			t.Logf("settled in %s with %d logs", rcpt.TxHash.Hex(), len(rcpt.Logs))
			size <- receiptSize(t, ctx, d.RPCURL(), rcpt.TxHash)
			settled.Add(1)
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close() // the reply is lost
			}
			return
		}
		if resp, reply, ok := relayTo(w, r, facURL, body); ok {
			passOn(w, resp, reply)
		}
	}))
	t.Cleanup(s.Close)
	return s, &settled
}

// receiptSize is the size of the JSON of transaction h's receipt, as the
// node at rpcURL answers eth_getTransactionReceipt.
func receiptSize(t *testing.T, ctx context.Context, rpcURL string, h common.Hash) int {
	body := `{"jsonrpc":"2.0","id":1,"method":"eth_getTransactionReceipt","params":["` + h.Hex() + `"]}`
	req, err := http.NewRequestWithContext(ctx, "POST", rpcURL, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return len(b)
}

// TestRemoteSettlementThroughARelayContractStaysPending: a remote
// facilitator settles the buyer's payment (the money moves to payTo)
// through a relay contract, in a transaction that also emits 5000 logs, a
// receipt of over 1 MiB of JSON (more than any other chain reply may be),
// and its reply is lost. The gate reads the outcome from the chain (rpc
// devnet) on the buyer's retry: the nonce's log and a matching Transfer
// are there, but the transaction called the relay, not the token, so which
// authorization it executed is not read from its input (another of the
// nonce, to the same payTo and value in an overlapping window, logs the
// same): the retry is 503 settlement_pending (do not pay again), the held
// answer not released, the buyer charged once and the upstream run once.
// (Before: the logs alone answered the payment settled.)
func TestRemoteSettlementThroughARelayContractStaysPending(t *testing.T) {
	d, facURL := sharedDevnet(t)
	const payerIdx, logs = 4, 5000
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dep, err := d.SendTx(ctx, evmfacilitator.DevKey(0), nil, batchRelayCode(d.Token(), logs))
	if err != nil {
		t.Fatalf("deploying the relay: %v", err)
	}
	size := make(chan int, 1)
	fac, settled := batchingFacilitator(t, d, facURL, dep.ContractAddress, size)
	up := newReportingUpstream(t)
	base := startCaddy(t, remoteSite(up.URL, fac.URL, "rpc devnet "+d.RPCURL(), gateDir(t)))
	url := base + "/verify/schema"
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), payerIdx)

	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || e["code"] != codeSettlementPending {
		t.Fatalf("first try: status %d %v; want 503 %s (the settle reply is lost)", resp.StatusCode, e, codeSettlementPending)
	}
	if n := <-size; n <= maxChainReply {
		t.Fatalf("the settlement's receipt is %d bytes; the test needs one over %d", n, maxChainReply)
	} else {
		t.Logf("the settlement's receipt: %d logs, %d bytes of JSON (%d a log)", logs, n, n/logs)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body := readJSON(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || body["code"] != codeSettlementPending || body["paid_content"] == true {
		t.Fatalf("the retry: status %d %v; want 503 %s (settled through a relay contract: which authorization it executed is unknown)", resp.StatusCode, body, codeSettlementPending)
	}
	if got := charged(t, d, payer, before); settled.Load() != 1 || got.Cmp(big.NewInt(20000)) != 0 || up.n.Load() != 1 {
		t.Errorf("%d settlements, %v charged, upstream ran %d times; want one of each", settled.Load(), got, up.n.Load())
	}
}
