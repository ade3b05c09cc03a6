package evmfacilitator

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/accounts/abi"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/aovhq/aov/x402"
)

// faultProxy is a fake RPC provider in front of the devnet's JSON-RPC, for
// a fault the devnet cannot be made to produce: it answers the requests
// match picks (at most budget of them) with an overload answer, as
// providers send them, and forwards everything else to the devnet.
type faultProxy struct {
	target string
	match  func(method, selector string) bool
	status int    // HTTP status of the fault answer
	code   int    // its JSON-RPC error code
	msg    string // its JSON-RPC error message
	// forward: a picked request still reaches the devnet, and its answer is
	// replaced by the fault's (the node ran it; its answer was lost: geth's
	// -32002 "request timed out", a load balancer's -32603).
	forward bool
	budget  atomic.Int64
	hits    atomic.Int64
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req struct {
		ID     json.RawMessage   `json:"id"`
		Method string            `json:"method"`
		Params []json.RawMessage `json:"params"`
	}
	if json.Unmarshal(body, &req) == nil {
		sel := ""
		if len(req.Params) > 0 {
			var call struct{ Data, Input string }
			_ = json.Unmarshal(req.Params[0], &call)
			d := call.Input
			if d == "" {
				d = call.Data
			}
			if len(d) >= 10 {
				sel = strings.ToLower(d[:10])
			}
		}
		if p.match(req.Method, sel) && p.budget.Add(-1) >= 0 {
			p.hits.Add(1)
			if p.forward {
				if resp, err := http.Post(p.target, "application/json", bytes.NewReader(body)); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(p.status)
			b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": map[string]any{"code": p.code, "message": p.msg}})
			w.Write(b)
			return
		}
	}
	resp, err := http.Post(p.target, "application/json", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

func selectorOf(method string) string {
	return "0x" + hex.EncodeToString(tokenABI.Methods[method].ID)
}

// An RPC provider's overload or lag is an outage, never the buyer's invalid
// payment: whichever read or estimate it hits, Verify and Settle return an
// error (the gateway's 503, retryable), Settle sends nothing, and once the
// fault is over the same payment verifies and settles: no answer of an
// overloaded node is remembered as the asset not being EIP-3009.
func TestRPCOverloadIsAnErrorNotARefusal(t *testing.T) {
	overloads := []struct {
		name   string
		status int
		code   int
		msg    string
	}{
		{"HTTP 200 -32005 limit exceeded", 200, -32005, "limit exceeded"},
		{"HTTP 200 -32000 header not found", 200, -32000, "header not found"},
		{"HTTP 200 -32000 execution aborted (timeout)", 200, -32000, "execution aborted (timeout = 5s)"},
		{"HTTP 200 -32603 internal error", 200, -32603, "internal error"},
		{"HTTP 429 with a JSON-RPC body", 429, -32005, "rate limited"},
	}
	calls := []struct {
		name  string
		match func(m, sel string) bool
	}{
		{"name()", func(m, s string) bool { return m == "eth_call" && s == selectorOf("name") }},
		{"version()", func(m, s string) bool { return m == "eth_call" && s == selectorOf("version") }},
		{"authorizationState", func(m, s string) bool { return m == "eth_call" && s == selectorOf("authorizationState") }},
		{"balanceOf", func(m, s string) bool { return m == "eth_call" && s == selectorOf("balanceOf") }},
		{"simulation", func(m, s string) bool { return m == "eth_call" && s == selectorOf(methodTransferVRS) }},
		{"estimateGas", func(m, s string) bool { return m == "eth_estimateGas" }},
	}
	d := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	e := &testEnv{d: d}
	relayer := crypto.PubkeyToAddress(DevKey(0).PublicKey)
	ctx := context.Background()
	for _, ov := range overloads {
		for _, call := range calls {
			t.Run(ov.name+"/"+call.name, func(t *testing.T) {
				p := &faultProxy{target: d.RPCURL(), match: call.match, status: ov.status, code: ov.code, msg: ov.msg}
				srv := httptest.NewServer(p)
				defer srv.Close()
				c, err := ethclient.Dial(srv.URL)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				fresh := func() *Facilitator { // its own cache of the token's name and version
					f, err := newFacilitator(Config{Chain: c, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, d.nonces)
					if err != nil {
						t.Fatal(err)
					}
					return f
				}
				f := fresh()
				req := e.requirements(payee, amount)
				pay := mustSignExact(t, payer, req)
				if call.name != "estimateGas" { // Verify estimates no gas
					p.budget.Store(1)
					if r, err := f.Verify(ctx, pay, req); err == nil || p.hits.Load() != 1 {
						t.Errorf("Verify with the node overloaded (%d fault answers) = %+v, %v; want an error, not the buyer's invalid payment", p.hits.Load(), r, err)
					}
					if r, err := f.Verify(ctx, pay, req); err != nil || !r.IsValid {
						t.Errorf("Verify after the overload = %+v, %v; want valid", r, err)
					}
				}
				nonce, err := d.Client().PendingNonceAt(ctx, relayer)
				if err != nil {
					t.Fatal(err)
				}
				p.hits.Store(0)
				p.budget.Store(1)
				f = fresh()
				r, err := f.Settle(ctx, pay, req)
				var unknown *x402.UnknownOutcomeError
				if err == nil || errors.As(err, &unknown) || p.hits.Load() != 1 {
					t.Errorf("Settle with the node overloaded (%d fault answers) = %+v, %v; want an error saying nothing was sent", p.hits.Load(), r, err)
				}
				if after, err := d.Client().PendingNonceAt(ctx, relayer); err != nil || after != nonce {
					t.Errorf("the relayer's nonce went from %d to %d (%v): something was sent", nonce, after, err)
				}
				if r, err := f.Settle(ctx, pay, req); err != nil || !r.Success {
					t.Errorf("Settle after the overload = %+v, %v; want success", r, err)
				}
			})
		}
	}
}

// A real revert is still an answer about the payment: an asset whose name()
// reverts (a contract without it, here the test wallet) is not an EIP-3009
// token, and the revert strings of the token map to their reasons.
func TestRevertIsARefusal(t *testing.T) {
	e := newEnv(t)
	wallet := deployWallet(t, e.d, crypto.PubkeyToAddress(payer.PublicKey))
	req := e.requirements(payee, amount)
	req.Asset = wallet.Hex()
	r, err := e.f.Verify(context.Background(), mustSignExact(t, payer, req), req)
	if err != nil || r.IsValid || r.InvalidReason != x402.ReasonExactEVMEIP3009NotSupported {
		t.Fatalf("Verify of an asset whose name() reverts = %+v, %v; want %s", r, err, x402.ReasonExactEVMEIP3009NotSupported)
	}
}

// Only an answer that proves the node refused a send means it was not
// sent. Any other answer to eth_sendRawTransaction may come after the node
// took the transaction (geth's -32002 when its HTTP timeout fires while
// the method runs, a load balancer's -32603 after forwarding): the outcome
// is then resolved from the chain, so a payment that was charged is never
// answered with a plain error (the gateway would release it, and the
// buyer's retry be refused nonce_already_used). A refusal sends nothing,
// and the payment settles afterwards.
func TestSendAnswersThatProveNothingAreResolvedFromTheChain(t *testing.T) {
	cases := []struct {
		name    string
		status  int
		code    int
		msg     string
		forward bool // the node took the transaction
		want    string
	}{
		{"taken, then geth's -32002 request timed out", 200, -32002, "request timed out", true, "taken"},
		{"taken, then a load balancer's -32603", 200, -32603, "internal error", true, "taken"},
		{"taken, then HTTP 502 with a JSON-RPC body", 502, -32603, "bad gateway", true, "taken"},
		// The resolution finds the node without it while it can still
		// execute, and sends the same transaction again. (Before: it
		// stayed unsent, and the relayer's later transactions waited
		// behind its nonce.)
		{"not taken, an answer that proves nothing: sent again", 200, -32000, "something went wrong", false, "unknown, then paid"},
		{"refused: rate limit -32005", 200, -32005, "limit exceeded", false, "refused"},
		{"refused: HTTP 429", 429, -32005, "rate limited", false, "refused"},
		{"refused: intrinsic gas too low", 200, -32000, "intrinsic gas too low", false, "refused"},
		{"refused: nonce too low, then sent again", 200, -32000, "nonce too low", false, "paid"},
	}
	d := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	e := &testEnv{d: d}
	relayer := crypto.PubkeyToAddress(DevKey(0).PublicKey)
	ctx := context.Background()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := &faultProxy{target: d.RPCURL(), match: func(m, _ string) bool { return m == "eth_sendRawTransaction" },
				status: tc.status, code: tc.code, msg: tc.msg, forward: tc.forward}
			p.budget.Store(1)
			srv := httptest.NewServer(p)
			defer srv.Close()
			c, err := ethclient.Dial(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			f, err := newFacilitator(Config{Chain: c, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 5 * time.Second}, d.nonces)
			if err != nil {
				t.Fatal(err)
			}
			// A payer of its own: an earlier case's settlement may land late.
			key, _ := crypto.GenerateKey()
			from := crypto.PubkeyToAddress(key.PublicKey)
			fundUSDC(t, d, DevKey(5), from, 20000)
			req := e.requirements(payee, amount)
			pay := mustSignExact(t, key, req)
			nonce, err := d.Client().PendingNonceAt(ctx, relayer)
			if err != nil {
				t.Fatal(err)
			}
			before := usdcBalance(t, d, from)
			r, err := f.Settle(ctx, pay, req)
			paid := usdcBalance(t, d, from).Cmp(before) != 0
			var unknown *x402.UnknownOutcomeError
			switch tc.want {
			case "taken": // settled, or pending (the devnet may not have mined it yet)
				if !r.Success && !errors.As(err, &unknown) {
					t.Fatalf("settle = %+v, %v (paid: %v); want success or an unknown outcome, never an error saying nothing was sent", r, err, paid)
				}
			case "paid":
				if !paid || err != nil || !r.Success {
					t.Fatalf("settle = %+v, %v (paid: %v); want success", r, err, paid)
				}
			case "unknown, then paid":
				if !errors.As(err, &unknown) {
					t.Fatalf("settle = %+v, %v (paid: %v); want an unknown outcome", r, err, paid)
				}
				for deadline := time.Now().Add(10 * time.Second); !paid; time.Sleep(50 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the transaction sent again never paid")
					}
					paid = usdcBalance(t, d, from).Cmp(before) != 0
				}
			case "refused":
				if paid || err == nil || errors.As(err, &unknown) || r.Success {
					t.Fatalf("settle = %+v, %v (paid: %v); want an error saying nothing was sent", r, err, paid)
				}
				if after, err := d.Client().PendingNonceAt(ctx, relayer); err != nil || after != nonce {
					t.Fatalf("the relayer's nonce went from %d to %d (%v): something was sent", nonce, after, err)
				}
				if r, err := f.Settle(ctx, pay, req); err != nil || !r.Success {
					t.Fatalf("settle after the refusal = %+v, %v; want success", r, err)
				}
			}
		})
	}
}

// deployCode deploys a contract whose runtime code is code (at most 32
// bytes) from key, and returns its address.
func deployCode(t testing.TB, d *Devnet, key *ecdsa.PrivateKey, code []byte) common.Address {
	t.Helper()
	l := len(code)
	init := append([]byte{byte(0x5f + l)}, code...)                              // PUSHl code
	init = append(init, 0x60, 0x00, 0x52, 0x60, byte(l), 0x60, byte(32-l), 0xf3) // MSTORE at 0; RETURN its last l bytes
	r := sendTx(t, d, key, nil, init)
	if r.Status != types.ReceiptStatusSuccessful {
		t.Fatal("deploying the code reverted")
	}
	if got, err := d.Client().CodeAt(context.Background(), r.ContractAddress, nil); err != nil || !bytes.Equal(got, code) {
		t.Fatalf("deployed code = %x, %v; want %x", got, err, code)
	}
	return r.ContractAddress
}

// The payer controls its contract wallet's code: when its
// isValidSignature executes and fails without a revert (the INVALID
// opcode, a stack underflow, a bad jump; geth answers -32000 with the VM's
// error), the signature is refused, as a revert is. An outage it is not:
// that would answer 503, retryable for ever.
func TestPayerWalletThatFailsToExecuteIsRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	for _, w := range []struct {
		name string
		code []byte
	}{
		{"INVALID", []byte{0xfe}},
		{"stack underflow", []byte{0x01}},
		{"invalid jump", []byte{0x60, 0x00, 0x56}},
	} {
		t.Run(w.name, func(t *testing.T) {
			wallet := deployCode(t, e.d, DevKey(4), w.code)
			a := auth(DevKey(4), req)
			a.From = wallet.Hex()
			p := sign(t, DevKey(4), a, req, req)
			v, err := e.f.Verify(ctx, p, req)
			if err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMSignature {
				t.Fatalf("verify = %+v, %v; want %s", v, err, x402.ReasonExactEVMSignature)
			}
			r, err := e.f.Settle(ctx, p, req)
			if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMSignature || r.Transaction != "" {
				t.Fatalf("settle = %+v, %v; want %s, nothing sent", r, err, x402.ReasonExactEVMSignature)
			}
		})
	}
}

