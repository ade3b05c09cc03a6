package evmfacilitator

import (
	"context"
	"errors"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// lagNonceChain is a node whose pending nonce lags a transaction it has
// just taken, as go-ethereum's does: eth_sendRawTransaction puts the
// transaction in its pool's queue and answers, and the pool counts it in
// the pending nonce only once its background loop promotes it, late on a
// loaded machine; meanwhile another transaction of that nonce is refused
// "replacement transaction underpriced" (the devnet shows the lag, but
// too briefly to be caught at will). The first send's answer is lost (an
// unknown send, after which the relayer reads the nonce again), and from
// then on the pool has not promoted it, until a later nonce is taken.
type lagNonceChain struct {
	Chain
	mu    sync.Mutex
	sends int
	first *types.Transaction // the transaction not yet promoted
}

func (c *lagNonceChain) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	c.sends++
	first := c.sends == 1
	if q := c.first; q != nil && tx.Nonce() == q.Nonce() && tx.Hash() != q.Hash() {
		c.mu.Unlock()
		return nodeError{code: -32000, msg: "replacement transaction underpriced"}
	}
	c.mu.Unlock()
	err := c.Chain.SendTransaction(ctx, tx)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err == nil && first:
		c.first = tx
		return errors.New("read tcp: connection reset by peer (fake: the answer lost)")
	case err == nil && c.first != nil && tx.Nonce() > c.first.Nonce():
		c.first = nil
	}
	return err
}

func (c *lagNonceChain) PendingNonceAt(ctx context.Context, a common.Address) (uint64, error) {
	c.mu.Lock()
	q := c.first
	c.mu.Unlock()
	if q != nil {
		return q.Nonce(), nil
	}
	return c.Chain.PendingNonceAt(ctx, a)
}

// A settlement after one whose send went unanswered reads the relayer's
// nonce again; a node whose pending nonce does not yet count the
// transaction it took answers that one's nonce, and refuses the new
// transaction of it, "replacement transaction underpriced": its pool
// holds one of that nonce, so the relayer tries once more with a later
// one, whatever the lagging read says, and the payment settles.
// (Before: the retry read the same lagging nonce and was refused again, and
// the settlement failed with "replacement transaction underpriced": seen
// once under load in the outage test, whose settles follow unanswered
// sends.)
func TestASettleAfterAnUnansweredSendSkipsTheNonceTheNodeHolds(t *testing.T) {
	e := newEnv(t)
	lc := &lagNonceChain{Chain: e.d.Client()}
	f, err := New(Config{Chain: lc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	_, err = f.Settle(context.Background(), mustSignExact(t, payer, req), req)
	var unknown *x402.UnknownOutcomeError
	if err != nil && !errors.As(err, &unknown) {
		t.Fatalf("the settle whose send went unanswered: %v; want paid or an unknown outcome", err)
	}
	resp, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
	if err != nil || !resp.Success {
		t.Fatalf("the next settle, the node's pending nonce lagging = %+v, %v; want paid", resp, err)
	}
	want := new(big.Int).Mul(big.NewInt(2), mustBig(amount))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		paid := new(big.Int).Sub(before, usdcBalance(t, e.d, from))
		if paid.Cmp(want) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the payer paid %s; want %s, both settlements", paid, want)
		}
	}
}
