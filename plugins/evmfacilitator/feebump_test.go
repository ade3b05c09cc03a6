package evmfacilitator

import (
	"bytes"
	"context"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/aovhq/aov/x402"
)

// spikeGasLimit is the block gas limit of the fee-spike devnet: one filler
// (congestion) fills a block, so each raises the base fee by nearly 12.5%.
// The token's deployment (3M gas) fits.
const spikeGasLimit = 4_000_000

// congestion sends, from development account 9, fillers: transactions to
// account 8 whose calldata alone (99,000 nonzero bytes, priced by
// EIP-7623's floor) uses almost a whole block, so that every block holding
// one raises the base fee (EIP-1559) by nearly 12.5%, and no code runs.
// Their tip is the miner's least (1 mwei), so the miner takes any
// settlement first and the filler waits for the next block when both do
// not fit.
type congestion struct {
	t     *testing.T
	d     *Devnet
	nonce uint64
}

func (g *congestion) send(ctx context.Context) *types.Transaction {
	g.t.Helper()
	data := bytes.Repeat([]byte{0xff}, 99_000)
	gas, err := intrinsicGas(data)
	if err != nil {
		g.t.Fatal(err)
	}
	to := DevAccounts()[8].Address
	tx, err := types.SignNewTx(DevKey(9), types.LatestSignerForChainID(big.NewInt(DevnetChainID)), &types.DynamicFeeTx{
		ChainID: big.NewInt(DevnetChainID), Nonce: g.nonce, GasTipCap: big.NewInt(1e6), GasFeeCap: big.NewInt(50e9),
		Gas: gas, To: &to, Data: data,
	})
	if err != nil {
		g.t.Fatal(err)
	}
	if err := g.d.Client().SendTransaction(ctx, tx); err != nil {
		if ctx.Err() == nil { // else the congestion ended (hold, as its test returns)
			g.t.Errorf("sending a filler: %v", err)
		}
		return nil
	}
	g.nonce++
	return tx
}

func (g *congestion) baseFee(ctx context.Context) *big.Int {
	h, err := g.d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		return nil
	}
	return h.BaseFee
}

// raise fills blocks until the base fee is above floor: a filler raises it
// by nearly 12.5%, so it sends enough of them at once, each mined in a block of its
// own, and then more if blocks sealed meanwhile lowered it.
func (g *congestion) raise(ctx context.Context, floor *big.Int) {
	for {
		b := g.baseFee(ctx)
		if b != nil && b.Cmp(floor) > 0 {
			return
		}
		if ctx.Err() != nil {
			g.t.Errorf("the base fee never rose above %s", floor)
			return
		}
		var last *types.Transaction
		for n := new(big.Int).Set(b); n.Cmp(floor) <= 0; n.Div(n.Mul(n, big.NewInt(9)), big.NewInt(8)) {
			if tx := g.send(ctx); tx != nil {
				last = tx
			}
		}
		if last != nil {
			g.waitMined(ctx, last.Hash())
		}
	}
}

