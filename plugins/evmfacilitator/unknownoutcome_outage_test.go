package evmfacilitator

import (
	"context"
	"errors"
	"math/big"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// outageChain is a fake for a fault the devnet cannot cause: the
// settlement transaction reaches the node, then the RPC endpoint goes
// down (every read fails) until down is cleared.
type outageChain struct {
	Chain
	down atomic.Bool
}

var errOutage = errors.New("connection refused (fake outage)")

func (c *outageChain) fail(ctx context.Context) error {
	if !c.down.Load() {
		return nil
	}
	return errOutage
}

func (c *outageChain) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	if err := c.Chain.SendTransaction(ctx, tx); err != nil {
		return err
	}
	c.down.Store(true)
	return errOutage
}
func (c *outageChain) TransactionReceipt(ctx context.Context, h common.Hash) (*types.Receipt, error) {
	if err := c.fail(ctx); err != nil {
		return nil, err
	}
	return c.Chain.TransactionReceipt(ctx, h)
}
func (c *outageChain) TransactionByHash(ctx context.Context, h common.Hash) (*types.Transaction, bool, error) {
	if err := c.fail(ctx); err != nil {
		return nil, false, err
	}
	return c.Chain.TransactionByHash(ctx, h)
}
func (c *outageChain) CallContract(ctx context.Context, m ethereum.CallMsg, b *big.Int) ([]byte, error) {
	if err := c.fail(ctx); err != nil {
		return nil, err
	}
	return c.Chain.CallContract(ctx, m, b)
}
func (c *outageChain) CodeAt(ctx context.Context, a common.Address, b *big.Int) ([]byte, error) {
	if err := c.fail(ctx); err != nil {
		return nil, err
	}
	return c.Chain.CodeAt(ctx, a, b)
}
func (c *outageChain) HeaderByNumber(ctx context.Context, b *big.Int) (*types.Header, error) {
	if err := c.fail(ctx); err != nil {
		return nil, err
	}
	return c.Chain.HeaderByNumber(ctx, b)
}
func (c *outageChain) NonceAt(ctx context.Context, a common.Address, b *big.Int) (uint64, error) {
	if err := c.fail(ctx); err != nil {
		return 0, err
	}
	return c.Chain.NonceAt(ctx, a, b)
}
func (c *outageChain) FilterLogs(ctx context.Context, q ethereum.FilterQuery) ([]types.Log, error) {
	if err := c.fail(ctx); err != nil {
		return nil, err
	}
	return c.Chain.FilterLogs(ctx, q)
}

// An ordinary account (no code, ECDSA signature) whose settlements paid
// An ordinary account (no code, an ECDSA signature) whose settlements paid
// payTo but were answered as unknown outcomes during an RPC outage is not
// charged failures: its place in flight ends with the answer, counting
// nothing, and nothing is read from the chain after the answer is decided.
// (Before: settle's deferred code read failed during the outage, a failure
// was taken as "has code", and follow counted each settlement as a revert
// once the outage outlasted it: after three the honest payer was refused
// for the failure window although every one paid.)
func TestOrdinaryPayerPaidDuringAnOutageIsChargedNoFailure(t *testing.T) {
	e := newEnv(t)
	oc := &outageChain{Chain: e.d.Client()}
	f, err := New(Config{Chain: oc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	for i := range DefaultMaxFailedPerPayer {
		_, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
		var unknown *x402.UnknownOutcomeError
		if !errors.As(err, &unknown) {
			t.Fatalf("settle %d: %v; want an unknown outcome", i, err)
		}
		f.budget.mu.Lock()
		flights := 0
		if id := f.budget.ids[from]; id != nil {
			flights = len(id.flights)
		}
		f.budget.mu.Unlock()
		if flights != 0 {
			t.Errorf("settle %d: an account without code has %d flights held after its answer; want 0", i, flights)
		}
		landedFailures(t, f, from) // follow gave up while the outage lasted
		oc.down.Store(false)       // the endpoint is back
	}
	paid := new(big.Int).Sub(before, usdcBalance(t, e.d, from))
	want := new(big.Int).Mul(big.NewInt(DefaultMaxFailedPerPayer), mustBig(amount))
	t.Logf("the payer paid %s (want %s: every settlement transferred)", paid, want)
	got := landedFailures(t, f, from)
	if got != 0 {
		t.Errorf("an account without code whose %d settlements all paid payTo has %d failures recorded; want 0", DefaultMaxFailedPerPayer, got)
	}
	v, err := f.Verify(context.Background(), mustSignExact(t, payer, req), req)
	if err != nil || !v.IsValid {
		t.Errorf("the honest payer's next payment = %+v, %v; want valid", v, err)
	}
}

func mustBig(s string) *big.Int {
	n, ok := new(big.Int).SetString(s, 10)
	if !ok {
		panic(s)
	}
	return n
}
