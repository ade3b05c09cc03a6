package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// hungFacilitator is a FAKE remote facilitator (listed first in a multi)
// whose /supported hangs for wait and then fails, as a black-holed host
// behind its timeout does, until up is set; then it answers with kinds.
type hungFacilitator struct {
	wait  time.Duration
	mu    sync.Mutex
	calls int
	up    bool
	kinds []x402.SupportedKind
}

func (h *hungFacilitator) Verify(context.Context, x402.PaymentPayload, x402.PaymentRequirements) (x402.VerifyResponse, error) {
	return x402.VerifyResponse{}, errors.New("down")
}

func (h *hungFacilitator) Settle(context.Context, x402.PaymentPayload, x402.PaymentRequirements) (x402.SettleResponse, error) {
	return x402.SettleResponse{}, errors.New("down")
}

func (h *hungFacilitator) Supported(ctx context.Context) (x402.SupportedResponse, error) {
	h.mu.Lock()
	h.calls++
	up := h.up
	h.mu.Unlock()
	if up {
		return x402.SupportedResponse{Kinds: h.kinds}, nil
	}
	select {
	case <-time.After(h.wait):
	case <-ctx.Done():
	}
	return x402.SupportedResponse{}, errors.New("facilitator /supported: timeout")
}

func (h *hungFacilitator) asked() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

// multi { http <remote that hangs> ; svm {...} }: a failed /supported is
// remembered, so the Solana payments after the first are sent to the svm
// facilitator at once; the remote is asked again after 2 s, then after
// twice as long at each failure, at most a minute apart, and used again
// once it answers. A caller that left says nothing of the remote.
// (Before: only a success was remembered, and every verify and settle of
// every Solana payment waited out the remote's timeout first.)
func TestMultiSkipsAFailedFacilitatorForAWhile(t *testing.T) {
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: "http://127.0.0.1:1"},
		Network: x402.NetworkSolanaDevnet, FeePayer: svmfacilitator.DevFeePayer()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	svm := &SVMFacilitator{f: f}
	hung := &hungFacilitator{wait: 100 * time.Millisecond,
		kinds: []x402.SupportedKind{{X402Version: x402.Version, Scheme: "exact", Network: "eip155:8453"}}}
	m := &MultiFacilitator{fs: []x402.Facilitator{hung, svm}}
	m.ready()
	clock := time.Now()
	now = func() time.Time { return clock }
	t.Cleanup(func() { now = time.Now })
	solana := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet}
	pick := func(ctx context.Context, req x402.PaymentRequirements, wantAsked int) x402.Facilitator {
		t.Helper()
		got, err := m.pick(ctx, req)
		if got == nil {
			t.Fatalf("pick: no facilitator (%v)", err)
		}
		if n := hung.asked(); n != wantAsked {
			t.Fatalf("the hung facilitator was asked %d times, want %d", n, wantAsked)
		}
		return got
	}
	// A caller that left starts no backoff.
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	if got, _ := m.pick(canceled, solana); got != svm {
		t.Fatalf("pick with the caller gone: %v", got)
	}
	ctx := context.Background()
	if got := pick(ctx, solana, 2); got != svm {
		t.Fatalf("picked %T, want the svm facilitator", got)
	}
	for range 3 {
		start := time.Now()
		pick(ctx, solana, 2)
		if d := time.Since(start); d >= hung.wait {
			t.Fatalf("payment waited %v for the hung facilitator's /supported", d.Round(time.Millisecond))
		}
	}
	// Its /supported, the union, fails at once too.
	start := time.Now()
	if _, err := m.Supported(ctx); err == nil || time.Since(start) >= hung.wait || hung.asked() != 2 {
		t.Fatalf("supported: %v after %v, asked %d times", err, time.Since(start), hung.asked())
	}
	// Asked again after 2 s, then after 4 s.
	clock = clock.Add(multiRetryFirst)
	pick(ctx, solana, 3)
	clock = clock.Add(2*multiRetryFirst - time.Millisecond)
	pick(ctx, solana, 3)
	clock = clock.Add(time.Millisecond)
	pick(ctx, solana, 4)
	// The backoff stops doubling at a minute.
	for i := 5; i < 12; i++ {
		clock = clock.Add(multiRetryMax)
		pick(ctx, solana, i)
	}
	// Back up: asked once the backoff ends, and used for its network.
	hung.mu.Lock()
	hung.up = true
	hung.mu.Unlock()
	clock = clock.Add(multiRetryMax)
	if got := pick(ctx, x402.PaymentRequirements{Scheme: "exact", Network: "eip155:8453"}, 12); got != hung {
		t.Fatalf("picked %T for its network, want the remote back up", got)
	}
	if got := pick(ctx, solana, 12); got != svm {
		t.Fatalf("picked %T, want the svm facilitator", got)
	}
}

