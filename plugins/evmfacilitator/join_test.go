package evmfacilitator

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math/big"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// stalledHeads is a fake chain for an order a test cannot otherwise force:
// the devnet's client, except that HeaderByNumber stalls for the calls
// whose context carries stallMark (the first chain read of a check,
// checkTime's), until the test calls release.
type stalledHeads struct {
	Chain
	stalled     chan struct{} // closed when the first marked read stalls
	release     chan struct{}
	once        sync.Once
	releaseOnce sync.Once
}

type stallMarkKey struct{}

// stallMark marks a context whose head reads stall on a stalledHeads.
func stallMark(ctx context.Context) context.Context {
	return context.WithValue(ctx, stallMarkKey{}, true)
}

func (c *stalledHeads) HeaderByNumber(ctx context.Context, n *big.Int) (*types.Header, error) {
	if ctx.Value(stallMarkKey{}) != nil {
		c.once.Do(func() { close(c.stalled) })
		<-c.release
	}
	return c.Chain.HeaderByNumber(ctx, n)
}

func (c *stalledHeads) releaseHeads() { c.releaseOnce.Do(func() { close(c.release) }) }

// mismatches are requirements a payment signed for req does not meet, each
// with the refusal it deserves.
func mismatches(req x402.PaymentRequirements) []struct {
	name, reason string
	req          x402.PaymentRequirements
} {
	more, elsewhere, otherNet, renamed := req, req, req, req
	more.Amount = req.Amount + "0" // ten times the signed value
	elsewhere.PayTo = other.Hex()
	otherNet.Network = "eip155:8453"
	renamed.Extra = map[string]any{"name": "USD Coin", "version": "3"}
	return []struct {
		name, reason string
		req          x402.PaymentRequirements
	}{
		{"ten times the amount", x402.ReasonExactEVMValueMismatch, more},
		{"another payTo", x402.ReasonExactEVMRecipientMismatch, elsewhere},
		{"another network", x402.ReasonExactEVMNetworkMismatch, otherNet},
		{"another EIP-712 domain", x402.ReasonExactEVMSignature, renamed},
	}
}

// A settle whose requirements the authorization does not meet, sent while
// a valid settle of that authorization is in flight (stalled at its send),
// is refused at once with the reason its own requirements deserve and no
// transaction: it is judged before it may join the settlement in flight,
// which would answer it with that settlement's success. The valid settle
// then lands as usual, once.
func TestJoinedSettleIsJudgedByItsOwnRequirements(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	stall := newStalledSends(e.d.Client())
	defer stall.releaseSends()
	f, err := newFacilitator(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 30 * time.Second}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	relayerNonce, _ := e.d.Client().NonceAt(ctx, f.Relayer(), nil)
	p := mustSignExact(t, payer, req)

	valid := settleAsync(ctx, f, p, req)
	stall.waitStalled(t)

	for _, m := range mismatches(req) {
		done := settleAsync(ctx, f, p, m.req)
		var got settled
		select {
		case got = <-done:
		case <-time.After(hangGuard):
			// It joined the settlement in flight: let that finish to
			// show what it was answered.
			stall.releaseSends()
			got = <-done
			t.Errorf("%s: the settle waited for the valid one in flight", m.name)
		}
		if got.err != nil || got.r.Success || got.r.ErrorReason != m.reason || got.r.Transaction != "" {
			t.Errorf("%s, while a valid settle is in flight: %+v, %v; want refused with %s and no transaction", m.name, got.r, got.err, m.reason)
		}
	}

	stall.releaseSends()
	got := <-valid
	if got.err != nil || !got.r.Success {
		t.Fatalf("the valid settle = %+v, %v", got.r, got.err)
	}
	if d := new(big.Int).Sub(before, usdcBalance(t, e.d, from)); d.String() != amount {
		t.Errorf("payer paid %v, want %s once", d, amount)
	}
	if after, _ := e.d.Client().NonceAt(ctx, f.Relayer(), nil); after != relayerNonce+1 {
		t.Errorf("relayer sent %d transactions, want 1", after-relayerNonce)
	}
}

