package evmfacilitator

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/aovhq/aov/x402"
)

// A lost settlement transaction whose second send is refused only by the
// provider's rate limit (JSON-RPC -32005, HTTP 429) keeps its nonce: a rate
// limit says nothing of the transaction, which may still execute. The
// relayer's next transaction takes the nonce after it, and a retry of the
// lost settlement once the limit has passed sends it again and is paid by
// it. (Before: the nonce went back to the chain's, the next settlement took
// it, and the lost payment could never settle.)
func TestLostSendRateLimitedAgainKeepsItsNonce(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit error
	}{
		{"JSON-RPC -32005", nodeError{code: -32005, msg: "limit exceeded"}},
		{"HTTP 429", rpc.HTTPError{StatusCode: http.StatusTooManyRequests, Status: "429 Too Many Requests"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			vc := &fakeLosingSends{Chain: e.d.Client(), drop: 1, refuseAgain: tc.limit}
			f, err := New(Config{Chain: vc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			req := e.requirements(payee, amount)
			lostPay := mustSignExact(t, payer, req)
			var ue *x402.UnknownOutcomeError
			if _, err := f.Settle(context.Background(), lostPay, req); !errors.As(err, &ue) {
				t.Fatalf("settle whose transaction was lost and rate-limited when sent again: %v; want an unknown outcome", err)
			}
			// Another settlement of the relayer meanwhile: queued behind
			// the lost nonce, so its outcome is unknown for now.
			if r, err := f.Settle(context.Background(), mustSignExact(t, payer, req), req); !errors.As(err, &ue) {
				t.Errorf("next settle while the lost nonce is unfilled = %+v, %v; want an unknown outcome", r, err)
			}
			vc.mu.Lock()
			lost := vc.lost[0]
			sends := slices.Clone(vc.sends)
			vc.refuseAgain = nil // the limit passed
			vc.mu.Unlock()
			// The next settlement's is the one send not of the lost
			// transaction: the look-after may send that again, rate-limited
			// too, before or after it, once it has waited its wait.
			others := slices.DeleteFunc(slices.Clone(sends), func(tx *types.Transaction) bool { return tx.Hash() == lost.Hash() })
			if len(sends) < 3 || sends[1].Hash() != lost.Hash() || len(others) != 1 {
				t.Fatalf("%d sends, %d of them not the lost transaction; want the lost one, its rate-limited second send, and one of the next settlement", len(sends), len(others))
			}
			next := others[0]
			if next.Nonce() != lost.Nonce()+1 {
				t.Fatalf("next settlement's nonce = %d; want %d, after the lost one's %d, which may still execute", next.Nonce(), lost.Nonce()+1, lost.Nonce())
			}
			if _, err := f.Settle(context.Background(), lostPay, req); !errors.As(err, &ue) {
				t.Errorf("retry of the lost settlement = %v; want an unknown outcome while it is sent again", err)
			}
			if r := waitMined(t, e, lost.Hash()); r.Status != types.ReceiptStatusSuccessful {
				t.Fatal("the lost transaction, sent again, reverted")
			}
			if r, err := f.Settle(context.Background(), lostPay, req); err != nil || !r.Success || r.Transaction != lost.Hash().Hex() {
				t.Errorf("retry once the lost transaction is mined = %+v, %v; want success naming %s", r, err, lost.Hash().Hex())
			}
			if r := waitMined(t, e, next.Hash()); r.Status != types.ReceiptStatusSuccessful {
				t.Error("the next settlement, behind the lost one, reverted")
			}
		})
	}
}
