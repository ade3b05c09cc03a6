package svmfacilitator

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// failedFee is what a payment of env's layout (two signatures, 20,000
// units at 1 micro-lamport) costs the fee payer when it fails on chain:
// 5,000 lamports per signature and ceil(20,000 × 1 / 10⁶) of priority fee.
const failedFee = 2*5000 + 1

// spentLamports is the fees of the failures in the window.
func (b *budget) spentLamports() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prune(now())
	return b.spent
}

// budgetEnv is an env whose facilitator reaches the chain through a
// faultyRPC, with the payer's token account funded to 1,000,000.
func budgetEnv(t *testing.T, cfg Config) (*env, *faultyRPC) {
	t.Helper()
	fr := &faultyRPC{}
	srv := fr.serve(t)
	cfg.RPC = &RPC{URL: srv}
	cfg.PollInterval = 20 * time.Millisecond
	e := newEnv(t, cfg)
	fr.set(func(f *faultyRPC) { f.target = e.chain.URL })
	return e, fr
}

// fund gives payer 1 SOL and exactly 1,000,000 USDC units.
func (e *env) fund(payer ed25519.PrivateKey) {
	e.chain.Airdrop(pub(payer).String(), 1_000_000_000)
	e.chain.SetTokenBalance(pub(payer).String(), solanachain.USDC, 1_000_000, "")
}

// pay is a payment of e's requirements by payer, told apart by memo, with
// extra instructions after the memo.
func (e *env) pay(t *testing.T, payer ed25519.PrivateKey, memo string, extra ...Ix) x402.PaymentPayload {
	t.Helper()
	p := e.payment(t)
	p.Authority, p.Memo = payer, memo
	return Payload(p.Build(append(p.Instructions(), extra...)), e.req)
}

// drainOnSend arms fr so that, before each settlement is forwarded to the
// chain, payer moves its whole USDC balance (1,000,000) away with a real
// transaction it signs and pays for itself: the hostile payer's race
// between the facilitator's simulation and its send. The settlement then
// fails on chain, and the fee payer pays its fee. The returned function
// reports the first error the move met.
func (e *env) drainOnSend(fr *faultyRPC, payer ed25519.PrivateKey) func() error {
	stash := pub(testKey("stash"))
	e.chain.SetTokenBalance(stash.String(), solanachain.USDC, 0, "")
	usdc := mustKey(solanachain.USDC)
	auth := pub(payer)
	rpc := &RPC{URL: e.chain.URL}
	var mu sync.Mutex
	var n int
	var firstErr error
	fr.set(func(f *faultyRPC) {
		f.beforeSend = func() {
			mu.Lock()
			defer mu.Unlock()
			n++
			ctx := context.Background()
			bh, err := rpc.LatestBlockhash(ctx)
			if err == nil {
				raw := Compile(auth, bh, []Ix{
					TransferCheckedIx(TokenProgram, AssociatedTokenAddress(auth, usdc, TokenProgram), usdc,
						AssociatedTokenAddress(stash, usdc, TokenProgram), auth, 1_000_000, 6),
					MemoIx(fmt.Sprint("drain ", n)),
				}, payer)
				_, err = rpc.Send(ctx, raw)
			}
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("draining the payer: %w", err)
			}
		}
	})
	return func() error {
		mu.Lock()
		defer mu.Unlock()
		return firstErr
	}
}

