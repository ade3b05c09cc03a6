package evmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/aovhq/aov/x402"
)

// gateDeadline is spikeBeforeSend whose settle caller's deadline (the
// gate's settle deadline) ends shortly after the first send reached the
// node, as when the spike-time send took most of it.
type gateDeadline struct {
	*spikeBeforeSend
	cancel context.CancelFunc
}

func (c *gateDeadline) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	err := c.spikeBeforeSend.SendTransaction(context.WithoutCancel(ctx), tx)
	time.AfterFunc(500*time.Millisecond, c.cancel)
	return err
}

// An ordinary account's settlement stuck by a fee spike and answered
// unknown before its wait ended, whose authorization then expires, is
// cancelled by the relayer on its own (README: "the relayer looks after its
// own stuck transactions"): nobody retries /settle (a retry is refused by
// the wall-clock validBefore check before it reaches the kept settlement),
// and there is no follow-up for an account without code. (Before: nothing
// ever replaced or cancelled it, the relayer's nonce stayed taken and every
// later settlement queued behind it.)
func TestExpiredStuckSettlementIsCancelledWithoutARetry(t *testing.T) {
	st := settleIntoSpike(t, 3*time.Second)
	st.waitNonceFreed(t, st.f)
}

// stuckSettlement is a settlement of f's relayer stuck by a fee spike and
// answered unknown (settleIntoSpike).
type stuckSettlement struct {
	ctx         context.Context // the spike's: it holds until the test ends
	d           *Devnet
	f           *Facilitator
	first       *types.Transaction // the settlement's first transaction
	validBefore uint64
}

// settleIntoSpike makes a facilitator of a fresh devnet's relayer, with
// receiptTimeout, whose first send a base-fee spike leaves pending and
// whose settle caller's deadline ends soon after, and settles one payment
// valid for 12 s through it: the settle answers unknown.
func settleIntoSpike(t *testing.T, receiptTimeout time.Duration) *stuckSettlement {
	t.Helper()
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	sp := startSpike(t, d, d.Client(), receiptTimeout)
	req := e.requirements(payee, amount)
	req.MaxTimeoutSeconds = 12
	p := mustSignExact(t, payer, req)
	validBefore := sp.f.checkOwn(sp.ctx, p, req).auth.ValidBefore.Uint64()
	_, err := sp.f.Settle(sp.sctx, p, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("settle sent before the spike: %v; want an unknown outcome", err)
	}
	t.Logf("first settle: %v", err)
	return &stuckSettlement{ctx: sp.ctx, d: d, f: sp.f, first: sp.sc.all()[0], validBefore: validBefore}
}

// spike is a facilitator of a devnet's relayer whose first send a
// base-fee spike leaves pending, and whose settle caller's deadline (the
// gate's) ends soon after that send reached the node.
type spike struct {
	f    *Facilitator
	sc   *gateDeadline
	ctx  context.Context    // the spike's: it holds until stop, or the test's end
	stop context.CancelFunc // ends the spike
	sctx context.Context    // the settle caller's: pass it to Settle
}

