package evmfacilitator

import (
	"context"
	"errors"
	"math/big"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/core/types"

	"github.com/aovhq/aov/x402"
)

// hangGuard is how long a test waits for a call that must not block on
// another's stalled send before it reports the call as blocked. It is a
// liveness guard, not a speed requirement: the calls it waits for make no
// chain call that can stall, and take milliseconds.
const hangGuard = 20 * time.Second

// stalledSends is a fake chain: the devnet's client, except that
// SendTransaction stalls, as behind an RPC endpoint that accepted the
// connection and never answers, until its context ends or the test calls
// release. It records whether the stalled send had a deadline.
type stalledSends struct {
	Chain
	stalled chan struct{} // closed when the first send stalls
	release chan struct{} // closed by release
	// lose: a released send reports success without sending, as an
	// endpoint that took the transaction and lost it.
	lose bool

	once        sync.Once
	hasDeadline bool      // written before stalled is closed
	deadline    time.Time // written before stalled is closed
	releaseOnce sync.Once
}

func newStalledSends(c Chain) *stalledSends {
	return &stalledSends{Chain: c, stalled: make(chan struct{}), release: make(chan struct{})}
}

func (c *stalledSends) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.once.Do(func() {
		c.deadline, c.hasDeadline = ctx.Deadline()
		close(c.stalled)
	})
	select {
	case <-c.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	if c.lose {
		return nil
	}
	return c.Chain.SendTransaction(ctx, tx)
}

func (c *stalledSends) releaseSends() { c.releaseOnce.Do(func() { close(c.release) }) }

// waitStalled waits for the first send to stall.
func (c *stalledSends) waitStalled(t *testing.T) {
	t.Helper()
	select {
	case <-c.stalled:
	case <-time.After(hangGuard):
		t.Fatal("the settlement never reached its send")
	}
}

// queuedThenCancelled is the devnet's client that ends the settle's context
// just after the settlement has read its fees (its last chain read before
// it takes the relayer's nonce lock), as a caller's deadline passing while
// its settlement waits behind another's. It counts the sends it is asked
// for.
type queuedThenCancelled struct {
	Chain
	cancel context.CancelFunc
	sends  atomic.Int32
}

func (c *queuedThenCancelled) SuggestGasTipCap(ctx context.Context) (*big.Int, error) {
	tip, err := c.Chain.SuggestGasTipCap(ctx)
	time.AfterFunc(20*time.Millisecond, c.cancel)
	return tip, err
}

func (c *queuedThenCancelled) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.sends.Add(1)
	return c.Chain.SendTransaction(ctx, tx)
}

