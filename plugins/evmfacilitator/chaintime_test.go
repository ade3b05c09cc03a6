package evmfacilitator

import (
	"context"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// When the chain runs ahead of the wall clock, validBefore is judged against
// the chain's time: an authorization the token would refuse for time by the
// time it settles is refused at verify, with the time reason, and one that
// stays valid on chain is accepted.
func TestVerifyJudgesTheWindowByTheLaterClock(t *testing.T) {
	e := newEnv(t)
	const lead = 30 * time.Second
	if err := e.d.backend.AdjustTime(lead); err != nil {
		t.Fatal(err)
	}
	head, err := e.d.Client().HeaderByNumber(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ahead := time.Until(time.Unix(int64(head.Time), 0))
	if ahead < lead-5*time.Second {
		t.Fatalf("the chain is only %v ahead of the wall clock", ahead)
	}
	// Valid for 3 s past the chain's head: the simulation at the head still
	// passes and the wall clock is far from validBefore, but the transfer
	// would land in a later block, inside the settlement margin.
	inMargin := int(ahead.Seconds()) + 3
	for _, tc := range []struct {
		desc    string
		timeout int // maxTimeoutSeconds: validBefore = now + timeout
		reason  string
	}{
		{"validBefore past by chain time is refused as valid_before", int(ahead.Seconds()) - 10, x402.ReasonExactEVMValidBefore},
		{"validBefore within the settlement margin of chain time is refused as valid_before", inMargin, x402.ReasonExactEVMValidBefore},
		{"validBefore valid by chain time too is accepted", 120, ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			req := e.requirements(payee, amount)
			req.MaxTimeoutSeconds = tc.timeout
			r, err := e.f.Verify(context.Background(), mustSignExact(t, payer, req), req)
			if err != nil {
				t.Fatal(err)
			}
			if tc.reason == "" && !r.IsValid {
				t.Fatalf("refused: %s (%s)", r.InvalidReason, r.InvalidMessage)
			}
			if tc.reason != "" && (r.IsValid || r.InvalidReason != tc.reason) {
				t.Fatalf("got isValid=%v reason %q (%s), want %q", r.IsValid, r.InvalidReason, r.InvalidMessage, tc.reason)
			}
		})
	}
}