// hold keeps the base fee above floor until ctx ends: whenever it is below
// 1.5 × floor, one more filler (the blocks sealed meanwhile, empty or not
// full, lower it).
func (g *congestion) hold(ctx context.Context, floor *big.Int) {
	high := new(big.Int).Div(new(big.Int).Mul(floor, big.NewInt(3)), big.NewInt(2))
	for ctx.Err() == nil {
		if b := g.baseFee(ctx); b != nil && b.Cmp(high) < 0 {
			if tx := g.send(ctx); tx != nil {
				g.waitMined(ctx, tx.Hash())
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (g *congestion) waitMined(ctx context.Context, h common.Hash) {
	for ctx.Err() == nil {
		if _, err := g.d.Client().TransactionReceipt(ctx, h); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// spikeBeforeSend is the devnet's client, except that the first send of
// the relayer waits until the base fee has risen past that transaction's
// fee cap, and stays there: a spike between the fee quote and the
// inclusion, as a sudden rush of traffic makes one. Every send is kept.
type spikeBeforeSend struct {
	Chain
	g     *congestion
	ctx   context.Context
	mu    sync.Mutex
	sends []*types.Transaction
}

func (c *spikeBeforeSend) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	c.sends = append(c.sends, tx)
	first := len(c.sends) == 1
	c.mu.Unlock()
	if first && c.g != nil {
		floor := new(big.Int).Mul(tx.GasFeeCap(), big.NewInt(2))
		rctx, cancel := context.WithTimeout(c.ctx, time.Minute)
		c.g.raise(rctx, floor)
		cancel()
		go c.g.hold(c.ctx, floor)
	}
	return c.Chain.SendTransaction(ctx, tx)
}

func (c *spikeBeforeSend) all() []*types.Transaction {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*types.Transaction(nil), c.sends...)
}

// A base-fee spike past the fee cap a settlement was sent with, lasting
// longer than its receipt wait, does not wedge the relayer: the stuck
// transaction is replaced with the same nonce and a higher fee, a retry of
// its settlement finds the replacement mined and answers success (naming
// it), and the settlements after it settle. The payer is charged once: the
// authorization's nonce is used once on chain, by the one mined
// transaction of the settlement. (Before: nothing replaced it; the retry
// stayed unknown, and every later settlement of the relayer queued behind
// its nonce for as long as the spike lasted.)
func TestFeeSpikeReplacesTheStuckSettlement(t *testing.T) {
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	g := &congestion{t: t, d: d}
	sc := &spikeBeforeSend{Chain: d.Client(), g: g, ctx: ctx}
	f, err := New(Config{Chain: sc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	payerAddr := DevAccounts()[1].Address
	before := usdcBalance(t, d, payerAddr)

	stuck := mustSignExact(t, payer, req)
	_, err = f.Settle(context.Background(), stuck, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("settle sent before the spike: %v; want an unknown outcome (still pending after its wait)", err)
	}
	first := sc.all()[0]

	// The client retries, as an unknown outcome tells it to.
	var r x402.SettleResponse
	deadline := time.Now().Add(15 * time.Second)
	for {
		r, err = f.Settle(context.Background(), stuck, req)
		if !errors.As(err, &ue) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil || !r.Success {
		t.Fatalf("retry of the stuck settlement = %+v, %v; want success by its replacement", r, err)
	}
	by := common.HexToHash(r.Transaction)
	if by == first.Hash() {
		t.Fatalf("settled by the first transaction, which the spike priced out; want its replacement")
	}
	tx, _, err := d.Client().TransactionByHash(context.Background(), by)
	if err != nil {
		t.Fatal(err)
	}
	if tx.Nonce() != first.Nonce() || tx.Data() == nil || string(tx.Data()) != string(first.Data()) {
		t.Errorf("the replacement has nonce %d (want %d) or other calldata", tx.Nonce(), first.Nonce())
	}
	if tx.GasTipCap().Cmp(first.GasTipCap()) <= 0 || tx.GasFeeCap().Cmp(first.GasFeeCap()) <= 0 {
		t.Errorf("the replacement's fees (tip %s, cap %s) are not above the first's (%s, %s)", tx.GasTipCap(), tx.GasFeeCap(), first.GasTipCap(), first.GasFeeCap())
	}
	if tx.GasFeeCap().Cmp(big.NewInt(maxReplacementFeeCap)) > 0 {
		t.Errorf("the replacement's fee cap %s is past the bound", tx.GasFeeCap())
	}
	if _, err := d.Client().TransactionReceipt(context.Background(), first.Hash()); err == nil {
		t.Errorf("the replaced transaction has a receipt too")
	}

	// The status check the gateway makes of the answer it kept, naming
	// the first transaction, finds the settlement done by its replacement.
	st, err := f.SentSettlementStatus(context.Background(), stuck, req, x402.SentSettlement{Transaction: first.Hash().Hex(), After: time.Now().Add(-time.Minute)})
	if err != nil || st.State != x402.SettlementDone || st.Transaction != by.Hex() {
		t.Errorf("status of the stuck settlement = %+v, %v; want done by %s", st, err, by.Hex())
	}

	// Settled once: a further retry is told it was already settled, by
	// the same transaction.
	r, err = f.Settle(context.Background(), stuck, req)
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != by.Hex() {
		t.Errorf("settle after the replacement landed = %+v, %v; want %s naming %s", r, err, x402.ReasonExactEVMNonceAlreadyUsed, by.Hex())
	}

	// The relayer is not wedged: later settlements land while the spike
	// lasts.
	for i := 0; i < 2; i++ {
		r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
		if err != nil || !r.Success {
			t.Errorf("settle #%d after the stuck one = %+v, %v; want success", i+2, r, err)
		}
	}
	stop()

	want := new(big.Int).Mul(big.NewInt(3), mustBig(amount))
	if paid := new(big.Int).Sub(before, usdcBalance(t, d, payerAddr)); paid.Cmp(want) != 0 {
		t.Errorf("the payer paid %s for three payments of %s; want %s", paid, amount, want)
	}
	for _, s := range sc.all() {
		if s.Nonce() == first.Nonce() && s.Hash() != by {
			if _, err := d.Client().TransactionReceipt(context.Background(), s.Hash()); err == nil {
				t.Errorf("a second transaction of the stuck settlement, %s, was mined", s.Hash().Hex())
			}
		}
	}
}

// A replacement's fees are each at least 12.5% above the replaced
// transaction's (the node takes no less) and its fee cap at least twice the
// head's base fee plus the tip; past maxReplacementFeeCap, or after
// maxFeeBumps replacements, nothing is sent and the message says why.
func TestReplacementFeesAreBounded(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	head, err := e.d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	old := types.NewTx(&types.DynamicFeeTx{GasTipCap: big.NewInt(1000), GasFeeCap: big.NewInt(3000)})
	q, err := e.f.bumpedFees(ctx, old, head)
	if err != nil {
		t.Fatal(err)
	}
	wantCap := new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), q.tip)
	if q.tip.Cmp(big.NewInt(1125)) < 0 || q.feeCap.Cmp(wantCap) < 0 || q.feeCap.Cmp(big.NewInt(3375)) < 0 {
		t.Errorf("bumped fees tip %s, cap %s; want tip ≥ 1125, cap ≥ 3375 and ≥ 2 × base fee %s + tip", q.tip, q.feeCap, head.BaseFee)
	}
	legacy := types.NewTx(&types.LegacyTx{GasPrice: big.NewInt(1000)})
	if q, err := e.f.bumpedFees(ctx, legacy, head); err != nil || q.price == nil || q.price.Cmp(big.NewInt(1125)) < 0 {
		t.Errorf("bumped legacy fees = %+v, %v; want a gas price ≥ 1125", q, err)
	}
	high := types.NewTx(&types.DynamicFeeTx{GasTipCap: big.NewInt(1e9), GasFeeCap: big.NewInt(maxReplacementFeeCap - 1)})
	if q, err := e.f.bumpedFees(ctx, high, head); err == nil {
		t.Errorf("a replacement past the fee bound: tip %s, cap %s", q.tip, q.feeCap)
	}
	near := types.NewTx(&types.DynamicFeeTx{GasTipCap: big.NewInt(1e9), GasFeeCap: big.NewInt(maxReplacementFeeCap * 8 / 9)})
	if q, err := e.f.bumpedFees(ctx, near, head); err != nil || q.feeCap.Cmp(big.NewInt(maxReplacementFeeCap)) > 0 {
		t.Errorf("a replacement just under the fee bound = %+v, %v; want one at most %d", q, err, maxReplacementFeeCap)
	}

	sc := &spikeBeforeSend{Chain: e.d.Client()}
	f, err := New(Config{Chain: sc, Network: DevnetNetwork, RelayerKey: DevKey(0)})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	c := f.checkOwn(ctx, mustSignExact(t, payer, req), req)
	s := newSentSettlement(old, time.Now(), c.auth.ValidBefore)
	for range maxFeeBumps {
		s.txs = append(s.txs, old)
	}
	if msg := f.replace(ctx, c, s); !strings.Contains(msg, "the most") || len(sc.all()) != 0 {
		t.Errorf("replace after %d replacements: %q, %d sent; want nothing sent", maxFeeBumps, msg, len(sc.all()))
	}
}

// A status reader (no relayer, no settlements of its own) asked about a
// settled payment naming its transaction answers done by it.
func TestStatusReaderWithTheSettlementsTransaction(t *testing.T) {
	e := newEnv(t)
	sp := settleOne(t, e.d, nil, nil)
	st, err := statusReader(t, e.d.Client()).SentSettlementStatus(context.Background(), sp.p, sp.req, x402.SentSettlement{Transaction: sp.r.Transaction, After: time.Now().Add(-time.Minute)})
	if err != nil || st.State != x402.SettlementDone || st.Transaction != sp.r.Transaction {
		t.Errorf("status = %+v, %v; want done by %s", st, err, sp.r.Transaction)
	}
}

// A settlement transaction stuck below the base fee whose authorization has
// expired is not replaced by its call, which could only revert, but by a
// cancellation: a transfer of nothing from the relayer to itself with its
// nonce and a bumped fee, which frees the nonce. The settlement then fails,
// nothing transferred, and the relayer's later settlements land. (Before:
// it was left pending, and every later settlement of the relayer queued
// behind its nonce for as long as the base fee stayed up.)
func TestStuckSettlementPastValidBeforeIsCancelled(t *testing.T) {
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	payerAddr := DevAccounts()[1].Address
	before := usdcBalance(t, d, payerAddr)
	c := f.checkOwn(ctx, mustSignExact(t, payer, req), req)
	if c.invalid {
		t.Fatalf("payment refused: %+v", c.resp)
	}

	// The relayer's settlement, sent with a fee cap the spiked base fee
	// has passed.
	g := &congestion{t: t, d: d}
	stuck, _ := sendStuckSettlement(ctx, t, d, g, f, c)
	nonce := stuck.Nonce()
	s := newSentSettlement(stuck, time.Now(), c.auth.ValidBefore)
	s.lastSent = time.Now().Add(-time.Minute) // it has had its wait
	// Its authorization has expired by the head block's time.
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.auth.ValidBefore = new(big.Int).SetUint64(head.Time)

	var ue *x402.UnknownOutcomeError
	if _, err := f.resolve(c, s, errors.New("its receipt wait ended")); !errors.As(err, &ue) {
		t.Fatalf("resolve of the stuck settlement: %v; want an unknown outcome", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := d.Client().NonceAt(ctx, f.relayer, nil)
		if err == nil && n > nonce {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relayer's nonce %d is still taken by the stuck transaction", nonce)
		}
		time.Sleep(50 * time.Millisecond)
	}
	r, err := f.resolve(c, s, errors.New("its receipt wait ended"))
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMTransactionFailed {
		t.Errorf("resolve once the nonce is freed = %+v, %v; want %s", r, err, x402.ReasonExactEVMTransactionFailed)
	}
	if _, err := d.Client().TransactionReceipt(ctx, stuck.Hash()); err == nil {
		t.Errorf("the stuck settlement transaction was mined")
	}
	r, err = f.Settle(ctx, mustSignExact(t, payer, req), req)
	if err != nil || !r.Success {
		t.Errorf("the next settlement = %+v, %v; want success", r, err)
	}
	stop()
	if paid := new(big.Int).Sub(before, usdcBalance(t, d, payerAddr)); paid.Cmp(mustBig(amount)) != 0 {
		t.Errorf("the payer paid %s; want %s, the next settlement's alone", paid, amount)
	}
}

// A contract payer's settlement stuck by a fee spike, answered unknown
// after its replacement was sent, is followed by the receipt of any of its
// transactions: the replacement's success counts nothing against the
// payer's failure budget, and the wallet pays once.
func TestFollowTakesTheReplacementsReceipt(t *testing.T) {
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	from, p, req := contractPayer(t, e, acceptAllRuntime)
	before := usdcBalance(t, d, from)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sc := &spikeBeforeSend{Chain: d.Client(), g: &congestion{t: t, d: d}, ctx: ctx}
	f, err := New(Config{Chain: sc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Settle(context.Background(), p, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "replaced at a higher fee") {
		t.Fatalf("settle stuck by the spike: %v; want an unknown outcome, its transaction replaced", err)
	}
	if n := landedFailures(t, f, from); n != 0 {
		t.Errorf("%d failures recorded for a settlement whose replacement paid; want none", n)
	}
	stop()
	if paid := new(big.Int).Sub(before, usdcBalance(t, d, from)); paid.Cmp(mustBig(amount)) != 0 {
		t.Errorf("the wallet paid %s; want %s", paid, amount)
	}
}

// A transaction of a settlement is replaced only once it has had its own
// wait: a client retrying /settle every second would otherwise raise the
// fee by 12.5% at each retry, spending the bumps (and up to the fee
// bound) before the replacement could be mined.
func TestReplacementWaitsItsTurn(t *testing.T) {
	d := startDevnet(t, DevnetConfig{gasLimit: spikeGasLimit, MaxClockLead: 20 * time.Second})
	e := &testEnv{d: d}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sc := &spikeBeforeSend{Chain: d.Client(), g: &congestion{t: t, d: d}, ctx: ctx}
	f, err := New(Config{Chain: sc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	c := f.checkOwn(ctx, p, req)
	c.settling = true
	c, err = f.checkChain(ctx, c)
	if err != nil || c.invalid {
		t.Fatalf("checks: %v, %+v", err, c.resp)
	}
	// Held pending by the spike: a settlement sent now, its nonce the
	// relayer's next, which replace is asked at once to replace.
	tx, err := f.send(ctx, ctx, c, identified(t, f), func(*types.Transaction) {})
	if err != nil {
		t.Fatal(err)
	}
	s := newSentSettlement(tx, time.Now(), c.auth.ValidBefore)
	if msg := f.replace(ctx, c, s); len(sc.all()) != 1 || !strings.Contains(msg, "not replaced yet") {
		t.Errorf("replace right after the send: %q, %d sends; want none until it has waited", msg, len(sc.all())-1)
	}
	time.Sleep(time.Second)
	if msg := f.replace(ctx, c, s); len(sc.all()) != 2 {
		t.Errorf("replace after its wait: %q; want it replaced", msg)
	}
}

// sendStuckSettlement sends c's settlement from f's relayer at its next
// nonce with a fee cap of twice the head's base fee plus a 1 gwei tip, then
// has g raise the base fee past twice that cap and hold it there until ctx
// ends: the transaction stays pending, as one of a base-fee spike. It
// returns the transaction and its fee cap.
func sendStuckSettlement(ctx context.Context, t *testing.T, d *Devnet, g *congestion, f *Facilitator, c *checked) (*types.Transaction, *big.Int) {
	t.Helper()
	head, err := d.Client().HeaderByNumber(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	low := new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), big.NewInt(1e9))
	floor := new(big.Int).Mul(low, big.NewInt(2))
	g.raise(ctx, floor)
	go g.hold(ctx, floor)
	nonce, err := d.Client().PendingNonceAt(ctx, f.relayer)
	if err != nil {
		t.Fatal(err)
	}
	stuck, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Nonce: nonce, GasTipCap: big.NewInt(1e9), GasFeeCap: low, Gas: 300_000, To: &c.token, Data: c.txData})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Client().SendTransaction(ctx, stuck); err != nil {
		t.Fatal(err)
	}
	return stuck, low
}
