package evmfacilitator

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/x402"
)

// Hand-assembled runtimes of EIP-1271 "wallets": a payer whose account is
// a contract controls the code that runs inside its settlement, at the
// relayer's gas.
const (
	// burnerRuntime loops 0x030D40 (200,000) times, about 26 gas each
	// (~5.2M gas), and then returns the EIP-1271 magic value for any
	// signature.
	//
	// PUSH3 K; JUMPDEST; PUSH1 1; SWAP1; SUB; DUP1; PUSH1 4; JUMPI;
	// POP; PUSH4 0x1626ba7e; PUSH1 0xe0; SHL; PUSH1 0; MSTORE; PUSH1 32;
	// PUSH1 0; RETURN
	burnerRuntime = "62030d405b600190038060045750631626ba7e60e01b60005260206000f3"
	// flipRuntime burns ~5.2M gas as burnerRuntime does, then accepts the
	// signature only when GASPRICE is 0 (an eth_call or eth_estimateGas
	// without a gas price) and reverts in a real transaction.
	flipRuntime = "62030d405b600190038060045750" + "3a602257" + "631626ba7e60e01b60005260206000f3" + "5b60006000fd"
	// cheapFlipRuntime is flipRuntime without the loop: a wallet that
	// tells a simulation from the real transaction by GASPRICE alone.
	//
	// GASPRICE; PUSH1 20; JUMPI; <accept>; JUMPDEST; PUSH1 0; PUSH1 0;
	// REVERT
	cheapFlipRuntime = "3a601457" + "631626ba7e60e01b60005260206000f3" + "5b60006000fd"
	// acceptAllRuntime returns the magic value for any signature, at a
	// few hundred gas.
	acceptAllRuntime = "631626ba7e60e01b60005260206000f3"
)

// contractPayer deploys runtime (hex) as a wallet funded with test USDC and
// returns a payment of amount from it to payee, signed by a key the wallet
// does not check.
func contractPayer(t *testing.T, e *testEnv, runtime string) (common.Address, x402.PaymentPayload, x402.PaymentRequirements) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wallet := deployRuntime(ctx, t, e.d, runtime)
	if code, _ := e.d.Client().CodeAt(ctx, wallet, nil); len(code) == 0 {
		t.Fatal("wallet not deployed")
	}
	fundUSDC(t, e.d, DevKey(5), wallet, 1_000_000)
	req := e.requirements(payee, amount)
	owner := DevKey(4)
	a := auth(owner, req)
	a.From = wallet.Hex()
	return wallet, sign(t, owner, a, req, req), req
}

