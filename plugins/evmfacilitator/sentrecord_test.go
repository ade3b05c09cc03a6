package evmfacilitator

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/aovhq/aov/x402"
)

// barrierReceipts holds every TransactionReceipt of hash h until `want`
// callers are inside (or 5 s pass): two retries resolving the same kept
// transaction at once, as two gateways or resource servers retrying
// /settle through facilitators of one relayer key in one process.
type barrierReceipts struct {
	*fakeHeldSends
	mu   sync.Mutex
	h    common.Hash
	want int
	in   int
	gate chan struct{}
}

func (c *barrierReceipts) TransactionReceipt(ctx context.Context, h common.Hash) (*types.Receipt, error) {
	c.mu.Lock()
	armed := c.gate != nil && h == c.h
	if armed {
		c.in++
		if c.in == c.want {
			close(c.gate)
		}
	}
	g := c.gate
	c.mu.Unlock()
	if armed {
		select {
		case <-g:
		case <-time.After(5 * time.Second):
		}
	}
	return c.fakeHeldSends.TransactionReceipt(ctx, h)
}

// README: one authorization is one success per process. Two retries of
// /settle after an unknown outcome, at once through two facilitators of
// the relayer key, both resolve the one kept transaction, mined and paid:
// the first to resolve it is answered success, the other
// nonce_already_used naming that transaction (settledBy), as a settle
// after the payment landed is. (Before: both found the kept transaction
// before either resolved it, and both were answered success for one
// transfer.)
func TestConcurrentRetriesAfterUnknownOutcomeAreOneSuccess(t *testing.T) {
	e := newEnv(t)
	hc := &fakeHeldSends{Chain: e.d.Client()}
	bc := &barrierReceipts{fakeHeldSends: hc, want: 2}
	cfg := Config{Chain: bc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	var ue *x402.UnknownOutcomeError
	if _, err = f.Settle(context.Background(), p, req); !errors.As(err, &ue) {
		t.Fatalf("first settle: %v; want an unknown outcome", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := hc.release(ctx); err != nil {
		t.Fatal(err)
	}
	first, _ := hc.sentNonces()
	if r := waitMined(t, e, first.Hash()); r.Status != types.ReceiptStatusSuccessful {
		t.Fatal("the settlement reverted")
	}
	bc.mu.Lock()
	bc.h, bc.gate = first.Hash(), make(chan struct{})
	bc.mu.Unlock()
	type out struct {
		r   x402.SettleResponse
		err error
	}
	outs := make([]out, 2)
	var wg sync.WaitGroup
	for i, fac := range []*Facilitator{f, f2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := fac.Settle(context.Background(), p, req)
			outs[i] = out{r, err}
		}()
	}
	wg.Wait()
	successes, settledBy := 0, 0
	for i, o := range outs {
		t.Logf("retry %d = success=%v reason=%q tx=%s err=%v", i+1, o.r.Success, o.r.ErrorReason, o.r.Transaction, o.err)
		switch {
		case o.err != nil:
		case o.r.Success && o.r.Transaction == first.Hash().Hex():
			successes++
		case o.r.ErrorReason == x402.ReasonExactEVMNonceAlreadyUsed && o.r.Transaction == first.Hash().Hex():
			settledBy++
		}
	}
	if successes != 1 || settledBy != 1 {
		t.Errorf("one transfer (%s) answered success %d times and %s naming it %d times; want once each", first.Hash().Hex(), successes, x402.ReasonExactEVMNonceAlreadyUsed, settledBy)
	}
	if _, n := hc.sentNonces(); n != 1 {
		t.Errorf("the sends used %d nonces; want 1", n)
	}
}