// startSpike starts a spike on d over chain (d's client, or a fake in
// front of it), with receiptTimeout.
func startSpike(t *testing.T, d *Devnet, chain Chain, receiptTimeout time.Duration) *spike {
	t.Helper()
	sp := &spike{}
	sp.ctx, sp.stop = context.WithCancel(context.Background())
	t.Cleanup(sp.stop)
	var scancel context.CancelFunc
	sp.sctx, scancel = context.WithCancel(context.Background())
	t.Cleanup(scancel)
	sp.sc = &gateDeadline{spikeBeforeSend: &spikeBeforeSend{Chain: chain, g: &congestion{t: t, d: d}, ctx: sp.ctx}, cancel: scancel}
	var err error
	sp.f, err = New(Config{Chain: sp.sc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: receiptTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// waitNonceFreed waits until the settlement's authorization has expired,
// by wall clock and by chain time, then for by's look-after to free the
// relayer's nonce it took (replaced or cancelled, within 20 s) and to end
// with no outcome left to learn (within 15 s).
func (st *stuckSettlement) waitNonceFreed(t *testing.T, by *Facilitator) {
	t.Helper()
	for {
		h, err := st.d.Client().HeaderByNumber(st.ctx, nil)
		if err == nil && h.Time > st.validBefore+1 && uint64(time.Now().Unix()) > st.validBefore+1 {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, nerr := st.d.Client().NonceAt(st.ctx, by.relayer, nil)
		if nerr == nil && n > st.first.Nonce() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("20 s after validBefore the relayer's nonce %d is still taken by the stuck settlement %s; want it replaced or cancelled", st.first.Nonce(), st.first.Hash().Hex())
		}
	}
	for deadline := time.Now().Add(15 * time.Second); watching(by.nonces); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the relayer's look-after still runs with no outcome left to learn")
		}
	}
}

// keepUnknownSettlement keeps, as f's, a settlement transaction of a
// payment signed for e's devnet, never sent: its outcome unknown.
func keepUnknownSettlement(t *testing.T, e *testEnv, f *Facilitator) *sentSettlement {
	t.Helper()
	req := e.requirements(payee, amount)
	c := f.checkOwn(context.Background(), mustSignExact(t, payer, req), req)
	tx, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Gas: 300_000, GasFeeCap: big.NewInt(1e9), To: &c.token, Data: c.txData})
	if err != nil {
		t.Fatal(err)
	}
	s := newSentSettlement(tx, time.Now(), c.auth.ValidBefore)
	s.owner.Store(f)
	s.c = *c
	identified(t, f).keep(usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, s, time.Now())
	return s
}

// watching reports whether n's look-after runs.
func watching(n *nonceManager) bool {
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	return n.watching
}

// A facilitator closed (its configuration unloaded) ends the look-after of
// the settlements it sent at once, without waiting for its next round.
func TestCloseEndsTheLookAfter(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	f, err := newFacilitator(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), ReceiptTimeout: time.Minute}, &nonceSet{})
	if err != nil {
		t.Fatal(err)
	}
	keepUnknownSettlement(t, e, f)
	if !watching(f.nonces) {
		t.Fatal("a settlement of unknown outcome kept, and no look-after runs")
	}
	f.Close()
	// Its next round is maxBumpWait (15 s) away: 5 s leaves a loaded
	// machine room and still tells "at once" from "at the next round".
	for deadline := time.Now().Add(5 * time.Second); watching(f.nonces); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the look-after still runs 5 s after its only facilitator closed; its next round was 15 s away")
		}
	}
}

// A contract payer's settlement stuck by a spike, whose settle caller's
// deadline (the gate's) ended before the receipt wait, and whose
// replacement at a higher fee then pays: the follow-up waits for the
// replacement's outcome and counts no failure against the wallet. (Before:
// follow's resolve sent the replacement and, in the same step, judged the
// outcome still unknown and recorded a failure.)
func TestFollowCountsNoFailureForItsOwnPaidReplacement(t *testing.T) {
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	from, p, req := contractPayer(t, e, acceptAllRuntime)
	before := usdcBalance(t, d, from)
	sp := startSpike(t, d, d.Client(), 3*time.Second)
	f, sc := sp.f, sp.sc
	f.Close() // the follow-up alone, not the relayer's look-after, replaces it
	_, err := f.Settle(sp.sctx, p, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("settle stuck by the spike: %v; want an unknown outcome", err)
	}
	t.Logf("settle: %v", err)
	n := landedFailures(t, f, from)
	// Let the replacement follow sent be mined.
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if paid := new(big.Int).Sub(before, usdcBalance(t, d, from)); paid.Sign() > 0 {
			break
		}
	}
	sp.stop()
	paid := new(big.Int).Sub(before, usdcBalance(t, d, from))
	t.Logf("%d transactions sent; the wallet paid %s", len(sc.all()), paid)
	if paid.Cmp(mustBig(amount)) == 0 && n != 0 {
		t.Errorf("%d failures recorded against a wallet whose settlement paid (by follow's own replacement); want none", n)
	}
}

