package evmfacilitator

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

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

// fakeWithholdingSends takes every transaction sent and answers
// "connection reset by peer" without forwarding it: a node that took it
// into a pool the facilitator cannot see (another node behind a load
// balancer), from which it lands later (release).
type fakeWithholdingSends struct {
	Chain
	mu   sync.Mutex
	held []*types.Transaction
}

func (c *fakeWithholdingSends) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	c.held = append(c.held, tx)
	c.mu.Unlock()
	return errors.New("connection reset by peer")
}

func (c *fakeWithholdingSends) sent() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.held)
}

// release lands the first transaction withheld (its resends are the same
// signed transaction).
func (c *fakeWithholdingSends) release(t *testing.T) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.held) == 0 {
		t.Fatal("nothing was sent")
	}
	if err := c.Chain.SendTransaction(context.Background(), c.held[0]); err != nil {
		t.Fatalf("landing the withheld settlement: %v", err)
	}
}

// keptRetryNearExpiry settles a payment valid for 12 s whose send is
// answered "connection reset" (an unknown outcome, the settlement kept),
// runs retry, then lands the withheld transaction, and returns the
// retry's answer once the payer was charged.
func keptRetryNearExpiry(t *testing.T, retry func(f *Facilitator, pay x402.PaymentPayload, req x402.PaymentRequirements, validBefore time.Time) (x402.SettleResponse, error)) (x402.SettleResponse, error) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	wc := &fakeWithholdingSends{Chain: d.Client()}
	f := relayerOn(t, wc, 0, 300*time.Millisecond)
	req, pay, validBefore := e.expiringPayment(t, 12)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, d, from)
	if _, err := f.Settle(context.Background(), pay, req); !errors.As(err, new(*x402.UnknownOutcomeError)) {
		t.Fatalf("first settle = %v; want an unknown outcome", err)
	}
	resp, rerr := retry(f, pay, req, validBefore)
	wc.release(t)
	after := usdcBalance(t, d, from)
	for deadline := time.Now().Add(3 * time.Second); after.Cmp(before) >= 0 && time.Now().Before(deadline); after = usdcBalance(t, d, from) {
		time.Sleep(50 * time.Millisecond)
	}
	if after.Cmp(before) >= 0 {
		t.Fatalf("payer balance %s -> %s: the withheld settlement did not land", before, after)
	}
	return resp, rerr
}

// The validBefore margin is time for a transaction sent now to be mined;
// a retry of a settlement already sent and kept sends nothing new, and is
// answered from what is kept (unknown while it is pending) until the chain
// can no longer include it. (Before: in the last 6 s before validBefore
// the retry was refused as valid_before, "nothing charged", and its
// transaction then landed.) A fresh authorization as close to validBefore
// is still refused, nothing sent.
func TestKeptRetryInTheMarginBeforeValidBeforeIsAnsweredFromWhatIsKept(t *testing.T) {
	var fresh x402.SettleResponse
	var freshErr error
	resp, err := keptRetryNearExpiry(t, func(f *Facilitator, pay x402.PaymentPayload, req x402.PaymentRequirements, validBefore time.Time) (x402.SettleResponse, error) {
		time.Sleep(time.Until(validBefore.Add(-4 * time.Second)))
		resp, err := f.Settle(context.Background(), pay, req)
		sends := f.chain.(*fakeWithholdingSends).sent()
		short := req
		short.MaxTimeoutSeconds = 4 // validBefore 4 s away, as the kept one's
		fresh, freshErr = f.Settle(context.Background(), mustSignExact(t, payer, short), short)
		if got := f.chain.(*fakeWithholdingSends).sent(); got != sends {
			t.Errorf("a fresh authorization 4 s before its validBefore sent %d transactions; want none", got-sends)
		}
		return resp, err
	})
	if !errors.As(err, new(*x402.UnknownOutcomeError)) {
		t.Errorf("retry of a kept, pending settlement 4 s before validBefore = %+v, %v; want an unknown outcome", resp, err)
	}
	if freshErr != nil || fresh.Success || fresh.ErrorReason != x402.ReasonExactEVMValidBefore {
		t.Errorf("a fresh authorization 4 s before its validBefore = %+v, %v; want refused as %s", fresh, freshErr, x402.ReasonExactEVMValidBefore)
	}
}

