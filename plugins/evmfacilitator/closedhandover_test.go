package evmfacilitator

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// A settlement whose transaction the node lost is handed to the newest
// facilitator of the key on the chain still open, whose look-after sends
// it again and fills the relayer's nonce: whether it was sent before its
// facilitator closed, or through that facilitator after it closed (Close:
// "Settle and the status calls keep working"). (Before: one kept by a
// closed facilitator after its handover stayed its own, looked after by
// no one, and the open facilitator's settlements queued behind its gap.)
func TestASettlementOfAClosedFacilitatorIsHandedOver(t *testing.T) {
	for _, tc := range []struct {
		name        string
		closeBefore bool
	}{{"sent before the close", false}, {"sent after the close", true}} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDevnet(t, DevnetConfig{})
			vc := &fakeLosingSends{Chain: d.Client(), drop: 2}
			f1, err := New(Config{Chain: vc, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			f2, err := New(Config{Chain: d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 1500 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer f2.Close()
			identified(t, f2)
			if tc.closeBefore {
				f1.Close()
			}
			req := (&testEnv{d: d}).requirements(payee, amount)
			_, err = f1.Settle(context.Background(), mustSignExact(t, payer, req), req)
			var ue *x402.UnknownOutcomeError
			if !errors.As(err, &ue) {
				t.Fatalf("settle with its transaction lost = %v; want an unknown outcome", err)
			}
			f1.Close()
			vc.mu.Lock()
			lost := vc.lost[0]
			vc.mu.Unlock()
			if !fillsTheGap(t, d, f2, lost) {
				t.Fatalf("8 s on, the relayer's nonce %d (lost transaction %s) is still a gap: no one looks after the settlement (look-after running=%v)", lost.Nonce(), lost.Hash().Hex(), watching(identified(t, f2)))
			}
			req2 := (&testEnv{d: d}).requirements(payee, amount)
			if r, err := f2.Settle(context.Background(), mustSignExact(t, payer, req2), req2); err != nil || !r.Success {
				t.Errorf("a later settle through the open facilitator = %+v, %v; want success", r, err)
			}
		})
	}
}