// TestFailedSettlementsSpendThePayersBudget: a payer whose settlements
// pass simulation and then fail on chain (it moves its USDC away in
// between) costs the fee payer a real fee each time; after
// DefaultMaxFailedPerPayer such failures its next payment is refused at
// verify and at settle before the chain sees it, another payer is not
// affected, and once the window has passed the payer may pay again.
func TestFailedSettlementsSpendThePayersBudget(t *testing.T) {
	e, fr := budgetEnv(t, Config{})
	ctx := context.Background()
	fee := pub(e.fee).String()
	drainErr := e.drainOnSend(fr, e.payer)

	for i := range DefaultMaxFailedPerPayer {
		e.fund(e.payer)
		pp := e.pay(t, e.payer, fmt.Sprint("fails ", i))
		if v, err := e.f.Verify(ctx, pp, e.req); err != nil || !v.IsValid {
			t.Fatalf("verify %d: %+v %v", i, v, err)
		}
		before := e.chain.Lamports(fee)
		s, err := e.f.Settle(ctx, pp, e.req)
		if err != nil || s.Success || s.ErrorReason != ReasonTransactionFailed || s.Transaction == "" || !strings.Contains(s.ErrorMessage, "on chain") {
			t.Fatalf("settle %d: %+v %v; want a failure on chain", i, s, err)
		}
		if err := drainErr(); err != nil {
			t.Fatal(err)
		}
		if paid := before - e.chain.Lamports(fee); paid != failedFee {
			t.Fatalf("failure %d cost the fee payer %d lamports, want %d", i, paid, failedFee)
		}
	}

	// Recorded overall too: exactly what the fee payer paid.
	if got := e.f.budget.spentLamports(); got != DefaultMaxFailedPerPayer*failedFee {
		t.Fatalf("the budget recorded %d lamports of failures, want %d", got, DefaultMaxFailedPerPayer*failedFee)
	}

	// The next one passes simulation as the others did, but is refused
	// before anything reaches the chain.
	e.fund(e.payer)
	pp := e.pay(t, e.payer, "refused")
	sims, sends, before := fr.count("simulateTransaction"), fr.count("sendTransaction"), e.chain.Lamports(fee)
	v, err := e.f.Verify(ctx, pp, e.req)
	if err != nil || v.IsValid || v.InvalidReason != ReasonPayerFailureBudget || v.Payer != pub(e.payer).String() {
		t.Fatalf("verify past the budget: %+v %v", v, err)
	}
	if !strings.Contains(v.InvalidMessage, "3 settlements of this payer failed on chain") {
		t.Fatalf("message %q", v.InvalidMessage)
	}
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || s.Success || s.ErrorReason != ReasonPayerFailureBudget || s.Transaction != "" {
		t.Fatalf("settle past the budget: %+v %v", s, err)
	}
	if fr.count("simulateTransaction") != sims || fr.count("sendTransaction") != sends {
		t.Fatal("the refused payment reached the chain")
	}
	if got := e.chain.Lamports(fee); got != before {
		t.Fatalf("the refused payment cost the fee payer %d lamports", before-got)
	}
	if a, _ := e.balances(t); a != 1_000_000 {
		t.Fatalf("the refused payer's balance is %d", a)
	}

	// Another payer pays as usual.
	fr.set(func(f *faultyRPC) { f.beforeSend = nil })
	other := testKey("another payer")
	e.fund(other)
	if s, err := e.f.Settle(ctx, e.pay(t, other, "other"), e.req); err != nil || !s.Success {
		t.Fatalf("another payer: %+v %v", s, err)
	}

	// Past the window the failures are forgotten.
	now = func() time.Time { return time.Now().Add(DefaultFailureWindow + time.Second) }
	defer func() { now = time.Now }()
	if s, err := e.f.Settle(ctx, e.pay(t, e.payer, "after the window"), e.req); err != nil || !s.Success {
		t.Fatalf("after the window: %+v %v", s, err)
	}
}

// lighthouseIx is a Lighthouse assertion instruction (its data is not
// read: the local chain does not have the program, so a transaction
// carrying one fails simulation when the facilitator lets it through).
func lighthouseIx() Ix { return Ix{program: LighthouseProgram, data: []byte{0, 1, 2, 3}} }

// payAt is pay with a compute unit limit of units at price micro-lamports
// per unit instead of the official client's 20,000 at 1.
func (e *env) payAt(t *testing.T, payer ed25519.PrivateKey, memo string, units uint32, price uint64, extra ...Ix) x402.PaymentPayload {
	t.Helper()
	p := e.payment(t)
	p.Authority, p.Memo = payer, memo
	ixs := p.Instructions()
	ixs[0], ixs[1] = ComputeLimitIx(units), ComputePriceIx(price)
	return Payload(p.Build(append(ixs, extra...)), e.req)
}

