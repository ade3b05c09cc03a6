package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// The x402 flow through the real gateway, verifierd and certd, on the devnet
// Caddy runs: the free allowance first, then 402 with PAYMENT-REQUIRED, then
// a payment signed by a development account is verified, the verification
// served, the payment settled on chain and recorded as paid by that account;
// the same payment never pays twice.
func TestPaidVerificationOnTheDevnet(t *testing.T) {
	s := newStack(t, "AOV_FREE_PER_DAY=1")
	const agent = "e2e-paying-agent"
	body := bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1)
	payer := evmfacilitator.DevAccounts()[1]

	t.Run("the first call of the day is free and says what is left", func(t *testing.T) {
		r := post(t, s.url("/verify/schema"), body)
		mustStatus(t, r, http.StatusOK)
		if r.header.Get("Free-Allowance-Limit") != "1" || r.header.Get("Free-Allowance-Remaining") != "0" {
			t.Fatalf("Free-Allowance-Limit %q, -Remaining %q", r.header.Get("Free-Allowance-Limit"), r.header.Get("Free-Allowance-Remaining"))
		}
	})

	var required x402.PaymentRequired
	t.Run("once the allowance is used, 402 with PAYMENT-REQUIRED and free_trial_exhausted", func(t *testing.T) {
		r := post(t, s.url("/verify/schema"), body)
		mustStatus(t, r, http.StatusPaymentRequired)
		if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentRequired), &required); err != nil {
			t.Fatalf("PAYMENT-REQUIRED: %v", err)
		}
		if required.X402Version != 2 || len(required.Accepts) == 0 {
			t.Fatalf("PAYMENT-REQUIRED %+v", required)
		}
		a := required.Accepts[0]
		if a.Network != "eip155:1337" || a.Amount != "20000" || !strings.EqualFold(a.PayTo, "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720") {
			t.Fatalf("offer %+v, want 20000 (0.02 USDC) on eip155:1337 to dev account 9", a)
		}
		var b struct {
			FreeTrial struct {
				Available bool   `json:"available"`
				Code      string `json:"code"`
			} `json:"free_trial"`
		}
		if err := json.Unmarshal(r.body, &b); err != nil || b.FreeTrial.Available || b.FreeTrial.Code != "free_trial_exhausted" {
			t.Fatalf("402 body (%v): %s", err, r.body)
		}
	})
	if len(required.Accepts) == 0 {
		t.FailNow()
	}

	payment, err := x402.SignExactEVM(payer.Key(), required.Accepts[0], &required.Resource, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	sig, err := x402.EncodeHeader(payment)
	if err != nil {
		t.Fatal(err)
	}
	var paid result
	t.Run("a signed payment is verified, served and settled on the devnet", func(t *testing.T) {
		r := do(t, http.MethodPost, s.url("/verify/schema"), body, map[string]string{x402.HeaderPaymentSignature: sig})
		mustStatus(t, r, http.StatusOK)
		var settle x402.SettleResponse
		if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentResponse), &settle); err != nil {
			t.Fatalf("PAYMENT-RESPONSE: %v", err)
		}
		if !settle.Success || settle.Transaction == "" || settle.Network != "eip155:1337" || !strings.EqualFold(settle.Payer, payer.Address.Hex()) {
			t.Fatalf("settlement %+v", settle)
		}
		paid = decode[result](t, r)
		if paid.Result != "pass" || paid.Attestation.Signature == "" {
			t.Fatalf("paid answer: result %q, attestation %+v", paid.Result, paid.Attestation)
		}
	})
	t.Run("the same payment sent again does not pay for a second call", func(t *testing.T) {
		r := do(t, http.MethodPost, s.url("/verify/schema"), body, map[string]string{x402.HeaderPaymentSignature: sig})
		mustStatus(t, r, http.StatusPaymentRequired)
	})
	t.Run("verifierd recorded one free and one paid call, the paid one with the payer", func(t *testing.T) {
		recs := s.history(t, agent)
		if len(recs) != 2 {
			t.Fatalf("%d records, want 2: %+v", len(recs), recs)
		}
		var free, paidRec int
		for _, r := range recs {
			switch r.Payment {
			case store.PaymentFree:
				free++
			case store.PaymentPaid:
				paidRec++
				if r.ID != paid.VerificationID || !strings.EqualFold(r.Payer, payer.Address.Hex()) || r.Network != "eip155:1337" {
					t.Errorf("paid record %+v", r)
				}
			}
		}
		if free != 1 || paidRec != 1 {
			t.Fatalf("records %+v", recs)
		}
	})
}

// The service describes itself from the live configuration: the x402
// manifest lists the priced routes, and the docs are served.
func TestDiscoveryDocuments(t *testing.T) {
	s := newStack(t)
	r := get(t, s.url("/.well-known/x402"))
	mustStatus(t, r, http.StatusOK)
	var manifest struct {
		Resources []string `json:"resources"`
	}
	if err := json.Unmarshal(r.body, &manifest); err != nil {
		t.Fatalf("manifest: %v: %.300s", err, r.body)
	}
	for _, want := range []string{"POST /verify/schema", "POST /verify/deliverable", "GET /score/{agent_id}"} {
		if !slices.Contains(manifest.Resources, want) {
			t.Errorf("/.well-known/x402 resources %q lack %q", manifest.Resources, want)
		}
	}
	for _, p := range []string{"/llms.txt", "/openapi.json", "/docs"} {
		if r := get(t, s.url(p)); r.status != http.StatusOK || len(r.body) == 0 {
			t.Errorf("GET %s: status %d, %d bytes", p, r.status, len(r.body))
		}
	}
	t.Run("a trust score is never free: 402 even while the allowance lasts", func(t *testing.T) {
		r := get(t, s.url("/score/e2e-some-agent"))
		mustStatus(t, r, http.StatusPaymentRequired)
		if r.header.Get(x402.HeaderPaymentRequired) == "" {
			t.Fatal("no PAYMENT-REQUIRED header")
		}
	})
}
