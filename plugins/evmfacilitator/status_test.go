package evmfacilitator

import (
	"context"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// SettlementStatus reads the chain: undecided while an authorization is
// unused and valid, done once it settled, never once it expired unused. A
// StatusReader (no key, the chain alone) judges every case alike.
func TestSettlementStatus(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	reader, err := NewStatusReader(e.d.Client(), DevnetNetwork)
	if err != nil {
		t.Fatal(err)
	}
	state := func(p x402.PaymentPayload) x402.SettlementState {
		t.Helper()
		st, err := e.f.SettlementStatus(ctx, p, req)
		if err != nil {
			t.Fatal(err)
		}
		rst, err := reader.SettlementStatus(ctx, p, req)
		if err != nil || rst != st {
			t.Fatalf("the status reader says %+v (%v), the facilitator %+v", rst, err, st)
		}
		return st.State
	}
	p := mustSignExact(t, payer, req)
	if got := state(p); got != x402.SettlementUndecided {
		t.Fatalf("unused and valid: %v", got)
	}
	if r, err := e.f.Settle(ctx, p, req); err != nil || !r.Success {
		t.Fatalf("settle: %+v %v", r, err)
	}
	if got := state(p); got != x402.SettlementDone {
		t.Fatalf("settled: %v", got)
	}
	short := req
	short.MaxTimeoutSeconds = 1
	expiring := mustSignExact(t, payer, short)
	if err := e.d.backend.AdjustTime(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if got := state(expiring); got != x402.SettlementNever {
		t.Fatalf("expired unused: %v", got)
	}
	other := req
	other.PayTo = "0x0000000000000000000000000000000000000001"
	if _, err := e.f.SettlementStatus(ctx, p, other); err == nil {
		t.Fatal("an authorization was judged against requirements it does not pay")
	}
	if _, err := reader.SettlementStatus(ctx, p, other); err == nil {
		t.Fatal("the status reader judged an authorization against requirements it does not pay")
	}
	if _, err := NewStatusReader(e.d.Client(), "solana-devnet"); err == nil {
		t.Fatal("a status reader was made for a network that is not EVM")
	}
}

// The devnet's token is where x402 expects it before any devnet runs, so a
// gateway whose facilitator is another process prices devnet routes right.
func TestDefaultDevnetAssetIsTheDevnetsToken(t *testing.T) {
	if got := (&Devnet{token: devnetToken()}).Asset(); got != x402.DefaultDevnetAsset {
		t.Fatalf("the devnet deploys %+v, x402 expects %+v", got, x402.DefaultDevnetAsset)
	}
}