// TestFailedLamportsCapThePriorityFee is a hostile review's scenario on
// the real chain, at the defaults: throwaway keys, 3 failures each with
// plain transfers they make fail (moving their USDC away before each
// send), at the highest fee the caps allow (260,000 lamports). The lamport
// budget takes 19 of them; then the attacker's costly payments are
// refused before the chain sees them, while honest payers keep paying,
// with a second Memo or a Lighthouse assertion as Phantom adds (the local
// chain has no Lighthouse program, so such a payment is shown to pass every
// check of ours and reach the chain's simulation, which refuses it), and
// a failure from then on costs the fee payer only the base fee and a
// priority fee within the cap. Past the window the caps apply again.
func TestFailedLamportsCapThePriorityFee(t *testing.T) {
	e, fr := budgetEnv(t, Config{})
	ctx := context.Background()
	fee := pub(e.fee).String()
	const atCaps = 2*5000 + 250_000
	start := e.chain.Lamports(fee)

	failures, refused := 0, 0
	for k := range 7 {
		key := testKey(fmt.Sprint("throwaway ", k))
		drainErr := e.drainOnSend(fr, key)
		for i := range DefaultMaxFailedPerPayer {
			e.fund(key)
			pp := e.payAt(t, key, fmt.Sprint("fails ", k, " ", i), DefaultMaxComputeUnits, DefaultMaxComputeUnitPrice)
			sends := fr.count("sendTransaction")
			s, err := e.f.Settle(ctx, pp, e.req)
			if err != nil {
				t.Fatal(err)
			}
			if s.ErrorReason == ReasonFailureBudgetPriorityFee {
				if s.Transaction != "" || fr.count("sendTransaction") != sends {
					t.Fatalf("key %d: the refused payment reached the chain: %+v", k, s)
				}
				refused++
				break
			}
			if s.Success || s.ErrorReason != ReasonTransactionFailed || s.Transaction == "" {
				t.Fatalf("key %d, payment %d: %+v; want a failure on chain", k, i, s)
			}
			if err := drainErr(); err != nil {
				t.Fatal(err)
			}
			failures++
		}
	}
	fr.set(func(f *faultyRPC) { f.beforeSend = nil })
	lost := start - e.chain.Lamports(fee)
	if failures != 19 || refused != 1 || lost != 19*atCaps || e.f.budget.spentLamports() != lost {
		t.Fatalf("%d failures cost the fee payer %d lamports (budget: %d), %d keys refused; want 19 failures at %d, the 20th refused",
			failures, lost, e.f.budget.spentLamports(), refused, atCaps)
	}

	// The 60,000 lamports left hold no failure at the caps. The attacker
	// goes on with cheap payments (the official client's fees) from two
	// more keys: they are admitted, and each failure costs the fee payer
	// 10,001 lamports, against the 5,000 the attacker pays for each move
	// of its tokens.
	for k := range 2 {
		key := testKey(fmt.Sprint("cheap throwaway ", k))
		drainErr := e.drainOnSend(fr, key)
		for i := range DefaultMaxFailedPerPayer {
			e.fund(key)
			before := e.chain.Lamports(fee)
			if s, err := e.f.Settle(ctx, e.pay(t, key, fmt.Sprint("cheap failure ", k, " ", i)), e.req); err != nil || s.ErrorReason != ReasonTransactionFailed || s.Transaction == "" {
				t.Fatalf("cheap failure %d of key %d: %+v %v", i, k, s, err)
			}
			if err := drainErr(); err != nil {
				t.Fatal(err)
			}
			if paid := before - e.chain.Lamports(fee); paid != failedFee {
				t.Fatalf("a cheap failure cost the fee payer %d lamports, want %d", paid, failedFee)
			}
		}
	}
	fr.set(func(f *faultyRPC) { f.beforeSend = nil })
	if got := e.f.budget.spentLamports(); got != 19*atCaps+6*failedFee {
		t.Fatalf("the budget recorded %d lamports", got)
	}

	// Honest payers, at the official client's fees, are not refused: a
	// plain payment and a second Memo settle, a Lighthouse assertion
	// passes our checks and only the chain refuses it.
	buyer := testKey("honest buyer")
	e.fund(buyer)
	for name, pp := range map[string]x402.PaymentPayload{
		"plain":     e.pay(t, buyer, "plain"),
		"two memos": e.pay(t, buyer, "two memos", MemoIx("second")),
	} {
		if s, err := e.f.Settle(ctx, pp, e.req); err != nil || !s.Success {
			t.Fatalf("%s: %+v %v", name, s, err)
		}
	}
	if v, err := e.f.Verify(ctx, e.pay(t, buyer, "lighthouse", lighthouseIx()), e.req); err != nil || v.InvalidReason != ReasonSimulationFailed {
		t.Fatalf("lighthouse past the budget: %+v %v; want the chain's refusal", v, err)
	}
	// A priority fee of exactly the cap (50,000 units × 100,000
	// micro-lamports = 5,000 lamports) settles.
	if s, err := e.f.Settle(ctx, e.payAt(t, buyer, "at the cap", DefaultMaxComputeUnits, 100_000), e.req); err != nil || !s.Success {
		t.Fatalf("at the priority fee cap: %+v %v", s, err)
	}
	// One micro-lamport more per unit is refused at verify and at settle,
	// before the chain sees it, at no cost to anyone.
	sims, sends, before := fr.count("simulateTransaction"), fr.count("sendTransaction"), e.chain.Lamports(fee)
	pp := e.payAt(t, buyer, "over the cap", DefaultMaxComputeUnits, 100_001)
	v, err := e.f.Verify(ctx, pp, e.req)
	if err != nil || v.IsValid || v.InvalidReason != ReasonFailureBudgetPriorityFee || v.Payer != pub(buyer).String() ||
		!strings.Contains(v.InvalidMessage, "at most 5000 lamports, this one asks for 5001") {
		t.Fatalf("verify over the cap: %+v %v", v, err)
	}
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || s.Success || s.ErrorReason != ReasonFailureBudgetPriorityFee || s.Transaction != "" {
		t.Fatalf("settle over the cap: %+v %v", s, err)
	}
	if fr.count("simulateTransaction") != sims || fr.count("sendTransaction") != sends || e.chain.Lamports(fee) != before {
		t.Fatal("a refused payment reached the chain")
	}

	now = func() time.Time { return time.Now().Add(DefaultFailureWindow + time.Second) }
	defer func() { now = time.Now }()
	if s, err := e.f.Settle(ctx, e.payAt(t, buyer, "at the caps after the window", DefaultMaxComputeUnits, DefaultMaxComputeUnitPrice), e.req); err != nil || !s.Success {
		t.Fatalf("at the caps after the window: %+v %v", s, err)
	}
}

