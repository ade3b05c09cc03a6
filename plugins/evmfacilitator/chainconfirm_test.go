package evmfacilitator

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"log"
	"math/big"
	"os"
	"slices"
	"strings"
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

// readGenesis has f read its chain's genesis block afresh, as a resend
// or a replacement does, not shared with one that began before.
func readGenesis(t testing.TB, f *Facilitator) {
	t.Helper()
	if _, err := f.confirmChain(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
}

// lyingGenesis answers every read of the genesis block with another block
// (a broken or malicious endpoint, a load balancer over nodes that encode
// the genesis header differently).
type lyingGenesis struct{ Chain }

func (c *lyingGenesis) HeaderByNumber(ctx context.Context, n *big.Int) (*types.Header, error) {
	h, err := c.Chain.HeaderByNumber(ctx, n)
	if err != nil || n == nil || n.Sign() != 0 {
		return h, err
	}
	h = types.CopyHeader(h)
	h.Extra = make([]byte, 32)
	rand.Read(h.Extra)
	return h, nil
}

// An endpoint whose genesis answer varies (a lying RPC, a load balancer
// over different chains) leaves the facilitator at most maxChainsPerKey
// chains remembered, and the process as many new nonce sets: those with
// nothing kept are dropped, the oldest first. (Before: each reading of a
// genesis block unseen before made a nonce set that was never dropped and
// added the one before to the former chains, which every settle scans:
// 500 reads, 499 former chains.)
func TestVaryingGenesisRemembersBoundedFormerChains(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	f, err := New(Config{Chain: &lyingGenesis{Chain: d.Client()}, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chainNonces.mu.Lock()
	sets0 := len(chainNonces.m)
	chainNonces.mu.Unlock()
	var logged bytes.Buffer
	log.SetOutput(&logged)
	const reads = 500
	for i := 0; i < reads; i++ {
		readGenesis(t, f)
	}
	log.SetOutput(os.Stderr)
	if n := strings.Count(logged.String(), "evm facilitator: the endpoint of relayer"); n == 0 || n > maxChainsPerKey {
		t.Errorf("%d genesis reads, each another chain, logged %d lines; want one per change until the bound, then one saying the answers vary:\n%s", reads, n, logged.String())
	}
	f.idMu.Lock()
	former := len(f.former)
	f.idMu.Unlock()
	chainNonces.mu.Lock()
	sets := len(chainNonces.m) - sets0
	chainNonces.mu.Unlock()
	if former > maxChainsPerKey-1 || sets > maxChainsPerKey {
		t.Errorf("after %d settles' genesis reads the facilitator remembers %d former chains and the process %d new nonce sets, never dropped; want a bound", reads, former, sets)
	}
}

// Under an endpoint whose genesis answer varies, a chain whose manager
// keeps a settlement is remembered before those that keep nothing, and
// its set stays the process's: a retry of that payment through the
// facilitator is still an unknown outcome, nothing sent on the chain the
// endpoint reaches now.
func TestVaryingGenesisKeepsAChainWithASettlementKept(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	f, err := New(Config{Chain: &lyingGenesis{Chain: d.Client()}, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	req := (&testEnv{d: d}).requirements(payee, amount)
	pay := mustSignExact(t, payer, req)
	c := f.checkOwn(context.Background(), pay, req)
	tx, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Gas: 300_000, GasFeeCap: big.NewInt(1e9), To: &c.token, Data: c.txData})
	if err != nil {
		t.Fatal(err)
	}
	s := newSentSettlement(tx, time.Now(), c.auth.ValidBefore)
	s.c = *c
	first := identified(t, f)
	first.keep(usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, s, time.Now())
	for range 3 * maxChainsPerKey {
		readGenesis(t, f)
	}
	f.idMu.Lock()
	remembered := slices.ContainsFunc(f.former, func(c formerChain) bool { return c.n == first })
	former := len(f.former)
	f.idMu.Unlock()
	if !remembered || former > maxChainsPerKey-1 {
		t.Errorf("the chain with a settlement kept is remembered: %v, among %d former chains; want it, among at most %d", remembered, former, maxChainsPerKey-1)
	}
	chainNonces.mu.Lock()
	kept := false
	for _, set := range chainNonces.m {
		set.mu.Lock()
		kept = kept || set.m[f.relayer] == first
		set.mu.Unlock()
	}
	chainNonces.mu.Unlock()
	if !kept {
		t.Error("the nonce set of the chain with a settlement kept was released")
	}
	before := usdcBalance(t, d, crypto.PubkeyToAddress(payer.PublicKey))
	_, err = f.Settle(context.Background(), pay, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Errorf("a retry of the settlement kept on a chain before = %v; want an unknown outcome", err)
	}
	if after := usdcBalance(t, d, crypto.PubkeyToAddress(payer.PublicKey)); after.Cmp(before) != 0 {
		t.Errorf("the payer's balance went %s -> %s; want nothing sent", before, after)
	}
}

// slowGenesis counts the genesis reads and makes each take delay.
type slowGenesis struct {
	Chain
	delay time.Duration
	reads atomic.Int32
}

func (c *slowGenesis) HeaderByNumber(ctx context.Context, n *big.Int) (*types.Header, error) {
	if n != nil && n.Sign() == 0 {
		c.reads.Add(1)
		time.Sleep(c.delay)
	}
	return c.Chain.HeaderByNumber(ctx, n)
}

// A settle that arrives while a genesis read runs, at most
// sharedReadLead after it began, shares it: one read, one round trip; one
// arriving later waits for it and reads again, since that read may predate
// a restart it must see. (Before: a settle shared only a read that began
// after it arrived, so under steady load each waited up to two genesis
// round trips, and README's "one read, shared by the settles that arrive
// while it runs" was wrong.)
func TestSettleArrivingDuringAGenesisReadSharesIt(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	sg := &slowGenesis{Chain: d.Client(), delay: 300 * time.Millisecond}
	f, err := New(Config{Chain: sg, Network: DevnetNetwork, RelayerKey: DevKey(0)})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	identified(t, f)
	time.Sleep(50 * time.Millisecond)
	sg.reads.Store(0)
	done := make(chan time.Duration, 2)
	go func() { s := time.Now(); identified(t, f); done <- time.Since(s) }()
	time.Sleep(sharedReadLead / 4) // arrives while the first read runs
	go func() { s := time.Now(); identified(t, f); done <- time.Since(s) }()
	d1, d2 := <-done, <-done
	if n := sg.reads.Load(); n != 1 {
		t.Errorf("two settles, the second arriving %v into the first one's genesis read: %d genesis reads (waits %v, %v); want one, shared", sharedReadLead/4, n, d1.Round(time.Millisecond), d2.Round(time.Millisecond))
	}

	// One arriving past the bound does not take that read.
	sg.reads.Store(0)
	go func() { identified(t, f); done <- 0 }()
	time.Sleep(sharedReadLead + 100*time.Millisecond)
	go func() { identified(t, f); done <- 0 }()
	<-done
	<-done
	if n := sg.reads.Load(); n != 2 {
		t.Errorf("two settles, the second arriving %v into the first one's genesis read: %d genesis reads; want two", sharedReadLead+100*time.Millisecond, n)
	}
}
