package caddymodule

import (
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/x402"
)

// lyingVerifier is a fake of a verification service that lies (a
// compromised verifierd, or anyone on the plain-http hop to it): it
// forwards every request to the real one (the agent card included) and
// rewrites each receipt by lie before handing it back.
func lyingVerifier(t *testing.T, vf *verifierFixture, lie func(m map[string]any)) *verifierFixture {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequest(r.Method, vf.srv.URL+r.URL.Path, r.Body)
		req.Header = r.Header.Clone()
		resp, err := testClient.Do(req)
		if err != nil {
			http.Error(w, "unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if r.URL.Path == "/verify/schema" && json.Unmarshal(body, &m) == nil {
			lie(m)
			body, _ = json.Marshal(m)
		}
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		w.Write(body)
	}))
	t.Cleanup(srv.Close)
	return &verifierFixture{srv: srv}
}

// The gate settles, and verify_response attaches a receipt, only on a
// receipt whose signature holds against the agent card's keys, checked
// as a buyer checks it: a verification service that turns "fail" into
// "pass" gets the answer withheld (503 upstream_unavailable) and nothing
// charged, while the passing answers it forwards untouched are settled
// with receipts that verify.
func TestGateSettlesOnlyOnAReceiptWhoseSignatureHolds(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	liar := lyingVerifier(t, vf, func(m map[string]any) {
		if m["result"] == "fail" {
			m["result"] = "pass"
		}
	})
	base := startCaddy(t, sellerPaidSite(agent, fac, liar))
	keys := vf.keys(t)
	payerIdx := 4
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	for _, c := range []struct {
		path    string // INV-7732 fails sum_equals
		charged bool
	}{{"/invoices/INV-7732", false}, {"/invoices/INV-7731", true}} {
		before := balance(t, d, payer)
		resp, _ := getBody(t, base+c.path, nil)
		sig := signFor(t, paymentRequired(t, resp), payerIdx)
		resp, body := getBody(t, base+c.path, map[string]string{x402.HeaderPaymentSignature: sig})
		charged := new(big.Int).Sub(before, balance(t, d, payer))
		if !c.charged {
			if charged.Sign() != 0 || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderVerificationReceipt) != "" {
				t.Errorf("%s: a failing output receipted pass by a lying verifier: status %d, charged %v, receipt %t; body %.120s",
					c.path, resp.StatusCode, charged, resp.Header.Get(HeaderVerificationReceipt) != "", body)
			}
			continue
		}
		if resp.StatusCode != 200 || charged.Sign() <= 0 || resp.Header.Get(HeaderVerificationStatus) != "pass" {
			t.Fatalf("%s: status %d, charged %v, Verification-Status %q; body %.120s", c.path, resp.StatusCode, charged, resp.Header.Get(HeaderVerificationStatus), body)
		}
		if err := receipt.VerifyReceipt(headerReceipt(t, resp, HeaderVerificationReceipt), keys, receipt.ContextVerify); err != nil {
			t.Errorf("%s: the attached receipt does not verify: %v", c.path, err)
		}
	}
}

// The keys are read from the card once and kept; a receipt signed with a
// key rotated in since has the card read again, and verifies. A receipt
// naming a key version the card never had is refused, and costs at most
// one read of the card a second (cardRefetchEvery), not one per answer.
// A card that cannot be read makes every answer unverifiable: withheld
// under fail_closed, released without a receipt under fail_open.
func TestReceiptKeysFollowTheCard(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	unknown := lyingVerifier(t, vf, func(m map[string]any) {
		m["attestation"].(map[string]any)["key_version"] = "k99"
		m["verify"].(map[string]any)["key_version"] = "k99"
	})
	base := startCaddy(t, ":{port} {"+
		sellerRoute("/genuine", agent, vf, "")+
		sellerRoute("/unknown", agent, unknown, "")+
		sellerRoute("/nocard", agent, vf, "card_url http://127.0.0.1:1/.well-known/agent-card.json")+
		sellerRoute("/nocardopen", agent, vf, "card_url http://127.0.0.1:1/.well-known/agent-card.json\n\t\t\ton_error fail_open")+
		"}")
	keyVersion := func(path string) string {
		t.Helper()
		resp, body := getBody(t, base+path, nil)
		if resp.StatusCode != 200 || resp.Header.Get(HeaderVerificationStatus) != "pass" {
			t.Fatalf("%s: status %d, Verification-Status %q; body %.120s", path, resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
		}
		raw := headerReceipt(t, resp, HeaderVerificationReceipt)
		v, err := receipt.Verify(raw, vf.keys(t), receipt.ContextVerify)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return v.KeyVersion
	}
	cards := vf.cards.Load()
	if kv := keyVersion("/genuine/invoices/INV-7731"); kv != "k1" {
		t.Fatalf("first receipt signed by %q", kv)
	}
	keyVersion("/genuine/invoices/INV-7731")
	if got := vf.cards.Load() - cards - 2; got != 1 { // less the test's two reads
		t.Errorf("the card was read %d times by the gate for two answers, want once", got)
	}
	time.Sleep(cardRefetchEvery + 100*time.Millisecond)
	if _, err := vf.keyStore.Rotate(); err != nil {
		t.Fatal(err)
	}
	if kv := keyVersion("/genuine/invoices/INV-7731"); kv != "k2" {
		t.Errorf("receipt after the rotation signed by %q, want k2", kv)
	}

	cards = vf.cards.Load()
	start := time.Now()
	for i := range 10 {
		resp, body := getBody(t, base+"/unknown/invoices/INV-7731", nil)
		var e struct{ Code string }
		json.Unmarshal(body, &e)
		if resp.StatusCode != http.StatusServiceUnavailable || e.Code != "upstream_unavailable" || resp.Header.Get(HeaderVerificationReceipt) != "" {
			t.Fatalf("call %d: receipt of an unknown key: status %d, body %.120s", i, resp.StatusCode, body)
		}
	}
	if got, most := vf.cards.Load()-cards, int64(time.Since(start)/cardRefetchEvery)+1; got > most {
		t.Errorf("10 receipts of an unknown key version had the card read %d times in %v", got, time.Since(start))
	}

	resp, body := getBody(t, base+"/nocard/invoices/INV-7731", nil)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(HeaderVerificationReceipt) != "" {
		t.Errorf("card unreachable, fail_closed: status %d, body %.120s", resp.StatusCode, body)
	}
	resp, _ = getBody(t, base+"/nocardopen/invoices/INV-7731", nil)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderVerificationStatus) != outcomeUnverified || resp.Header.Get(HeaderVerificationReceipt) != "" {
		t.Errorf("card unreachable, fail_open: status %d, Verification-Status %q, receipt %t", resp.StatusCode,
			resp.Header.Get(HeaderVerificationStatus), resp.Header.Get(HeaderVerificationReceipt) != "")
	}
}
