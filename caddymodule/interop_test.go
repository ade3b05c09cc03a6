package caddymodule

import (
	"bytes"
	"encoding/json"
	"math/big"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
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

// officialVerify asks the official facilitator to verify p for req, as a
// resource server would, and returns its answer.
func officialVerify(t *testing.T, facilitatorURL string, p x402.PaymentPayload, req x402.PaymentRequirements) x402.VerifyResponse {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"x402Version": 2, "paymentPayload": p, "paymentRequirements": req})
	resp, err := testClient.Post(facilitatorURL+"/verify", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var vr x402.VerifyResponse
	if err := json.NewDecoder(resp.Body).Decode(&vr); err != nil || resp.StatusCode != 200 {
		t.Fatalf("official /verify: %d %v", resp.StatusCode, err)
	}
	return vr
}

// The official facilitator reads a payment by its shape and its numbers with
// BigInt: a payment whose validBefore is spelt in hex verifies (and would
// settle), and a valid EIP-3009 payment with a permit2Authorization beside
// it is judged as Permit2. The gate, in front of it, used to forward both
// (the first was paid for and ran with a claim timed wrong; the second was
// judged on a transfer the gate never named). It now refuses both before
// anything is claimed or forwarded, and no money moves.
func TestOfficialFacilitatorIsNeverSentWhatItReadsDifferently(t *testing.T) {
	d, _ := sharedDevnet(t)
	var ready struct{ URL string }
	interop.Start(t, "facilitator-server.mjs", []string{
		"RPC_URL=" + d.RPCURL(),
		"PRIVATE_KEY=" + evmfacilitator.DevAccounts()[3].PrivateKeyHex,
		"NETWORK=eip155:1337",
	}, &ready)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, ready.URL, 0, ""))
	pr := paymentRequired(t, post(t, base+"/verify/schema", validRequest, nil))
	payer := evmfacilitator.DevAccounts()[2]
	before := balance(t, d, payer.Address)

	respelt := func(edit func(payload string, a x402.Authorization) string) x402.PaymentPayload {
		p, err := x402.SignExactEVM(evmfacilitator.DevKey(2), pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		var ev x402.ExactEVMPayload
		json.Unmarshal(p.Payload, &ev)
		p.Payload = json.RawMessage(edit(string(p.Payload), ev.Authorization))
		return p
	}
	for _, c := range []struct {
		desc     string
		p        x402.PaymentPayload
		official func(x402.VerifyResponse) bool // what the official facilitator makes of it
		reason   string                         // the gate's refusal
	}{
		{"validBefore in hex", respelt(func(s string, a x402.Authorization) string {
			n, _ := strconv.ParseInt(a.ValidBefore, 10, 64)
			return strings.Replace(s, `"validBefore":"`+a.ValidBefore+`"`, `"validBefore":"0x`+strconv.FormatInt(n, 16)+`"`, 1)
		}), func(vr x402.VerifyResponse) bool { return vr.IsValid }, x402.ReasonInvalidPayload},
		{"a valid authorization beside a permit2Authorization", respelt(func(s string, a x402.Authorization) string {
			return strings.Replace(s, `{`, `{"permit2Authorization":{"from":"`+a.From+`","spender":"0x1111111111111111111111111111111111111111","nonce":"7","deadline":"99999999999","permitted":{"token":"`+pr.Accepts[0].Asset+`","amount":"`+a.Value+`"},"witness":{"to":"`+a.To+`","validAfter":"0","extra":"0x"}},`, 1)
		}), func(vr x402.VerifyResponse) bool { return !vr.IsValid && strings.Contains(vr.InvalidReason, "permit2") }, x402.ReasonUnsupportedPayloadType},
	} {
		if vr := officialVerify(t, ready.URL, c.p, pr.Accepts[0]); !c.official(vr) {
			t.Fatalf("%s: the official facilitator answered %+v; the premise of this test is gone", c.desc, vr)
		}
		h, err := x402.EncodeHeader(c.p)
		if err != nil {
			t.Fatal(err)
		}
		resp := post(t, base+"/verify/schema", validRequest, map[string]string{x402.HeaderPaymentSignature: h})
		if m := readJSON(t, resp); resp.StatusCode != http.StatusBadRequest || m["reason"] != c.reason {
			t.Errorf("%s: the gate answered %d %v %v, want 400 %s", c.desc, resp.StatusCode, m["reason"], m["error"], c.reason)
		}
	}
	if up.calls.Load() != 0 || balance(t, d, payer.Address).Cmp(before) != 0 {
		t.Fatalf("the upstream ran %d times and the payer paid %v", up.calls.Load(), new(big.Int).Sub(before, balance(t, d, payer.Address)))
	}
}
