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

// README: a /settle retried after an unknown outcome sends nothing more,
// whichever facilitator of the key sent the transaction. A caller told
// the outcome is unknown while the settle that sent it still waits for
// its receipt (a joined settle whose deadline ended; an HTTP client of
// x402_facilitator whose own timeout is shorter than receipt_timeout)
// retries through another facilitator of the key, which resolves that
// transaction and sends nothing of its own. (Before: the transaction was
// kept only once the settle that sent it returned, so the retry found
// nothing kept and sent the authorization a second time, which reverted at
// the relayer's gas once the first landed.)
func TestRetryAfterJoinedUnknownOutcomeSendsNoSecondTransaction(t *testing.T) {
	e := newEnv(t)
	hc := &fakeHeldSends{Chain: e.d.Client()}
	f, f2 := twinFacilitators(t, hc)
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	leader := settleAsync(context.Background(), f, p, req)
	for deadline := time.Now().Add(5 * time.Second); ; {
		hc.mu.Lock()
		n := len(hc.sends)
		hc.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first settle never sent")
		}
		time.Sleep(10 * time.Millisecond)
	}
	jctx, jcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer jcancel()
	var ue *x402.UnknownOutcomeError
	if _, err := f.Settle(jctx, p, req); !errors.As(err, &ue) {
		t.Fatalf("joined settle with a short deadline: %v; want an unknown outcome", err)
	}
	// Told "unknown", the caller retries, through another facilitator of
	// the key.
	if r, err := f2.Settle(context.Background(), p, req); !errors.As(err, &ue) {
		t.Errorf("retry through another facilitator while the transaction is pending = %+v, %v; want an unknown outcome", r, err)
	}
	if _, n := hc.sentNonces(); n != 1 {
		t.Errorf("one authorization's sends used %d nonces after a retry of an unknown outcome; want 1 (the retry sends nothing more)", n)
	}
	if err := hc.release(context.Background()); err != nil {
		t.Fatal(err)
	}
	o := <-leader
	first, _ := hc.sentNonces()
	if o.err != nil || !o.r.Success || o.r.Transaction != first.Hash().Hex() {
		t.Errorf("the settle that sent = %+v, %v; want success naming %s", o.r, o.err, first.Hash().Hex())
	}
}

// README: up to 4,096 transactions of unknown outcome are kept; past that
// the oldest go first. (Before: past the cap, whichever entry map
// iteration returned first was dropped, often a recent one whose retry is
// the likeliest to come, while the oldest stayed.)
func TestSentRecordDropsTheOldestPastItsCap(t *testing.T) {
	n := newNonceManager(common.Address{1})
	unknown := &x402.UnknownOutcomeError{Op: "settle", Err: errors.New("pending")}
	t0 := time.Unix(1_000_000, 0)
	key := func(i int) usedKey { return usedKey{nonce: [32]byte{byte(i), byte(i >> 8), 1}} }
	for i := 0; i < usedCacheMax+3; i++ {
		tx := types.NewTx(&types.DynamicFeeTx{Nonce: uint64(i)})
		at := t0.Add(time.Duration(i) * time.Millisecond)
		n.noteSent(key(i), newSentSettlement(tx, at, big.NewInt(t0.Unix()+3600)), unknown, at)
		if i == 2 {
			// Known outcomes leave, wherever they are in the order.
			s1, _ := n.sentOf(key(1), at)
			n.noteSent(key(1), s1, nil, at)
		}
	}
	for i := 0; i < usedCacheMax+3; i++ {
		_, kept := n.sentOf(key(i), t0)
		if want := i >= 3; kept != want {
			t.Errorf("#%d kept = %v; want %v (the oldest two, #0 and #2, dropped; #1 known)", i, kept, want)
		}
	}
}

// The order the sent record keeps its entries in does not grow with the
// entries that left it (known outcomes): it stays within twice the cap.
func TestSentRecordOrderStaysBounded(t *testing.T) {
	n := newNonceManager(common.Address{1})
	unknown := &x402.UnknownOutcomeError{Op: "settle", Err: errors.New("pending")}
	t0 := time.Unix(1_000_000, 0)
	for i := 0; i < 5*usedCacheMax; i++ {
		k := usedKey{nonce: [32]byte{byte(i), byte(i >> 8), byte(i >> 16), 2}}
		s := newSentSettlement(types.NewTx(&types.DynamicFeeTx{Nonce: uint64(i)}), t0, big.NewInt(t0.Unix()+3600))
		n.noteSent(k, s, unknown, t0)
		n.noteSent(k, s, nil, t0)
	}
	if len(n.sent) != 0 || len(n.sentOrder) > 2*usedCacheMax {
		t.Errorf("after %d entries made and gone: %d kept, the order holds %d; want 0 and at most %d", 5*usedCacheMax, len(n.sent), len(n.sentOrder), 2*usedCacheMax)
	}
}

// twinFacilitators are two facilitators of one relayer key on chain, as two
// configurations of one gateway process are: they share the key's kept
// settlements.
func twinFacilitators(t *testing.T, chain Chain) (*Facilitator, *Facilitator) {
	t.Helper()
	cfg := Config{Chain: chain, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 6 * time.Second}
	f, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f, f2
}
