package evmfacilitator

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log"
	"math/big"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
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

// genesisOutageEnv is a facilitator (receipts awaited 1.5 s, closed when
// the test ends) on a devnet whose node loses its first two sends, so that
// the first settle's outcome is unknown and its transaction kept (vc.lost,
// landed later by the look-after), behind a client whose reads of the
// genesis block fail while oc.down is set; req is a payment's
// requirements on it.
type genesisOutageEnv struct {
	d   *Devnet
	vc  *droppingSends
	oc  *genesisOutage
	f   *Facilitator
	req x402.PaymentRequirements
}

func lostSendsBehindGenesisOutage(t *testing.T) *genesisOutageEnv {
	t.Helper()
	o := &genesisOutageEnv{d: startDevnet(t, DevnetConfig{})}
	o.vc = &droppingSends{Chain: o.d.Client(), drop: 2}
	o.oc = &genesisOutage{Chain: o.vc}
	var err error
	o.f, err = New(Config{Chain: o.oc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.f.Close() })
	o.req = (&testEnv{d: o.d}).requirements(payee, amount)
	return o
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
	o := lostSendsBehindGenesisOutage(t)
	d, vc, oc, f, req := o.d, o.vc, o.oc, o.f, o.req
	pay := mustSignExact(t, payer, req)
	_, err := f.Settle(context.Background(), pay, req)
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

// What is kept answers only its own authorization while the genesis read
// fails too: another authorization of the kept settlement's nonce (one
// second more of validity) is nonce_already_used naming no transaction,
// nothing sent, as with the chain identified. (Before: it was told the
// outcome of "an earlier settle of this authorization" was unknown, of a
// transaction that is not its own.)
func TestAnotherAuthorizationOfAKeptNonceDuringGenesisReadFailureIsNonceAlreadyUsed(t *testing.T) {
	o := lostSendsBehindGenesisOutage(t)
	oc, f, req := o.oc, o.f, o.req
	b := auth(payer, req)
	var ue *x402.UnknownOutcomeError
	if r, err := f.Settle(context.Background(), sign(t, payer, b, req, req), req); !errors.As(err, &ue) {
		t.Fatalf("first settle = %+v, %v; want an unknown outcome", r, err)
	}
	other := b
	vb, _ := new(big.Int).SetString(b.ValidBefore, 10)
	other.ValidBefore = vb.Add(vb, big.NewInt(1)).String()
	oc.down.Store(true)
	time.Sleep(4 * sharedReadLead) // past any reading of the genesis block that began before
	r, err := f.Settle(context.Background(), sign(t, payer, other, req, req), req)
	oc.down.Store(false)
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != "" {
		t.Errorf("another authorization of the kept nonce while the genesis read fails = %+v, %v; want %s naming no transaction", r, err, x402.ReasonExactEVMNonceAlreadyUsed)
	}
}

// readGenesis has f read its chain's genesis block afresh, as a resend
// or a replacement does, not shared with one that began before.
func readGenesis(t testing.TB, f *Facilitator) {
	t.Helper()
	n, err := f.confirmChain(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	n.unhold()
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
	// The second settle is timed from when the first one's read began, not
	// from when its goroutine was started: on a loaded machine that may be
	// later by more than the bound.
	began := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); sg.reads.Load() == 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the first settle's genesis read never began")
			}
		}
	}
	sg.reads.Store(0)
	done := make(chan time.Duration, 2)
	go func() { s := time.Now(); identified(t, f); done <- time.Since(s) }()
	began() // arrives while the first read runs
	s2 := time.Now()
	identified(t, f)
	d1, d2 := <-done, time.Since(s2)
	if n := sg.reads.Load(); n != 1 {
		t.Errorf("two settles, the second arriving within %v of the first one's genesis read: %d genesis reads (waits %v, %v); want one, shared", sharedReadLead, n, d1.Round(time.Millisecond), d2.Round(time.Millisecond))
	}

	// One arriving past the bound does not take that read.
	sg.reads.Store(0)
	go func() { identified(t, f); done <- 0 }()
	began()
	time.Sleep(sharedReadLead + 100*time.Millisecond)
	identified(t, f)
	<-done
	if n := sg.reads.Load(); n != 2 {
		t.Errorf("two settles, the second arriving %v into the first one's genesis read: %d genesis reads; want two", sharedReadLead+100*time.Millisecond, n)
	}
}

// taggedChain answers the genesis block with its own extra data
// (tag, or, from the (flipAfter+1)th read on when flipAfter > 0, a fresh
// one each read: an endpoint whose answers vary), optionally holds the
// first gas estimate until gate closes, answers every send with an
// error after forwarding it (sendLies), and fails genesis reads while down.
type taggedChain struct {
	Chain
	tag       string
	flipAfter int32
	reads     atomic.Int32
	gate      chan struct{}
	gated     chan struct{}
	estimates atomic.Int32
	sendLies  bool
	down      atomic.Bool
}

