package evmfacilitator

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/holiman/uint256"

	"github.com/aovhq/aov/x402"
)

// delegate7702 makes key's EOA delegate its code to target (EIP-7702), by a
// type-4 transaction sent from sender, and waits for it to be included.
func delegate7702(t *testing.T, d *Devnet, sender, key *ecdsa.PrivateKey, target common.Address) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	authority := crypto.PubkeyToAddress(key.PublicKey)
	an, err := d.Client().PendingNonceAt(ctx, authority)
	if err != nil {
		t.Fatal(err)
	}
	sa, err := types.SignSetCode(key, types.SetCodeAuthorization{ChainID: *uint256.NewInt(DevnetChainID), Address: target, Nonce: an})
	if err != nil {
		t.Fatal(err)
	}
	from := crypto.PubkeyToAddress(sender.PublicKey)
	sn, err := d.Client().PendingNonceAt(ctx, from)
	if err != nil {
		t.Fatal(err)
	}
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	feeCap := new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), big.NewInt(1e9))
	tx, err := types.SignNewTx(sender, types.LatestSignerForChainID(big.NewInt(DevnetChainID)), &types.SetCodeTx{
		ChainID: uint256.NewInt(DevnetChainID), Nonce: sn, GasTipCap: uint256.NewInt(1e9), GasFeeCap: uint256.MustFromBig(feeCap),
		Gas: 200_000, To: authority, AuthList: []types.SetCodeAuthorization{sa},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Client().SendTransaction(ctx, tx); err != nil {
		t.Fatal(err)
	}
	for {
		if r, err := d.Client().TransactionReceipt(ctx, tx.Hash()); err == nil {
			if r.Status != types.ReceiptStatusSuccessful {
				t.Fatal("set-code transaction reverted")
			}
			if _, err := SettledHead(ctx, d.Client()); err != nil {
				t.Fatal(err)
			}
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("set-code transaction not mined")
		case <-time.After(20 * time.Millisecond):
		}
	}
	code, err := d.Client().CodeAt(ctx, authority, nil)
	if err != nil || len(code) == 0 {
		t.Fatalf("no delegation on %s: %x, %v", authority.Hex(), code, err)
	}
}

// An EOA that delegates its code (EIP-7702) to a wallet that accepts in
// the simulations and fails in the mined block signs ordinary ECDSA
// authorizations, which recover to from, while the token (as USDC does)
// sees code at from and runs its isValidSignature inside every
// settlement, at the relayer's gas. It is budgeted as a contract payer:
// of its concurrent settlements at most max_failed_per_payer are sent,
// costing at most max_failed_per_payer × max_settlement_gas. (Before: it
// was budgeted as an EOA, and all 16 were sent and reverted, 7.9M gas.)
func TestDelegatedEOAIsBudgetedAsAContractPayer(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	target := deployRuntime(ctx, t, e.d, blockBoundRuntime)
	owner := DevKey(7) // an ordinary funded dev account (1,000,000 test USDC)
	wallet := crypto.PubkeyToAddress(owner.PublicKey)
	delegate7702(t, e.d, DevKey(6), owner, target)

	req := e.requirements(payee, amount)
	const n = 16 // DefaultMaxInFlightPerPayer
	ps := make([]x402.PaymentPayload, n)
	for i := range ps {
		ps[i] = sign(t, owner, auth(owner, req), req, req) // plain ECDSA: recovers to from
	}
	if _, err := e.d.SendTx(ctx, DevKey(6), &wallet, nil); err != nil { // arm: store the head's number
		t.Fatal(err)
	}
	outs := settleAllAtOnce(ctx, e, ps, req)
	reverted, gas := revertedGas(ctx, t, e, outs)
	reasons := map[string]int{}
	for _, o := range outs {
		reasons[o.r.ErrorReason]++
		if o.err != nil {
			reasons["error: "+o.err.Error()]++
		}
	}
	t.Logf("outcomes: %v", reasons)
	t.Logf("%d settlements of one 7702-delegated EOA reverted, %d gas paid by the relayer", reverted, gas)
	if reverted > DefaultMaxFailedPerPayer || gas > DefaultMaxFailedPerPayer*DefaultMaxSettlementGas {
		t.Errorf("one delegated EOA made %d settlements revert, %d gas at the relayer's cost; promised at most max_failed_per_payer (%d) × max_settlement_gas (%d) = %d",
			reverted, gas, DefaultMaxFailedPerPayer, DefaultMaxSettlementGas, DefaultMaxFailedPerPayer*DefaultMaxSettlementGas)
	}
}

// codeCounter counts the eth_getCode calls made through it.
type codeCounter struct {
	Chain
	calls atomic.Int32
}

func (c *codeCounter) CodeAt(ctx context.Context, a common.Address, block *big.Int) ([]byte, error) {
	c.calls.Add(1)
	return c.Chain.CodeAt(ctx, a, block)
}

// Whether a payer has code is read only when the budget's answer depends
// on it: an EOA's payment with nothing of its payer in flight or reverted
// is verified and settled without eth_getCode, and one past the contract
// payer's rule (here, its failures recorded) has its code read once, and
// passes when it has none.
func TestPayerCodeIsReadOnlyWhenTheBudgetDependsOnIt(t *testing.T) {
	e := newEnv(t)
	cc := &codeCounter{Chain: e.d.Client()}
	f, err := New(Config{Chain: cc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	if v, err := f.Verify(ctx, p, req); err != nil || !v.IsValid {
		t.Fatalf("verify = %+v, %v", v, err)
	}
	if s, err := f.Settle(ctx, p, req); err != nil || !s.Success {
		t.Fatalf("settle = %+v, %v", s, err)
	}
	if n := cc.calls.Load(); n != 0 {
		t.Errorf("%d eth_getCode calls for an EOA's payment with nothing in flight; want 0", n)
	}
	from := crypto.PubkeyToAddress(payer.PublicKey)
	for range DefaultMaxFailedPerPayer - 1 {
		f.budget.end(f.budget.hold(e.d.token, from, big.NewInt(1)), true)
	}
	f.budget.hold(e.d.token, from, big.NewInt(1)) // one more in flight: a contract payer's budget is full
	p = mustSignExact(t, payer, req)
	if v, err := f.Verify(ctx, p, req); err != nil || !v.IsValid {
		t.Fatalf("verify of an EOA with %d failures and one settlement in flight = %+v, %v; want valid", DefaultMaxFailedPerPayer-1, v, err)
	}
	if n := cc.calls.Load(); n != 1 {
		t.Errorf("%d eth_getCode calls for an EOA's payment the contract payer's rule would refuse; want 1", n)
	}
}
