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
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// slowNonceTooLow holds the first SendTransaction until release is closed,
// then answers it "nonce too low" (another process of the relayer key took
// that nonce meanwhile); every later send goes to the chain.
type slowNonceTooLow struct {
	Chain
	mu      sync.Mutex
	first   *types.Transaction
	entered chan struct{}
	release chan struct{}
	sends   []*types.Transaction
	answer  error // the first send's answer; nil: "nonce too low"
}

func (c *slowNonceTooLow) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	c.sends = append(c.sends, tx)
	isFirst := c.first == nil
	if isFirst {
		c.first = tx
	}
	c.mu.Unlock()
	if isFirst {
		close(c.entered)
		<-c.release
		if c.answer != nil {
			return c.answer
		}
		return nodeError{code: -32000, msg: "nonce too low: next nonce " + "x" + ", tx nonce y"}
	}
	return c.Chain.SendTransaction(ctx, tx)
}

// A settlement transaction is kept from the moment it is signed. When
// its send is answered "nonce too low" (another process of the key used
// the nonce), submit signs the authorization again with the next nonce
// and sends that, which settles the payment. A retry that finds the first
// signed transaction kept in between (a caller told "unknown" because the
// send had been signed, retrying through another facilitator of the key)
// must not conclude from it that nothing was transferred while that send
// is outstanding: it is answered unknown, and the payment then settles.
// (Before: the retry was answered invalid_exact_evm_transaction_failed,
// "nothing was transferred", and the payment was charged a moment later.)
func TestRetryWhileTheSignedSendIsOutstandingIsNotToldNothingTransferred(t *testing.T) {
	e := newEnv(t)
	sc := &slowNonceTooLow{Chain: e.d.Client(), entered: make(chan struct{}), release: make(chan struct{})}
	f, f2, p, req, leader := sendHeldAndJoined(t, e, sc)
	// Another process of the relayer key uses the nonce the held send has.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sc.mu.Lock()
	n := sc.first.Nonce()
	sc.mu.Unlock()
	to := common.Address{0x42}
	other, err := types.SignNewTx(DevKey(0), types.LatestSignerForChainID(big.NewInt(DevnetChainID)), &types.DynamicFeeTx{
		ChainID: big.NewInt(DevnetChainID), Nonce: n, GasTipCap: big.NewInt(2e9), GasFeeCap: big.NewInt(100e9), Gas: 21000, To: &to,
	})
	if err != nil {
		t.Fatal(err)
	}
	if crypto.PubkeyToAddress(DevKey(0).PublicKey) != f.relayer {
		t.Fatal("relayer is not DevKey(0)")
	}
	if err := e.d.Client().SendTransaction(ctx, other); err != nil {
		t.Fatal(err)
	}
	waitMined(t, e, other.Hash())
	// The caller told "unknown" retries through another facilitator of the key.
	r, rerr := f2.Settle(context.Background(), p, req)
	t.Logf("retry = success=%v reason=%q msg=%q tx=%s err=%v", r.Success, r.ErrorReason, r.ErrorMessage, r.Transaction, rerr)
	close(sc.release)
	o := <-leader
	t.Logf("leader = success=%v reason=%q tx=%s err=%v", o.r.Success, o.r.ErrorReason, o.r.Transaction, o.err)
	if o.err != nil || !o.r.Success {
		t.Fatalf("the settle signed again with the next nonce: %+v, %v; want success", o.r, o.err)
	}
	if rerr == nil && !r.Success && r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed {
		t.Errorf("the payment settled (%s), yet the retry was answered a definite failure %q: %s", o.r.Transaction, r.ErrorReason, r.ErrorMessage)
	}
}

// Kept at signing, the transaction a send is still waiting on can be
// resolved by a retry (a caller told "unknown" since the send was signed,
// retrying through another facilitator of the key), which sends it again
// (rebroadcast), and the node takes it. The first send is then refused
// transiently ("txpool is full", as a provider's pool answers): the settle
// that sent it must not answer as if nothing was sent, since the very
// transaction it signed may be (here: is) mined: it is answered from the
// chain, as after an unanswered send. (Before: it returned the plain
// error "sending: txpool is full", which the gateway reads as not
// charged, and gave the nonce back, while its transaction paid.)
func TestSendRefusedAfterARetrySentTheSameTransactionIsUnknown(t *testing.T) {
	e := newEnv(t)
	sc := &slowNonceTooLow{Chain: e.d.Client(), entered: make(chan struct{}), release: make(chan struct{}),
		answer: nodeError{code: -32000, msg: "txpool is full"}}
	_, f2, p, req, leader := sendHeldAndJoined(t, e, sc)
	r, rerr := f2.Settle(context.Background(), p, req)
	t.Logf("retry = success=%v reason=%q tx=%s err=%v", r.Success, r.ErrorReason, r.Transaction, rerr)
	sc.mu.Lock()
	first := sc.first
	sc.mu.Unlock()
	waitMined(t, e, first.Hash())
	close(sc.release)
	o := <-leader
	t.Logf("sender = success=%v reason=%q tx=%s err=%v", o.r.Success, o.r.ErrorReason, o.r.Transaction, o.err)
	rcpt := waitMined(t, e, first.Hash())
	var ue *x402.UnknownOutcomeError
	if rcpt.Status == types.ReceiptStatusSuccessful && o.err != nil && !errors.As(o.err, &ue) {
		t.Errorf("the settle's own transaction %s was mined and paid, yet it answered %v (not an unknown outcome)", first.Hash().Hex(), o.err)
	}
	// A later settle of the same authorization is told it was settled by
	// that transaction.
	r3, err3 := f2.Settle(context.Background(), p, req)
	if err3 != nil || r3.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r3.Transaction != first.Hash().Hex() {
		t.Errorf("later retry = %+v, %v; want %s naming %s", r3, err3, x402.ReasonExactEVMNonceAlreadyUsed, first.Hash().Hex())
	}
}

// sendHeldAndJoined settles a payment through one of two facilitators of
// the relayer key on sc, whose first send sc holds, and has a caller
// joining that settle, whose deadline ends, told "unknown" (the
// transaction was signed). It returns both facilitators, the payment and
// the leader's outcome to come.
func sendHeldAndJoined(t *testing.T, e *testEnv, sc *slowNonceTooLow) (f, f2 *Facilitator, p x402.PaymentPayload, req x402.PaymentRequirements, leader <-chan settled) {
	t.Helper()
	f, f2 = twinFacilitators(t, sc)
	req = e.requirements(payee, amount)
	p = mustSignExact(t, payer, req)
	leader = settleAsync(context.Background(), f, p, req)
	select {
	case <-sc.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the settle never sent")
	}
	jctx, jcancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer jcancel()
	var ue *x402.UnknownOutcomeError
	if _, err := f.Settle(jctx, p, req); !errors.As(err, &ue) {
		t.Fatalf("joined settle: %v; want unknown", err)
	}
	return f, f2, p, req, leader
}