// The follow-up of a contract payer's settlement whose outcome is unknown
// keeps it kept in its chain's nonce set until it learns it, so it holds
// that set as the settle did, until it ends: a chain forgotten meanwhile
// is not let go of under it. (Before: the settle let go of the set as it
// answered, while its follow-up still ran.)
func TestFollowHoldsItsChainsSetUntilItEnds(t *testing.T) {
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	from, p, req := contractPayer(t, e, acceptAllRuntime)
	sp := startSpike(t, d, d.Client(), 3*time.Second)
	f := sp.f
	set := identified(t, f).set
	f.Close()
	holds := func() int {
		chainNonces.mu.Lock()
		defer chainNonces.mu.Unlock()
		return set.holds
	}
	if _, err := f.Settle(sp.sctx, p, req); !errors.As(err, new(*x402.UnknownOutcomeError)) {
		t.Fatalf("settle stuck by the spike: %v; want an unknown outcome", err)
	}
	if h := holds(); h != 1 {
		t.Errorf("while the follow-up runs, the chain's set is held %d times; want 1 (the settle's, handed to it)", h)
	}
	landedFailures(t, f, from) // the follow-up ended
	for deadline := time.Now().Add(10 * time.Second); holds() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the follow-up ended, and the chain's set is still held %d times", holds())
		}
	}
}

// After a restart (a status reader, or a facilitator with an
// empty record) the gateway's status check naming the first, replaced
// transaction finds the replacement's Transfer by the nonce's logs.
func TestStatusAfterRestartFindsTheReplacement(t *testing.T) {
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sc := &spikeBeforeSend{Chain: d.Client(), g: &congestion{t: t, d: d}, ctx: ctx}
	f, err := New(Config{Chain: sc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	after := time.Now()
	_, err = f.Settle(context.Background(), p, req)
	first := sc.all()[0]
	var r x402.SettleResponse
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var ue *x402.UnknownOutcomeError
		r, err = f.Settle(context.Background(), p, req)
		if !errors.As(err, &ue) || time.Now().After(deadline) {
			break
		}
	}
	stop()
	if err != nil || !r.Success {
		t.Fatalf("retry = %+v, %v", r, err)
	}
	st, err := statusReader(t, d.Client()).SentSettlementStatus(context.Background(), p, req, x402.SentSettlement{Transaction: first.Hash().Hex(), After: after})
	if err != nil || st.State != x402.SettlementDone || st.Transaction != r.Transaction {
		t.Errorf("status after a restart naming the replaced %s = %+v, %v; want done by %s", first.Hash().Hex(), st, err, r.Transaction)
	}
	restarted, err := newFacilitator(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0)}, &nonceSet{})
	if err != nil {
		t.Fatal(err)
	}
	st, err = restarted.SentSettlementStatus(context.Background(), p, req, x402.SentSettlement{Transaction: first.Hash().Hex(), After: after})
	if err != nil || st.State != x402.SettlementDone || st.Transaction != r.Transaction {
		t.Errorf("restarted facilitator's status = %+v, %v; want done by %s", st, err, r.Transaction)
	}
}

// lostCancel is the devnet's client, except that the first cancellation (a
// transfer of nothing from the relayer to itself) never reaches the node:
// its send times out, as a dropped connection or a stalled provider makes
// one.
type lostCancel struct {
	Chain
	relayer common.Address
	cancels atomic.Int32
}

func (c *lostCancel) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	if tx.To() != nil && *tx.To() == c.relayer && len(tx.Data()) == 0 && c.cancels.Add(1) == 1 {
		return fmt.Errorf("Post \"http://node\": %w", context.DeadlineExceeded)
	}
	return c.Chain.SendTransaction(ctx, tx)
}

