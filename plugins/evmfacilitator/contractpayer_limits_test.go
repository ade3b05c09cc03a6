package evmfacilitator

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/params"

	"github.com/aovhq/aov/x402"
)

// The simulations run with at most MaxSettlementGas gas. A contract
// payer's signature is payer-chosen bytes up to 16 KiB
// (x402.ParseSignature); since Prague (EIP-7623, live on Base and
// Ethereum) a transaction's calldata has a floor cost of 10 gas per token
// (40 per nonzero byte), so a 16 KiB signature's isValidSignature call
// needs ~676,000 gas before any code runs. The node refuses the eth_call
// itself ("insufficient gas for floor data gas cost"): such a payment is
// refused (invalid_exact_evm_transaction_simulation_failed) before the node
// is asked, nothing sent. (Before: classify took the node's answer for its
// own trouble, and verify and settle returned an error, the gateway's 503
// "retry later".)
func TestContractPayerSignaturePastTheCalldataFloorIsRefusedUnsent(t *testing.T) {
	e := newEnv(t)
	_, p, req := contractPayer(t, e, acceptAllRuntime)
	var pl x402.ExactEVMPayload
	if err := json.Unmarshal(p.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	long := "0x" + hex.EncodeToString(bytes.Repeat([]byte{0xff}, 16384))
	p = payload(t, long, pl.Authorization, p.Accepted)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := e.f.Verify(ctx, p, req)
	if err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMSimulationFailed {
		t.Errorf("verify = %+v, err = %v; want a refusal with a reason and no error", v, err)
	}
	nonce := relayerNonce(t, e)
	s, err := e.f.Settle(ctx, p, req)
	if err != nil || s.Success || s.ErrorReason != x402.ReasonExactEVMSimulationFailed || s.Transaction != "" {
		t.Errorf("settle = %+v, err = %v; want a refusal with a reason and no error", s, err)
	}
	if n := relayerNonce(t, e); n != nonce {
		t.Fatalf("relayer nonce moved %d -> %d", nonce, n)
	}
}

// blockBoundRuntime: a contract payer's wallet that, on a plain call
// (no calldata), stores the block number, and on isValidSignature burns
// ~312,000 gas and then accepts only while NUMBER <= that stored block:
// eth_call and eth_estimateGas at "latest" (that block) accept, the
// settlement, mined in a later block, fails (INVALID, all its gas).
//
//	CALLDATASIZE ISZERO PUSH1 arm JUMPI; PUSH3 12000; loop: JUMPDEST PUSH1 1
//	SWAP1 SUB DUP1 PUSH1 loop JUMPI POP; NUMBER PUSH1 0 SLOAD LT PUSH1 bad
//	JUMPI; <accept>; bad: JUMPDEST INVALID; arm: JUMPDEST NUMBER PUSH1 0
//	SSTORE STOP
const blockBoundRuntime = "3615602d57" + "62002ee0" + "5b600190038060095750" + "4360005410602b57" +
	"631626ba7e60e01b60005260206000f3" + "5bfe" + "5b4360005500"

// A contract payer's wallet costs the relayer at most max_failed_per_payer
// × max_settlement_gas per failure_window, however many of its settlements
// run at once: its settlements in flight count against its failure budget,
// so a wallet that accepts in the simulations and fails in the mined block
// has at most 3 of 16 concurrent settlements sent, the rest refused with
// the failure budget's reason, nothing sent. (Before: the budget counted a
// revert only once recorded, and all 16, up to max_in_flight_per_payer,
// were sent and reverted: 7,887,232 gas at the relayer's cost.)
func TestContractWalletRevertsAtMostItsFailureBudgetAtOnce(t *testing.T) {
	// The wallet accepts only up to the block that armed it, so the
	// scenario needs every one of the 16 checks to run before the block of
	// the first settlement is sealed. On a loaded machine a check can come
	// after it and be refused as a bad signature, before any budget: the
	// round then proves nothing either way, and runs again on a fresh
	// chain.
	for attempt := 1; ; attempt++ {
		late, done := walletRevertsAtOnce(t)
		if done || attempt == 3 {
			if !done {
				t.Fatalf("in each of %d rounds %d of the checks came after the armed block; the scenario never ran", attempt, late)
			}
			return
		}
		t.Logf("round %d: %d checks came after the armed block; again", attempt, late)
	}
}

// walletRevertsAtOnce is one round of
// TestContractWalletRevertsAtMostItsFailureBudgetAtOnce. It reports how
// many settlements were refused as a bad signature (checked after the
// armed block), and whether the round ran as designed (none was) and was
// judged.
func walletRevertsAtOnce(t *testing.T) (late int, done bool) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wallet := deployRuntime(ctx, t, e.d, blockBoundRuntime)
	fundUSDC(t, e.d, DevKey(5), wallet, 1_000_000)
	req := e.requirements(payee, amount)
	owner := DevKey(4)
	const n = 16 // DefaultMaxInFlightPerPayer
	ps := make([]x402.PaymentPayload, n)
	for i := range ps {
		a := auth(owner, req)
		a.From = wallet.Hex()
		ps[i] = sign(t, owner, a, req, req)
	}
	if _, err := e.d.SendTx(ctx, DevKey(6), &wallet, nil); err != nil { // arm: store the head's number
		t.Fatal(err)
	}
	outs := settleAllAtOnce(ctx, e, ps, req)
	reverted, gas := revertedGas(ctx, t, e, outs)
	refused := 0
	for _, o := range outs {
		switch {
		case o.err == nil && o.r.Transaction == "" && o.r.ErrorReason == ReasonPayerFailureBudget:
			refused++
		case o.err == nil && o.r.Transaction == "" && o.r.ErrorReason == x402.ReasonExactEVMSignature:
			late++
		}
	}
	t.Logf("%d settlements of one wallet reverted, %d gas paid by the relayer", reverted, gas)
	if reverted > DefaultMaxFailedPerPayer || gas > DefaultMaxFailedPerPayer*DefaultMaxSettlementGas {
		t.Errorf("one contract wallet made %d settlements revert, %d gas at the relayer's cost; README: at most max_failed_per_payer (%d) × max_settlement_gas (%d)",
			reverted, gas, DefaultMaxFailedPerPayer, DefaultMaxSettlementGas)
	}
	if late > 0 {
		return late, false
	}
	if reverted+refused != n {
		t.Errorf("%d reverted and %d refused with %s, of %d", reverted, refused, ReasonPayerFailureBudget, n)
	}
	// Recorded: the wallet's next payment is refused (its wallet, past the
	// armed block, now refuses at verify first).
	if reason, _ := e.f.budget.check(wallet, nil, true); reason != ReasonPayerFailureBudget {
		t.Errorf("after %d reverts the wallet's budget check = %q; want %s", reverted, reason, ReasonPayerFailureBudget)
	}
	return 0, true
}