// A settle whose requirements the authorization does not meet, arriving
// first and still being checked (stalled at its first chain read), does not
// lead the valid settles of that authorization that follow: they do not
// wait for it and are not answered with its refusal. They settle, sending
// one transaction and sharing its outcome; it is refused.
func TestMismatchedSettleDoesNotLeadValidOnes(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	stall := &stalledHeads{Chain: e.d.Client(), stalled: make(chan struct{}), release: make(chan struct{})}
	defer stall.releaseHeads()
	f, err := newFacilitator(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 30 * time.Second}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	relayerNonce, _ := e.d.Client().NonceAt(ctx, f.Relayer(), nil)
	p := mustSignExact(t, payer, req)
	more := req
	more.Amount = amount + "0"

	first := settleAsync(stallMark(ctx), f, p, more)
	select {
	case <-stall.stalled:
	case <-time.After(hangGuard):
		t.Fatal("the mismatched settle never read the chain head")
	}

	const n = 4
	res := make([]settled, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := f.Settle(ctx, p, req)
			res[i] = settled{r, err}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(hangGuard):
		t.Error("the valid settles waited for the mismatched one")
		stall.releaseHeads()
		<-done
	}
	hashes := map[string]bool{}
	for i, got := range res {
		switch {
		case got.err != nil:
			t.Errorf("valid settle %d: %v", i, got.err)
		case got.r.Success:
			hashes[got.r.Transaction] = true
		case got.r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed:
			t.Errorf("valid settle %d = %+v; want success (or, once settled, nonce already used)", i, got.r)
		}
	}
	if len(hashes) != 1 {
		t.Errorf("the valid settles report %d distinct transactions, want 1", len(hashes))
	}
	if after, _ := e.d.Client().NonceAt(ctx, f.Relayer(), nil); after != relayerNonce+1 {
		t.Errorf("relayer sent %d transactions, want 1", after-relayerNonce)
	}

	stall.releaseHeads()
	if got := <-first; got.err != nil || got.r.Success || got.r.ErrorReason != x402.ReasonExactEVMValueMismatch || got.r.Transaction != "" {
		t.Errorf("the mismatched settle = %+v, %v; want refused with %s", got.r, got.err, x402.ReasonExactEVMValueMismatch)
	}
}

// A settle refused for its requirements sends nothing, so it takes no
// place in flight and counts no failure against the payer's budget: with
// a budget of one settlement in flight and one failure, mismatched settles
// sent before, during and after a valid one (holding the payer's only
// place) are refused for what they are, never for the budget, and the
// payer's next payment settles.
func TestMismatchedSettleCostsThePayerNoBudget(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	stall := newStalledSends(e.d.Client())
	defer stall.releaseSends()
	f, err := newFacilitator(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond,
		ReceiptTimeout: 30 * time.Second, MaxFailedPerPayer: 1, MaxInFlightPerPayer: 1}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	from := crypto.PubkeyToAddress(payer.PublicKey)
	p := mustSignExact(t, payer, req)
	refuseAll := func(when string) {
		t.Helper()
		for _, m := range mismatches(req) {
			for range 3 {
				r, err := f.Settle(ctx, p, m.req)
				if err != nil || r.Success || r.ErrorReason != m.reason {
					t.Fatalf("%s, %s: %+v, %v; want refused with %s", m.name, when, r, err, m.reason)
				}
			}
		}
	}
	budgetOf := func() (inFlight, failures int) {
		f.budget.mu.Lock()
		defer f.budget.mu.Unlock()
		if id := f.budget.ids[from]; id != nil {
			return len(id.flights), len(id.failures)
		}
		return 0, 0
	}

	refuseAll("before the valid settle")
	if in, failed := budgetOf(); in != 0 || failed != 0 {
		t.Fatalf("after mismatched settles only, the payer has %d in flight and %d failures", in, failed)
	}

	valid := make(chan error, 1)
	go func() {
		r, err := f.Settle(ctx, p, req)
		if err == nil && !r.Success {
			t.Errorf("the valid settle = %+v", r)
		}
		valid <- err
	}()
	stall.waitStalled(t)
	refuseAll("while the valid settle holds the payer's only place in flight")
	if in, failed := budgetOf(); in != 1 || failed != 0 {
		t.Fatalf("during the valid settle, the payer has %d in flight and %d failures; want 1 and 0", in, failed)
	}
	stall.releaseSends()
	if err := <-valid; err != nil {
		t.Fatal(err)
	}
	refuseAll("after the valid settle")
	if in, failed := budgetOf(); in != 0 || failed != 0 {
		t.Fatalf("after, the payer has %d in flight and %d failures", in, failed)
	}
	if r, err := f.Settle(ctx, mustSignExact(t, payer, req), req); err != nil || !r.Success {
		t.Fatalf("the payer's next payment = %+v, %v; want success", r, err)
	}
}