// A cancellation whose send had no answer is checked at the next resolve
// and, unknown to the node, sent again, as a lost settlement transaction
// is, until the expired settlement's nonce is freed. (Before: it was
// recorded as sent and never sent again; every later resolve answered "it
// was cancelled already" and the relayer's nonce stayed taken.)
func TestUnansweredCancellationIsSentAgain(t *testing.T) {
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	g := &congestion{t: t, d: d}
	sc := &lostCancel{Chain: d.Client(), relayer: DevAccounts()[0].Address}
	f, err := New(Config{Chain: sc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	c := f.checkOwn(ctx, mustSignExact(t, payer, req), req)
	stuck, _ := sendStuckSettlement(ctx, t, d, g, f, c)
	nonce := stuck.Nonce()
	s := newSentSettlement(stuck, time.Now(), c.auth.ValidBefore)
	s.lastSent = time.Now().Add(-time.Minute)
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.auth.ValidBefore = new(big.Int).SetUint64(head.Time)
	_, err = f.resolve(c, s, errors.New("its receipt wait ended"))
	t.Logf("first resolve: %v", err)
	if s.cancel == nil {
		t.Fatalf("no cancellation sent")
	}
	time.Sleep(4 * time.Second) // the cancellation's wait
	r, err := f.resolve(c, s, errors.New("its receipt wait ended"))
	t.Logf("second resolve: %+v, %v", r, err)
	r, err = f.resolve(c, s, errors.New("its receipt wait ended"))
	t.Logf("third resolve: %+v, %v", r, err)
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := d.Client().NonceAt(ctx, f.relayer, nil)
		if err == nil && n > nonce {
			return
		}
		if time.Now().After(deadline) {
			fresh := req
			fresh.MaxTimeoutSeconds = 120
			nr, nerr := f.Settle(context.Background(), mustSignExact(t, payer, fresh), fresh)
			_, _, known := d.Client().TransactionByHash(ctx, s.cancel.Hash())
			t.Fatalf("the relayer's nonce %d is still held by the expired settlement %s; the cancellation %s recorded is unknown to the node (%v) and was never sent again (%d cancellation sends); a fresh settlement = %+v, %v; want the nonce freed", nonce, stuck.Hash().Hex(), s.cancel.Hash().Hex(), known, sc.cancels.Load(), nr, nerr)
		}
	}
}

// A cancellation itself priced out by a base fee that rose past its fee cap
// is replaced at a bumped fee by the relayer's look-after, until it is
// mined and the expired settlement's nonce is free. (Before: the
// settlement, its own transaction gone from the pool, failed as one that
// can no longer execute and nothing looked at the cancellation again; the
// relayer's nonce stayed taken.)
func TestStuckCancellationIsBumped(t *testing.T) {
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	g := &congestion{t: t, d: d}
	f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	c := f.checkOwn(ctx, mustSignExact(t, payer, req), req)
	stuck, low := sendStuckSettlement(ctx, t, d, g, f, c)
	nonce := stuck.Nonce()
	// Its cancellation, sent at fees the base fee has since risen past.
	cancel, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Nonce: nonce, GasTipCap: feeBump(stuck.GasTipCap()), GasFeeCap: feeBump(low), Gas: 21_000, To: &f.relayer})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Client().SendTransaction(ctx, cancel); err != nil {
		t.Fatal(err)
	}
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.auth.ValidBefore = new(big.Int).SetUint64(head.Time)
	s := newSentSettlement(stuck, time.Now(), c.auth.ValidBefore)
	s.cancel, s.lastSent = cancel, time.Now().Add(-time.Minute)
	s.owner.Store(f)
	s.c = *c
	identified(t, f).keep(usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, s, time.Now())
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		n, err := d.Client().NonceAt(ctx, f.relayer, nil)
		if err == nil && n > nonce {
			break
		}
		if time.Now().After(deadline) {
			_, pending, err := d.Client().TransactionByHash(ctx, cancel.Hash())
			t.Fatalf("the relayer's nonce %d is still held by the cancellation %s (pending %v, %v), priced out at a fee cap of %s; want it replaced at a bumped fee", nonce, cancel.Hash().Hex(), pending, err, cancel.GasFeeCap())
		}
	}
	s.mu.Lock()
	by := s.cancel
	s.mu.Unlock()
	if by == cancel || by.To() == nil || *by.To() != f.relayer || len(by.Data()) != 0 || by.Value().Sign() != 0 || by.GasFeeCap().Cmp(big.NewInt(maxReplacementFeeCap)) > 0 {
		t.Errorf("the cancellation kept is %s, to %v, %d bytes, value %s, fee cap %s; want a bumped transfer of nothing to the relayer within the bound", by.Hash().Hex(), by.To(), len(by.Data()), by.Value(), by.GasFeeCap())
	}
}