// hangingRemote is an HTTP facilitator whose every endpoint hangs until
// the test ends or the caller leaves, with x402's default timeout (30 s).
func hangingRemote(t *testing.T) *x402.HTTPFacilitator {
	t.Helper()
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hang); srv.Close() })
	return x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: srv.URL})
}

// multi { http <remote that hangs>; http <healthy remote> }, with callers
// whose deadline is short (500 ms): each member's /supported ask gets at
// most half the caller's time left, so the healthy second member is asked
// with time left and picked, and a failure the caller's deadline cut short
// starts no backoff for either. The verify sent to the member picked has
// time left too, and is answered. (Before: the first member's ask spent
// the whole deadline, the second was asked on an expired context and its
// failure started its backoff: the next payments, which skipped the first,
// found the healthy second skipped as well.)
func TestMultiCallersDeadlineBacksOffNoHealthyMember(t *testing.T) {
	d, fac := sharedDevnet(t)
	a := hangingRemote(t)
	b := x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: fac})
	s, err := b.Supported(context.Background())
	if err != nil || len(s.Kinds) == 0 {
		t.Fatalf("healthy facilitator's /supported: %v %v", s, err)
	}
	req := x402.PaymentRequirements{Scheme: s.Kinds[0].Scheme, Network: s.Kinds[0].Network}
	m := &MultiFacilitator{fs: []x402.Facilitator{a, b}}
	m.ready()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		got, err := m.pick(ctx, req)
		cancel()
		if got != x402.Facilitator(b) {
			t.Fatalf("payment %d: picked %v, err %v; want the healthy second facilitator", i, got, err)
		}
	}
	m.mu.Lock()
	failed := m.failed
	m.mu.Unlock()
	for i, f := range failed {
		if f.err != nil {
			t.Errorf("member %d backed off (%v) for a failure the caller's deadline caused", i, f.err)
		}
	}
	// Verify through the multi, afresh: the member picked verifies a good
	// payment within the caller's deadline.
	m = &MultiFacilitator{fs: []x402.Facilitator{a, b}}
	m.ready()
	req = x402.PaymentRequirements{Scheme: "exact", Network: evmfacilitator.DevnetNetwork, Amount: "1000", Asset: d.Token().Hex(),
		PayTo: payTo.Hex(), MaxTimeoutSeconds: 60, Extra: d.Asset().Extra()}
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(6), req, &x402.Resource{URL: "http://example.test/verify/schema"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if v, err := m.Verify(ctx, p, req); err != nil || !v.IsValid {
		t.Fatalf("verify: %+v, err %v; want the healthy member's verdict, asked with time left", v, err)
	}
}

// A member whose /supported hangs past multiAskTimeout, for a caller with
// time to spare (no deadline here), costs the payment multiAskTimeout,
// not the member's own timeout, and is backed off: the next payment goes
// straight to the next member.
func TestMultiBoundsEachSupportedAsk(t *testing.T) {
	old := multiAskTimeout
	multiAskTimeout = 200 * time.Millisecond
	t.Cleanup(func() { multiAskTimeout = old })
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: "http://127.0.0.1:1"},
		Network: x402.NetworkSolanaDevnet, FeePayer: svmfacilitator.DevFeePayer()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	svm := &SVMFacilitator{f: f}
	hung := &hungFacilitator{wait: time.Hour}
	m := &MultiFacilitator{fs: []x402.Facilitator{hung, svm}}
	m.ready()
	solana := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet}
	for i := range 2 {
		start := time.Now()
		got, err := m.pick(context.Background(), solana)
		if got != x402.Facilitator(svm) {
			t.Fatalf("payment %d: picked %v, err %v; want the svm facilitator", i, got, err)
		}
		if d := time.Since(start); d > 2*multiAskTimeout {
			t.Fatalf("payment %d waited %v; want at most about %v", i, d.Round(time.Millisecond), multiAskTimeout)
		}
	}
	if n := hung.asked(); n != 1 {
		t.Fatalf("the hung member was asked %d times; want once, then backed off", n)
	}
}