// scriptedNode is a fake RPC provider for the error forms of nodes the
// devnet is not (Besu, Nethermind, providers' limits): it answers every
// request with one JSON-RPC error, data included when set.
type scriptedNode struct {
	status int
	code   int
	msg    string
	data   any
}

func (s *scriptedNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ ID json.RawMessage }
	_ = json.NewDecoder(r.Body).Decode(&req)
	e := map[string]any{"code": s.code, "message": s.msg}
	if s.data != nil {
		e["data"] = s.data
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(s.status)
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": req.ID, "error": e})
	w.Write(b)
}

// classify, the one reading of a node's errors, knows each client's way of
// saying a call reverted or failed to execute, whatever its case, and
// takes nothing else for either: a provider's limit, a missing header, a
// timeout or an internal error stay the node's trouble.
func TestClassifyReadsEachClientsForms(t *testing.T) {
	errorString := func(s string) string { // ABI Error(string)
		b, _ := abi.NewType("string", "", nil)
		packed, _ := abi.Arguments{{Type: b}}.Pack(s)
		return "0x08c379a0" + hex.EncodeToString(packed)
	}
	cases := []struct {
		name   string
		node   scriptedNode
		kind   answer
		reason string
	}{
		{"geth, code 3", scriptedNode{200, 3, "execution reverted: no", errorString("no")}, answerReverted, "no"},
		{"geth, no data", scriptedNode{200, -32000, "execution reverted", nil}, answerReverted, "execution reverted"},
		{"Besu", scriptedNode{200, -32000, "Execution reverted", errorString("no")}, answerReverted, "no"},
		{"Besu, reason in the message", scriptedNode{200, -32000, "Execution reverted: no", nil}, answerReverted, "no"},
		{"Nethermind, Reverted data", scriptedNode{200, -32015, "VM execution error.", "Reverted " + errorString("no")}, answerReverted, "no"},
		{"Nethermind, revert: reason", scriptedNode{200, -32015, "VM execution error.", "revert: no"}, answerReverted, "no"},
		{"Nethermind, bare revert", scriptedNode{200, -32015, "VM execution error.", "revert"}, answerReverted, "revert"},
		{"geth, INVALID", scriptedNode{200, -32000, "invalid opcode: INVALID", nil}, answerFailed, "invalid opcode: INVALID"},
		{"geth, out of gas", scriptedNode{200, -32000, "out of gas", nil}, answerFailed, "out of gas"},
		{"geth, stack underflow", scriptedNode{200, -32000, "stack underflow (0 <=> 2)", nil}, answerFailed, "stack underflow (0 <=> 2)"},
		{"Nethermind, bad instruction", scriptedNode{200, -32015, "VM execution error.", "BadInstruction"}, answerFailed, "VM execution error.: BadInstruction"},
		{"limit", scriptedNode{200, -32005, "limit exceeded", nil}, answerNodeError, "limit exceeded"},
		{"missing header", scriptedNode{200, -32000, "header not found", nil}, answerNodeError, "header not found"},
		{"call timeout", scriptedNode{200, -32000, "execution aborted (timeout = 5s)", nil}, answerNodeError, "execution aborted (timeout = 5s)"},
		{"internal error", scriptedNode{200, -32603, "internal error", nil}, answerNodeError, "internal error"},
		{"HTTP 503", scriptedNode{503, -32603, "unavailable", nil}, answerNone, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(&tc.node)
			defer srv.Close()
			c, err := ethclient.Dial(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			to := common.Address{1}
			_, err = c.CallContract(context.Background(), ethereum.CallMsg{To: &to}, nil)
			if kind, reason := classify(err); kind != tc.kind || reason != tc.reason {
				t.Fatalf("classify(%v) = %d, %q; want %d, %q", err, kind, reason, tc.kind, tc.reason)
			}
		})
	}
}