// TestSettlementsInFlightArePlacesInTheBudget: a payer's settlements sent
// and not yet confirmed hold places (MaxInFlightPerPayer): one move of its
// tokens would fail them all at once, before any failure is recorded. A
// payer at its cap is refused at verify too, before anything is simulated
// (a gateway that settles after the call would otherwise run the call and
// then fail to settle); verify takes no place. A place is given back once
// the outcome is known.
func TestSettlementsInFlightArePlacesInTheBudget(t *testing.T) {
	e, fr := budgetEnv(t, Config{MaxInFlightPerPayer: 1, ConfirmTimeout: time.Minute})
	ctx := context.Background()
	sent := make(chan struct{})
	var once sync.Once
	fr.set(func(f *faultyRPC) {
		f.hideStatus = true
		f.beforeSend = func() { once.Do(func() { close(sent) }) }
	})
	first := make(chan x402.SettleResponse, 1)
	go func() {
		s, err := e.f.Settle(ctx, e.pay(t, e.payer, "first"), e.req)
		if err != nil {
			t.Error(err)
		}
		first <- s
	}()
	<-sent // the first settlement holds its place and is on its way

	second := e.pay(t, e.payer, "second")
	sims := fr.count("simulateTransaction")
	v, err := e.f.Verify(ctx, second, e.req)
	if err != nil || v.IsValid || v.InvalidReason != ReasonPayerFailureBudget || !strings.Contains(v.InvalidMessage, "1 settlements of this payer are in flight") {
		t.Fatalf("verify while one is in flight: %+v %v", v, err)
	}
	if fr.count("simulateTransaction") != sims {
		t.Fatal("verify simulated a payment it refused")
	}
	s, err := e.f.Settle(ctx, second, e.req)
	if err != nil || s.Success || s.ErrorReason != ReasonPayerFailureBudget || !strings.Contains(s.ErrorMessage, "in flight") || s.Transaction != "" {
		t.Fatalf("settle while one is in flight: %+v %v", s, err)
	}
	if n := fr.count("sendTransaction"); n != 1 {
		t.Fatalf("%d sends, want only the first", n)
	}

	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	if s := <-first; !s.Success {
		t.Fatalf("first: %+v", s)
	}
	if v, err := e.f.Verify(ctx, second, e.req); err != nil || !v.IsValid {
		t.Fatalf("verify once the first is confirmed: %+v %v", v, err)
	}
	if s, err := e.f.Settle(ctx, second, e.req); err != nil || !s.Success {
		t.Fatalf("second, once the first is confirmed: %+v %v", s, err)
	}
}

