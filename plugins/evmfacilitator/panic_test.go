package evmfacilitator

import (
	"bytes"
	"context"
	"errors"
	"math/big"
	"testing"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// panickingChain is a fake chain for a fault a real client cannot be made
// to have: the devnet's client, except that the token's balanceOf read
// (balance) or the gas estimate (after release is closed) panics, as a
// chain client's bug would; the HTTP server recovers such a panic and the
// process goes on.
type panickingChain struct {
	Chain
	balance bool
	arrived chan struct{} // closed when the estimate waits for release
	release chan struct{}
}

func (c *panickingChain) CallContract(ctx context.Context, msg ethereum.CallMsg, block *big.Int) ([]byte, error) {
	if c.balance && bytes.HasPrefix(msg.Data, tokenABI.Methods["balanceOf"].ID) {
		panic("a chain client's bug")
	}
	return c.Chain.CallContract(ctx, msg, block)
}

func (c *panickingChain) EstimateGas(ctx context.Context, msg ethereum.CallMsg) (uint64, error) {
	if c.release != nil {
		close(c.arrived)
		<-c.release
		panic("a chain client's bug")
	}
	return c.Chain.EstimateGas(ctx, msg)
}

// settleRecovering settles p, recovering a panic (as the HTTP server
// does), and reports whether it panicked.
func settleRecovering(f *Facilitator, p x402.PaymentPayload, req x402.PaymentRequirements) (panicked bool) {
	defer func() { panicked = recover() != nil }()
	_, _ = f.Settle(context.Background(), p, req)
	return false
}

// A settle that panics while it holds the payer's amount in flight (a read
// after checkChain held it) releases it and leaves the authorization free
// to settle: a panic must not lock the payer's balance, or the payment,
// out for the life of the process.
func TestSettlePanicInChecksReleasesItsHold(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	pc := &panickingChain{Chain: e.d.Client(), balance: true}
	f, err := newFacilitator(Config{Chain: pc, Network: DevnetNetwork, RelayerKey: DevKey(0)}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan bool, 1)
	go func() { done <- settleRecovering(f, mustSignExact(t, payer, req), req) }()
	if !waitFor(t, done, "the panicking settle") {
		t.Fatal("the settle did not panic; the test needs it to")
	}
	if _, n := f.budget.committed(e.d.Token(), crypto.PubkeyToAddress(payer.PublicKey), nil); n != 0 {
		t.Errorf("after a panic in the checks, %d of the payer's settlements are still held in flight", n)
	}
	f.inflightMu.Lock()
	left := len(f.inflight)
	f.inflightMu.Unlock()
	if left != 0 {
		t.Errorf("after a panic, %d authorizations are still in flight", left)
	}
}

// A settle that joined one whose leader panics before sending is told so,
// with an error (nothing was sent), instead of waiting for good or being
// answered an empty response.
func TestSettlePanicAnswersItsWaiters(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	pc := &panickingChain{Chain: e.d.Client(), arrived: make(chan struct{}), release: make(chan struct{})}
	f, err := newFacilitator(Config{Chain: pc, Network: DevnetNetwork, RelayerKey: DevKey(0)}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	p := mustSignExact(t, payer, req)
	leader := make(chan bool, 1)
	go func() { leader <- settleRecovering(f, p, req) }()
	waitFor(t, pc.arrived, "the leader's gas estimate")
	type result struct {
		r   x402.SettleResponse
		err error
	}
	joiner := make(chan result, 1)
	go func() {
		r, err := f.Settle(context.Background(), p, req)
		joiner <- result{r, err}
	}()
	waitJoined(t, f, 1)
	close(pc.release)
	if !waitFor(t, leader, "the panicking leader") {
		t.Fatal("the leader did not panic; the test needs it to")
	}
	j := waitFor(t, joiner, "the settle that joined a panicking one")
	var unknown *x402.UnknownOutcomeError
	if j.err == nil || errors.As(j.err, &unknown) || j.r.Success {
		t.Errorf("the settle that joined a leader which panicked before sending = %+v, %v; want an error saying nothing was sent", j.r, j.err)
	}
	f.inflightMu.Lock()
	left := len(f.inflight)
	f.inflightMu.Unlock()
	if left != 0 {
		t.Errorf("after a panic, %d authorizations are still in flight", left)
	}
}