// Verify of a payment whose settlement is kept and still pending, in the
// last 6 s before validBefore, answers as the retry of its settle does,
// the outcome unknown: settlement_pending, never valid_before, which tells
// a resource server that verifies before it settles to ask its buyer for
// a new payment while the first transaction can still land (and here
// does). Verify of another authorization of the kept nonce is
// nonce_already_used, as its settle is; of a fresh authorization as close
// to validBefore, still valid_before. (Before: valid_before for the kept
// payment and the other authorization alike.)
func TestVerifyOfAKeptPendingSettlementInTheMarginIsSettlementPending(t *testing.T) {
	ctx := context.Background()
	var kept, other, fresh x402.VerifyResponse
	var keptErr, otherErr, freshErr error
	resp, err := keptRetryNearExpiry(t, func(f *Facilitator, pay x402.PaymentPayload, req x402.PaymentRequirements, validBefore time.Time) (x402.SettleResponse, error) {
		time.Sleep(time.Until(validBefore.Add(-4 * time.Second)))
		kept, keptErr = f.Verify(ctx, pay, req)
		pl, err := x402.ParseExactEVMPayload(pay.Payload)
		if err != nil {
			t.Fatal(err)
		}
		a := pl.Authorization // the same nonce and validBefore, another validAfter
		va, _ := new(big.Int).SetString(a.ValidAfter, 10)
		a.ValidAfter = va.Sub(va, big.NewInt(1)).String()
		other, otherErr = f.Verify(ctx, sign(t, payer, a, req, req), req)
		short := req
		short.MaxTimeoutSeconds = 4 // validBefore 4 s away, as the kept one's
		fresh, freshErr = f.Verify(ctx, mustSignExact(t, payer, short), short)
		return f.Settle(ctx, pay, req)
	})
	if !errors.As(err, new(*x402.UnknownOutcomeError)) {
		t.Errorf("retry of the kept, pending settlement 4 s before validBefore = %+v, %v; want an unknown outcome", resp, err)
	}
	if keptErr != nil || kept.IsValid || kept.InvalidReason != x402.ReasonSettlementPending {
		t.Errorf("Verify of the kept, pending settlement 4 s before validBefore = %+v, %v; want %s (its transaction may still land: a new payment would charge twice)", kept, keptErr, x402.ReasonSettlementPending)
	}
	if otherErr != nil || other.IsValid || other.InvalidReason != x402.ReasonExactEVMNonceAlreadyUsed {
		t.Errorf("Verify of another authorization of the kept nonce = %+v, %v; want %s", other, otherErr, x402.ReasonExactEVMNonceAlreadyUsed)
	}
	if freshErr != nil || fresh.IsValid || fresh.InvalidReason != x402.ReasonExactEVMValidBefore {
		t.Errorf("Verify of a fresh authorization 4 s before its validBefore = %+v, %v; want %s", fresh, freshErr, x402.ReasonExactEVMValidBefore)
	}
}

// A kept settlement is judged by the chain's time, not the wall clock: a
// chain whose block time lags may still include it after validBefore by
// the wall clock, and its retry is answered unknown until the chain's
// time passes validBefore. (Before: refused as valid_before once the wall
// clock passed it, and then charged.)
func TestKeptRetryPastValidBeforeByTheWallClockIsJudgedByTheChainsTime(t *testing.T) {
	resp, err := keptRetryNearExpiry(t, func(f *Facilitator, pay x402.PaymentPayload, req x402.PaymentRequirements, validBefore time.Time) (x402.SettleResponse, error) {
		// The facilitator's clock 15 s past the chain's: past validBefore.
		now = func() time.Time { return time.Now().Add(15 * time.Second) }
		defer func() { now = time.Now }()
		if !now().After(validBefore) {
			t.Fatal("setup: the wall clock is not past validBefore")
		}
		return f.Settle(context.Background(), pay, req)
	})
	if !errors.As(err, new(*x402.UnknownOutcomeError)) {
		t.Errorf("retry of a kept settlement the chain may still include, past validBefore by the wall clock only = %+v, %v; want an unknown outcome", resp, err)
	}
}

