package caddymodule

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"io"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// A payment from a contract wallet whose signature is long (x402 allows 16
// KiB) needs more calldata gas (the EIP-7623 floor) than max_settlement_gas:
// the facilitator service's /verify (which a resource server, ours or the
// official one, calls with it in the body, as an MCP _meta payment carries
// it too) answers 200 isValid false with
// invalid_exact_evm_transaction_simulation_failed. (Before: the node
// refused the capped simulation as malformed, "insufficient gas for floor
// data gas cost", and /verify answered an outage.)
func TestFacilitatorRefusesAContractSignaturePastTheCalldataFloor(t *testing.T) {
	d, fac := sharedDevnet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// runtime: accept any signature (EIP-1271 magic value)
	rt := common.FromHex("631626ba7e60e01b60005260206000f3")
	init := append([]byte{0x60, byte(len(rt)), 0x80, 0x60, 0x0b, 0x60, 0x00, 0x39, 0x60, 0x00, 0xf3}, rt...)
	r, err := d.SendTx(ctx, evmfacilitator.DevKey(0), nil, init)
	if err != nil {
		t.Fatal(err)
	}
	wallet := r.ContractAddress
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, ""))
	pr := paymentRequired(t, post(t, base+"/verify/schema", validRequest, nil))
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(2), pr.Accepts[0], &pr.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var ev x402.ExactEVMPayload
	json.Unmarshal(p.Payload, &ev)
	ev.Authorization.From = wallet.Hex()
	ev.Signature = "0x" + hex.EncodeToString(bytes.Repeat([]byte{0xff}, 16384))
	p.Payload, _ = json.Marshal(ev)
	body, _ := json.Marshal(map[string]any{"x402Version": 2, "paymentPayload": p, "paymentRequirements": pr.Accepts[0]})
	resp, err := testClient.Post(fac+"/verify", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	var vr x402.VerifyResponse
	if resp.StatusCode != 200 || json.Unmarshal(out, &vr) != nil || vr.IsValid || vr.InvalidReason != x402.ReasonExactEVMSimulationFailed {
		t.Errorf("facilitator /verify: %d %.400s; want 200 with isValid false and a reason", resp.StatusCode, out)
	}
}
