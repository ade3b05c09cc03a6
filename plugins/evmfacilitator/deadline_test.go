package evmfacilitator

import (
	"context"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// stalledReads is a fake chain: the devnet's client, except that gas
// estimates (estimate) or eth_calls (calls) are taken and never answered,
// as by an RPC endpoint behind a black-holed connection: ethclient's HTTP
// client has no timeout, so only the caller's context ends them.
type stalledReads struct {
	Chain
	estimate, calls bool
	once            sync.Once
	stalled         chan struct{} // closed when the first read stalls
}

func newStalledReads(c Chain) *stalledReads {
	return &stalledReads{Chain: c, stalled: make(chan struct{})}
}

func (c *stalledReads) stall(ctx context.Context) error {
	c.once.Do(func() { close(c.stalled) })
	<-ctx.Done()
	return ctx.Err()
}

func (c *stalledReads) EstimateGas(ctx context.Context, msg ethereum.CallMsg) (uint64, error) {
	if c.estimate {
		return 0, c.stall(ctx)
	}
	return c.Chain.EstimateGas(ctx, msg)
}

func (c *stalledReads) CallContract(ctx context.Context, msg ethereum.CallMsg, block *big.Int) ([]byte, error) {
	if c.calls {
		return nil, c.stall(ctx)
	}
	return c.Chain.CallContract(ctx, msg, block)
}

// waitFor returns what ch delivers, failing the test if nothing does
// within hangGuard (a hang, not a speed limit).
func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(hangGuard):
		t.Fatalf("%s never ended", what)
		panic("unreachable")
	}
}