// A settlement gas ceiling below what an EOA's transferWithAuthorization
// needs is refused by New, naming the least it accepts: no payment could
// settle under it. (Before: New took 21,000, and the node refused every
// simulation as malformed, "intrinsic gas too low": every payment, from
// every payer, was an outage, 503, rather than a refusal.)
func TestNewRefusesACeilingBelowATransfersNeed(t *testing.T) {
	e := newEnv(t)
	for _, gas := range []uint64{21_000, 40_000, MinSettlementGas - 1} {
		_, err := New(Config{Chain: e.d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), MaxSettlementGas: gas})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprint(MinSettlementGas)) {
			t.Errorf("New with MaxSettlementGas %d: %v; want refused, naming %d", gas, err, MinSettlementGas)
		}
	}
	// README states the least, in the option table and the cost section.
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), fmt.Sprintf("at least %d", MinSettlementGas)); n != 2 {
		t.Errorf("README says \"at least %d\" %d times; want 2 (max_settlement_gas's least)", MinSettlementGas, n)
	}
}

// At MinSettlementGas an EOA's payment verifies and settles, on a chain
// with the gas schedule public chains run (Osaka's; the default devnet
// prices new storage by a later fork), to a payTo already holding the
// token and to one holding none yet (a seller's fresh address: the
// transfer writes a new storage slot), the costlier: the minimum is not
// above what a transfer needs, and leaves the settlement's gas limit its
// whole headroom over the estimate. (Before: measured for a payee holding
// the token, 71277, it refused a payment to a fresh payTo, whose
// estimate is 86536.)
func TestMinSettlementGasSettlesAnEOAPayment(t *testing.T) {
	forks := *params.AllDevChainProtocolChanges
	forks.BogotaTime = nil
	d := startDevnet(t, DevnetConfig{forks: &forks})
	f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, MaxSettlementGas: MinSettlementGas})
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{d: d, f: f}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fresh := common.HexToAddress("0x00000000000000000000000000000000000a11ce")
	for _, to := range []common.Address{payee, fresh} {
		req := e.requirements(to, amount)
		p := mustSignExact(t, payer, req)
		estimate, err := d.Client().EstimateGas(ctx, ethereum.CallMsg{From: f.Relayer(), To: &d.token, Data: mustTxData(t, p, req)})
		if err != nil {
			t.Fatal(err)
		}
		if v, err := f.Verify(ctx, p, req); err != nil || !v.IsValid {
			t.Fatalf("verify at MinSettlementGas (%d) of a payment to %s = %+v, %v", MinSettlementGas, to.Hex(), v, err)
		}
		s, err := f.Settle(ctx, p, req)
		if err != nil || !s.Success {
			t.Fatalf("settle at MinSettlementGas (%d) of a payment to %s = %+v, %v", MinSettlementGas, to.Hex(), s, err)
		}
		tx, _, err := d.Client().TransactionByHash(ctx, common.HexToHash(s.Transaction))
		if err != nil {
			t.Fatal(err)
		}
		if tx.Gas() != withHeadroom(estimate) {
			t.Errorf("payment to %s: gas limit %d at MinSettlementGas (%d); want its estimate %d with its headroom, %d", to.Hex(), tx.Gas(), MinSettlementGas, estimate, withHeadroom(estimate))
		}
		t.Logf("payment to %s: estimate %d, gas limit %d, ceiling %d", to.Hex(), estimate, tx.Gas(), MinSettlementGas)
	}
}

