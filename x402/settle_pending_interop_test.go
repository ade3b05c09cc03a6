package x402

import (
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/interop"
)

// TestOfficialResourceServerRetriesOurPendingSettlement: the official
// x402ResourceServer settles through our facilitator API as it settles
// through the official facilitator: an unknown outcome naming its
// transaction reaches its settleWithPendingRetry as settlement_pending
// with that transaction, which asks /settle once more (its one retry); one
// that names none is settlement_pending too, not retried. (Before: a 503
// error shape, which the official client threw as a plain failure, with no
// retry.)
func TestOfficialResourceServerRetriesOurPendingSettlement(t *testing.T) {
	interop.Dir(t)
	const tx = "0x2222222222222222222222222222222222222222222222222222222222222222"
	now := time.Now()
	req := devnetRequirements()
	p, err := SignExactEVM(testKey(t), req, &Resource{URL: "https://a.example/r"}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		reply *SettleResponse
		calls int32
		tx    string
	}{
		{"naming its transaction", &SettleResponse{ErrorReason: ReasonSettlementPending, Transaction: tx, Network: req.Network}, 2, tx},
		{"naming none", nil, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := &fakeFacilitator{now: now, settleErr: &UnknownOutcomeError{Op: "settle", Reply: tc.reply, Err: errors.New("confirm timeout")}}
			srv := httptest.NewServer(NewFacilitatorHandler(fake))
			defer srv.Close()
			var out struct {
				Settle struct {
					SettleResponse
					Thrown string `json:"thrown"`
				} `json:"settle"`
			}
			interop.Run(t, "settle-pending-retry.mjs", nil, map[string]any{"url": srv.URL, "paymentPayload": p, "paymentRequirements": req}, &out)
			s := out.Settle
			if s.Thrown != "" || s.Success || s.ErrorReason != ReasonSettlementPending || s.Transaction != tc.tx || s.Network != req.Network {
				t.Errorf("the official resource server settled %+v; want settlement_pending naming %q on %s", s, tc.tx, req.Network)
			}
			if n := fake.calls.Load(); n != tc.calls {
				t.Errorf("/settle asked %d times; want %d", n, tc.calls)
			}
		})
	}
}
