package evmfacilitator

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// lateChain is a fake for a race a real node cannot be made to lose on
// demand: the reply to the settlement's send is lost (the connection
// broke) and the transaction held back; when the resolution first looks
// the transaction up, lookup runs. It stands for a load-balanced provider
// whose nodes disagree by a block, or a transaction mined between two
// reads.
type lateChain struct {
	Chain
	lookup func(c *lateChain) (found bool)
	mu     sync.Mutex
	held   *types.Transaction
	looked bool
}

func (c *lateChain) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	c.held = tx
	c.mu.Unlock()
	return errors.New("connection reset by peer (fake)")
}

// land sends the held transaction to the devnet and waits for its receipt.
func (c *lateChain) land(t testing.TB) {
	c.mu.Lock()
	tx := c.held
	c.held = nil
	c.mu.Unlock()
	if tx == nil {
		return
	}
	if err := c.Chain.SendTransaction(context.Background(), tx); err != nil {
		t.Errorf("sending the held transaction: %v", err)
		return
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, err := c.Chain.TransactionReceipt(context.Background(), tx.Hash()); err == nil {
			return
		}
	}
	t.Errorf("the held transaction was not mined")
}

func (c *lateChain) TransactionByHash(ctx context.Context, h common.Hash) (*types.Transaction, bool, error) {
	c.mu.Lock()
	first := !c.looked
	c.looked = true
	c.mu.Unlock()
	if first && !c.lookup(c) {
		return nil, false, ethereum.NotFound
	}
	return c.Chain.TransactionByHash(ctx, h)
}

// A settlement whose send's reply was lost is resolved from the chain, and
// "the node does not know the transaction" proves nothing while it can
// still execute: the resolution answers success when the transfer landed
// (mined between the nonce read and the lookup, or right after a lookup
// that missed it), a failure only once the authorization can no longer
// execute (expired, or the relayer's nonce moved past the transaction with
// the authorization unused), and an unknown outcome otherwise, never a
// failure while money may move.
func TestLostSendIsResolvedByWhatTheChainProves(t *testing.T) {
	cases := []struct {
		desc        string
		lookup      func(t *testing.T, e *testEnv, c *lateChain) bool
		wantSuccess bool
		wantUnknown bool
		wantMoved   bool
	}{
		{desc: "mined between the nonce read and the lookup: success, by its receipt",
			lookup: func(t *testing.T, _ *testEnv, c *lateChain) bool { c.land(t); return true }, wantSuccess: true, wantMoved: true},
		{desc: "not found by the lookup, mined right after: success",
			lookup: func(t *testing.T, _ *testEnv, c *lateChain) bool { c.land(t); return false }, wantSuccess: true, wantMoved: true},
		{desc: "not found, and may still land: unknown",
			lookup: func(*testing.T, *testEnv, *lateChain) bool { return false }, wantUnknown: true},
		{desc: "not found, and the relayer's nonce moved past it: a failure",
			lookup: func(t *testing.T, e *testEnv, c *lateChain) bool {
				c.mu.Lock()
				c.held = nil // lost for good
				c.mu.Unlock()
				to := DevAccounts()[7].Address
				sendTx(t, e.d, DevKey(0), &to, nil) // takes the lost transaction's nonce
				return false
			}},
		{desc: "not found, and the authorization expired: a failure",
			lookup: func(t *testing.T, e *testEnv, c *lateChain) bool {
				c.mu.Lock()
				c.held = nil
				c.mu.Unlock()
				if err := e.d.backend.AdjustTime(2 * time.Minute); err != nil {
					t.Fatal(err)
				}
				return false
			}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			e := newEnv(t)
			lc := &lateChain{Chain: e.d.Client()}
			lc.lookup = func(c *lateChain) bool { return tc.lookup(t, e, c) }
			f, err := newFacilitator(Config{Chain: lc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: time.Second}, e.d.nonces)
			if err != nil {
				t.Fatal(err)
			}
			req := e.requirements(payee, amount)
			from := crypto.PubkeyToAddress(payer.PublicKey)
			before := usdcBalance(t, e.d, from)
			r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req)
			var unknown *x402.UnknownOutcomeError
			switch {
			case tc.wantUnknown:
				if !errors.As(err, &unknown) {
					t.Fatalf("settle = %+v, %v; want *x402.UnknownOutcomeError", r, err)
				}
			case err != nil:
				t.Fatalf("settle error %v; want an answer", err)
			case r.Success != tc.wantSuccess:
				t.Fatalf("settle = %+v; want success %v", r, tc.wantSuccess)
			case r.Success && len(common.FromHex(r.Transaction)) != common.HashLength:
				t.Fatalf("success without the transaction: %+v", r)
			case !r.Success && r.ErrorReason != x402.ReasonExactEVMTransactionFailed:
				t.Fatalf("failure %+v; want %s", r, x402.ReasonExactEVMTransactionFailed)
			}
			if moved := usdcBalance(t, e.d, from).Cmp(before) != 0; moved != tc.wantMoved {
				t.Errorf("test USDC moved = %v, want %v (settle answered %+v, %v)", moved, tc.wantMoved, r, err)
			}
		})
	}
}