// The validBefore margin refuses sending something new, nothing else: a
// retry of a settlement that landed (its success answer lost), once no
// longer kept, is answered from the chain's nonce state in the last 6 s
// before validBefore and past it as before it, nonce_already_used naming
// the transaction, and Verify says the nonce is used. (Before: in the
// margin and past validBefore it was refused as valid_before, which tells
// the buyer to sign a new payment, although the payer was charged.) A
// fresh authorization as close to or past its validBefore is still
// refused as valid_before, and nothing is charged.
func TestRetryOfALandedSettlementNearOrPastValidBeforeIsNonceAlreadyUsed(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	f := relayerOn(t, d.Client(), 0, 0)
	req, pay, validBefore := e.expiringPayment(t, 12)
	first, err := f.Settle(context.Background(), pay, req)
	if err != nil || !first.Success {
		t.Fatalf("first settle = %+v, %v; want success", first, err)
	}
	from := crypto.PubkeyToAddress(payer.PublicKey)
	retry := func(when string) {
		t.Helper()
		resp, err := f.Settle(context.Background(), pay, req)
		if err != nil || resp.Success || resp.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || resp.Transaction != first.Transaction {
			t.Errorf("retry of the payment settled in %s, %s = %+v, %v; want %s naming it", first.Transaction, when, resp, err, x402.ReasonExactEVMNonceAlreadyUsed)
		}
		v, err := f.Verify(context.Background(), pay, req)
		if err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMNonceAlreadyUsed {
			t.Errorf("Verify of the settled payment, %s = %+v, %v; want %s", when, v, err, x402.ReasonExactEVMNonceAlreadyUsed)
		}
	}
	fresh := func(when string, validFor int64) {
		t.Helper()
		a := auth(payer, req)
		a.ValidBefore = fmt.Sprint(time.Now().Unix() + validFor)
		before := usdcBalance(t, d, from)
		resp, err := f.Settle(context.Background(), sign(t, payer, a, req, req), req)
		if err != nil || resp.Success || resp.ErrorReason != x402.ReasonExactEVMValidBefore || resp.Transaction != "" {
			t.Errorf("a fresh authorization %s = %+v, %v; want refused as %s", when, resp, err, x402.ReasonExactEVMValidBefore)
		}
		if after := usdcBalance(t, d, from); after.Cmp(before) != 0 {
			t.Errorf("a fresh authorization %s: payer balance %s -> %s; want nothing charged", when, before, after)
		}
	}
	retry("12 s before validBefore")
	time.Sleep(time.Until(validBefore.Add(-4 * time.Second)))
	retry("4 s before validBefore")
	fresh("4 s before its validBefore", 4)
	time.Sleep(time.Until(validBefore.Add(time.Second)))
	retry("past validBefore")
	fresh("past its validBefore", -1)
}

// nonceReads is the devnet's client counting its authorizationState reads,
// and failing them while fail is set (an overloaded provider).
type nonceReads struct {
	Chain
	reads atomic.Int32
	fail  atomic.Bool
}

func (c *nonceReads) CallContract(ctx context.Context, m ethereum.CallMsg, b *big.Int) ([]byte, error) {
	if bytes.HasPrefix(m.Data, tokenABI.Methods["authorizationState"].ID) {
		c.reads.Add(1)
		if c.fail.Load() {
			return nil, errors.New("503 Service Unavailable")
		}
	}
	return c.Chain.CallContract(ctx, m, b)
}

// The nonce state of a payment that misses validBefore is read only for
// it: a fresh settle reads authorizationState once, as before. A payment
// in the margin whose nonce cannot be read is an error (retryable) from
// Settle and Verify, never valid_before, since it may be one the chain
// already took.
func TestNonceStateBeforeTheMarginRefusalIsReadOnlyForItAndFailsClosed(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	nr := &nonceReads{Chain: d.Client()}
	f := relayerOn(t, nr, 0, 0)
	req, pay, validBefore := e.expiringPayment(t, 8)
	if r, err := f.Settle(context.Background(), pay, req); err != nil || !r.Success {
		t.Fatalf("settle = %+v, %v; want success", r, err)
	}
	if n := nr.reads.Load(); n != 1 {
		t.Errorf("a fresh settle read authorizationState %d times; want once", n)
	}
	time.Sleep(time.Until(validBefore.Add(-4 * time.Second)))
	nr.fail.Store(true)
	if r, err := f.Settle(context.Background(), pay, req); err == nil {
		t.Errorf("retry of a settled payment 4 s before validBefore, its nonce unreadable = %+v; want an error", r)
	}
	if v, err := f.Verify(context.Background(), pay, req); err == nil {
		t.Errorf("Verify of a settled payment 4 s before validBefore, its nonce unreadable = %+v; want an error", v)
	}
}

