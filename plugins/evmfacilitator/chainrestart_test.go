package evmfacilitator

import (
	"context"
	"errors"
	"math/big"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/ethclient"

	"github.com/aovhq/aov/x402"
)

// restartableEndpoint is a devnet serving JSON-RPC on a local port and an
// ethclient dialled to it, as a gateway's rpc_url facilitator reaches a
// devnet's rpc_listen; restart stops that devnet and starts another on the
// same address: the node behind the endpoint is now another chain of chain
// ID 1337 (README: "a devnet started again is another chain").
type restartableEndpoint struct {
	d      *Devnet
	client *ethclient.Client
	listen string
}

func newRestartableEndpoint(t *testing.T) *restartableEndpoint {
	t.Helper()
	d, err := StartDevnet(DevnetConfig{RPCListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	client, err := ethclient.Dial(d.RPCURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(client.Close)
	return &restartableEndpoint{d: d, client: client, listen: strings.TrimPrefix(d.RPCURL(), "http://")}
}

func (r *restartableEndpoint) restart(t *testing.T) {
	t.Helper()
	r.d.Close()
	r.d = startDevnet(t, DevnetConfig{RPCListen: r.listen})
}

// A facilitator whose endpoint's node restarts as another chain of its
// chain ID (a devnet stopped and started again on the same rpc_listen,
// which a reload that drops and re-adds the devnet does while the rpc_url
// facilitator stays loaded) settles on the new chain with the relayer's
// nonce of that chain. (Before: it kept the identity read when it was made
// and the nonce cached from the chain before, ahead of the relayer's on the
// new one: the settlement was queued, never mined, its outcome unknown.)
func TestAnEndpointRestartedAsAnotherChainSettlesWithThatChainsNonces(t *testing.T) {
	ep := newRestartableEndpoint(t)
	f, err := New(Config{Chain: ep.client, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := 0; i < 2; i++ {
		req := (&testEnv{d: ep.d}).requirements(payee, amount)
		if r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req); err != nil || !r.Success {
			t.Fatalf("settle %d = %+v, %v", i, r, err)
		}
	}
	ep.restart(t)
	req := (&testEnv{d: ep.d}).requirements(payee, amount)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if r, err := f.Settle(ctx, mustSignExact(t, payer, req), req); err != nil || !r.Success {
		t.Errorf("settle on the chain started again at %s = %+v, %v; want success", ep.listen, r, err)
	}
	if f.knownNonces() != ep.d.nonces.of(f.relayer) {
		t.Errorf("the facilitator still holds the nonce manager of the chain before")
	}
}

// A settlement kept on one chain (its transaction lost by the node, its
// outcome unknown) is never resolved or sent again on the chain that
// replaced it behind the endpoint: the client's retry through the same
// facilitator is answered unknown, nothing sent, and the relayer's
// look-after leaves it alone, so the payer's authorization, signed
// transaction and all, never executes on the new chain. (Before: the retry
// and the look-after sent the old chain's transaction to the new one,
// where it was mined and moved the payer's tokens.)
func TestASettlementKeptOnOneChainIsNeverSentOnTheChainThatReplacedIt(t *testing.T) {
	ep := newRestartableEndpoint(t)
	vc := &fakeLosingSends{Chain: ep.client, drop: 2}
	f, err := New(Config{Chain: vc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	req := (&testEnv{d: ep.d}).requirements(payee, amount)
	b := auth(payer, req)
	pay := sign(t, payer, b, req, req)
	_, err = f.Settle(context.Background(), pay, req)
	var ue *x402.UnknownOutcomeError
	if !errors.As(err, &ue) {
		t.Fatalf("settle with its transaction lost = %v; want an unknown outcome", err)
	}
	vc.mu.Lock()
	lost := vc.lost[0]
	vc.mu.Unlock()

	ep.restart(t)
	before := usdcBalance(t, ep.d, crypto.PubkeyToAddress(payer.PublicKey))
	r, err := f.Settle(context.Background(), pay, req) // the client's retry
	if !errors.As(err, &ue) || r.Success {
		t.Errorf("retry after the chain behind the endpoint changed = %+v, %v; want an unknown outcome", r, err)
	}
	// Another authorization of its nonce is not answered from it, nor sent.
	other := b
	vb, _ := new(big.Int).SetString(b.ValidBefore, 10)
	other.ValidBefore = vb.Add(vb, big.NewInt(1)).String()
	r, err = f.Settle(context.Background(), sign(t, payer, other, req, req), req)
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != "" {
		t.Errorf("another authorization of the kept nonce after the chain changed = %+v, %v; want %s naming no transaction", r, err, x402.ReasonExactEVMNonceAlreadyUsed)
	}
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if rc, err := ep.d.Client().TransactionReceipt(context.Background(), lost.Hash()); err == nil {
			t.Fatalf("the transaction %s kept of the chain before was sent on the new chain and mined there (status %d); the payer's balance on it went %s -> %s", lost.Hash().Hex(), rc.Status, before, usdcBalance(t, ep.d, crypto.PubkeyToAddress(payer.PublicKey)))
		}
	}
	if after := usdcBalance(t, ep.d, crypto.PubkeyToAddress(payer.PublicKey)); after.Cmp(before) != 0 {
		t.Errorf("the payer's balance on the new chain went %s -> %s", before, after)
	}
}

// switchingGenesis is a node behind one endpoint that is restarted as
// another chain of its chain ID (other set: its genesis block differs), and
// whose genesis reads can be held (hold), as a read's round trip is.
type switchingGenesis struct {
	Chain
	other   atomic.Bool
	hold    atomic.Pointer[chan struct{}]
	entered chan struct{}
}

func (c *switchingGenesis) HeaderByNumber(ctx context.Context, n *big.Int) (*types.Header, error) {
	if n != nil && n.Sign() == 0 {
		if h := c.hold.Load(); h != nil {
			select {
			case c.entered <- struct{}{}:
			default:
			}
			select {
			case <-*h:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	h, err := c.Chain.HeaderByNumber(ctx, n)
	if err != nil || n == nil || n.Sign() != 0 || !c.other.Load() {
		return h, err
	}
	h = types.CopyHeader(h)
	h.Extra = []byte("another chain of chain ID 1337")
	return h, nil
}

// A replacement whose fresh genesis read (onChainOf, under the
// settlement's lock) is the first to find the endpoint on another chain
// leaves the chain before (nonceManager.close) while that chain's
// look-after round runs, and both go on: the replacement is not sent, and
// later settles are answered. (Before: replace held the settlement's lock
// while close waited for the manager's sentMu, and the look-after held
// sentMu while it waited for the settlement's lock (sentAt): both waited
// for good, the facilitator's genesis read slot stayed taken, and every
// later settle through it hung with no deadline.)
func TestAReplacementFindingAnotherChainDoesNotDeadlockTheLookAfter(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	sc := &switchingGenesis{Chain: d.Client(), entered: make(chan struct{}, 1)}
	f, err := New(Config{Chain: sc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.prepareTimeout = time.Second
	n := identified(t, f)
	s := keepUnsent(t, e, f, n) // watched: the look-after runs (every 15 s)
	s.mu.Lock()
	s.lastSent = time.Now().Add(-time.Minute) // pending past its wait: replace goes on to send
	s.mu.Unlock()

	hold := make(chan struct{})
	sc.hold.Store(&hold)
	done := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout) // resolve's
		defer cancel()
		c := s.c
		done <- f.replace(ctx, &c, s)
	}()
	select {
	case <-sc.entered: // replace holds s.mu and reads the genesis block
	case r := <-done:
		t.Fatalf("replace returned before reading the genesis block: %s", r)
	case <-time.After(10 * time.Second):
		t.Fatal("replace never read the genesis block")
	}
	// The look-after's round comes meanwhile (here cut short, as close does).
	select {
	case n.wake <- struct{}{}:
	default:
	}
	time.Sleep(300 * time.Millisecond)
	// The node answers: it is another chain now.
	sc.other.Store(true)
	sc.hold.Store(nil)
	close(hold)

	select {
	case r := <-done:
		if !strings.Contains(r, errOtherChain.Error()) {
			t.Errorf("replace = %q; want it not replaced, its endpoint on another chain", r)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("replace, which found the endpoint on another chain, has not returned 5 s after its genesis read answered: deadlocked (it holds s.mu and waits for the old manager's sentMu in confirmChain -> old.close, while the look-after holds sentMu and waits for s.mu in resolveWatched -> sentAt)")
		buf := make([]byte, 1<<20)
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "resolveWatched") || strings.Contains(g, ".replace(") {
				t.Logf("%s", g)
			}
		}
		// What that costs: a settle through f, with a 1 s prepareTimeout.
		sdone := make(chan error, 1)
		go func() {
			req := e.requirements(payee, amount)
			_, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
			sdone <- err
		}()
		select {
		case err := <-sdone:
			t.Logf("a later settle answered: %v", err)
		case <-time.After(5 * time.Second):
			t.Errorf("a later settle through f (prepareTimeout 1 s) has not answered in 5 s: it waits with no deadline (identifying taken forever, then keptOnAnyChain -> sentOf on the old manager's sentMu)")
		}
	}
}

// keepUnsent keeps, as f's, a settlement transaction of a payment signed
// for e's devnet with the relayer's next nonce and never sent: a
// settlement of unknown outcome, which f's look-after watches.
func keepUnsent(t *testing.T, e *testEnv, f *Facilitator, n *nonceManager) *sentSettlement {
	t.Helper()
	req := e.requirements(payee, amount)
	c := f.checkOwn(context.Background(), mustSignExact(t, payer, req), req)
	nonce, err := e.d.Client().NonceAt(context.Background(), f.relayer, nil)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := types.SignNewTx(f.key, f.signer, &types.DynamicFeeTx{ChainID: f.chainID, Nonce: nonce, Gas: 300_000, GasFeeCap: big.NewInt(1e9), To: &c.token, Data: c.txData})
	if err != nil {
		t.Fatal(err)
	}
	s := newSentSettlement(tx, time.Now(), c.auth.ValidBefore)
	s.owner.Store(f)
	s.c = *c
	n.keep(usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, s, time.Now())
	return s
}