// beforeSend is a fake for a race a test cannot otherwise win on demand:
// before it forwards the facilitator's send to the devnet, it runs before
// (a transaction of someone else's, mined first), as if that transaction
// had landed between the facilitator's gas estimate and the inclusion of
// its own.
type beforeSend struct {
	Chain
	before func()
	sends  int
}

func (c *beforeSend) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.sends++
	if c.before != nil {
		c.before()
	}
	return c.Chain.SendTransaction(ctx, tx)
}

// relayAuthorization submits p's authorization itself from key's account
// (anyone may: the payer's own client, another facilitator) and waits for
// it to land.
func relayAuthorization(t testing.TB, d *Devnet, key *ecdsa.PrivateKey, p x402.PaymentPayload) *types.Receipt {
	t.Helper()
	pl, err := x402.ParseExactEVMPayload(p.Payload)
	if err != nil {
		t.Fatal(err)
	}
	v, err := pl.Authorization.Values()
	if err != nil {
		t.Fatal(err)
	}
	data, err := transferCallData(v, common.FromHex(pl.Signature), false)
	if err != nil {
		t.Fatal(err)
	}
	tok := d.Token()
	r := sendTx(t, d, key, &tok, data)
	if r.Status != types.ReceiptStatusSuccessful {
		t.Fatal("relaying the authorization reverted")
	}
	return r
}

