package caddymodule

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

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
