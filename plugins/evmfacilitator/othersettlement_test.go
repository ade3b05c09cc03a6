package evmfacilitator

import (
	"context"
	"math/big"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
	"github.com/ethereum/go-ethereum/crypto"
)

// Two resource servers of one payTo are handed the same authorization,
// each settling it through its own facilitator: ours, and another with its
// own relayer (an official middleware's). The other's transaction lands
// first and its settle answers success, so its server serves. Ours,
// already past its checks and sending, is outrun: its transaction
// reverts, and it answers nonce_already_used naming the other's
// transaction, as it answers a settle our own relayer's other transaction
// made. (Before: success naming the other's transaction, and both servers
// served one transfer.)
func TestOutrunByAnotherFacilitatorAnswersNonceUsed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	req := e.requirements(payee, amount)
	p := mustSignExact(t, payer, req)
	other, err := newFacilitator(Config{Chain: e.d.Client(), Network: DevnetNetwork, RelayerKey: DevKey(5), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 10 * time.Second}, &nonceSet{})
	if err != nil {
		t.Fatal(err)
	}
	var theirs x402.SettleResponse
	var theirsErr error
	bs := &beforeSend{Chain: e.d.Client()}
	bs.before = func() {
		if bs.sends == 1 {
			theirs, theirsErr = other.Settle(ctx, p, req)
		}
	}
	f, err := newFacilitator(Config{Chain: bs, Network: DevnetNetwork, RelayerKey: DevKey(0), PollInterval: 20 * time.Millisecond,
		ReceiptTimeout: 10 * time.Second, MaxFailedPerPayer: 1, FailureWindow: time.Hour}, e.d.nonces)
	if err != nil {
		t.Fatal(err)
	}
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, e.d, from)
	ours, err := f.Settle(ctx, p, req)
	if theirsErr != nil || !theirs.Success {
		t.Fatalf("the other facilitator's settle = %+v, %v; want success", theirs, theirsErr)
	}
	if err != nil || ours.Success || ours.ErrorReason != x402.ReasonExactEVMNonceAlreadyUsed || ours.Transaction != theirs.Transaction {
		t.Fatalf("ours = %+v, %v; want %s naming the other's %s", ours, err, x402.ReasonExactEVMNonceAlreadyUsed, theirs.Transaction)
	}
	if paid := new(big.Int).Sub(before, usdcBalance(t, e.d, from)); paid.String() != amount {
		t.Fatalf("payer charged %v, want %s", paid, amount)
	}
	// The payment was made: our reverted transaction is no failure of the
	// payer's (MaxFailedPerPayer 1 would refuse its next payment).
	next := mustSignExact(t, payer, req)
	if v, err := f.Verify(ctx, next, req); err != nil || !v.IsValid {
		t.Fatalf("verify of the payer's next payment = %+v, %v; want valid", v, err)
	}
}