func (c *taggedChain) HeaderByNumber(ctx context.Context, n *big.Int) (*types.Header, error) {
	if n == nil || n.Sign() != 0 {
		return c.Chain.HeaderByNumber(ctx, n)
	}
	if c.down.Load() {
		return nil, errors.New("connection refused")
	}
	h, err := c.Chain.HeaderByNumber(ctx, n)
	if err != nil {
		return h, err
	}
	h = types.CopyHeader(h)
	h.Extra = []byte(c.tag)
	if r := c.reads.Add(1); c.flipAfter > 0 && r > c.flipAfter {
		h.Extra = []byte(fmt.Sprintf("%s-varied-%d", c.tag, r))
	}
	return h, nil
}

func (c *taggedChain) EstimateGas(ctx context.Context, m ethereum.CallMsg) (uint64, error) {
	if c.gate != nil && c.estimates.Add(1) == 1 {
		close(c.gated)
		<-c.gate
	}
	return c.Chain.EstimateGas(ctx, m)
}

func (c *taggedChain) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	err := c.Chain.SendTransaction(ctx, tx)
	if c.sendLies && err == nil {
		return errors.New("connection reset by peer") // after the node took it
	}
	return err
}

// A settle through a facilitator already closed (a request of an unloaded
// configuration, which Close lets run) holds its chain's nonce set for its
// life: another facilitator of the key that forgets the chain (its
// endpoint's genesis answer varies) leaves the set to the process, the
// settlement it keeps is found by a retry whose genesis read fails (an
// unknown outcome, not "nothing charged"), and once a retry learns its
// outcome the set goes. (Before: releaseChainSet counted only open
// facilitators and kept settlements, released the set under the settle,
// whose settlement was then kept in a manager the process no longer knew:
// the retry was a plain error, x402's 503 with nothing charged, for a
// payment charged.)
func TestASettleHoldsItsChainsNonceSetAgainstRelease(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	tag := fmt.Sprintf("varying-chain-%d", time.Now().UnixNano())
	hc := &taggedChain{Chain: d.Client(), tag: tag, gate: make(chan struct{}), gated: make(chan struct{}), sendLies: true}
	h, err := New(Config{Chain: hc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	identified(t, h)
	fc := &taggedChain{Chain: d.Client(), tag: tag, flipAfter: 1}
	f, err := New(Config{Chain: fc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if identified(t, f) != identified(t, h) {
		t.Fatal("f and h are not on one chain's manager")
	}

	req := e.requirements(payee, amount)
	pay := mustSignExact(t, payer, req)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, d, from)
	res := make(chan error, 1)
	go func() {
		_, err := h.Settle(context.Background(), pay, req)
		res <- err
	}()
	<-hc.gated // h's settle holds the chain's manager, past its checks
	h.Close()  // a reload unloads h; its request still runs

	for range maxChainsPerKey {
		readGenesis(t, f) // f's endpoint answers other genesis blocks: X is forgotten
	}
	h.idMu.Lock()
	x := h.ident
	h.idMu.Unlock()
	registered := func() bool {
		chainNonces.mu.Lock()
		defer chainNonces.mu.Unlock()
		return chainNonces.m[x] != nil
	}
	if !registered() {
		t.Error("chain X's nonce set was released while h's settle held its manager")
	}

	hc.down.Store(true) // the outage that leaves h's outcome unknown fails the genesis read too
	close(hc.gate)
	err = <-res
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("h's settle = %v; the setup expects an unknown outcome", err)
	}
	after := usdcBalance(t, d, from)
	for deadline := time.Now().Add(5 * time.Second); after.Cmp(before) >= 0 && time.Now().Before(deadline); after = usdcBalance(t, d, from) {
		time.Sleep(50 * time.Millisecond)
	}
	if after.Cmp(before) >= 0 {
		t.Fatalf("the payer's balance went %s -> %s; the setup expects h's transaction mined", before, after)
	}

	// The retry, through a facilitator of the key on X whose genesis read fails.
	rc := &taggedChain{Chain: d.Client(), tag: tag}
	rc.down.Store(true)
	r, err := New(Config{Chain: rc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	resp, rerr := r.Settle(context.Background(), pay, req)
	if !errors.As(rerr, &ue) {
		t.Errorf("retry while the genesis read fails = %+v, %v; want an unknown outcome: a plain error is x402's 503 with nothing charged, and the payer's balance went %s -> %s", resp, rerr, before, after)
	}

	// A retry that learns the outcome, through h (closed, nobody on X
	// open): the payment settled, nothing is kept of X any more, and the
	// set X was dropped from goes.
	hc.down.Store(false)
	resp, err = h.Settle(context.Background(), pay, req)
	if err != nil || !resp.Success {
		t.Errorf("the retry that reads X = %+v, %v; want the success of h's transaction", resp, err)
	}
	if registered() {
		t.Error("chain X's nonce set, forgotten, stays in the process with nothing in use: every settle of the chain ID scans it")
	}
}

// shortReleaseRetry has a chain's nonce set found in use when it was let
// go of judged again every d instead of every minute (releaseRetry), for
// the test's length, so that a test sees it go.
func shortReleaseRetry(t *testing.T, d time.Duration) {
	chainNonces.mu.Lock()
	retry := releaseRetry
	releaseRetry = d
	chainNonces.mu.Unlock()
	t.Cleanup(func() {
		chainNonces.mu.Lock()
		releaseRetry = retry
		chainNonces.mu.Unlock()
	})
}

// A chain's nonce set forgotten while it kept a settlement goes once that
// settlement's authorization has expired (no retry of it finds it then)
// and nothing of it is pending (done): it is judged again every
// releaseRetry until nothing in it is in use. (Before: it stayed in the
// process for good, and every settle of the chain ID scanned it.) One that
// may still be pending past validBefore keeps the set (it holds the
// relayer's nonce, for the next facilitator on the chain to cancel).
func TestAForgottenChainSetGoesOnceItsSettlementsExpireResolved(t *testing.T) {
	shortReleaseRetry(t, 50*time.Millisecond)
	var genesis common.Hash
	rand.Read(genesis[:])
	set, _ := chainSet(chainIdentity{id: "1337", genesis: genesis})
	n := set.of(crypto.PubkeyToAddress(DevKey(0).PublicKey))
	tx := types.NewTx(&types.DynamicFeeTx{})
	kept := newSentSettlement(tx, time.Now(), big.NewInt(time.Now().Add(2*time.Second).Unix()))
	n.keep(usedKey{nonce: [32]byte{1}}, kept, time.Now())
	set.unhold()
	registered := func() bool {
		chainNonces.mu.Lock()
		defer chainNonces.mu.Unlock()
		return chainNonces.m[set.id] == set
	}
	releaseChainSet(set) // forgotten by the facilitators that reached it
	if !registered() {
		t.Fatal("a chain's nonce set was released while it kept a settlement")
	}
	time.Sleep(3 * time.Second) // past validBefore, judged again many times
	if !registered() {
		t.Fatal("a chain's nonce set was released while it kept a settlement that may still be pending")
	}
	kept.done.Store(true) // the look-after learned nothing of it is pending
	for deadline := time.Now().Add(10 * time.Second); registered(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the forgotten chain's nonce set stays 10 s after its one kept settlement expired and was resolved (judged again every 50ms)")
		}
	}
}

// Settles, Close, new facilitators (a reload), endpoints whose genesis
// answer varies (chain switches, sets forgotten and released) and the
// look-after's rounds, all at once under -race: nothing waits for good, and
// once everything has answered no set is still held (a hold never let go
// keeps a forgotten set in the process for good) or held below zero (let
// go twice: a set released under a settle).
func TestConcurrentSettlesClosesAndChainSwitchesLeaveNoSetHeld(t *testing.T) {
	shortReleaseRetry(t, 20*time.Millisecond)
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	tag := fmt.Sprintf("holds-%d", time.Now().UnixNano())
	req := e.requirements(payee, "1")
	req.MaxTimeoutSeconds = 10
	var wg sync.WaitGroup
	var mu sync.Mutex
	var facs []*Facilitator
	deadline := time.Now().Add(8 * time.Second)
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; time.Now().Before(deadline); i++ {
				c := &taggedChain{Chain: d.Client(), tag: tag, sendLies: (w+i)%2 == 0}
				if w%3 == 0 {
					c.flipAfter = int32(1 + i%3) // an endpoint whose genesis answer varies
				}
				f, err := New(Config{Chain: c, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 200 * time.Millisecond})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				facs = append(facs, f)
				mu.Unlock()
				var inner sync.WaitGroup
				for j := range 3 {
					inner.Add(1)
					go func() {
						defer inner.Done()
						pay := mustSignExact(t, payer, req)
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+100*j)*time.Millisecond)
						defer cancel()
						f.Settle(ctx, pay, req)
						f.Settle(context.Background(), pay, req) // the retry
						f.SentSettlementStatus(context.Background(), pay, req, x402.SentSettlement{Transaction: "0x" + strings.Repeat("ab", 32)})
					}()
				}
				if i%2 == 0 {
					time.Sleep(30 * time.Millisecond)
					f.Close() // a reload: its settles still run
				}
				inner.Wait()
				f.Close()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 1)
		t.Fatal("settles, closes and chain switches still running 60 s after their 8 s: something waits for good")
	}
	chainNonces.mu.Lock()
	defer chainNonces.mu.Unlock()
	for id, s := range chainNonces.m {
		if s.holds != 0 {
			t.Errorf("chain %s/%s: its nonce set is held %d times with no settle or identification running", id.id, id.genesis.Hex()[:10], s.holds)
		}
	}
}