// A contract account's signature only the chain can judge (EIP-1271), so
// a settle carrying one the wallet refuses, for an authorization a valid
// settle is settling, is judged on its own: refused for its signature,
// not answered with the valid settle's success.
func TestWalletSignatureIsJudgedBeforeSharingASettlement(t *testing.T) {
	e := newEnv(t)
	owner := DevKey(4)
	wallet := deployWallet(t, e.d, crypto.PubkeyToAddress(owner.PublicKey))
	fundUSDC(t, e.d, DevKey(5), wallet, 1_000_000)
	stall := newStalledSends(e.d.Client())
	defer stall.releaseSends()
	f, err := newFacilitator(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 30 * time.Second}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := e.requirements(payee, amount)
	a := auth(owner, req)
	a.From = wallet.Hex()
	good, forged := sign(t, owner, a, req, req), sign(t, DevKey(6), a, req, req)

	valid := settleAsync(ctx, f, good, req)
	stall.waitStalled(t)
	done := settleAsync(ctx, f, forged, req)
	var got settled
	select {
	case got = <-done:
	case <-time.After(hangGuard):
		stall.releaseSends()
		got = <-done
		t.Error("the forged settle waited for the valid one in flight")
	}
	if got.err != nil || got.r.Success || got.r.ErrorReason != x402.ReasonExactEVMSignature || got.r.Transaction != "" {
		t.Errorf("a signature the wallet refuses, while a valid settle is in flight: %+v, %v; want refused with %s", got.r, got.err, x402.ReasonExactEVMSignature)
	}
	stall.releaseSends()
	if got := <-valid; got.err != nil || !got.r.Success {
		t.Fatalf("the valid settle = %+v, %v", got.r, got.err)
	}
}

// waitJoined waits until n settles have joined a settlement in flight of f.
func waitJoined(t *testing.T, f *Facilitator, n int) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		f.inflightMu.Lock()
		joined := 0
		for _, call := range f.inflight {
			joined += call.waiters
		}
		f.inflightMu.Unlock()
		if joined >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d settles joined the settlement in flight, want %d", joined, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// One payment is one success per process: a settle that joins a
// settlement of the same authorization in flight (a resource server using
// x402_facilitator that got one payment in two concurrent requests, each
// verified, served and settled) is not answered with that settlement's
// success, which would have the payment serve twice, but with
// nonce_already_used naming its transaction, as a settle after it lands
// is. A failure is shared (nothing was paid, both see why), and so is an
// unknown outcome (nobody was answered success; a status check decides).
func TestJoinedSettleIsNotASecondSuccess(t *testing.T) {
	cases := []struct {
		name string
		// during runs while the leader's send stalls.
		during         func(t *testing.T, e *testEnv, p x402.PaymentPayload, req x402.PaymentRequirements)
		lose           bool // the leader's send is lost: its outcome stays unknown
		receiptTimeout time.Duration
	}{
		{name: "the leader settles", receiptTimeout: 30 * time.Second},
		{name: "the leader fails", receiptTimeout: 30 * time.Second,
			during: func(t *testing.T, e *testEnv, p x402.PaymentPayload, req x402.PaymentRequirements) {
				spendNonce(t, e.d, "cancel", payer, p, req)
			}},
		{name: "the leader's outcome is unknown", lose: true, receiptTimeout: 300 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			req := e.requirements(payee, amount)
			stall := newStalledSends(e.d.Client())
			stall.lose = tc.lose
			defer stall.releaseSends()
			f, err := newFacilitator(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: tc.receiptTimeout}, e.d.nonces)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			from := crypto.PubkeyToAddress(payer.PublicKey)
			before := usdcBalance(t, e.d, from)
			relayerNonce, _ := e.d.Client().NonceAt(ctx, f.Relayer(), nil)
			p := mustSignExact(t, payer, req)

			leader := settleAsync(ctx, f, p, req)
			stall.waitStalled(t)
			joiner := settleAsync(ctx, f, p, req)
			waitJoined(t, f, 1)
			if tc.during != nil {
				tc.during(t, e, p, req)
			}
			stall.releaseSends()
			l, j := <-leader, <-joiner

			switch tc.name {
			case "the leader settles":
				if l.err != nil || !l.r.Success || l.r.Transaction == "" {
					t.Fatalf("the leader = %+v, %v; want success", l.r, l.err)
				}
				if j.err != nil || j.r.Success || j.r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || j.r.Transaction != l.r.Transaction ||
					j.r.Payer != l.r.Payer || j.r.Network != DevnetNetwork || !strings.Contains(j.r.ErrorMessage, "already settled by another settle") {
					t.Errorf("the joined settle = %+v, %v; want %s naming %s, saying another settle settled it", j.r, j.err, x402.ReasonExactEVMNonceAlreadyUsed, l.r.Transaction)
				}
				if d := new(big.Int).Sub(before, usdcBalance(t, e.d, from)); d.String() != amount {
					t.Errorf("payer paid %v, want %s once", d, amount)
				}
				if after, _ := e.d.Client().NonceAt(ctx, f.Relayer(), nil); after != relayerNonce+1 {
					t.Errorf("relayer sent %d transactions, want 1", after-relayerNonce)
				}
			case "the leader fails":
				if l.err != nil || l.r.Success || l.r.ErrorReason == "" {
					t.Fatalf("the leader = %+v, %v; want a failure", l.r, l.err)
				}
				if j.err != nil || !reflect.DeepEqual(j.r, l.r) {
					t.Errorf("the joined settle = %+v, %v; want the leader's failure %+v", j.r, j.err, l.r)
				}
				if usdcBalance(t, e.d, from).Cmp(before) != 0 {
					t.Error("a failed settlement moved test USDC")
				}
			default:
				var lu, ju *x402.UnknownOutcomeError
				if !errors.As(l.err, &lu) || l.r.Success {
					t.Fatalf("the leader = %+v, %v; want an unknown outcome", l.r, l.err)
				}
				if !errors.As(j.err, &ju) || j.r.Success {
					t.Errorf("the joined settle = %+v, %v; want the leader's unknown outcome", j.r, j.err)
				}
			}
		})
	}
}