// A caller whose context is already spent when the member is picked (here:
// canceled) is not sent on to the member: the multi answers the caller's
// error itself, and the member's verify and settle are never called.
func TestMultiSendsNothingOnASpentContext(t *testing.T) {
	member := &hungFacilitator{up: true,
		kinds: []x402.SupportedKind{{X402Version: x402.Version, Scheme: "exact", Network: "eip155:8453"}}}
	req := x402.PaymentRequirements{Scheme: "exact", Network: "eip155:8453"}
	m := &MultiFacilitator{fs: []x402.Facilitator{member}}
	m.ready()
	if got, err := m.pick(context.Background(), req); got != x402.Facilitator(member) {
		t.Fatalf("pick: %v %v", got, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Verify(ctx, x402.PaymentPayload{}, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("verify: err %v; want the caller's context.Canceled, the member not asked", err)
	}
	if _, err := m.Settle(ctx, x402.PaymentPayload{}, req); !errors.Is(err, context.Canceled) {
		t.Fatalf("settle: err %v; want the caller's context.Canceled, the member not asked", err)
	}
}

// statusMember is a FAKE facilitator that answers /supported with kinds
// and counts the settlement-status questions it is asked.
type statusMember struct {
	hungFacilitator
	statuses int
}

func (s *statusMember) SettlementStatus(context.Context, x402.PaymentPayload, x402.PaymentRequirements) (x402.SettlementStatus, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.statuses++
	return x402.SettlementStatus{}, nil
}

// The gate asks a multi for a settlement's status within resolveTimeout,
// twice multiAskTimeout: half its time left is just under
// multiAskTimeout, and a member's /supported that hangs for that bound is
// the member's failure and backs it off, so the next question goes
// straight to the next member. A question on a context already spent is
// answered with the caller's error, the member picked never asked.
// (Before: every ask whose bound half the caller's time had set counted as
// cut by the caller, so a hung member was asked again, and waited for,
// on every status question; and a spent context was sent on.)
func TestMultiStatusBacksOffAHungMember(t *testing.T) {
	old := multiAskTimeout
	multiAskTimeout = 200 * time.Millisecond
	t.Cleanup(func() { multiAskTimeout = old })
	kinds := []x402.SupportedKind{{X402Version: x402.Version, Scheme: "exact", Network: "eip155:8453"}}
	hung := &hungFacilitator{wait: time.Hour, kinds: kinds}
	member := &statusMember{hungFacilitator: hungFacilitator{up: true, kinds: kinds}}
	m := &MultiFacilitator{fs: []x402.Facilitator{hung, member}}
	m.ready()
	req := x402.PaymentRequirements{Scheme: "exact", Network: "eip155:8453"}
	for i := range 2 {
		// The gate's bound, scaled as multiAskTimeout is.
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout*multiAskTimeout/old)
		start := time.Now()
		_, err := m.SentSettlementStatus(ctx, x402.PaymentPayload{}, req, x402.SentSettlement{})
		cancel()
		if err != nil {
			t.Fatalf("status %d: %v; want the next member's answer", i, err)
		}
		if i > 0 && time.Since(start) >= multiAskTimeout/2 {
			t.Fatalf("status %d waited %v for the hung member", i, time.Since(start).Round(time.Millisecond))
		}
	}
	if n := hung.asked(); n != 1 {
		t.Errorf("the hung member was asked %d times; want once, then backed off", n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.SentSettlementStatus(ctx, x402.PaymentPayload{}, req, x402.SentSettlement{}); !errors.Is(err, context.Canceled) {
		t.Errorf("status on a spent context: err %v; want the caller's context.Canceled", err)
	}
	if member.statuses != 2 {
		t.Errorf("the member was asked %d settlement statuses; want 2, none on the spent context", member.statuses)
	}
}
