package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// learnedAll waits until the facilitator has learned the outcome of every
// transaction it sent (its resolver is done), or fails t.
func (e *env) learnedAll(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		e.f.mu.Lock()
		n, running := len(e.f.unlearned), e.f.resolving
		e.f.mu.Unlock()
		if n == 0 && !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sent transactions still unlearned after 10s", n)
		}
	}
}

// hangUpAfterSend posts pp to /settle at srv and hangs up once the
// settlement is forwarded to the chain, as a payer calling the public
// facilitator itself may. It reports whether the settlement was sent.
func (e *env) hangUpAfterSend(t *testing.T, fr *faultyRPC, srv string, pp x402.PaymentPayload) bool {
	t.Helper()
	body, err := json.Marshal(x402.FacilitatorRequest{X402Version: 2, PaymentPayload: pp, PaymentRequirements: e.req})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var before func()
	fr.set(func(f *faultyRPC) {
		before = f.beforeSend
		f.beforeSend = func() {
			if before != nil {
				before()
			}
			cancel()                           // the caller hangs up: its transaction is on its way
			time.Sleep(200 * time.Millisecond) // and the server sees it before the send's reply
		}
	})
	defer fr.set(func(f *faultyRPC) { f.beforeSend = before })
	sends := fr.count("sendTransaction")
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv+"/settle", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the caller hung up, yet got an answer")
	}
	return fr.count("sendTransaction") > sends
}

// TestFailuresOfSettlesWhoseCallerHangsUpAreCharged: a hostile payer calls
// the public /settle itself, moves its USDC away before the send (the
// settlement fails on chain, the fee payer pays its fee) and hangs up once
// the transaction is on its way, and never asks about it again. The
// facilitator that sent it learns every failure by itself and charges it:
// after max_failed_per_payer of them the payer is refused, and the lamport
// budget counts what the fee payer lost.
func TestFailuresOfSettlesWhoseCallerHangsUpAreCharged(t *testing.T) {
	e, fr := budgetEnv(t, Config{})
	drainErr := e.drainOnSend(fr, e.payer)
	srv := httptest.NewServer(x402.NewFacilitatorHandler(e.f))
	defer srv.Close()
	fee := pub(e.fee).String()
	start := e.chain.Lamports(fee)

	for i := range DefaultMaxFailedPerPayer {
		e.fund(e.payer)
		pp := e.payAt(t, e.payer, fmt.Sprint("hang up ", i), DefaultMaxComputeUnits, DefaultMaxComputeUnitPrice)
		if !e.hangUpAfterSend(t, fr, srv.URL, pp) {
			t.Fatalf("settlement %d was not sent", i)
		}
		if err := drainErr(); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); e.failuresOf(e.payer) < i+1; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("settlement %d failed on chain and its caller hung up: after 10s the budget counts %d failures of the payer, want %d", i, e.failuresOf(e.payer), i+1)
			}
		}
	}
	e.learnedAll(t)
	lost := start - e.chain.Lamports(fee)
	if n, l := e.failuresOf(e.payer), e.f.budget.spentLamports(); n != DefaultMaxFailedPerPayer || l != lost {
		t.Fatalf("the fee payer lost %d lamports to %d failures; the budget counts %d failures and %d lamports", lost, DefaultMaxFailedPerPayer, n, l)
	}
	fr.set(func(f *faultyRPC) { f.beforeSend = nil })
	e.fund(e.payer)
	v, err := e.f.Verify(context.Background(), e.payAt(t, e.payer, "next", DefaultMaxComputeUnits, DefaultMaxComputeUnitPrice), e.req)
	if err != nil || v.IsValid || v.InvalidReason != ReasonPayerFailureBudget {
		t.Fatalf("the payer's next payment after %d failures: %+v %v; want %s", DefaultMaxFailedPerPayer, v, err, ReasonPayerFailureBudget)
	}
}