// failingCalls is the devnet's client whose contract calls all fail, as a
// provider's that answers everything else: every resolve of a settlement
// then stays unknown.
type failingCalls struct{ Chain }

func (failingCalls) CallContract(context.Context, ethereum.CallMsg, *big.Int) ([]byte, error) {
	return nil, errors.New("eth_call: internal error")
}

// A kept settlement whose outcome stays unknown (its chain reads fail) yet
// whose nonce the chain has used holds nothing of the relayer's: the
// look-after is done with it and ends, rather than stopping at it for good
// in front of the relayer's later settlements.
func TestLookAfterSkipsASettlementWhoseNonceIsUsed(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	f, err := New(Config{Chain: failingCalls{d.Client()}, Network: DevnetNetwork, RelayerKey: DevKey(0), ReceiptTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := d.Client().NonceAt(context.Background(), f.relayer, nil); err != nil || n == 0 {
		t.Fatalf("the relayer's nonce = %d, %v; want some used", n, err)
	}
	req := e.requirements(payee, amount)
	c := f.checkOwn(context.Background(), mustSignExact(t, payer, req), req)
	tx, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Nonce: 0, Gas: 300_000, GasFeeCap: big.NewInt(1e9), To: &c.token, Data: c.txData})
	if err != nil {
		t.Fatal(err)
	}
	s := newSentSettlement(tx, time.Now(), c.auth.ValidBefore)
	s.owner.Store(f)
	s.c, s.lastSent = *c, time.Now().Add(-time.Minute)
	n := identified(t, f)
	n.keep(usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, s, time.Now())
	for deadline := time.Now().Add(5 * time.Second); watching(n); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the look-after still runs for a settlement whose nonce the chain used")
		}
	}
	if !s.done.Load() {
		t.Error("the look-after ended without being done with the settlement")
	}
}

// A devnet started afresh is a new chain: the settlements kept of the one
// before are not the new chain's, and its facilitators never resolve (and
// send again) them. One started again from its data_dir is the chain
// before, resumed without its pending transactions: what its managers kept
// is dropped.
func TestANewDevnetDropsTheSettlementsKeptOfTheOld(t *testing.T) {
	keep := func(t *testing.T, d *Devnet) (*Facilitator, usedKey) {
		t.Helper()
		f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0)})
		if err != nil {
			t.Fatal(err)
		}
		identified(t, f)
		req := (&testEnv{d: d}).requirements(payee, amount)
		c := f.checkOwn(context.Background(), mustSignExact(t, payer, req), req)
		tx, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Gas: 300_000, GasFeeCap: big.NewInt(1e9), To: &c.token, Data: c.txData})
		if err != nil {
			t.Fatal(err)
		}
		k := usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}
		identified(t, f).keep(k, newSentSettlement(tx, time.Now(), c.auth.ValidBefore), time.Now())
		return f, k
	}
	t.Run("afresh", func(t *testing.T) {
		d := startDevnet(t, DevnetConfig{})
		_, k := keep(t, d)
		d.Close()
		g, err := startDevnet(t, DevnetConfig{}).NewFacilitator()
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := g.nonces.sentOf(k, time.Now()); ok {
			t.Error("a settlement kept of the devnet before is kept on the new one")
		}
	})
	t.Run("from its data_dir", func(t *testing.T) {
		dir := t.TempDir()
		d := startDevnet(t, DevnetConfig{DataDir: dir})
		f, k := keep(t, d)
		d.Close()
		g, err := startDevnet(t, DevnetConfig{DataDir: dir}).NewFacilitator()
		if err != nil {
			t.Fatal(err)
		}
		if g.nonces != f.nonces {
			t.Error("the devnet started again from its data_dir is taken for another chain")
		}
		if _, ok := f.nonces.sentOf(k, time.Now()); ok {
			t.Error("a settlement kept before the devnet started again from its data_dir is still kept")
		}
	})
}

