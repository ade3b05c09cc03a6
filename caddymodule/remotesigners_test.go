package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"go.uber.org/zap"

	"github.com/aovhq/aov/x402"
)

// A remote facilitator's signers, whose transfers a status read counts as
// its own, come from its GET /supported: those under "eip155:*" and under
// the network, remembered for multiSupportedTTL; while the remote does not
// answer, the last answer is kept (its own transfers stay its own), and
// one that lists none leaves them unknown (nil: every sender counts).
func TestRemoteSignersAreReadFromSupported(t *testing.T) {
	const network = "eip155:1337"
	a, b := "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
	var answer atomic.Value
	answer.Store(`{"kinds":[],"extensions":[],"signers":{"eip155:*":["` + a + `"],"eip155:1337":["` + b + `","not an address"],"eip155:8453":["0x0000000000000000000000000000000000000001"]}}`)
	asked := atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		s := answer.Load().(string)
		if s == "" {
			http.Error(w, "down", http.StatusNotFound)
			return
		}
		w.Write([]byte(s))
	}))
	defer srv.Close()
	m := &HTTPFacilitator{f: x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: srv.URL, Timeout: 2 * time.Second}), status: remoteStatus{signers: &remoteSigners{}}, logger: zap.NewNop()}
	ctx := context.Background()
	want := []common.Address{common.HexToAddress(a), common.HexToAddress(b)}
	if got := m.evmSigners(ctx, network); !slices.Equal(got, want) {
		t.Fatalf("signers = %v, want %v", got, want)
	}
	answer.Store("")
	if got := m.evmSigners(ctx, network); !slices.Equal(got, want) || asked.Load() != 1 {
		t.Fatalf("within the TTL: signers = %v after %d asks, want %v from the one ask", got, asked.Load(), want)
	}
	clock := time.Now()
	now = func() time.Time { return clock.Add(multiSupportedTTL + time.Second) }
	t.Cleanup(func() { now = time.Now })
	if got := m.evmSigners(ctx, network); !slices.Equal(got, want) || asked.Load() != 2 {
		t.Fatalf("the remote down past the TTL: signers = %v after %d asks, want the last answer's %v", got, asked.Load(), want)
	}
	answer.Store(`{"kinds":[],"extensions":[],"signers":{}}`)
	now = func() time.Time { return clock.Add(multiSupportedTTL + multiRetryMax + 2*time.Second) }
	if got := m.evmSigners(ctx, network); got != nil {
		t.Fatalf("a remote listing no signers: %v, want nil (unknown)", got)
	}
}
