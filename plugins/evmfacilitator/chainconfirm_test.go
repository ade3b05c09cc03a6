package evmfacilitator

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// droppingSends acknowledges the first drop sends and discards them, as a
// node that lost them (restarted without its journal) does; the first one
// lost is kept (lost).
type droppingSends struct {
	Chain
	mu   sync.Mutex
	drop int
	lost atomic.Pointer[types.Transaction]
}

func (c *droppingSends) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	d := c.drop > 0
	if d {
		c.drop--
		c.lost.CompareAndSwap(nil, tx)
	}
	c.mu.Unlock()
	if d {
		return nil
	}
	return c.Chain.SendTransaction(ctx, tx)
}

// A retry of a settlement whose outcome was unknown, arriving while the
// genesis read fails (the outage that made the first outcome unknown, a
// provider's 429 on one call), is an unknown outcome, nothing sent: its
// kept transaction may still land, and does, sent again by the look-after
// once the node answers. (Before: the retry read the genesis block before
// it looked up what was kept, and its failure was a plain error, which
// Settle's contract reads as nothing sent: the x402 handler's 503, charged
// false, for a payment then charged.)
func TestKeptRetryDuringGenesisReadFailureIsUnknownOutcome(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	vc := &droppingSends{Chain: d.Client(), drop: 2}
	oc := &genesisOutage{Chain: vc}
	f, err := New(Config{Chain: oc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	req := (&testEnv{d: d}).requirements(payee, amount)
	pay := mustSignExact(t, payer, req)
	_, err = f.Settle(context.Background(), pay, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("first settle = %v; want an unknown outcome", err)
	}
	lost := vc.lost.Load()
	before := usdcBalance(t, d, crypto.PubkeyToAddress(payer.PublicKey))

	oc.down.Store(true) // the retry meets a failed genesis read
	r, rerr := f.Settle(context.Background(), pay, req)
	oc.down.Store(false)

	// The kept transaction lands all the same (the look-after).
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	mined := false
	for ctx.Err() == nil {
		if _, err := d.Client().TransactionReceipt(ctx, lost.Hash()); err == nil {
			mined = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	after := usdcBalance(t, d, crypto.PubkeyToAddress(payer.PublicKey))
	if !errors.As(rerr, &ue) {
		t.Errorf("retry while the genesis read fails = %+v, %v (unknown outcome: false): Settle's contract reads a plain error as nothing sent (x402_facilitator answers 503, charged false); then the kept transaction %s was mined=%v and the payer's balance went %s -> %s; want an unknown outcome", r, rerr, lost.Hash().Hex(), mined, before, after)
	}
}