// countingCalls is the devnet's client counting its contract calls.
type countingCalls struct {
	Chain
	calls atomic.Int32
}

func (c *countingCalls) CallContract(ctx context.Context, m ethereum.CallMsg, b *big.Int) ([]byte, error) {
	c.calls.Add(1)
	return c.Chain.CallContract(ctx, m, b)
}

// A settlement whose settle still runs is left to that settle's own receipt
// wait and resolve: the look-after resolves it only once the settle has
// answered, so that it never replaces a transaction while its settle waits
// for its receipt.
func TestLookAfterLeavesARunningSettleItsSettlement(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	cc := &countingCalls{Chain: d.Client()}
	f, err := New(Config{Chain: cc, Network: DevnetNetwork, RelayerKey: DevKey(0), ReceiptTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	c := f.checkOwn(context.Background(), mustSignExact(t, payer, req), req)
	tx, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Nonce: 1 << 20, Gas: 300_000, GasFeeCap: big.NewInt(1e9), To: &c.token, Data: c.txData})
	if err != nil {
		t.Fatal(err)
	}
	s := newSentSettlement(tx, time.Now(), c.auth.ValidBefore)
	s.owner.Store(f)
	s.c, s.lastSent = *c, time.Now().Add(-time.Minute)
	s.settling.Store(true)
	identified(t, f).keep(usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, s, time.Now())
	time.Sleep(300 * time.Millisecond) // six rounds
	if n := cc.calls.Load(); n != 0 {
		t.Fatalf("the look-after read the chain %d times for a settlement whose settle still runs; want none", n)
	}
	s.settling.Store(false)
	for deadline := time.Now().Add(5 * time.Second); cc.calls.Load() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the look-after never resolved the settlement once its settle answered")
		}
	}
	f.Close()
}

// fakePanickingChain is the devnet's client whose contract reads panic: a
// chain client's bug, a fault the real client cannot be made to have.
type fakePanickingChain struct{ Chain }

func (fakePanickingChain) CallContract(context.Context, ethereum.CallMsg, *big.Int) ([]byte, error) {
	panic("a chain client's bug")
}

// A panic in a round of the relayer's look-after (here a chain client's
// contract read) is recovered and logged, as follow and a settle's server
// recover theirs: the process goes on. Run in a child process, whose death
// the parent sees. (Before: the round's goroutine had no recover, and the
// whole gateway process exited.)
func TestLookAfterPanicIsRecovered(t *testing.T) {
	if os.Getenv("AOV_LOOKAFTER_PANIC_CHILD") == "1" {
		d := startDevnet(t, DevnetConfig{})
		e := &testEnv{d: d}
		f, err := New(Config{Chain: fakePanickingChain{d.Client()}, Network: DevnetNetwork, RelayerKey: DevKey(0), ReceiptTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		g, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), ReceiptTimeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		req := e.requirements(payee, amount)
		c := g.checkOwn(context.Background(), mustSignExact(t, payer, req), req)
		tx, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Nonce: 1 << 20, Gas: 300_000, GasFeeCap: big.NewInt(1e9), To: &c.token, Data: c.txData})
		if err != nil {
			t.Fatal(err)
		}
		s := newSentSettlement(tx, time.Now(), c.auth.ValidBefore)
		s.owner.Store(f)
		s.c, s.lastSent = *c, time.Now().Add(-time.Minute)
		identified(t, f).keep(usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, s, time.Now())
		time.Sleep(2 * time.Second)
		g.Close()
		f.Close()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLookAfterPanicIsRecovered$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AOV_LOOKAFTER_PANIC_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		i := max(strings.Index(string(out), "panic:"), 0)
		t.Fatalf("the process died (%v) of a panic in the relayer's look-after; want it recovered:\n%.600s", err, out[i:])
	}
	if !strings.Contains(string(out), "looking after the relayer's pending settlements panicked") {
		t.Fatalf("the child ran no round that panicked, so it proves nothing:\n%.600s", out)
	}
}

