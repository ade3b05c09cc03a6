package evmfacilitator

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// The simulations run with at most MaxSettlementGas gas. A contract
// payer's signature is payer-chosen bytes up to 16 KiB
// (x402.ParseSignature); since Prague (EIP-7623, live on Base and
// Ethereum) a transaction's calldata has a floor cost of 10 gas per token
// (40 per nonzero byte), so a 16 KiB signature's isValidSignature call
// needs ~676,000 gas before any code runs. The node refuses the eth_call
// itself ("insufficient gas for floor data gas cost"): such a payment is
// refused (invalid_exact_evm_transaction_simulation_failed) before the node
// is asked, nothing sent. (Before: classify took the node's answer for its
// own trouble, and verify and settle returned an error, the gateway's 503
// "retry later".)
func TestContractPayerSignaturePastTheCalldataFloorIsRefusedUnsent(t *testing.T) {
	e := newEnv(t)
	_, p, req := contractPayer(t, e, acceptAllRuntime)
	var pl x402.ExactEVMPayload
	if err := json.Unmarshal(p.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	long := "0x" + hex.EncodeToString(bytes.Repeat([]byte{0xff}, 16384))
	p = payload(t, long, pl.Authorization, p.Accepted)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := e.f.Verify(ctx, p, req)
	if err != nil || v.IsValid || v.InvalidReason != x402.ReasonExactEVMSimulationFailed {
		t.Errorf("verify = %+v, err = %v; want a refusal with a reason and no error", v, err)
	}
	nonce := relayerNonce(t, e)
	s, err := e.f.Settle(ctx, p, req)
	if err != nil || s.Success || s.ErrorReason != x402.ReasonExactEVMSimulationFailed || s.Transaction != "" {
		t.Errorf("settle = %+v, err = %v; want a refusal with a reason and no error", s, err)
	}
	if n := relayerNonce(t, e); n != nonce {
		t.Fatalf("relayer nonce moved %d -> %d", nonce, n)
	}
}