// mustTxData is the calldata of p's settlement, an EOA's.
func mustTxData(t *testing.T, p x402.PaymentPayload, req x402.PaymentRequirements) []byte {
	t.Helper()
	chk, err := x402.CheckExactEVM(p, req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	data, err := transferCallData(chk.Values, chk.Signature, false)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// landedFailures waits until f holds no settlement of payer in flight
// (follow has learned every unknown outcome) and returns the failures
// recorded against it.
func landedFailures(t *testing.T, f *Facilitator, payer common.Address) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		f.budget.mu.Lock()
		failures, flights := 0, 0
		if id := f.budget.ids[payer]; id != nil {
			failures, flights = len(id.failures), len(id.flights)
		}
		f.budget.mu.Unlock()
		if flights == 0 {
			return failures
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d settlements of %s still in flight", flights, payer.Hex())
		}
	}
}

// A contract payer's settlement whose outcome stays unknown counts as a
// failure of its budget once the facilitator gives up learning it (it
// may still revert once mined, at the relayer's gas, unseen), and is held
// in flight until then; an EOA's counts nothing, and is released with the
// answer: its signature runs no payer code.
func TestContractPayerUnknownOutcomeCountsAgainstItsBudget(t *testing.T) {
	for _, contract := range []bool{true, false} {
		e := newEnv(t)
		lc := &lossyChain{Chain: e.d.Client(), dropSends: true, errConnection: errors.New("connection reset by peer (fake)")}
		f, err := New(Config{Chain: lc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		req := e.requirements(payee, amount)
		from := crypto.PubkeyToAddress(payer.PublicKey)
		p := mustSignExact(t, payer, req)
		if contract {
			from, p, req = contractPayer(t, e, acceptAllRuntime)
		}
		_, err = f.Settle(context.Background(), p, req)
		var unknown *x402.UnknownOutcomeError
		if !errors.As(err, &unknown) {
			t.Fatalf("contract %v: settle error %v; want an unknown outcome", contract, err)
		}
		f.budget.mu.Lock()
		flights := 0
		if id := f.budget.ids[from]; id != nil {
			flights = len(id.flights)
		}
		f.budget.mu.Unlock()
		if want := map[bool]int{true: 1, false: 0}[contract]; flights != want {
			t.Errorf("contract %v: %d flights held as settle answered an unknown outcome; want %d", contract, flights, want)
		}
		if got, want := landedFailures(t, f, from), map[bool]int{true: 1, false: 0}[contract]; got != want {
			t.Errorf("contract %v: %d failures recorded once the outcome stayed unknown; want %d", contract, got, want)
		}
	}
}

// A contract payer's settlement answered as an unknown outcome (the RPC
// connection broke after the send) is held in flight while the
// facilitator keeps reading its receipt, then counted by what the chain
// shows: a wallet whose three such settlements all paid payTo records no
// failure, and its next payment is valid; one whose settlement reverted
// records one. (Before: each counted as a revert at once, and a wallet
// whose settlements all went through was refused for failure_window.)
func TestContractPayerUnknownOutcomeCountsAsTheChainShows(t *testing.T) {
	for _, tc := range []struct {
		runtime  string
		settles  int
		failures int
	}{{acceptAllRuntime, DefaultMaxFailedPerPayer, 0}, {blockBoundRuntime, 1, 1}} {
		e := newEnv(t)
		lc := &lossyChain{Chain: e.d.Client(), breakAfterTx: true, errConnection: errors.New("connection reset by peer (fake)")}
		f, err := New(Config{Chain: lc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wallet, _, req := contractPayer(t, e, tc.runtime)
		owner := DevKey(4)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if tc.runtime == blockBoundRuntime {
			if _, err := e.d.SendTx(ctx, DevKey(6), &wallet, nil); err != nil { // arm: store the head's number
				t.Fatal(err)
			}
		}
		for i := range tc.settles {
			a := auth(owner, req)
			a.From = wallet.Hex()
			_, err := f.Settle(ctx, sign(t, owner, a, req, req), req)
			var unknown *x402.UnknownOutcomeError
			if !errors.As(err, &unknown) {
				t.Fatalf("settle %d: %v; want an unknown outcome", i, err)
			}
			lc.mu.Lock()
			lc.sent, lc.resolving = false, false // the connection is back
			lc.mu.Unlock()
		}
		if got := landedFailures(t, f, wallet); got != tc.failures {
			t.Errorf("%d settlements of a wallet answered unknown, %d failures recorded once learned; want %d", tc.settles, got, tc.failures)
		}
		if tc.failures > 0 {
			continue
		}
		a := auth(owner, req)
		a.From = wallet.Hex()
		if v, err := f.Verify(ctx, sign(t, owner, a, req, req), req); err != nil || !v.IsValid {
			t.Errorf("the next payment of a wallet whose %d settlements all transferred = %+v, %v; want valid", tc.settles, v, err)
		}
	}
}

// settleAllAtOnce settles every payment of ps at the same time through e's
// facilitator (settleAsync) and returns their answers.
func settleAllAtOnce(ctx context.Context, e *testEnv, ps []x402.PaymentPayload, req x402.PaymentRequirements) []settled {
	chs := make([]<-chan settled, len(ps))
	for i, p := range ps {
		chs[i] = settleAsync(ctx, e.f, p, req)
	}
	outs := make([]settled, len(ps))
	for i, ch := range chs {
		outs[i] = <-ch
	}
	return outs
}

// revertedGas counts the answers of outs that name a transaction that did
// not succeed, and the gas their receipts say the relayer paid.
func revertedGas(ctx context.Context, t *testing.T, e *testEnv, outs []settled) (reverted int, gas uint64) {
	t.Helper()
	for _, o := range outs {
		if o.r.Transaction != "" && !o.r.Success {
			reverted++
			if rc, err := e.d.Client().TransactionReceipt(ctx, common.HexToHash(o.r.Transaction)); err == nil {
				gas += rc.GasUsed
			}
		}
	}
	return reverted, gas
}
