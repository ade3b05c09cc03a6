package evmfacilitator

import (
	"context"
	"sync"
	"testing"
	"time"

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
// relayer. A release frees a place.
func TestBudgetCapsSettlementsInFlight(t *testing.T) {
	b := newBudget(Config{MaxFailedPerPayer: 3, MaxInFlightPerPayer: 2, FailureWindow: time.Hour})
	a, other := common.HexToAddress("0x01"), common.HexToAddress("0x02")
	for i := range 2 {
		if reason, msg := b.reserve(a); reason != "" {
			t.Fatalf("reservation %d refused: %s", i+1, msg)
		}
	}
	if reason, _ := b.check(a); reason != ReasonPayerFailureBudget {
		t.Fatalf("a payer at its cap in flight: check = %q", reason)
	}
	if reason, _ := b.reserve(a); reason != ReasonPayerFailureBudget {
		t.Fatalf("a payer at its cap in flight: reserve = %q", reason)
	}
	if reason, _ := b.reserve(other); reason != "" {
		t.Fatal("another payer was refused")
	}
	b.release(a)
	if reason, _ := b.reserve(a); reason != "" {
		t.Fatal("a released place was not freed")
	}
}

// A settlement that reverts because someone relayed the same
// authorization first (a third party watching the mempool, paying its own
// gas) still PAID payTo: it is the payer's success, not its failure. If it
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
	if err != nil || !r.Success || theirs == nil || r.Transaction != theirs.TxHash.Hex() {
		t.Fatalf("outrun settle = %+v, %v; want success naming the relay", r, err)
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