// A settle on a context without a deadline (the x402_facilitator
// handler's) ends when its RPC endpoint stalls before the send: its reads
// are bounded by prepareTimeout, after which it answers a plain
// (retryable) error, having sent nothing, and frees the payer's
// reservation and the authorization's place in flight. A settle of the
// same payment that joined it and gives up meanwhile is told nothing was
// sent (a plain error), not that the outcome is unknown.
func TestSettleBeforeItsSendIsBounded(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	st := newStalledReads(e.d.Client())
	st.estimate = true
	f, err := newFacilitator(Config{Chain: st, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	f.prepareTimeout = 2 * time.Second
	p := mustSignExact(t, payer, req)
	from := crypto.PubkeyToAddress(payer.PublicKey)

	noDeadline, stop := context.WithCancel(context.Background())
	defer stop()
	leader := make(chan error, 1)
	go func() {
		_, err := f.Settle(noDeadline, p, req)
		leader <- err
	}()
	waitFor(t, st.stalled, "the settle's gas estimate")
	if _, n := f.budget.committed(e.d.Token(), from, nil); n != 1 {
		t.Fatalf("in flight = %d, want the stalled settle's", n)
	}

	jctx, jcancel := context.WithCancel(context.Background())
	joiner := make(chan error, 1)
	go func() {
		_, err := f.Settle(jctx, p, req)
		joiner <- err
	}()
	waitJoined(t, f, 1)
	jcancel()
	var unknown *x402.UnknownOutcomeError
	if err := waitFor(t, joiner, "the joined settle"); err == nil || errors.As(err, &unknown) {
		t.Errorf("a joined settle that gave up before anything was sent = %v; want a plain error, not an unknown outcome", err)
	}

	err = waitFor(t, leader, "a settle whose endpoint stalls")
	if err == nil || errors.As(err, &unknown) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a settle whose endpoint stalled before its send = %v; want a plain error past its deadline", err)
	}
	if _, n := f.budget.committed(e.d.Token(), from, nil); n != 0 {
		t.Errorf("in flight after the settle ended = %d, want 0", n)
	}
	f.inflightMu.Lock()
	left := len(f.inflight)
	f.inflightMu.Unlock()
	if left != 0 {
		t.Errorf("%d settlements still in flight", left)
	}
}

// The wait for the relayer's turn is part of the work before the send:
// while another settlement's send stalls (holding the relayer for up to
// submitTimeout), a settle on a context without a deadline gives up at its
// own prepareTimeout, having sent nothing, with a plain error.
func TestSettleWaitForTheRelayerIsBounded(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	stall := newStalledSends(e.d.Client())
	defer stall.releaseSends()
	f, err := newFacilitator(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	f.prepareTimeout = 2 * time.Second
	first := make(chan error, 1)
	go func() {
		_, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
		first <- err
	}()
	stall.waitStalled(t)

	second := make(chan error, 1)
	go func() {
		_, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
		second <- err
	}()
	var unknown *x402.UnknownOutcomeError
	if err := waitFor(t, second, "a settle waiting for the relayer"); err == nil || errors.As(err, &unknown) || !errors.Is(err, context.DeadlineExceeded) ||
		!strings.Contains(err.Error(), "waiting for the account's earlier transactions") {
		t.Errorf("a settle waiting for a relayer held by a stalled send = %v; want a plain error past its deadline", err)
	}
	stall.releaseSends()
	if err := waitFor(t, first, "the stalled send's settle"); err != nil {
		t.Errorf("the settle whose send stalled = %v", err)
	}
}

// Verify on a context without a deadline ends when its RPC endpoint
// stalls: an error (retryable) after prepareTimeout.
func TestVerifyIsBounded(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	st := newStalledReads(e.d.Client())
	st.calls = true
	f, err := newFacilitator(Config{Chain: st, Network: DevnetNetwork, RelayerKey: DevKey(0)}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	f.prepareTimeout = time.Second
	done := make(chan error, 1)
	go func() {
		_, err := f.Verify(context.Background(), mustSignExact(t, payer, req), req)
		done <- err
	}()
	if err := waitFor(t, done, "a verify whose endpoint stalls"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a verify whose endpoint stalled = %v; want an error past its deadline", err)
	}
}

// slowNonce is a fake chain: the devnet's client, except that the first
// PendingNonceAt stalls for delay (an RPC endpoint slow to answer), which
// submit runs after taking the relayer's lock, under the settle's own
// context and submitTimeout, not under prepareTimeout.
type slowNonce struct {
	Chain
	delay time.Duration
	once  sync.Once
}

func (c *slowNonce) PendingNonceAt(ctx context.Context, a common.Address) (uint64, error) {
	c.once.Do(func() {
		select {
		case <-time.After(c.delay):
		case <-ctx.Done():
		}
	})
	return c.Chain.PendingNonceAt(ctx, a)
}

// A settle that joined another of the same authorization and whose
// deadline ends first is told that nothing was sent only if its leader
// then sends nothing: the leader's reads before the send, the nonce read
// after it takes the relayer's lock included, end with its prepareTimeout,
// which began before the joiner's settle. Here that nonce read stalls past
// the leader's prepareTimeout and past the joiner's deadline (twice the
// prepareTimeout, begun later); whatever the joiner is told must be true
// on chain once the leader is done.
func TestJoinerToldNothingSentOnlyIfItsLeaderSendsNothing(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	sn := &slowNonce{Chain: e.d.Client(), delay: 1500 * time.Millisecond}
	f, err := newFacilitator(Config{Chain: sn, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, &nonceSet{})
	if err != nil {
		t.Fatal(err)
	}
	f.prepareTimeout = 300 * time.Millisecond
	before, err := e.d.Client().NonceAt(ctx, f.Relayer(), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := mustSignExact(t, payer, req)
	leader := settleAsync(ctx, f, p, req)
	waitFor := time.Now().Add(hangGuard)
	for {
		f.inflightMu.Lock()
		n := len(f.inflight)
		f.inflightMu.Unlock()
		if n > 0 || time.Now().After(waitFor) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	jctx, cancel := context.WithTimeout(ctx, 600*time.Millisecond)
	defer cancel()
	jr, jerr := f.Settle(jctx, p, req)
	l := <-leader
	t.Logf("leader = %+v, %v; joiner = %+v, %v", l.r, l.err, jr, jerr)
	var unknown *x402.UnknownOutcomeError
	if jerr == nil || errors.As(jerr, &unknown) {
		return // a success or an unknown outcome claims nothing false
	}
	if l.err == nil && l.r.Success {
		t.Fatalf("the joiner was told %v (nothing sent), but the leader sent and settled %s after the joiner gave up", jerr, l.r.Transaction)
	}
	after, err := e.d.Client().NonceAt(ctx, f.Relayer(), nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := f.Verify(ctx, p, req) // a used nonce is refused
	if err != nil {
		t.Fatal(err)
	}
	if after != before || !v.IsValid {
		t.Errorf("the joiner was told %v (nothing sent), but the relayer sent %d transactions, and the authorization verifies as %+v", jerr, after-before, v)
	}
}
