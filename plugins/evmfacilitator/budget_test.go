package evmfacilitator

import (
	"context"
	"crypto/ecdsa"
	"math/big"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// A payer who makes its own settlements revert (here it cancels the
// authorization between the facilitator's gas estimate and its send) costs
// the relayer gas each time; after MaxFailedPerPayer reverts within the
// window its payments are refused at verify and at settle, before
// anything is sent, with their own reason. Another payer is not affected,
// and once the window has passed the payer may pay again.
func TestRevertingPayerIsRefusedBeforeSending(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	var (
		mu    sync.Mutex
		clock = time.Now()
		cur   x402.PaymentPayload // the payment the next send's payer spoils
		spoil bool
	)
	bs := &beforeSend{Chain: e.d.Client()}
	bs.before = func() {
		if spoil {
			spendNonce(t, e.d, "cancel", payer, cur, req)
		}
	}
	f, err := newFacilitator(Config{Chain: bs, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond,
		ReceiptTimeout: 10 * time.Second, MaxFailedPerPayer: 2, FailureWindow: time.Hour}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	f.budget.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	relayer := crypto.PubkeyToAddress(DevKey(0).PublicKey)
	relayerNonce := func() uint64 {
		t.Helper()
		n, err := e.d.Client().PendingNonceAt(ctx, relayer)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	spoil = true
	for i := range 2 {
		cur = mustSignExact(t, payer, req)
		n := relayerNonce()
		r, err := f.Settle(ctx, cur, req)
		if err != nil || r.Success {
			t.Fatalf("settlement %d, reverted by its payer: %+v, %v; want a failure", i+1, r, err)
		}
		if relayerNonce() != n+1 {
			t.Fatalf("settlement %d: the relayer sent nothing; the test needs a reverted transaction", i+1)
		}
	}
	spoil = false

	p := mustSignExact(t, payer, req)
	if r, err := f.Verify(ctx, p, req); err != nil || r.IsValid || r.InvalidReason != ReasonPayerFailureBudget {
		t.Fatalf("verify past the budget = %+v, %v; want %s", r, err, ReasonPayerFailureBudget)
	}
	n, sends := relayerNonce(), bs.sends
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	r, err := f.Settle(ctx, p, req)
	if err != nil || r.Success || r.ErrorReason != ReasonPayerFailureBudget || r.Transaction != "" {
		t.Fatalf("settle past the budget = %+v, %v; want %s", r, err, ReasonPayerFailureBudget)
	}
	if relayerNonce() != n || bs.sends != sends || usdcBalance(t, e.d, from).Cmp(before) != 0 {
		t.Fatal("a settlement past the budget was sent")
	}

	otherPayer := DevKey(4)
	if r, err := f.Settle(ctx, mustSignExact(t, otherPayer, req), req); err != nil || !r.Success {
		t.Fatalf("another payer's settlement = %+v, %v; want success", r, err)
	}

	mu.Lock()
	clock = clock.Add(time.Hour + time.Second)
	mu.Unlock()
	if r, err := f.Settle(ctx, p, req); err != nil || !r.Success {
		t.Fatalf("settle after the window = %+v, %v; want success", r, err)
	}
}

// A payer's settlements in flight are capped: one move of its tokens
// reverts them all at once, so the cap bounds what one move costs the
// relayer. Each settlement counts those held before it (Verify, all); a
// release frees a place, and their amounts are what the payer's balance
// must cover besides its own.
func TestBudgetCapsSettlementsInFlight(t *testing.T) {
	b := newBudget(Config{MaxFailedPerPayer: 3, MaxInFlightPerPayer: 2, FailureWindow: time.Hour})
	a, other := common.HexToAddress("0x01"), common.HexToAddress("0x02")
	tok, tok2 := common.HexToAddress("0x10"), common.HexToAddress("0x20")
	var held []*flight
	for i := range 2 {
		fl := b.hold(tok, a, big.NewInt(10))
		if reason, msg := b.check(a, fl, false); reason != "" {
			t.Fatalf("settlement %d refused: %s", i+1, msg)
		}
		held = append(held, fl)
	}
	if reason, _ := b.check(a, nil, false); reason != ReasonPayerFailureBudget {
		t.Fatalf("a payer at its cap in flight: check = %q", reason)
	}
	third := b.hold(tok, a, big.NewInt(10))
	if reason, _ := b.check(a, third, false); reason != ReasonPayerFailureBudget {
		t.Fatalf("a payer at its cap in flight: the third settlement's check = %q", reason)
	}
	if sum, n := b.committed(tok, a, third); n != 2 || sum.Int64() != 20 {
		t.Fatalf("committed ahead of the third = %v in %d; want 20 in 2", sum, n)
	}
	// Another token's balance owes nothing to these flights, yet they
	// count against the payer's cap all the same.
	if sum, n := b.committed(tok2, a, nil); n != 0 || sum != nil {
		t.Fatalf("committed in another token = %v in %d; want none", sum, n)
	}
	inTok2 := b.hold(tok2, a, big.NewInt(10))
	if reason, _ := b.check(a, inTok2, false); reason != ReasonPayerFailureBudget {
		t.Fatalf("a payer at its cap in flight in one token: a settlement in another token's check = %q", reason)
	}
	b.release(inTok2)
	b.release(third)
	if reason, _ := b.check(other, b.hold(tok, other, big.NewInt(1)), false); reason != "" {
		t.Fatal("another payer was refused")
	}
	b.release(held[0])
	fl := b.hold(tok, a, big.NewInt(10))
	if reason, _ := b.check(a, fl, false); reason != "" {
		t.Fatal("a released place was not freed")
	}
	if sum, n := b.committed(tok, a, fl); n != 1 || sum.Int64() != 10 {
		t.Fatalf("committed ahead = %v in %d; want 10 in 1", sum, n)
	}
	b.release(held[1])
	b.release(fl)
	if _, ok := b.ids[a]; ok {
		t.Fatal("a payer with nothing in flight and no failure is still recorded")
	}
}

// A settlement that reverts because someone relayed the same
// authorization first (a third party watching the mempool, paying its own
// gas) still PAID payTo: answered as another settlement's, it is no
// failure of the payer's. If it
// counted, whoever can see a payer's settlements could lock that payer out
// with MaxFailedPerPayer such relays.
func TestOutrunSettlementThatPaidIsNoPayerFailure(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	var cur x402.PaymentPayload
	var theirs *types.Receipt
	frontRun := true
	bs := &beforeSend{Chain: e.d.Client()}
	bs.before = func() {
		if frontRun {
			theirs = relayAuthorization(t, e.d, DevKey(5), cur)
		}
	}
	f, err := newFacilitator(Config{Chain: bs, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond,
		ReceiptTimeout: 10 * time.Second, MaxFailedPerPayer: 1, FailureWindow: time.Hour}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	cur = mustSignExact(t, payer, req)
	r, err := f.Settle(ctx, cur, req)
	if err != nil || r.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || theirs == nil || r.Transaction != theirs.TxHash.Hex() {
		t.Fatalf("outrun settle = %+v, %v; want nonce_already_used naming the relay", r, err)
	}
	frontRun = false
	next := mustSignExact(t, payer, req)
	if v, err := f.Verify(ctx, next, req); err != nil || !v.IsValid {
		t.Fatalf("verify of the payer's next payment = %+v, %v; want valid (its only settlement paid)", v, err)
	}
	if r, err := f.Settle(ctx, next, req); err != nil || !r.Success {
		t.Fatalf("settle of the payer's next payment = %+v, %v; want success", r, err)
	}
}

// estimateBarrier is a fake for a race the devnet cannot show on demand
// (it mines each transaction at once): it holds every gas estimate until
// every one of n concurrent settlements has either reached its estimate or
// returned, so those that reach it were all checked against one state and
// are all sent before any lands, as on a chain whose blocks take seconds.
type estimateBarrier struct {
	Chain
	n        int
	mu       sync.Mutex
	arrived  int
	returned int
	all      chan struct{}
}

func newEstimateBarrier(c Chain, n int) *estimateBarrier {
	return &estimateBarrier{Chain: c, n: n, all: make(chan struct{})}
}

func (c *estimateBarrier) count(arrived, returned int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.arrived += arrived
	c.returned += returned
	if c.arrived+c.returned == c.n {
		close(c.all)
	}
}

func (c *estimateBarrier) EstimateGas(ctx context.Context, msg ethereum.CallMsg) (uint64, error) {
	g, err := c.Chain.EstimateGas(ctx, msg)
	c.count(1, 0)
	<-c.all
	return g, err
}

// settleAtOnce settles one payment of key per element of n at once through
// bar and returns the answers.
func settleAtOnce(t *testing.T, f *Facilitator, bar *estimateBarrier, key *ecdsa.PrivateKey, req x402.PaymentRequirements) []x402.SettleResponse {
	type res struct {
		r   x402.SettleResponse
		err error
	}
	out := make(chan res, bar.n)
	for range bar.n {
		p := mustSignExact(t, key, req)
		go func() {
			r, err := f.Settle(context.Background(), p, req)
			if r.Transaction == "" && err == nil { // returned before its estimate
				bar.count(0, 1)
			}
			out <- res{r, err}
		}()
	}
	var rs []x402.SettleResponse
	for range bar.n {
		x := <-out
		if x.err != nil {
			t.Fatalf("settle: %v", x.err)
		}
		rs = append(rs, x.r)
	}
	return rs
}

// A payer's settlements in flight are counted against its balance: a payer
// funded for one payment that pays six calls at once gets one settled and
// the others refused for their balance before anything is sent, instead
// of five reverts at the relayer's gas (balance and simulation are read
// per payment, and all six pass them before any lands). A payer funded for
// all its payments still has them settled at once.
func TestOneBalanceIsNotSpentManyTimesInFlight(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	relayer := crypto.PubkeyToAddress(DevKey(0).PublicKey)
	for _, tc := range []struct {
		name     string
		payments int64 // the payer's balance, in payments
		want     int   // settled
	}{
		{"funded for one of six", 1, 1},
		{"funded for all three", 3, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, _ := crypto.GenerateKey()
			fundUSDC(t, e.d, DevKey(5), crypto.PubkeyToAddress(key.PublicKey), tc.payments*20000)
			n := 6
			if tc.payments == 3 {
				n = 3
			}
			bar := newEstimateBarrier(e.d.Client(), n)
			f, err := newFacilitator(Config{Chain: bar, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, e.d.nonces)
			if err != nil {
				t.Fatal(err)
			}
			n0, _ := e.d.Client().PendingNonceAt(ctx, relayer)
			ok := 0
			for _, r := range settleAtOnce(t, f, bar, key, req) {
				switch {
				case r.Success:
					ok++
				case r.ErrorReason != x402.ReasonExactEVMInsufficientBalance || r.Transaction != "":
					t.Errorf("settle = %+v; want success, or %s with nothing sent", r, x402.ReasonExactEVMInsufficientBalance)
				}
			}
			n1, _ := e.d.Client().PendingNonceAt(ctx, relayer)
			if ok != tc.want || n1-n0 != uint64(tc.want) {
				t.Fatalf("%d settled, %d relayer transactions; want %d of each", ok, n1-n0, tc.want)
			}
		})
	}
}

// stallToken is a fake chain: the devnet's client, except that every gas
// estimate of a transaction to token waits until the test releases it, so
// that token's settlement is in flight meanwhile.
type stallToken struct {
	Chain
	token   common.Address
	arrived chan struct{}
	release chan struct{}
}

func (c *stallToken) EstimateGas(ctx context.Context, msg ethereum.CallMsg) (uint64, error) {
	if msg.To != nil && *msg.To == c.token {
		c.arrived <- struct{}{}
		<-c.release
	}
	return c.Chain.EstimateGas(ctx, msg)
}

// The amounts in flight are reserved per (token, payer): a payer holding
// exactly one payment of each of two EIP-3009 tokens has its payment in
// the second verified and settled while its payment in the first is in
// flight. Counted per payer alone, the first would be taken from the
// second token's balance, and the payment refused for a balance it has.
func TestReservationIsPerToken(t *testing.T) {
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := e.d.SendTx(ctx, DevKey(0), nil, hexCode(testUSDCBin)) // a second EIP-3009 token
	if err != nil {
		t.Fatal(err)
	}
	tokenB := r.ContractAddress
	key, _ := crypto.GenerateKey()
	who := crypto.PubkeyToAddress(key.PublicKey)
	fundUSDC(t, e.d, DevKey(5), who, 20000) // one payment of token A
	mint, err := tokenABI.Pack("mint", who, big.NewInt(20000))
	if err != nil {
		t.Fatal(err)
	}
	sendTx(t, e.d, DevKey(0), &tokenB, mint) // one payment of token B

	reqA := e.requirements(payee, amount)
	reqB := reqA
	reqB.Asset = tokenB.Hex()
	st := &stallToken{Chain: e.d.Client(), token: e.d.Token(), arrived: make(chan struct{}), release: make(chan struct{})}
	f, err := newFacilitator(Config{Chain: st, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan x402.SettleResponse, 1)
	go func() {
		r, err := f.Settle(ctx, mustSignExact(t, key, reqA), reqA)
		if err != nil {
			t.Errorf("settle in token A: %v", err)
		}
		done <- r
	}()
	<-st.arrived // token A's settlement holds its flight now
	pb := mustSignExact(t, key, reqB)
	v, verr := f.Verify(ctx, pb, reqB)
	rb, serr := f.Settle(ctx, pb, reqB)
	close(st.release)
	if ra := <-done; !ra.Success {
		t.Errorf("settle in token A = %+v", ra)
	}
	if verr != nil || !v.IsValid {
		t.Errorf("verify in token B while a token-A settlement is in flight = %+v, %v; want valid (the payer holds one payment of each token)", v, verr)
	}
	if serr != nil || !rb.Success {
		t.Errorf("settle in token B while a token-A settlement is in flight = %+v, %v; want success", rb, serr)
	}
}