// failuresOf is the failures counted against payer within the window.
func (e *env) failuresOf(payer ed25519.PrivateKey) int {
	e.f.budget.mu.Lock()
	defer e.f.budget.mu.Unlock()
	if id := e.f.budget.ids[pub(payer)]; id != nil {
		return e.f.budget.recent(id, now())
	}
	return 0
}

// TestAReplayedFailureIsNotChargedAgain: a settlement that failed on chain
// costs the fee payer its fee once, and is charged to the budget once.
// After its record ages out (DuplicateWindow), a /settle of the very same
// payload finds the failed transaction by lookup and answers it failed;
// that costs the fee payer nothing, so it is not charged again. Otherwise
// anyone who can call /settle could replay one failure at the caps every
// two minutes and keep the lamport budget used up, refusing every honest
// payment that asks for a priority fee above the cap past the budget.
func TestAReplayedFailureIsNotChargedAgain(t *testing.T) {
	e, fr := budgetEnv(t, Config{})
	ctx := context.Background()
	fee := pub(e.fee).String()
	drainErr := e.drainOnSend(fr, e.payer)
	e.fund(e.payer)
	// The costliest payment the caps allow: 50,000 units × 5,000,000.
	pp := e.payAt(t, e.payer, "fails once", 50_000, 5_000_000)
	before := e.chain.Lamports(fee)
	s, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || s.Success || s.ErrorReason != ReasonTransactionFailed {
		t.Fatalf("first settle: %+v %v", s, err)
	}
	if err := drainErr(); err != nil {
		t.Fatal(err)
	}
	fr.set(func(f *faultyRPC) { f.beforeSend = nil })
	paid := before - e.chain.Lamports(fee)
	one := e.f.budget.spentLamports()
	if one != paid || e.failuresOf(e.payer) != 1 {
		t.Fatalf("the failure cost the fee payer %d lamports; the budget counts %d lamports and %d failures of the payer", paid, one, e.failuresOf(e.payer))
	}

	defer func() { now = time.Now }()
	for i := 1; i <= 25; i++ {
		shift := time.Duration(i) * (DuplicateWindow + sweepEvery + time.Second)
		now = func() time.Time { return time.Now().Add(shift) }
		s, err := e.f.Settle(ctx, pp, e.req)
		if err != nil || s.Success || s.ErrorReason != ReasonTransactionFailed {
			t.Fatalf("replay %d: %+v %v", i, s, err)
		}
		if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementNever {
			t.Fatalf("status after replay %d: %+v %v", i, st, err)
		}
	}
	if got := before - e.chain.Lamports(fee); got != paid {
		t.Fatalf("the replays cost the fee payer %d lamports, the failure %d", got, paid)
	}
	if got, n := e.f.budget.spentLamports(), e.failuresOf(e.payer); got != one || n != 1 {
		t.Fatalf("after 25 replays of one failure (no new fee paid) the budget counts %d lamports (want %d) and %d failures of the payer (want 1)", got, one, n)
	}
	// An honest payer asking for a priority fee of 10,000 lamports.
	other := testKey("honest costly payer")
	e.fund(other)
	if v, err := e.f.Verify(ctx, e.payAt(t, other, "honest", 20_000, 500_000), e.req); err != nil || !v.IsValid {
		t.Fatalf("an honest payment after the replays: %+v %v", v, err)
	}
}

