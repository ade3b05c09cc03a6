package caddymodule

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
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

// README ("What the gateway checks in PAYMENT-SIGNATURE") promises a header
// of up to 64 KiB (x402.MaxHeaderBytes), and a contract wallet's signature
// may be 16 KiB (x402.ParseSignature), but Caddy reads request headers up to
// 16 KiB by default: Caddyfile.example raises max_header_size past the
// gates' limit, and under its setting a 32 KB PAYMENT-SIGNATURE reaches
// the gate and is judged by it (402, the error shape); under Caddy's
// default it gets net/http's plain-text 431, as README says. (Before: the
// example kept the default, and the 64 KiB promise was a 431.)
func TestPaymentHeaderUnder64KiBReachesTheGateWithTheExampleServers(t *testing.T) {
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					MaxHeaderBytes int `json:"max_header_bytes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal([]byte(adapt(t, string(raw))), &cfg); err != nil {
		t.Fatal(err)
	}
	limit := 0
	for name, srv := range cfg.Apps.HTTP.Servers {
		if srv.MaxHeaderBytes < x402.MaxHeaderBytes+16<<10 {
			t.Fatalf("Caddyfile.example's server %s reads %d bytes of headers; want room for a %d-byte PAYMENT-SIGNATURE and 16 KiB more", name, srv.MaxHeaderBytes, x402.MaxHeaderBytes)
		}
		limit = srv.MaxHeaderBytes
	}

	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	send := func(base string) (*http.Response, []byte, int) {
		pr := paymentRequired(t, post(t, base+"/verify/schema", validRequest, nil))
		p, err := x402.SignExactEVM(evmfacilitator.DevKey(2), pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		var ev x402.ExactEVMPayload
		json.Unmarshal(p.Payload, &ev)
		ev.Signature = "0x" + hex.EncodeToString(bytes.Repeat([]byte{0xff}, 12000))
		p.Payload, _ = json.Marshal(ev)
		h, err := x402.EncodeHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		resp := post(t, base+"/verify/schema", validRequest, map[string]string{x402.HeaderPaymentSignature: h})
		out, _ := io.ReadAll(resp.Body)
		return resp, out, len(h)
	}
	resp, out, n := send(startCaddy(t, gateSite(up.URL, fac, 0, "")))
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("%d-byte PAYMENT-SIGNATURE under Caddy's default header limit: %d %.200s; want 431 (README)", n, resp.StatusCode, out)
	}
	base := startCaddyServers(t, fmt.Sprintf("\t\tmax_header_size %d", limit), "", gateSite(up.URL, fac, 0, ""))
	resp, out, n = send(base)
	// Judged: its signature is not the payer's.
	var e struct {
		Error string `json:"error"`
	}
	if resp.StatusCode != http.StatusPaymentRequired || json.Unmarshal(out, &e) != nil || e.Error != x402.ReasonExactEVMSignature {
		t.Errorf("%d-byte PAYMENT-SIGNATURE under Caddyfile.example's max_header_size: %d %.300s; want the gate's 402 refusal, %s (README: at most 64 KiB)", n, resp.StatusCode, out, x402.ReasonExactEVMSignature)
	}
}