// A settlement kept after an unknown outcome answers only the
// authorization it was sent for (its EIP-712 digest), not every one of
// its token, payer and nonce: another authorization of the nonce (the
// same payer, payTo and value, another validBefore) is
// nonce_already_used naming no transaction and sends nothing, while the
// kept one is pending and once it landed, and the kept authorization's
// own retry is then the one success. (Before: an authorization that had
// expired one second before the kept one's block, so it never executed,
// was answered success naming that transaction, and the kept one's own
// retry nonce_already_used: one transfer answered two payments.)
func TestKeptSettlementAnswersOnlyItsOwnAuthorization(t *testing.T) {
	e := newEnv(t)
	hc := &fakeHeldSends{Chain: e.d.Client()}
	f, err := New(Config{Chain: hc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	req := e.requirements(payee, amount)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	b := auth(payer, req)
	pb := sign(t, payer, b, req, req)
	var ue *x402.UnknownOutcomeError
	if r, err := f.Settle(context.Background(), pb, req); !errors.As(err, &ue) {
		t.Fatalf("settle of B = %+v, %v; want an unknown outcome", r, err)
	}
	refused := func(what string, a x402.Authorization) {
		t.Helper()
		r, err := f.Settle(context.Background(), sign(t, payer, a, req, req), req)
		if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != "" {
			t.Errorf("settle of %s = %+v, %v; want %s naming no transaction", what, r, err, x402.ReasonExactEVMNonceAlreadyUsed)
		}
	}
	later := b
	vb, _ := new(big.Int).SetString(b.ValidBefore, 10)
	later.ValidBefore = vb.Add(vb, big.NewInt(1)).String()
	refused("another authorization of B's nonce while B is pending", later)
	first, n := hc.sentNonces()
	if n != 1 {
		t.Fatalf("the relayer sent with %d nonces; want B's alone", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := hc.release(ctx); err != nil {
		t.Fatal(err)
	}
	rcpt := waitMined(t, e, first.Hash())
	h, err := e.d.Client().HeaderByNumber(ctx, rcpt.BlockNumber)
	if err != nil {
		t.Fatal(err)
	}
	expired := b
	expired.ValidBefore = fmt.Sprint(h.Time - 1)
	refused("an authorization of B's nonce that expired before B's block", expired)
	r, err := f.Settle(context.Background(), pb, req)
	if err != nil || !r.Success || r.Transaction != first.Hash().Hex() {
		t.Errorf("retry of B once mined = %+v, %v; want success naming %s", r, err, first.Hash().Hex())
	}
	if spent := new(big.Int).Sub(before, usdcBalance(t, e.d, from)); spent.String() != amount {
		t.Errorf("payer charged %s; want %s, once", spent, amount)
	}
}

// expiredBeforeAnother settles an authorization B through f and returns
// it, f's answer, and A: B's nonce signed to expire a second before B's
// block, so that A never executed though another used its nonce.
func expiredBeforeAnother(t *testing.T, d *Devnet, f *Facilitator, req x402.PaymentRequirements) (b x402.Authorization, rb x402.SettleResponse, pa x402.PaymentPayload) {
	t.Helper()
	b = auth(payer, req)
	rb, err := f.Settle(context.Background(), sign(t, payer, b, req, req), req)
	if err != nil || !rb.Success {
		t.Fatalf("settle of B = %+v, %v", rb, err)
	}
	rcpt, err := d.Client().TransactionReceipt(context.Background(), common.HexToHash(rb.Transaction))
	if err != nil {
		t.Fatal(err)
	}
	h, err := d.Client().HeaderByNumber(context.Background(), rcpt.BlockNumber)
	if err != nil {
		t.Fatal(err)
	}
	a := b
	a.ValidBefore = fmt.Sprint(h.Time - 1) // A expired before B's block: A never executed
	return b, rb, sign(t, payer, a, req, req)
}

// An authorization whose nonce another authorization used in a block
// past its validBefore never executed: its settle is nonce_already_used
// naming no transaction, through the facilitator that settled the other
// and through one that keeps nothing of it, as a status check judges it
// (nonceUse.within). (Before: both named the other's transaction, which
// tells the caller this payment was already settled by it.)
func TestExpiredAuthorizationIsNotNamedAnotherAuthorizationsTransaction(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	f := relayerOn(t, d.Client(), 0, 0)
	req := e.requirements(payee, amount)
	b, rb, pa := expiredBeforeAnother(t, d, f, req)
	for _, c := range []struct {
		who string
		f   *Facilitator
	}{{"the facilitator that settled B", f}, {"another relayer's facilitator", relayerOn(t, d.Client(), 1, 0)}} {
		r, err := c.f.Settle(context.Background(), pa, req)
		if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != "" {
			t.Errorf("%s: settle of A, expired before B's block = %+v, %v; want %s naming no transaction (B's %s is not A's)", c.who, r, err, x402.ReasonExactEVMNonceAlreadyUsed, rb.Transaction)
		}
	}
	// B's own retry still names its transaction.
	if r, err := f.Settle(context.Background(), sign(t, payer, b, req, req), req); err != nil || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != rb.Transaction {
		t.Errorf("retry of B = %+v, %v; want %s naming %s", r, err, x402.ReasonExactEVMNonceAlreadyUsed, rb.Transaction)
	}
}
