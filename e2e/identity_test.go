package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// Identities are owned, through the whole stack (Caddyfile.example, Caddy,
// verifierd, certd, the devnet): the victim's wallet binds its agent id;
// four throw-away wallets each prove themselves, name the victim's id and
// send a failing output; every one is refused with 403, nothing is
// recorded and no free call is used. Four callers with no wallet at all
// then send failing outputs under the victim's id: they are checked and
// recorded, but are not the owner's, so the victim's paid score does not
// move.
func TestScorePoisoningThroughTheStack(t *testing.T) {
	s := newStack(t)
	const victim = "e2e-victim-agent"
	accts := evmfacilitator.DevAccounts()
	url := s.url("/verify/schema")
	invoice := bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+victim+`"`), 1)
	// The same invoice with a wrong total fails its sum rule.
	failing := bytes.Replace(invoice, []byte(`"total": 129.5`), []byte(`"total": 135.0`), 1)
	if bytes.Equal(failing, invoice) {
		t.Fatal("could not make the failing invoice")
	}
	proof := func(t *testing.T, i int) map[string]string {
		h, err := walletauth.SignRequest(accts[i].Key(), walletauth.Request{Method: "POST", URL: url, AgentID: victim})
		if err != nil {
			t.Fatal(err)
		}
		return map[string]string{walletauth.HeaderName: h}
	}
	score := func(t *testing.T) map[string]any {
		t.Helper()
		r := get(t, s.url("/score/"+victim))
		mustStatus(t, r, http.StatusPaymentRequired)
		var req x402.PaymentRequired
		if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentRequired), &req); err != nil || len(req.Accepts) == 0 {
			t.Fatalf("PAYMENT-REQUIRED: %v", err)
		}
		p, err := x402.SignExactEVM(accts[1].Key(), req.Accepts[0], &req.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		sig, _ := x402.EncodeHeader(p)
		r = do(t, http.MethodGet, s.url("/score/"+victim), nil, map[string]string{x402.HeaderPaymentSignature: sig})
		mustStatus(t, r, http.StatusOK)
		var doc map[string]any
		if err := json.Unmarshal(r.body, &doc); err != nil {
			t.Fatal(err)
		}
		return doc
	}

	for range 3 {
		r := do(t, http.MethodPost, url, invoice, proof(t, 2))
		mustStatus(t, r, http.StatusOK)
	}
	before := score(t)
	if before["score"] != 0.438494 {
		t.Fatalf("the victim's score is %v, want 0.438494 for 3 authenticated passes", before["score"])
	}
	remaining := ""
	for i := 3; i < 7; i++ {
		r := do(t, http.MethodPost, url, failing, proof(t, i))
		mustStatus(t, r, http.StatusForbidden)
		if e := decode[map[string]any](t, r); e["code"] != "forbidden" || e["charged"] != false {
			t.Fatalf("refusal %v", e)
		}
		if r.header.Get("Free-Allowance-Remaining") != "" {
			remaining = r.header.Get("Free-Allowance-Remaining")
		}
	}
	if remaining != "" {
		t.Fatalf("a refused call reported allowance %s", remaining)
	}
	for range 4 {
		r := post(t, url, failing)
		mustStatus(t, r, http.StatusOK)
		if v := decode[map[string]any](t, r); v["result"] != "fail" {
			t.Fatalf("a label's result %v, want fail", v["result"])
		}
	}
	rep := decode[map[string]any](t, get(t, s.url("/reputation/"+victim)))
	if c := rep["counts"].(map[string]any); c["total"] != 7.0 || c["fail"] != 4.0 || c["authenticated_pass"] != 3.0 {
		t.Fatalf("reputation counts %v, want the victim's 3 authenticated passes and the 4 labels", c)
	}
	counted := 0
	for _, e := range rep["verifications"].([]any) {
		if e.(map[string]any)["counts_toward_score"] == true {
			counted++
		}
	}
	if rep["owned"] != true || counted != 3 {
		t.Fatalf("reputation owned %v, %d records count toward the score, want the owner's 3", rep["owned"], counted)
	}
	after := score(t)
	if after["score"] != before["score"] {
		t.Fatalf("the attack moved the score from %v to %v", before["score"], after["score"])
	}
	if win := after["inputs"].(map[string]any)["window"].(map[string]any); win["records"] != 3.0 || win["not_counted"] != 4.0 {
		t.Fatalf("score window %v, want the owner's 3 records and 4 not counted", win)
	}
	// 3 owner calls, 4 refusals that cost nothing, 4 labels and this one:
	// 92 of 100 free calls left.
	r := post(t, url, bytes.Replace(invoice, []byte(`"`+victim+`"`), []byte(`"e2e-bystander"`), 1))
	mustStatus(t, r, http.StatusOK)
	if got := r.header.Get("Free-Allowance-Remaining"); got != "92" {
		t.Fatalf("Free-Allowance-Remaining %q after 4 refusals, want 92", got)
	}
	owners := 0
	for _, rec := range s.history(t, victim) {
		if rec.Authenticated {
			owners++
			if !strings.EqualFold(rec.Wallet, accts[2].Address.Hex()) {
				t.Fatalf("record %+v: authenticated, but not by the owner", rec)
			}
		}
	}
	if owners != 3 {
		t.Fatalf("%d authenticated records, want the owner's 3", owners)
	}
}

// verifierd's own listener refuses the paid score route without the
// gateway token, and the facilitator API settles only payments to the
// operator's pay_to.
func TestPaidRoutesAndFacilitatorAreNotOpen(t *testing.T) {
	s := newStack(t)
	t.Run("GET /score on verifierd directly is 403", func(t *testing.T) {
		r := get(t, "http://"+s.verifierdAddr+"/score/seller-7")
		mustStatus(t, r, http.StatusForbidden)
	})
	t.Run("a settle to a foreign pay_to through /facilitator/settle is refused", func(t *testing.T) {
		r := post(t, s.url("/verify/schema"), nil) // the discovery probe: 402 with the live offer
		mustStatus(t, r, http.StatusPaymentRequired)
		var req x402.PaymentRequired
		if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentRequired), &req); err != nil || len(req.Accepts) == 0 {
			t.Fatalf("PAYMENT-REQUIRED: %v", err)
		}
		accts := evmfacilitator.DevAccounts()
		offer := req.Accepts[0]
		offer.PayTo = accts[4].Address.Hex() // the attacker's own address
		p, err := x402.SignExactEVM(accts[3].Key(), offer, nil, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(x402.FacilitatorRequest{X402Version: 2, PaymentPayload: p, PaymentRequirements: offer})
		r = do(t, http.MethodPost, s.url("/facilitator/settle"), body, map[string]string{"Content-Type": "application/json"})
		mustStatus(t, r, http.StatusOK)
		var sr x402.SettleResponse
		if err := json.Unmarshal(r.body, &sr); err != nil || sr.Success || sr.ErrorReason != x402.ReasonInvalidPaymentRequirements || sr.Transaction != "" {
			t.Fatalf("settle answer %s", r.body)
		}
		if strings.Contains(string(r.body), accts[4].Address.Hex()) {
			t.Fatal("the refusal echoes the pay_to")
		}
	})
}