// TestAFailureIsChargedByItsSenderOnce: a failure on chain is charged to
// the budget by the facilitator that sent the transaction, once. One sent
// by another (an instance with the same fee payer, or this one before a
// restart) and found by lookup cost this facilitator nothing, and is not
// charged. One this facilitator sent and answered pending is charged
// once, by the facilitator learning its outcome in the background, and
// not again by whatever asks about it after its record was swept (its
// settlement status, a /settle of it), however often.
func TestAFailureIsChargedByItsSenderOnce(t *testing.T) {
	ctx := context.Background()
	defer func() { now = time.Now }()
	past := func() {
		now = func() time.Time { return time.Now().Add(DuplicateWindow + sweepEvery + time.Second) }
	}

	t.Run("sent by another", func(t *testing.T) {
		e := newEnv(t, Config{})
		p := e.payment(t)
		p.Amount = 2_000_000 // over the buyer's balance: the transfer fails
		raw := p.Build(p.Instructions())
		tx, err := DecodeTransaction(raw)
		if err != nil {
			t.Fatal(err)
		}
		copy(tx.Signatures[0], ed25519.Sign(e.fee, tx.Message))
		if _, err := (&RPC{URL: e.chain.URL}).Send(ctx, raw); err != nil {
			t.Fatal(err)
		}
		req := e.req
		req.Amount = "2000000"
		for range 2 {
			st, err := e.f.SettlementStatus(ctx, Payload(raw, req), req)
			if err != nil || st.State != x402.SettlementNever {
				t.Fatalf("status of a transaction that failed on chain: %+v %v", st, err)
			}
		}
		if s, err := e.f.Settle(ctx, Payload(raw, req), req); err != nil || s.ErrorReason != ReasonTransactionFailed {
			t.Fatalf("settle of a transaction that failed on chain: %+v %v", s, err)
		}
		if n, l := e.failuresOf(e.payer), e.f.budget.spentLamports(); n != 0 || l != 0 {
			t.Fatalf("another's failure, learned by lookup, counted %d failures and %d lamports here, want none", n, l)
		}
	})

	t.Run("sent here, swept pending", func(t *testing.T) {
		now = time.Now
		e, fr := budgetEnv(t, Config{ConfirmTimeout: 300 * time.Millisecond})
		drainErr := e.drainOnSend(fr, e.payer)
		e.fund(e.payer)
		fr.set(func(f *faultyRPC) { f.hideStatus = true })
		pp := e.pay(t, e.payer, "pending, then failed")
		_, err := e.f.Settle(ctx, pp, e.req)
		var unknown *x402.UnknownOutcomeError
		if !errors.As(err, &unknown) {
			t.Fatalf("want an unknown outcome, got %v", err)
		}
		if err := drainErr(); err != nil {
			t.Fatal(err)
		}
		fr.set(func(f *faultyRPC) { f.hideStatus, f.beforeSend = false, nil })
		e.learnedAll(t)
		past()
		e.f.mu.Lock()
		e.f.sweep(now())
		swept := len(e.f.settled) == 0
		e.f.mu.Unlock()
		if !swept {
			t.Fatal("the pending record outlived its window and a sweep")
		}
		for range 2 {
			if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementNever {
				t.Fatalf("status: %+v %v", st, err)
			}
		}
		if s, err := e.f.Settle(ctx, pp, e.req); err != nil || s.ErrorReason != ReasonTransactionFailed {
			t.Fatalf("settle: %+v %v", s, err)
		}
		if n, l := e.failuresOf(e.payer), e.f.budget.spentLamports(); n != 1 || l != failedFee {
			t.Fatalf("a failure this facilitator sent counted %d times, %d lamports; want once, %d", n, l, failedFee)
		}
	})
}

// countedSent is a store of sends that counts the records written.
type countedSent struct {
	SentStore
	written atomic.Int32
}

func (s *countedSent) ClaimHeld(ctx context.Context, keys []string, until time.Time, span time.Duration, note func(store.Claim) (string, error)) (store.Claim, error) {
	c, err := s.SentStore.ClaimHeld(ctx, keys, until, span, note)
	if err == nil {
		s.written.Add(1)
	}
	return c, err
}