// TestAPendingSettlementHoldsItsPlaceInFlight: a settlement whose caller
// gave up before its outcome was known (its deadline, or a hang-up) still
// holds its payer's place in flight until the facilitator learns the
// outcome in the background: otherwise a payer could have any number of
// settlements on their way at once, all failed by one move of its tokens.
func TestAPendingSettlementHoldsItsPlaceInFlight(t *testing.T) {
	e, fr := budgetEnv(t, Config{MaxInFlightPerPayer: 1})
	fr.set(func(f *faultyRPC) { f.hideStatus = true })
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err := e.f.Settle(ctx, e.pay(t, e.payer, "first"), e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) || unknown.Reply == nil || unknown.Reply.ErrorReason != ReasonSettlementPending {
		t.Fatalf("first, its caller's deadline passed: %v; want settlement_pending", err)
	}

	second := e.pay(t, e.payer, "second")
	v, err := e.f.Verify(context.Background(), second, e.req)
	if err != nil || v.IsValid || v.InvalidReason != ReasonPayerFailureBudget || !strings.Contains(v.InvalidMessage, "in flight") {
		t.Fatalf("verify while the first is pending: %+v %v; want %s (in flight)", v, err, ReasonPayerFailureBudget)
	}

	fr.set(func(f *faultyRPC) { f.hideStatus = false })
	e.learnedAll(t)
	if v, err := e.f.Verify(context.Background(), second, e.req); err != nil || !v.IsValid {
		t.Fatalf("verify once the first landed: %+v %v", v, err)
	}
	if n := e.failuresOf(e.payer); n != 0 {
		t.Fatalf("a settlement that landed counted %d failures", n)
	}
}

// TestASweepDuringAStatusChargesAFailureOnce: a settlement answered pending
// fails on chain; a settlement status of it reads its record and asks the
// chain, and meanwhile another payment's verify sweeps the expired record.
// The failure is charged once, whoever learns it (the status, the
// background resolver, a later status or /settle of the payload). The
// fake holds the signature status requests until the sweep has run: the
// interleaving cannot be timed otherwise.
func TestASweepDuringAStatusChargesAFailureOnce(t *testing.T) {
	ctx := context.Background()
	defer func() { now = time.Now }()
	e, fr := budgetEnv(t, Config{ConfirmTimeout: 300 * time.Millisecond})
	drainErr := e.drainOnSend(fr, e.payer)
	e.fund(e.payer)
	fr.set(func(f *faultyRPC) { f.hideStatus = true })
	pp := e.pay(t, e.payer, "pending, then failed")
	if _, err := e.f.Settle(ctx, pp, e.req); err == nil {
		t.Fatal("want an unknown outcome")
	}
	if err := drainErr(); err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fr.set(func(f *faultyRPC) {
		f.hideStatus, f.beforeSend = false, nil
		f.beforeStatus = func() {
			once.Do(func() { close(entered) })
			<-release
		}
	})
	// The record is past DuplicateWindow, not swept yet.
	now = func() time.Time { return time.Now().Add(DuplicateWindow + sweepEvery + time.Second) }
	first := make(chan error, 1)
	go func() {
		st, err := e.f.SettlementStatus(ctx, pp, e.req)
		if err == nil && st.State != x402.SettlementNever {
			err = fmt.Errorf("state %v", st.State)
		}
		first <- err
	}()
	<-entered
	other := testKey("another payer")
	e.fund(other)
	if v, err := e.f.Verify(ctx, e.pay(t, other, "other"), e.req); err != nil || !v.IsValid {
		t.Fatalf("another payer's verify: %+v %v", v, err)
	}
	e.f.mu.Lock()
	swept := len(e.f.settled) == 0
	e.f.mu.Unlock()
	if !swept {
		t.Fatal("the verify did not sweep the expired record")
	}
	fr.set(func(f *faultyRPC) { f.beforeStatus = nil })
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if st, err := e.f.SettlementStatus(ctx, pp, e.req); err != nil || st.State != x402.SettlementNever {
			t.Fatalf("a later status: %+v %v", st, err)
		}
	}
	if s, err := e.f.Settle(ctx, pp, e.req); err != nil || s.ErrorReason != ReasonTransactionFailed {
		t.Fatalf("a later settle: %+v %v", s, err)
	}
	e.learnedAll(t)
	if n, l := e.failuresOf(e.payer), e.f.budget.spentLamports(); n != 1 || l != failedFee {
		t.Fatalf("one failure on chain (the fee payer paid %d once) is counted %d times, %d lamports; want once, %d", failedFee, n, l, failedFee)
	}
}