// fakeNullLogNode is a FAKE FOR A FAULT the devnet cannot produce: an RPC
// endpoint in front of it whose every transaction receipt lists a null
// log first (a buggy or hostile provider's answer), which ethclient
// decodes without complaint into a nil *types.Log.
func fakeNullLogNode(t *testing.T, target string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		resp, err := http.Post(target, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var req struct{ Method string }
		var m map[string]any
		if json.Unmarshal(body, &req) == nil && req.Method == "eth_getTransactionReceipt" && json.Unmarshal(raw, &m) == nil {
			if res, ok := m["result"].(map[string]any); ok {
				if logs, ok := res["logs"].([]any); ok {
					res["logs"] = append([]any{nil}, logs...)
					raw, _ = json.Marshal(m)
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		w.Write(raw)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// A receipt that lists a null log is not read. A settle whose receipt is
// only ever answered so is resolved by the nonce's logs once its wait
// for the receipt ends: success, naming its transaction. A status read by the
// transaction the facilitator named (a hint, judged by its receipt) finds
// the transaction by the nonce's logs instead, and answers as over the
// devnet itself. (Before: a nil pointer dereference, on every read of
// every payment such an endpoint answered for.)
func TestReceiptWithANullLogIsNotRead(t *testing.T) {
	d := startDevnet(t, DevnetConfig{RPCListen: "127.0.0.1:0"})
	c, err := ethclient.Dial(fakeNullLogNode(t, d.RPCURL()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	f, err := newFacilitator(Config{Chain: c, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: time.Second}, d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	req := (&testEnv{d: d, f: f}).requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	if r, err := f.Settle(context.Background(), p, req); err != nil || !r.Success || r.Transaction == "" {
		t.Fatalf("a settle whose receipts list a null log: %+v, %v; want success", r, err)
	}
	s := settleOne(t, d, nil, nil)
	sent := x402.SentSettlement{Transaction: s.r.Transaction}
	want, err := statusReader(t, d.Client()).SentSettlementStatus(context.Background(), s.p, s.req, sent)
	if err != nil || want.State != x402.SettlementDone {
		t.Fatalf("over the devnet: %+v, %v; want done", want, err)
	}
	if st, err := statusReader(t, c).SentSettlementStatus(context.Background(), s.p, s.req, sent); err != nil || st != want {
		t.Fatalf("over an endpoint whose receipts list a null log: %+v, %v; want %+v", st, err, want)
	}
}
