package evmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/aovhq/aov/x402"
)

// fakeLosingSends models a node that accepts a transaction (nil error) and
// then loses it: evicted from its pool (a base-fee rise, pool pressure), a
// node restart without a journal, a load balancer whose other node never
// saw it. The first `drop` sends are acknowledged and discarded (lost);
// with refuseAgain set, a lost transaction sent again is answered with it
// (a node whose price floor rose meanwhile). Every send is kept (sends).
type fakeLosingSends struct {
	Chain
	mu          sync.Mutex
	drop        int
	refuseAgain error
	lost        []*types.Transaction
	sends       []*types.Transaction
}

func (c *fakeLosingSends) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	c.sends = append(c.sends, tx)
	if c.refuseAgain != nil && slices.ContainsFunc(c.lost, func(l *types.Transaction) bool { return l.Hash() == tx.Hash() }) {
		c.mu.Unlock()
		return c.refuseAgain
	}
	d := c.drop > 0
	if d {
		c.drop--
		c.lost = append(c.lost, tx)
	}
	c.mu.Unlock()
	if d {
		return nil
	}
	return c.Chain.SendTransaction(ctx, tx)
}

// waitMined waits for h's receipt on the devnet.
func waitMined(t *testing.T, e *testEnv, h common.Hash) *types.Receipt {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for {
		if r, err := e.d.Client().TransactionReceipt(ctx, h); err == nil {
			return r
		}
		if ctx.Err() != nil {
			t.Fatalf("transaction %s never mined", h.Hex())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A settlement transaction the node acknowledged and then lost is sent
// again, the same signed transaction, once its receipt wait ends: it fills
// the relayer's nonce, so the payment settles and later settlements are not
// queued behind a gap. (Before: the nonce manager stayed one ahead of the
// chain for good; every later settlement of the relayer, through any
// facilitator of the key, sat in the node's queue and ended unknown until
// the process restarted.)
func TestLostSendIsSentAgainAndDoesNotWedgeTheRelayer(t *testing.T) {
	e := newEnv(t)
	vc := &fakeLosingSends{Chain: e.d.Client(), drop: 1}
	f, err := New(Config{Chain: vc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	_, err = f.Settle(context.Background(), mustSignExact(t, payer, req), req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("settle whose transaction the node lost: %v; want an unknown outcome", err)
	}
	vc.mu.Lock()
	lost := vc.lost[0]
	sends := append([]*types.Transaction(nil), vc.sends...)
	vc.mu.Unlock()
	if len(sends) != 2 || sends[1].Hash() != lost.Hash() {
		t.Fatalf("sends after the lost one's wait = %d, want the lost transaction sent once more as is", len(sends))
	}
	if r := waitMined(t, e, lost.Hash()); r.Status != types.ReceiptStatusSuccessful {
		t.Errorf("the transaction sent again reverted")
	}
	for i := 0; i < 2; i++ {
		r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
		if err != nil || !r.Success {
			t.Errorf("settle #%d after a lost transaction = %+v, %v; want success", i+2, r, err)
		}
	}
	// A facilitator made later (a config reload) shares the relayer's
	// nonces: nothing is wedged there either.
	f2, err := New(Config{Chain: e.d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := f2.Settle(context.Background(), mustSignExact(t, payer, req), req); err != nil || !r.Success {
		t.Errorf("settle through a new facilitator (as after a reload) = %+v, %v; want success", r, err)
	}
}

// A lost settlement transaction that can no longer execute (its
// authorization expired before it was found missing) is not sent again: the
// settle fails, nothing transferred, and the relayer's next transaction
// takes its nonce, which the chain never used. (Before: the nonce manager
// stayed past it, and every later settlement waited behind the gap.)
func TestLostSendPastValidBeforeGivesItsNonceBack(t *testing.T) {
	e := newEnv(t)
	vc := &fakeLosingSends{Chain: e.d.Client(), drop: 1}
	f, err := New(Config{Chain: vc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	head, err := e.d.Client().HeaderByNumber(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	a := auth(payer, req)
	a.ValidBefore = fmt.Sprint(max(time.Now().Unix(), int64(head.Time)) + 8)
	r, err := f.Settle(context.Background(), sign(t, payer, a, req, req), req)
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMTransactionFailed {
		t.Fatalf("settle whose transaction was lost and whose authorization then expired = %+v, %v; want %s", r, err, x402.ReasonExactEVMTransactionFailed)
	}
	vc.mu.Lock()
	lost := vc.lost[0]
	n := len(vc.sends)
	vc.mu.Unlock()
	if n != 1 {
		t.Errorf("the expired authorization's transaction was sent %d times; want once (it can only revert now)", n)
	}
	r, err = f.Settle(context.Background(), mustSignExact(t, payer, req), req)
	if err != nil || !r.Success {
		t.Fatalf("next settle = %+v, %v; want success", r, err)
	}
	tx, _, err := e.d.Client().TransactionByHash(context.Background(), common.HexToHash(r.Transaction))
	if err != nil {
		t.Fatal(err)
	}
	if tx.Nonce() != lost.Nonce() {
		t.Errorf("next settlement's nonce = %d, want the lost one's %d", tx.Nonce(), lost.Nonce())
	}
}

// A lost settlement transaction that the node refuses when it is sent
// again can never fill its nonce: the relayer's next transaction takes
// that nonce from the chain, and a retry of the lost settlement then finds
// it can no longer execute, a failure with nothing transferred. (Before:
// the nonce manager stayed past it, and every later settlement waited
// behind the gap.)
func TestLostSendRefusedAgainGivesItsNonceBack(t *testing.T) {
	e := newEnv(t)
	vc := &fakeLosingSends{Chain: e.d.Client(), drop: 1, refuseAgain: nodeError{code: -32000, msg: "transaction underpriced"}}
	f, err := New(Config{Chain: vc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	lostPay := mustSignExact(t, payer, req)
	_, err = f.Settle(context.Background(), lostPay, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("settle whose transaction was lost and refused again: %v; want an unknown outcome", err)
	}
	vc.mu.Lock()
	lost := vc.lost[0]
	vc.mu.Unlock()
	r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
	if err != nil || !r.Success {
		t.Fatalf("next settle = %+v, %v; want success", r, err)
	}
	tx, _, err := e.d.Client().TransactionByHash(context.Background(), common.HexToHash(r.Transaction))
	if err != nil {
		t.Fatal(err)
	}
	if tx.Nonce() != lost.Nonce() {
		t.Errorf("next settlement's nonce = %d, want the lost one's %d", tx.Nonce(), lost.Nonce())
	}
	vc.mu.Lock()
	sends := slices.Clone(vc.sends)
	vc.mu.Unlock()
	// The lost one, its refused second send, the next settlement; the
	// look-after may have sent the lost one again (refused too) once it
	// had waited its wait, before the next settlement took its nonce.
	others := slices.DeleteFunc(slices.Clone(sends), func(tx *types.Transaction) bool { return tx.Hash() == lost.Hash() })
	if len(sends) < 3 || sends[1].Hash() != lost.Hash() || len(others) != 1 || others[0].Hash() != tx.Hash() {
		t.Errorf("%d sends, %d of them not the lost transaction; want the lost one, its refused second send, and the next settlement", len(sends), len(others))
	}
	r, err = f.Settle(context.Background(), lostPay, req)
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMTransactionFailed {
		t.Errorf("retry of the lost settlement = %+v, %v; want %s", r, err, x402.ReasonExactEVMTransactionFailed)
	}
	vc.mu.Lock()
	n := len(vc.sends)
	vc.mu.Unlock()
	if n != len(sends) {
		t.Errorf("%d sends after the retry, %d before: the retry sends nothing", n, len(sends))
	}
}

// A lost settlement transaction sent again has been pending since it was
// sent again, not since the send the node lost: a retry that finds it
// pending at once does not replace it at a higher fee, and it is the one
// mined. (Before: its wait was counted from the lost send, so the retry,
// or the relayer's look-after, replaced it at once, a fee bump of a
// transaction pending for a few milliseconds, and the transaction sent
// again was never mined.)
func TestLostSendSentAgainIsNotReplacedAtOnce(t *testing.T) {
	d := startDevnet(t, DevnetConfig{MaxClockLead: time.Second})
	e := &testEnv{d: d}
	vc := &fakeLosingSends{Chain: d.Client(), drop: 1}
	const wait = 4 * time.Second
	f, err := New(Config{Chain: vc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: wait})
	if err != nil {
		t.Fatal(err)
	}
	// The chain's head 7 s ahead of the wall clock: the devnet seals
	// nothing for about 6 s, so the lost transaction, sent again once the
	// settle's 4 s receipt wait ends, stays pending through the retry, and
	// is mined well before it has been pending for its wait.
	head, err := d.Client().HeaderByNumber(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.backend.AdjustTime(time.Duration(time.Now().Add(7*time.Second).Unix()-int64(head.Time)) * time.Second); err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	lostPay := mustSignExact(t, payer, req)
	var ue *x402.UnknownOutcomeError
	if _, err := f.Settle(context.Background(), lostPay, req); !errors.As(err, &ue) {
		t.Fatalf("settle whose transaction the node lost: %v; want an unknown outcome", err)
	}
	vc.mu.Lock()
	lost := vc.lost[0]
	n := len(vc.sends)
	vc.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d sends, want 2: the lost transaction and its second send", n)
	}
	if _, pending, err := d.Client().TransactionByHash(context.Background(), lost.Hash()); err != nil || !pending {
		t.Fatalf("the lost transaction, sent again, is not pending (%v, %v): the chain sealed it before the retry", pending, err)
	}
	if _, err := f.Settle(context.Background(), lostPay, req); !errors.As(err, &ue) {
		t.Errorf("retry while the transaction sent again is pending = %v; want an unknown outcome", err)
	}
	vc.mu.Lock()
	n = len(vc.sends)
	vc.mu.Unlock()
	if n != 2 {
		t.Errorf("%d sends, want 2: the retry replaced a transaction pending for less than its wait (%s)", n, wait)
	}
	if r := waitMined(t, e, lost.Hash()); r.Status != types.ReceiptStatusSuccessful {
		t.Fatal("the lost transaction, sent again, reverted")
	}
	if r, err := f.Settle(context.Background(), lostPay, req); err != nil || !r.Success || r.Transaction != lost.Hash().Hex() {
		t.Errorf("retry once the lost transaction is mined = %+v, %v; want success naming %s", r, err, lost.Hash().Hex())
	}
}