// relayerNonce is the relayer's pending nonce: unchanged, nothing was sent.
func relayerNonce(t *testing.T, e *testEnv) uint64 {
	t.Helper()
	n, err := e.d.Client().PendingNonceAt(context.Background(), e.f.Relayer())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// assertRefusedUnsent checks that p is refused with reason at verify and
// at settle, and that the settle sent nothing.
func assertRefusedUnsent(t *testing.T, e *testEnv, f *Facilitator, p x402.PaymentPayload, req x402.PaymentRequirements, reason string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := f.Verify(ctx, p, req)
	if err != nil || v.IsValid || v.InvalidReason != reason {
		t.Fatalf("verify = %+v, %v; want refused with %s", v, err, reason)
	}
	nonce := relayerNonce(t, e)
	s, err := f.Settle(ctx, p, req)
	if err != nil || s.Success || s.ErrorReason != reason || s.Transaction != "" {
		t.Fatalf("settle = %+v, %v; want refused with %s, nothing sent", s, err, reason)
	}
	if n := relayerNonce(t, e); n != nonce {
		t.Fatalf("the relayer's nonce moved from %d to %d: a transaction was sent", nonce, n)
	}
}

// A contract payer whose isValidSignature burns millions of gas and then
// accepts is refused at verify and at settle, nothing sent: the relayer
// pays at most MaxSettlementGas for any settlement. (Before: verify said
// valid, the gas estimate (+20%) had no bound, and a $0.02 settlement cost
// the relayer 5,369,370 gas.)
func TestContractPayerWalletPastTheGasCeilingIsRefusedUnsent(t *testing.T) {
	e := newEnv(t)
	_, p, req := contractPayer(t, e, burnerRuntime)
	assertRefusedUnsent(t, e, e.f, p, req, x402.ReasonExactEVMSimulationFailed)
}

// A contract payer whose wallet burns millions of gas, then accepts in a
// simulation (gas price 0) and refuses in the real transaction, is refused
// before anything is sent. (Before: it passed verify and the gas estimate,
// and the settlement reverted after burning ~5.2M gas at the relayer's
// cost; the failure budget counts per from, and a contract payer is one
// CREATE away from a new one.)
func TestContractPayerWalletThatRevertsOnlyWhenSentCostsTheRelayerNothing(t *testing.T) {
	e := newEnv(t)
	_, p, req := contractPayer(t, e, flipRuntime)
	assertRefusedUnsent(t, e, e.f, p, req, x402.ReasonExactEVMSimulationFailed)
}

// The simulations run at the gas price the settlement pays, so a cheap
// wallet that accepts only when GASPRICE is 0 is refused at verify, as the
// real transaction would refuse it, and nothing is sent. (Before: verify
// and the estimate ran at gas price 0, said valid, and the settlement
// reverted at the relayer's gas.)
func TestContractPayerWalletCannotTellSimulationByGasPrice(t *testing.T) {
	e := newEnv(t)
	_, p, req := contractPayer(t, e, cheapFlipRuntime)
	assertRefusedUnsent(t, e, e.f, p, req, x402.ReasonExactEVMSignature)
}

// A contract payer whose isValidSignature is cheap settles, with a gas
// limit within the ceiling.
func TestContractPayerWithACheapWalletSettlesWithinTheCeiling(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, p, req := contractPayer(t, e, acceptAllRuntime)
	if v, err := e.f.Verify(ctx, p, req); err != nil || !v.IsValid {
		t.Fatalf("verify = %+v, %v", v, err)
	}
	s, err := e.f.Settle(ctx, p, req)
	if err != nil || !s.Success {
		t.Fatalf("settle = %+v, %v", s, err)
	}
	tx, _, err := e.d.Client().TransactionByHash(ctx, common.HexToHash(s.Transaction))
	if err != nil {
		t.Fatal(err)
	}
	if tx.Gas() > DefaultMaxSettlementGas {
		t.Errorf("gas limit %d, past the ceiling %d", tx.Gas(), DefaultMaxSettlementGas)
	}
}

// Config.MaxSettlementGas is the ceiling: set below what an EOA's
// transferWithAuthorization needs (MinSettlementGas, on the devnet whose
// later fork prices new storage higher), an EOA's payment is refused at
// verify and at settle, nothing sent; the default facilitator settles it.
func TestMaxSettlementGasBoundsEveryPayment(t *testing.T) {
	e := newEnv(t)
	f, err := New(Config{Chain: e.d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, MaxSettlementGas: MinSettlementGas})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	assertRefusedUnsent(t, e, f, p, req, x402.ReasonExactEVMSimulationFailed)
	if s, err := e.f.Settle(context.Background(), p, req); err != nil || !s.Success {
		t.Fatalf("settle with the default ceiling = %+v, %v", s, err)
	}
}

// estimateAbove is the devnet's client, except that its gas estimates
// exceed the bound they were given, as a node that ignores it would.
type estimateAbove struct{ Chain }

func (c estimateAbove) EstimateGas(ctx context.Context, msg ethereum.CallMsg) (uint64, error) {
	return msg.Gas + 1, nil
}

// A gas estimate past the ceiling refuses the settlement, nothing sent,
// whatever the node makes of the bound.
func TestSettleRefusesAnEstimatePastTheCeiling(t *testing.T) {
	e := newEnv(t)
	f, err := New(Config{Chain: estimateAbove{e.d.Client()}, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	nonce := relayerNonce(t, e)
	s, err := f.Settle(context.Background(), p, req)
	if err != nil || s.Success || s.ErrorReason != x402.ReasonExactEVMSimulationFailed || s.Transaction != "" {
		t.Fatalf("settle = %+v, %v; want refused, nothing sent", s, err)
	}
	if n := relayerNonce(t, e); n != nonce {
		t.Fatalf("the relayer's nonce moved from %d to %d", nonce, n)
	}
}

// deployRuntime deploys a contract whose runtime code is the hex runtime
// (under 256 bytes), from DevKey(0), and returns its address.
func deployRuntime(ctx context.Context, t *testing.T, d *Devnet, runtime string) common.Address {
	t.Helper()
	rt, err := hex.DecodeString(runtime)
	if err != nil {
		t.Fatal(err)
	}
	// PUSH1 len; DUP1; PUSH1 11; PUSH1 0; CODECOPY; PUSH1 0; RETURN
	init := append([]byte{0x60, byte(len(rt)), 0x80, 0x60, 0x0b, 0x60, 0x00, 0x39, 0x60, 0x00, 0xf3}, rt...)
	r, err := d.SendTx(ctx, DevKey(0), nil, init)
	if err != nil {
		t.Fatal(err)
	}
	return r.ContractAddress
}