// notJSONRPC starts a server that answers every request 200 with JSON that
// is no JSON-RPC reply, as another service given a retired endpoint's port
// may; calls counts the requests it got.
func notJSONRPC(t *testing.T) (url string, calls *atomic.Int64) {
	calls = new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"paid_content":true}`))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, calls
}

// failingWhileResolving settles a payment whose send lands but whose
// outcome Settle does not learn (the send's reply is lost, the status
// hidden), so the background resolver polls it; then the endpoint fails
// every request (its calls count them) until heal.
func failingWhileResolving(t *testing.T) (e *env, calls *atomic.Int64, heal func()) {
	t.Helper()
	e, fr := budgetEnv(t, Config{ConfirmTimeout: 300 * time.Millisecond})
	fr.set(func(f *faultyRPC) { f.dropSend, f.forwardOK, f.hideStatus = true, true, true })
	_, err := e.f.Settle(context.Background(), e.pay(t, e.payer, "landed, unanswered"), e.req)
	var unknown *x402.UnknownOutcomeError
	if !errors.As(err, &unknown) {
		t.Fatalf("settle with its reply lost: %v; want an unknown outcome", err)
	}
	other, calls := notJSONRPC(t)
	fr.set(func(f *faultyRPC) { f.target, f.dropSend, f.hideStatus = other, false, false })
	return e, calls, func() { fr.set(func(f *faultyRPC) { f.target = e.chain.URL }) }
}

// TestTheResolverBacksOffAnEndpointThatFails: a send whose outcome Settle
// did not learn is polled in the background for up to FailureWindow (1 h).
// While every poll fails (the endpoint down, refusing, or, here, answering
// what is not JSON-RPC, as another server on a retired endpoint's port
// may), the resolver waits twice as long after each round: over 2 s at a
// PollInterval of 20 ms the endpoint is asked a handful of times. (Before:
// every PollInterval, about 100 requests here; at the default 400 ms, about
// 9,000 per waiting send over the hour.) Once the endpoint answers again
// the outcome is learned, and the landed send charges nothing.
func TestTheResolverBacksOffAnEndpointThatFails(t *testing.T) {
	e, calls, heal := failingWhileResolving(t)
	time.Sleep(2 * time.Second)
	n := calls.Load()
	if n == 0 {
		t.Fatal("the resolver asked the failing endpoint nothing: the test needs it to poll")
	}
	if n > 10 {
		t.Errorf("the resolver asked an endpoint that fails every time %d times in 2 s at a PollInterval of 20 ms; want its wait doubled after each failed round (at most 10)", n)
	}
	heal()
	e.learnedAll(t)
	if f := e.failuresOf(e.payer); f != 0 {
		t.Fatalf("a settlement that landed counted %d failures", f)
	}
}

// TestTheResolversWaitIsCapped: the resolver's wait while its polls fail
// doubles up to resolveMaxWait and no further, so a send waiting on an
// endpoint that comes back is learned at most that long after. Here the
// cap is 100 ms: over 2 s the failing endpoint is asked about every
// 100 ms, far more often than doubling alone would (about 6 times).
func TestTheResolversWaitIsCapped(t *testing.T) {
	old := resolveMaxWait
	resolveMaxWait = 100 * time.Millisecond
	t.Cleanup(func() { resolveMaxWait = old })
	e, calls, heal := failingWhileResolving(t)
	time.Sleep(2 * time.Second)
	if n := calls.Load(); n < 12 || n > 25 {
		t.Errorf("the resolver asked a failing endpoint %d times in 2 s with its wait capped at 100 ms; want about 17 (12 to 25)", n)
	}
	heal()
	e.learnedAll(t)
}

// TestCloseWakesTheResolverFromItsWait: a resolver backed off from a
// failing endpoint is waiting up to resolveMaxWait between rounds; Close
// ends it at once, not at the end of that wait, so nothing of a closed
// facilitator lingers.
func TestCloseWakesTheResolverFromItsWait(t *testing.T) {
	e, _, _ := failingWhileResolving(t)
	time.Sleep(1500 * time.Millisecond) // its wait is past a second now
	e.f.Close()
	for deadline := time.Now().Add(300 * time.Millisecond); ; time.Sleep(10 * time.Millisecond) {
		e.f.mu.Lock()
		running := e.f.resolving
		e.f.mu.Unlock()
		if !running {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the resolver still runs 300 ms after Close: it sleeps out its wait")
		}
	}
}
