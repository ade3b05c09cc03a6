package svmfacilitator

import (
	"context"
	"testing"
)

// The x402 reference resource-server middleware verifies, runs the
// handler, then settles, and holds no claim of its own on a payment. Two
// requests carrying one payment both verify (nothing has landed yet) and
// both run; the second Settle arrives after the first answered success.
// It must be duplicate_settlement naming the first's transaction, with
// nothing simulated or sent again, or the seller serves twice for one
// payment.
func TestReferenceMiddlewareRaceServesOnce(t *testing.T) {
	e, fr := countingEnv(t)
	p := e.payment(t)
	pp := Payload(p.Build(p.Instructions()), e.req)
	ctx := context.Background()
	for i := range 2 {
		if v, err := e.f.Verify(ctx, pp, e.req); err != nil || !v.IsValid {
			t.Fatalf("verify of request %d: %+v %v", i, v, err)
		}
	}
	first, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || !first.Success {
		t.Fatalf("first settle: %+v %v", first, err)
	}
	sims, sends := fr.count("simulateTransaction"), fr.count("sendTransaction")
	second, err := e.f.Settle(ctx, pp, e.req)
	if err != nil || second.Success || second.ErrorReason != ReasonDuplicateSettlement || second.Transaction != first.Transaction || second.Payer != first.Payer {
		t.Fatalf("second settle: %+v %v; want %s naming %s", second, err, ReasonDuplicateSettlement, first.Transaction)
	}
	if fr.count("simulateTransaction") != sims || fr.count("sendTransaction") != sends {
		t.Fatal("the second settle simulated or sent again")
	}
	if a, b := e.balances(t); a != 1_000_000-20000 || b != 20000 {
		t.Fatalf("balances payer %d payee %d", a, b)
	}
}
