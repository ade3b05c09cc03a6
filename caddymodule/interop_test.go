package caddymodule

import (
	"encoding/json"
	"math/big"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
)

// fetchResult is what interop/x402-fetch-pay.mjs reports.
type fetchResult struct {
	Status          int    `json:"status"`
	Body            string `json:"body"`
	PaymentResponse *struct {
		Success     bool   `json:"success"`
		Transaction string `json:"transaction"`
		Network     string `json:"network"`
		Payer       string `json:"payer"`
	} `json:"paymentResponse"`
}

// payWithOfficialClient has the official @x402/fetch client pay for a
// verification through the gate, and checks the money moved.
func payWithOfficialClient(t *testing.T, facilitatorURL string) {
	t.Helper()
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, facilitatorURL, 0, ""))
	payer := evmfacilitator.DevAccounts()[1]
	before := balance(t, d, payer.Address)

	var res fetchResult
	interop.Run(t, "x402-fetch-pay.mjs", nil, map[string]any{
		"privateKey": payer.PrivateKeyHex,
		"url":        base + "/verify/schema",
		"method":     "POST",
		"body":       validRequest,
	}, &res)
	if res.Status != 200 {
		t.Fatalf("status %d: %s", res.Status, res.Body)
	}
	if res.PaymentResponse == nil || !res.PaymentResponse.Success || res.PaymentResponse.Transaction == "" || !strings.EqualFold(res.PaymentResponse.Payer, payer.Address.Hex()) {
		t.Fatalf("PAYMENT-RESPONSE as the client read it: %+v", res.PaymentResponse)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(res.Body), &body); err != nil || body["payment"] != "paid" {
		t.Fatalf("upstream answer %s (%v)", res.Body, err)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("payer charged %v, want 20000", got)
	}
}

func TestOfficialFetchClientPaysThroughTheGate(t *testing.T) {
	_, fac := sharedDevnet(t)
	payWithOfficialClient(t, fac)
}

func TestOfficialFacilitatorSettlesForTheGate(t *testing.T) {
	d, _ := sharedDevnet(t)
	var ready struct{ URL string }
	// The official facilitator submits settlements from development account
	// 3 (our own facilitator uses account 0; one relayer key per sender).
	interop.Start(t, "facilitator-server.mjs", []string{
		"RPC_URL=" + d.RPCURL(),
		"PRIVATE_KEY=" + evmfacilitator.DevAccounts()[3].PrivateKeyHex,
		"NETWORK=eip155:1337",
	}, &ready)
	payWithOfficialClient(t, ready.URL)
}