// TestSettleWaitingForTheRelayerEndsWithItsContext: every facilitator of a
// relayer key shares its nonce lock, whatever its RPC endpoint. While one
// settlement's send stalls on its endpoint, another facilitator's settle
// whose context ends must return with its context's error, having sent
// nothing, as an error that says so (not an unknown outcome), rather than
// wait for the stalled endpoint. The stalled settlement then goes on.
func TestSettleWaitingForTheRelayerEndsWithItsContext(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	stall := newStalledSends(e.d.Client())
	defer stall.releaseSends()
	slow, err := New(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		r   x402.SettleResponse
		err error
	}
	slowPay, otherPay := mustSignExact(t, payer, req), mustSignExact(t, DevKey(3), req)
	slowDone := make(chan result, 1)
	go func() {
		r, err := slow.Settle(context.Background(), slowPay, req)
		slowDone <- result{r, err}
	}()
	stall.waitStalled(t)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	queued := &queuedThenCancelled{Chain: e.d.Client(), cancel: cancel}
	other, err := New(Config{Chain: queued, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	otherDone := make(chan result, 1)
	go func() {
		r, err := other.Settle(ctx, otherPay, req)
		otherDone <- result{r, err}
	}()
	select {
	case got := <-otherDone:
		var unknown *x402.UnknownOutcomeError
		switch {
		case !errors.Is(got.err, context.Canceled):
			t.Errorf("settle waiting for the relayer = %+v, %v; want its context's error", got.r, got.err)
		case errors.As(got.err, &unknown):
			t.Errorf("settle that sent nothing reported an unknown outcome: %v", got.err)
		case got.r.Success || got.r.Transaction != "":
			t.Errorf("settle that sent nothing answered %+v", got.r)
		}
	case <-time.After(hangGuard):
		t.Error("a settle whose context ended is still waiting for another facilitator's stalled send")
	}
	if n := queued.sends.Load(); n != 0 {
		t.Errorf("the cancelled settle sent %d transactions", n)
	}

	stall.releaseSends()
	if got := <-slowDone; got.err != nil || !got.r.Success {
		t.Fatalf("the stalled settlement, released = %+v, %v", got.r, got.err)
	}
	// The relayer's lock and nonce are as good as before.
	if r, err := e.f.Settle(context.Background(), mustSignExact(t, DevKey(4), req), req); err != nil || !r.Success {
		t.Fatalf("a settle after = %+v, %v", r, err)
	}
}

// TestRelayerSendHasItsOwnDeadline: a settlement holds the relayer's nonce
// lock, which every facilitator of the key shares, while it sends. Called
// with no deadline (x402_facilitator settles on the HTTP request's
// context), a send to a stalled endpoint would hold it for ever; it must
// have a deadline of its own, no later than submitTimeout.
func TestRelayerSendHasItsOwnDeadline(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	stall := newStalledSends(e.d.Client())
	defer stall.releaseSends()
	f, err := New(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	pay := mustSignExact(t, payer, req)
	done := make(chan error, 1)
	go func() {
		_, err := f.Settle(context.Background(), pay, req)
		done <- err
	}()
	stall.waitStalled(t)
	switch {
	case !stall.hasDeadline:
		t.Error("a settlement's send, called without a deadline, has none: a stalled endpoint holds the relayer for ever")
	case stall.deadline.After(time.Now().Add(submitTimeout)):
		t.Errorf("the send's deadline is %v away, past submitTimeout %v", time.Until(stall.deadline), submitTimeout)
	}
	stall.releaseSends()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestDevnetStartDuringAStalledSendWaitsForNothing: a devnet started while
// a send of the relayer on another devnet stalls must not wait for it: a
// facilitator's Provision (New) during a reload and the devnet's start
// itself would stall for as long as the send does. The new chain's
// settlements read its own nonce, not the one the stalled send moves on.
func TestDevnetStartDuringAStalledSendWaitsForNothing(t *testing.T) {
	a, err := StartDevnet(DevnetConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	// Account 0's cached nonce runs ahead of any fresh chain.
	fa, err := New(Config{Chain: a.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	reqA := (&testEnv{d: a}).requirements(payee, amount)
	if r, err := fa.Settle(context.Background(), mustSignExact(t, payer, reqA), reqA); err != nil || !r.Success {
		t.Fatalf("settle on the first devnet = %+v, %v", r, err)
	}

	stall := newStalledSends(a.Client())
	// Released, the send is taken as sent: the cached nonce moves on,
	// ahead of the new chain, unless the forgetting is applied after it.
	stall.lose = true
	defer stall.releaseSends()
	slow, err := New(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	slowDone := make(chan error, 1)
	pay := mustSignExact(t, payer, reqA)
	go func() {
		_, err := slow.Settle(context.Background(), pay, reqA)
		slowDone <- err
	}()
	stall.waitStalled(t)
	a.Close()

	type started struct {
		d   *Devnet
		f   *Facilitator
		err error
	}
	done := make(chan started, 1)
	go func() {
		d, err := StartDevnet(DevnetConfig{})
		if err != nil {
			done <- started{err: err}
			return
		}
		f, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second})
		done <- started{d, f, err}
	}()
	var s started
	select {
	case s = <-done:
	case <-time.After(hangGuard):
		t.Error("starting a devnet and making a facilitator wait for another facilitator's stalled send")
		stall.releaseSends()
		s = <-done
	}
	if s.d != nil {
		defer s.d.Close()
	}
	if s.err != nil {
		t.Fatal(s.err)
	}
	if identified(t, s.f) == fa.knownNonces() {
		t.Fatal("the facilitator made on the new devnet takes the closed devnet's nonces")
	}
	stall.releaseSends()
	if err := <-slowDone; err == nil {
		t.Error("the lost settlement on the closed devnet succeeded")
	}
	req := (&testEnv{d: s.d}).requirements(payee, amount)
	if r, err := s.f.Settle(context.Background(), mustSignExact(t, payer, req), req); err != nil || !r.Success {
		t.Fatalf("settle on the new devnet = %+v, %v", r, err)
	}
}