// Two payments of one payer settled at once both pass the budget's check
// (nothing is in flight yet) and one is refused its place in flight
// (MaxInFlightPerPayer 1): the refused one writes no record of a send,
// since it sends nothing, so no facilitator on the same store can adopt
// it and poll a signature the chain never gets. (Before: the record was
// written before the place was taken and dropped after the refusal;
// found in between, it was adopted as a send in flight.)
func TestABudgetRefusalAtItsPlaceInFlightWritesNoRecord(t *testing.T) {
	db := openStore(t, t.TempDir())
	sent := &countedSent{SentStore: sentOf(db)}
	e, fr := budgetEnv(t, Config{Sent: sent, MaxInFlightPerPayer: 1, ConfirmTimeout: 300 * time.Millisecond})
	var arrived atomic.Int32
	fr.set(func(f *faultyRPC) {
		f.hideStatus = true // the payment sent stays in flight
		f.beforeSimulate = func() {
			// Both simulate once both passed the budget's check.
			arrived.Add(1)
			for deadline := time.Now().Add(2 * time.Second); arrived.Load() < 2 && time.Now().Before(deadline); {
				time.Sleep(5 * time.Millisecond)
			}
		}
	})
	ctx := context.Background()
	var wg sync.WaitGroup
	var refused atomic.Int32
	for _, memo := range []string{"first", "second"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := e.f.Settle(ctx, e.pay(t, e.payer, memo), e.req)
			if err == nil && s.ErrorReason == ReasonPayerFailureBudget {
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	if refused.Load() != 1 || fr.count("sendTransaction") != 1 {
		t.Fatalf("refused %d, sent %d; want one of each", refused.Load(), fr.count("sendTransaction"))
	}
	if n := sent.written.Load(); n != 1 {
		t.Errorf("%d records written for one send; want 1", n)
	}
}

// A facilitator whose payer is at MaxInFlightPerPayer is asked to settle a
// payment another facilitator on the same store of sends recorded and is
// sending: it follows that send (settlement_pending here, its statuses
// hidden), never refuses it, since the transfer then lands. (Before: the
// budget was consulted before the record and the answer was
// payer_failure_budget_exhausted, "pay again", for a payment that landed.)
func TestBudgetNeverRefusesAPaymentRecordedInFlightElsewhere(t *testing.T) {
	db := openStore(t, t.TempDir())
	frA := &faultyRPC{}
	srvA := frA.serve(t)
	e := newEnv(t, Config{RPC: &RPC{URL: srvA}, Sent: sentOf(db), ConfirmTimeout: 2 * time.Second, PollInterval: 20 * time.Millisecond})
	reached, release := make(chan struct{}), make(chan struct{})
	var once atomic.Bool
	frA.set(func(f *faultyRPC) {
		f.target = e.chain.URL
		f.beforeSend = func() {
			if once.CompareAndSwap(false, true) {
				close(reached)
				<-release
			}
		}
	})
	frB := &faultyRPC{}
	srvB := frB.serve(t)
	frB.set(func(f *faultyRPC) { f.target, f.hideStatus = e.chain.URL, true })
	cfg := e.f.cfg
	cfg.RPC, cfg.MaxInFlightPerPayer, cfg.ConfirmTimeout = &RPC{URL: srvB}, 1, 300*time.Millisecond
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// B holds one payment of this payer in flight (its statuses hidden).
	q := e.payment(t)
	q.Memo = "another-payment-another-payment!"
	if _, err := b.Settle(context.Background(), Payload(q.Transaction(), e.req), e.req); err == nil {
		t.Fatal("B's own payment: want pending")
	}
	pp := Payload(e.payment(t).Transaction(), e.req)
	done := make(chan x402.SettleResponse, 1)
	go func() {
		s, _ := e.f.Settle(context.Background(), pp, e.req)
		done <- s
	}()
	<-reached // A recorded the payment and is sending it
	s, err := b.Settle(context.Background(), pp, e.req)
	close(release)
	a := <-done
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Errorf("B's settle of the payment A recorded and is sending: %+v %v; want settlement_pending (following A's send), never a refusal", s, err)
	}
	if !a.Success {
		t.Errorf("A: %+v; want success", a)
	}
	if _, paid := e.balances(t); paid != 2*20000 {
		t.Errorf("payee holds %d; want both payments once", paid)
	}
}