// One authorization is one send per process, whatever encoding of its
// signature each settle carries. A contract account's wallet may accept
// many (the test wallet takes v as 27/28 or 0/1, as ecrecover-based
// wallets do; others any bytes they like): a settle with a second
// encoding, once its wallet accepts it, joins the settlement in flight
// instead of sending a transaction of its own, which would revert at the
// relayer's gas.
func TestWalletSignatureEncodingsShareOneSend(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	owner := DevKey(4)
	wallet := deployWallet(t, e.d, crypto.PubkeyToAddress(owner.PublicKey))
	fundUSDC(t, e.d, DevKey(5), wallet, 1_000_000)
	stall := newStalledSends(e.d.Client())
	defer stall.releaseSends()
	f, err := newFacilitator(Config{Chain: stall, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 30 * time.Second}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	req := e.requirements(payee, amount)
	a := auth(owner, req)
	a.From = wallet.Hex()
	p1 := sign(t, owner, a, req, req)
	var pl x402.ExactEVMPayload
	if err := json.Unmarshal(p1.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	sig := common.FromHex(pl.Signature)
	sig[64] -= 27 // the same signature, v as 0/1: the wallet accepts it too
	p2 := payload(t, "0x"+hex.EncodeToString(sig), a, req)
	if v, err := f.Verify(ctx, p2, req); err != nil || !v.IsValid {
		t.Fatalf("the second encoding = %+v, %v; the test needs one the wallet accepts", v, err)
	}
	relayerNonce, _ := e.d.Client().NonceAt(ctx, f.Relayer(), nil)

	leader := settleAsync(ctx, f, p1, req)
	stall.waitStalled(t)
	joiner := settleAsync(ctx, f, p2, req)
	waitJoined(t, f, 1)
	stall.releaseSends()
	l, j := <-leader, <-joiner
	if l.err != nil || !l.r.Success {
		t.Fatalf("the first encoding's settle = %+v, %v; want success", l.r, l.err)
	}
	if j.err != nil || j.r.Success || j.r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || j.r.Transaction != l.r.Transaction {
		t.Errorf("the second encoding's settle = %+v, %v; want %s naming %s", j.r, j.err, x402.ReasonExactEVMNonceAlreadyUsed, l.r.Transaction)
	}
	if after, _ := e.d.Client().NonceAt(ctx, f.Relayer(), nil); after != relayerNonce+1 {
		t.Errorf("the relayer sent %d transactions for one authorization, want 1", after-relayerNonce)
	}
}

// heldFirstSend is a fake chain: the devnet's client, except that the
// first transaction sent is taken (nil error) but kept out of the chain,
// as on a congested chain where it waits in the pool past the settle's
// receipt deadline; the pending nonce counts it, as the node's would. The
// next send first releases it to the chain, then sends its own: the held
// one lands first (lower nonce), as it would.
type heldFirstSend struct {
	Chain
	mu   sync.Mutex
	held *types.Transaction
	done bool
}

func (c *heldFirstSend) SendTransaction(ctx context.Context, tx *types.Transaction) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.done && c.held == nil {
		c.held = tx
		return nil
	}
	if !c.done {
		c.done = true
		if err := c.Chain.SendTransaction(ctx, c.held); err != nil {
			return err
		}
	}
	return c.Chain.SendTransaction(ctx, tx)
}

func (c *heldFirstSend) PendingNonceAt(ctx context.Context, a common.Address) (uint64, error) {
	n, err := c.Chain.PendingNonceAt(ctx, a)
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil && c.held != nil && !c.done && n <= c.held.Nonce() {
		n = c.held.Nonce() + 1
	}
	return n, err
}

// An honest payer whose settlement is slow to land (its settle ends with
// an unknown outcome after the receipt deadline) and whose client retries
// /settle, as it is told to, has the payment settled once by the first
// transaction, and the retry is answered from it: it sends nothing, and
// the payer's failure budget counts nothing. (Before: the retry sent a
// second transaction, which reverted behind the first at the relayer's
// gas.)
func TestRetryAfterUnknownOutcomeDoesNotChargeThePayer(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	hc := &heldFirstSend{Chain: e.d.Client()}
	f, err := newFacilitator(Config{Chain: hc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond,
		ReceiptTimeout: time.Second, MaxFailedPerPayer: 1, FailureWindow: time.Hour}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	p := mustSignExact(t, payer, req)
	r1, err := f.Settle(ctx, p, req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) {
		t.Fatalf("first settle = %+v, %v; the test needs an unknown outcome", r1, err)
	}
	relayerNonce, err := e.d.Client().PendingNonceAt(ctx, f.Relayer())
	if err != nil {
		t.Fatal(err)
	}
	r2, err := f.Settle(ctx, p, req) // the client's retry
	t.Logf("retry = %+v, %v", r2, err)
	if !errors.As(err, &unknown) && (err != nil || !r2.Success || r2.Transaction != hc.held.Hash().Hex()) {
		t.Fatalf("retry = %+v, %v; want the first transaction %s's outcome: success naming it, or unknown while it is pending", r2, err, hc.held.Hash().Hex())
	}
	if after, _ := e.d.Client().PendingNonceAt(ctx, f.Relayer()); after != relayerNonce {
		t.Errorf("the retry sent %d transactions, want none", after-relayerNonce)
	}
	v, err := f.Verify(ctx, mustSignExact(t, payer, req), req)
	if err != nil || !v.IsValid {
		t.Errorf("the honest payer's next payment = %+v, %v; want valid (its only 'failure' is our own retry reverting behind our own first send)", v, err)
	}
}

// Anyone who sees a payer's authorization (public once a settlement of it
// is in the mempool) can replay it to another facilitator of the same
// relayer key in the process (x402_facilitator beside a gate with other
// settings). Both send, the replay reverts behind the gate's, and the
// payer, who paid once, must not be charged a failure at either: else a
// third party could exhaust a victim payer's budget.
func TestReplayToAnotherFacilitatorOfTheKeyDoesNotChargeThePayer(t *testing.T) {
	e := newEnv(t)
	req := e.requirements(payee, amount)
	bar := newEstimateBarrier(e.d.Client(), 2)
	gate, err := newFacilitator(Config{Chain: bar, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond,
		ReceiptTimeout: 30 * time.Second, MaxFailedPerPayer: 1, FailureWindow: time.Hour}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	public, err := newFacilitator(Config{Chain: bar, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond,
		ReceiptTimeout: 20 * time.Second, MaxFailedPerPayer: 1, FailureWindow: time.Hour}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	p := mustSignExact(t, payer, req) // the victim's one payment
	done := make(chan struct{}, 2)
	var gr, ar x402.SettleResponse
	var gerr, aerr error
	go func() { gr, gerr = gate.Settle(context.Background(), p, req); done <- struct{}{} }()
	go func() { ar, aerr = public.Settle(context.Background(), p, req); done <- struct{}{} }() // the attacker's replay
	<-done
	<-done
	t.Logf("gate = %+v, %v; replay = %+v, %v", gr, gerr, ar, aerr)
	for name, f := range map[string]*Facilitator{"gate": gate, "x402_facilitator": public} {
		v, err := f.Verify(context.Background(), mustSignExact(t, payer, req), req)
		if err != nil || !v.IsValid {
			t.Errorf("victim's next payment at %s = %+v, %v; want valid (a third party's replay must not charge the payer)", name, v, err)
		}
	}
}

// settled is one Settle's answer, from settleAsync.
type settled struct {
	r   x402.SettleResponse
	err error
}

// settleAsync runs f.Settle in a goroutine of its own, for tests that hold
// one settle in flight while another joins it; its answer comes on the
// channel returned.
func settleAsync(ctx context.Context, f *Facilitator, p x402.PaymentPayload, req x402.PaymentRequirements) <-chan settled {
	c := make(chan settled, 1)
	go func() {
		r, err := f.Settle(ctx, p, req)
		c <- settled{r, err}
	}()
	return c
}