// When another account relays the same authorization first, the
// facilitator's own transaction reverts ("authorization is used"): the
// payer paid payTo, but by a settlement that is not this one, which the
// chain cannot tell from another facilitator's settle for another
// resource server (whose server serves it). So the answer is
// nonce_already_used naming the transaction that paid, never a second
// success for one transfer. (Before: success naming the relay.)
func TestSettlementOutrunByAnotherRelayIsAnotherSettlement(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	var theirs *types.Receipt
	bs := &beforeSend{Chain: e.d.Client()}
	bs.before = func() { theirs = relayAuthorization(t, e.d, DevKey(5), p) }
	f, err := newFacilitator(Config{Chain: bs, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	r, err := f.Settle(context.Background(), p, req)
	if theirs == nil {
		t.Fatal("the other relay did not run")
	}
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != theirs.TxHash.Hex() {
		t.Fatalf("settle = %+v, %v; want %s naming the relay that paid, %s", r, err, x402.ReasonExactEVMNonceAlreadyUsed, theirs.TxHash.Hex())
	}
}

// When the transaction that used the authorization first was sent by our
// own relayer key (a second facilitator instance, in another process, that
// got the same payment: a resource server's two concurrent requests behind
// a load balancer), it is a duplicate settle, not a relay by someone else:
// the one whose transaction reverted gets nonce_already_used naming the
// other instance's transaction, not a second success for one payment.
// The payment settled, so its reverted transaction is no failure of the
// payer's budget.
func TestSettlementOutrunByOurOwnRelayerIsADuplicate(t *testing.T) {
	outrun(t, DevKey(0)) // another process: the same key, nonces of its own
}

// outrun settles one payment through a facilitator of relayer 0 whose
// first send is outrun by another facilitator of otherKey settling the
// same payment (it takes the authorization's nonce first), and wants ours
// answered nonce_already_used naming the other's transaction, the payer
// charged once, and its next payment still valid (the reverted
// transaction is no failure of the payer's: MaxFailedPerPayer 1 would
// refuse it).
func outrun(t *testing.T, otherKey *ecdsa.PrivateKey) {
	t.Helper()
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	other, err := newFacilitator(Config{Chain: e.d.Client(), Network: DevnetNetwork, RelayerKey: otherKey, PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, &nonceSet{})
	if err != nil {
		t.Fatal(err)
	}
	var theirs x402.SettleResponse
	var theirsErr error
	bs := &beforeSend{Chain: e.d.Client()}
	bs.before = func() {
		if bs.sends == 1 {
			theirs, theirsErr = other.Settle(ctx, p, req)
		}
	}
	f, err := newFacilitator(Config{Chain: bs, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond,
		ReceiptTimeout: 10 * time.Second, MaxFailedPerPayer: 1, FailureWindow: time.Hour}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	r, err := f.Settle(ctx, p, req)
	if theirsErr != nil || !theirs.Success {
		t.Fatalf("the other settle = %+v, %v; want success", theirs, theirsErr)
	}
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != theirs.Transaction ||
		!strings.Contains(r.ErrorMessage, "already settled by another settle") {
		t.Fatalf("settle = %+v, %v; want %s naming the other's %s", r, err, x402.ReasonExactEVMNonceAlreadyUsed, theirs.Transaction)
	}
	if d := new(big.Int).Sub(before, usdcBalance(t, e.d, from)); d.String() != amount {
		t.Errorf("payer paid %v, want %s once", d, amount)
	}
	// With our own key, the other's transaction takes our relayer's nonce
	// too: ours is sent again and reverts.
	if otherKey.Equal(DevKey(0)) && bs.sends < 2 {
		t.Fatalf("our settlement was sent %d times; the test needs the other's to take its nonce and ours to revert", bs.sends)
	}
	if v, err := f.Verify(ctx, mustSignExact(t, payer, req), req); err != nil || !v.IsValid {
		t.Errorf("verify of the payer's next payment = %+v, %v; want valid (its payment settled)", v, err)
	}
}

// A caller retrying /settle after a lost reply, at a restarted or another
// instance, learns that its payment was already settled and by which
// transaction, and can tell that from an authorization its payer
// cancelled; both keep the reference's reason, nonce_already_used.
func TestSettlingASettledAuthorizationNamesItsTransaction(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	first, err := e.f.Settle(ctx, p, req)
	if err != nil || !first.Success {
		t.Fatalf("settle: %+v, %v", first, err)
	}
	restarted, err := e.d.NewFacilitator()
	if err != nil {
		t.Fatal(err)
	}
	r, err := restarted.Settle(ctx, p, req)
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != first.Transaction || r.Payer != first.Payer ||
		!strings.Contains(r.ErrorMessage, "already settled") {
		t.Fatalf("settling it again = %+v, %v; want %s naming %s, saying it was already settled", r, err, x402.ReasonExactEVMNonceAlreadyUsed, first.Transaction)
	}

	cancelled := mustSignExact(t, payer, req)
	spendNonce(t, e.d, "cancel", payer, cancelled, req)
	r, err = restarted.Settle(ctx, cancelled, req)
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != "" || strings.Contains(r.ErrorMessage, "settled") {
		t.Fatalf("settling a cancelled authorization = %+v, %v; want %s naming no transaction", r, err, x402.ReasonExactEVMNonceAlreadyUsed)
	}
}

// Replaying /settle of a settled authorization (anyone may: it is public
// once on chain, and the x402_facilitator handler's requests have no
// deadline) searches for the transaction that used its nonce once, under a
// deadline of its own; a replay within usedCacheTTL gets the same answer
// without searching again.
func TestReplayedSettleSearchesOnce(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	first, err := e.f.Settle(ctx, p, req)
	if err != nil || !first.Success {
		t.Fatalf("settle: %+v, %v", first, err)
	}
	spy := &logSpy{Chain: e.d.Client()}
	f, err := newFacilitator(Config{Chain: spy, Network: DevnetNetwork, RelayerKey: DevKey(0)}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		r, err := f.Settle(ctx, p, req)
		if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != first.Transaction {
			t.Fatalf("replay %d = %+v, %v; want %s naming %s", i+1, r, err, x402.ReasonExactEVMNonceAlreadyUsed, first.Transaction)
		}
		spy.mu.Lock()
		noDeadline := spy.noDeadline
		spy.mu.Unlock()
		headers, ranges := spy.reset()
		headers-- // checkTime's read of the head, which every settle makes
		switch {
		case i == 0 && (headers == 0 || len(ranges) == 0):
			t.Fatalf("the first replay read %d headers and %d log ranges; the test needs a search", headers, len(ranges))
		case i == 0 && noDeadline != 0:
			t.Fatalf("the first replay's search made %d reads without a deadline", noDeadline)
		case i > 0 && (headers != 0 || len(ranges) != 0):
			t.Fatalf("replay %d searched again: %d headers, %d log ranges", i+1, headers, len(ranges))
		}
	}
}

// failingLogs is a fake chain: the devnet's client, except that
// eth_getLogs fails while broken is set, as a provider rate-limiting
// (429) or timing out does.
type failingLogs struct {
	Chain
	mu     sync.Mutex
	broken bool
}

func (c *failingLogs) setBroken(b bool) {
	c.mu.Lock()
	c.broken = b
	c.mu.Unlock()
}

func (c *failingLogs) FilterLogs(ctx context.Context, q ethereum.FilterQuery) ([]types.Log, error) {
	c.mu.Lock()
	b := c.broken
	c.mu.Unlock()
	if b {
		return nil, errors.New("429 Too Many Requests")
	}
	return c.Chain.FilterLogs(ctx, q)
}

// A retry of /settle after a lost reply, for a payment that settled, is
// never told that its authorization was cancelled or spent elsewhere (a
// plain nonce_already_used: "sign a new payment") because the search for
// the transaction that used the nonce failed: that is an unknown outcome
// (do not pay again, retry later), and it is not remembered, so the next
// retry, once the provider answers, is told which transaction settled it.
func TestFailedUsedSearchIsUnknownAndNotRemembered(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	fl := &failingLogs{Chain: e.d.Client()}
	f, err := newFacilitator(Config{Chain: fl, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	p := mustSignExact(t, payer, req)
	first, err := f.Settle(ctx, p, req)
	if err != nil || !first.Success {
		t.Fatalf("settle = %+v, %v", first, err)
	}

	fl.setBroken(true)
	r, err := f.Settle(ctx, p, req) // the retry after a lost reply
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || r.Success || r.ErrorReason != "" {
		t.Errorf("a retry while the search fails = %+v, %v; want an unknown outcome, not a refusal", r, err)
	}

	fl.setBroken(false)
	r, err = f.Settle(ctx, p, req) // the provider is back, within usedCacheTTL
	if err != nil || r.Success || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || r.Transaction != first.Transaction {
		t.Errorf("a retry once the search works = %+v, %v; want %s naming %s (a failed search must not be remembered)", r, err, x402.ReasonExactEVMNonceAlreadyUsed, first.Transaction)
	}
}
