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

	"github.com/aovhq/aov/x402"
)

// fakeHeldSends is a fake for a node that has the first settlement
// transaction pending and mines it only once release is called: a slow
// chain, a congested block, landing after the facilitator's receipt wait
// ended. Until then the node answers for it, and for every replacement of
// it (its nonce), as pending, and mines none of them. Every send is kept
// (sends).
type fakeHeldSends struct {
	Chain
	mu       sync.Mutex
	held     *types.Transaction
	released bool
	sends    []*types.Transaction
}

func (c *fakeHeldSends) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	c.sends = append(c.sends, tx)
	hold := c.held == nil || (tx.Nonce() == c.held.Nonce() && !c.released)
	if c.held == nil {
		c.held = tx
	}
	c.mu.Unlock()
	if hold {
		return nil
	}
	return c.Chain.SendTransaction(ctx, tx)
}

func (c *fakeHeldSends) TransactionByHash(ctx context.Context, h common.Hash) (*types.Transaction, bool, error) {
	c.mu.Lock()
	held := c.held
	var pending *types.Transaction
	if held != nil && !c.released {
		for _, tx := range c.sends {
			if tx.Hash() == h && tx.Nonce() == held.Nonce() {
				pending = tx
			}
		}
	}
	c.mu.Unlock()
	if pending != nil {
		return pending, true, nil
	}
	return c.Chain.TransactionByHash(ctx, h)
}

// sentNonces returns the first transaction sent and how many nonces the
// sends used.
func (c *fakeHeldSends) sentNonces() (*types.Transaction, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	nonces := map[uint64]bool{}
	for _, tx := range c.sends {
		nonces[tx.Nonce()] = true
	}
	return c.sends[0], len(nonces)
}

func (c *fakeHeldSends) release(ctx context.Context) error {
	c.mu.Lock()
	tx := c.held
	c.released = true
	c.mu.Unlock()
	return c.Chain.SendTransaction(ctx, tx)
}

// README (failure budget): "a facilitator sends one authorization once,
// whatever its signature's encoding, so one authorization costs at most one
// send per facilitator of the key". A /settle retried after an unknown
// outcome, while the first transaction is still pending, resolves that
// transaction instead of sending the authorization again: unknown while it
// is pending (replaced at a higher fee, its nonce kept: one nonce is mined
// once), success by its receipt once it is mined, through any
// facilitator of the relayer key in the process. (Before: the retry sent a
// second transaction, which reverted at the relayer's gas once the first,
// with the lower nonce, landed.)
func TestRetryAfterUnknownOutcomeSendsNoSecondTransaction(t *testing.T) {
	e := newEnv(t)
	hc := &fakeHeldSends{Chain: e.d.Client()}
	cfg := Config{Chain: hc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	_, err = f.Settle(context.Background(), p, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("first settle: %v; want an unknown outcome", err)
	}
	// The caller retries /settle with the same payment, as README tells it
	// ("retry the same request later"), here and through another
	// facilitator of the key (a reload's).
	f2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i, fac := range []*Facilitator{f, f2} {
		if r, err := fac.Settle(context.Background(), p, req); !errors.As(err, &ue) {
			t.Errorf("retry %d while the transaction is pending = %+v, %v; want an unknown outcome", i+1, r, err)
		}
	}
	first, n := hc.sentNonces()
	if n != 1 {
		t.Fatalf("one authorization was sent with %d nonces; want one", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := hc.release(ctx); err != nil {
		t.Fatal(err)
	}
	if r := waitMined(t, e, first.Hash()); r.Status != types.ReceiptStatusSuccessful {
		t.Fatalf("the settlement transaction reverted")
	}
	r, err := f2.Settle(context.Background(), p, req)
	if err != nil || !r.Success || r.Transaction != first.Hash().Hex() {
		t.Errorf("retry once mined = %+v, %v; want success naming %s", r, err, first.Hash().Hex())
	}
	// Resolved: the record is gone, and a replay is the payment already
	// settled, by that transaction.
	r, err = f.Settle(context.Background(), p, req)
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != first.Hash().Hex() {
		t.Errorf("replay after the resolved retry = %+v, %v; want %s naming %s", r, err, x402.ReasonExactEVMNonceAlreadyUsed, first.Hash().Hex())
	}
	if _, n = hc.sentNonces(); n != 1 {
		t.Errorf("one authorization was sent with %d nonces; want one", n)
	}
}

// A settlement transaction of unknown outcome is kept until its
// authorization's validBefore (no settle of it passes the checks after),
// until its outcome is known, and at most usedCacheMax of them, the
// expired going first.
func TestSentSettlementsAreKeptWhileTheyCanMatter(t *testing.T) {
	n := newNonceManager(common.Address{1})
	unknown := &x402.UnknownOutcomeError{Op: "settle", Err: errors.New("pending")}
	t0 := time.Unix(1_000_000, 0)
	sent := func(i int, validBefore int64) (usedKey, *sentSettlement) {
		k := usedKey{nonce: [32]byte{byte(i), byte(i >> 8)}}
		tx := types.NewTx(&types.DynamicFeeTx{Nonce: uint64(i)})
		return k, newSentSettlement(tx, t0, big.NewInt(validBefore))
	}
	k, s := sent(0, t0.Unix()+60)
	n.noteSent(k, s, unknown, t0)
	if _, ok := n.sentOf(k, t0.Add(59*time.Second)); !ok {
		t.Error("a sent settlement whose authorization is valid is not kept")
	}
	if _, ok := n.sentOf(k, t0.Add(60*time.Second)); ok {
		t.Error("a sent settlement is kept past its authorization's validBefore")
	}
	n.noteSent(k, s, unknown, t0)
	_, other := sent(1, t0.Unix()+60)
	n.noteSent(k, other, nil, t0) // another transaction's outcome: not this one's
	if _, ok := n.sentOf(k, t0); !ok {
		t.Error("another transaction's known outcome dropped the record")
	}
	n.noteSent(k, s, nil, t0)
	if _, ok := n.sentOf(k, t0); ok {
		t.Error("a sent settlement whose outcome is known is still kept")
	}

	expired, s := sent(1, t0.Unix()-1)
	n.noteSent(expired, s, unknown, t0)
	for i := 2; i < usedCacheMax+1; i++ {
		k, s := sent(i, t0.Unix()+60)
		n.noteSent(k, s, unknown, t0)
	}
	if len(n.sent) != usedCacheMax {
		t.Fatalf("kept %d, want %d", len(n.sent), usedCacheMax)
	}
	k, s = sent(usedCacheMax+1, t0.Unix()+60)
	n.noteSent(k, s, unknown, t0)
	if _, ok := n.sent[expired]; ok || len(n.sent) != usedCacheMax {
		t.Errorf("kept %d (the expired one: %v), want %d without the expired one", len(n.sent), ok, usedCacheMax)
	}
}