// A settlement stuck by a fee spike, answered unknown, on a chain whose
// only facilitator of the key is then unloaded, on a chain another
// facilitator's varying endpoint forgot: the chain's set is not released
// while the settlement may still be pending, past validBefore too, so the
// next facilitator loaded on the chain takes it over and cancels it.
// (Before: the set was released once validBefore passed by the wall clock,
// the next facilitator made a fresh set and took nothing over, and every
// later settlement of the relayer on that chain queued behind the stuck
// one for good.)
func TestAForgottenSetKeepsItsStuckSettlementForTheNextFacilitatorToCancel(t *testing.T) {
	stuckThenReload(t, true)
}

// The same on a chain nobody forgot: the next facilitator takes the stuck
// settlement over and cancels it.
func TestTheNextFacilitatorCancelsAStuckSettlementLeftByAnUnloadedOne(t *testing.T) {
	stuckThenReload(t, false)
}

// stuckThenReload settles into a fee spike through f, unloads f while the
// settle runs (no other facilitator of the key open on its chain X), has
// fv, another facilitator of the key on X whose endpoint's genesis answer
// varies, forget X when forget is set, and waits past validBefore: a
// facilitator opened on X then cancels the stuck settlement.
func stuckThenReload(t *testing.T, forget bool) {
	shortReleaseRetry(t, 50*time.Millisecond)
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	tag := fmt.Sprintf("stuck-reload-%d", time.Now().UnixNano())
	fc := &taggedChain{Chain: d.Client(), tag: tag, gate: make(chan struct{}), gated: make(chan struct{})}
	sp := startSpike(t, d, fc, 3*time.Second)
	f, ctx := sp.f, sp.ctx
	// another facilitator of the key on chain X, whose endpoint's genesis answer varies
	fv, err := New(Config{Chain: &taggedChain{Chain: d.Client(), tag: tag, flipAfter: 1}, Network: DevnetNetwork, RelayerKey: DevKey(0)})
	if err != nil {
		t.Fatal(err)
	}
	defer fv.Close()
	x := identified(t, f)
	if identified(t, fv) != x {
		t.Fatal("f and fv are not on one chain's manager")
	}
	req := e.requirements(payee, amount)
	req.MaxTimeoutSeconds = 12
	p := mustSignExact(t, payer, req)
	validBefore := f.checkOwn(ctx, p, req).auth.ValidBefore.Uint64()
	res := make(chan error, 1)
	go func() {
		_, err := f.Settle(sp.sctx, p, req)
		res <- err
	}()
	<-fc.gated // f's settle holds X, past its checks, nothing kept yet
	f.Close()  // unloaded (its request still runs); no other facilitator of the key is open on X
	for range maxChainsPerKey {
		if forget {
			readGenesis(t, fv) // fv forgets X (nothing kept there yet)
		}
	}
	close(fc.gate)
	err = <-res
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("settle sent before the spike: %v; want an unknown outcome", err)
	}
	st := &stuckSettlement{ctx: ctx, d: d, f: f, first: sp.sc.all()[0], validBefore: validBefore}
	registered := func() bool {
		chainNonces.mu.Lock()
		defer chainNonces.mu.Unlock()
		return chainNonces.m[x.set.id] == x.set
	}
	if !registered() {
		t.Fatal("setup: X released before validBefore")
	}
	for uint64(time.Now().Unix()) <= validBefore+1 {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(4 * releaseRetry) // X judged again past validBefore
	if _, pending, err := d.Client().TransactionByHash(ctx, st.first.Hash()); err != nil || !pending {
		t.Fatalf("setup: the stuck settlement pending=%v, %v when X was judged", pending, err)
	}
	if !registered() {
		t.Error("chain X's set was released while its stuck settlement is pending")
	}

	// The next facilitator loaded on X (a reload).
	next, err := New(Config{Chain: &taggedChain{Chain: d.Client(), tag: tag}, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	identified(t, next)
	st.waitNonceFreed(t, next)
}
