package e2e

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/internal/solanachain"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// solanaStack is a whole stack whose Solana facilitator (Caddyfile.example's
// `svm` block, AOV_SOLANA_RPC_ADDR) settles on a local litesvm chain of its
// own. The chain is started first, so it is stopped after Caddy.
func solanaStack(t *testing.T, caddyEnv ...string) (*stack, *solanachain.Chain) {
	t.Helper()
	chain := solanachain.Start(t)
	u, err := url.Parse(chain.URL)
	if err != nil {
		t.Fatal(err)
	}
	return newStack(t, append(caddyEnv, "AOV_SOLANA_RPC_ADDR="+u.Host)...), chain
}

// usdcOf is owner's balance in the chain's USDC associated token account.
func usdcOf(t *testing.T, chain *solanachain.Chain, owner string) int64 {
	t.Helper()
	o, err := svmfacilitator.ParsePublicKey(owner)
	if err != nil {
		t.Fatal(err)
	}
	m, _ := svmfacilitator.ParsePublicKey(solanachain.USDC)
	return chain.TokenBalance(svmfacilitator.AssociatedTokenAddress(o, m, svmfacilitator.TokenProgram).String())
}

// receiptFacts is the part of a receipt that depends on the input and the
// signing key only, not on how the call was paid.
func receiptFacts(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("answer is not JSON (%v): %.300s", err, body)
	}
	facts := map[string]any{}
	for _, k := range []string{"output_hash", "schema_hash", "rules_hash"} {
		if h, _ := m[k].(string); len(h) != 64 {
			t.Fatalf("receipt %s %v, want a SHA-256 hex digest", k, m[k])
		}
	}
	for _, k := range []string{"result", "agent_id", "task_id", "output_hash", "schema_hash", "rules_hash", "request_hash", "verify"} {
		facts[k] = m[k]
	}
	facts["key_version"] = m["attestation"].(map[string]any)["key_version"]
	return facts
}

// A verification paid on Solana through the real stack (Caddyfile.example,
// Caddy, verifierd, certd, a local litesvm chain), by the official
// @x402/fetch + @x402/svm client: it is served with PAYMENT-RESPONSE and
// the same signed receipt as a free call of the same input, which verifies
// offline against the agent card; the payer's and the payee's USDC move by
// the price exactly once, a payment signed by the official client and sent
// twice pays once, and verifierd records each paid call with its Solana
// payer on solana-devnet.
func TestPaidVerificationOnSolana(t *testing.T) {
	s, chain := solanaStack(t, "AOV_FREE_PER_DAY=1")
	const agent = "e2e-solana-paying-agent"
	body := bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1)
	payer := chain.Wallets[0]
	payee := chain.Wallets[3] // the documented default AOV_SOLANA_PAY_TO
	solana := map[string]any{"secretKey": payer.SecretKey, "rpcUrl": chain.URL}

	free := post(t, s.url("/verify/schema"), body)
	mustStatus(t, free, http.StatusOK)

	r := post(t, s.url("/verify/schema"), body)
	mustStatus(t, r, http.StatusPaymentRequired)
	var required x402.PaymentRequired
	if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentRequired), &required); err != nil {
		t.Fatalf("PAYMENT-REQUIRED: %v", err)
	}
	var offer *x402.PaymentRequirements
	for i, a := range required.Accepts {
		if a.Network == x402.NetworkSolanaDevnet {
			offer = &required.Accepts[i]
		}
	}
	if offer == nil || offer.Amount != "20000" || offer.Asset != solanachain.USDC || offer.PayTo != payee.Address || offer.Extra["feePayer"] != chain.FeePayer {
		t.Fatalf("Solana offer %+v, want 20000 USDC units to wallet 3 with the chain's fee payer", offer)
	}

	payerBefore, payeeBefore := usdcOf(t, chain, payer.Address), usdcOf(t, chain, payee.Address)
	feeBefore := chain.Lamports(chain.FeePayer)
	var res struct {
		Status          int               `json:"status"`
		Body            string            `json:"body"`
		Headers         map[string]string `json:"headers"`
		PaymentResponse *struct {
			Success     bool   `json:"success"`
			Transaction string `json:"transaction"`
			Network     string `json:"network"`
			Payer       string `json:"payer"`
		} `json:"paymentResponse"`
	}
	interop.Run(t, "x402-fetch-pay.mjs", nil, map[string]any{
		"solana": solana, "url": s.url("/verify/schema"), "method": "POST", "body": string(body),
	}, &res)
	if res.Status != http.StatusOK {
		t.Fatalf("status %d: %.500s", res.Status, res.Body)
	}
	pr := res.PaymentResponse
	if pr == nil || res.Headers["payment-response"] == "" || !pr.Success || pr.Network != x402.NetworkSolanaDevnet || pr.Payer != payer.Address || pr.Transaction == "" {
		t.Fatalf("PAYMENT-RESPONSE %+v", pr)
	}
	paid := decode[result](t, response{body: []byte(res.Body)})

	t.Run("the paid receipt is the free one's, signed, and verifies against the agent card", func(t *testing.T) {
		if paid.Result != "pass" || paid.Attestation.Signature == "" || paid.Verify.PublicKeyURL != s.cardURL() {
			t.Fatalf("paid answer: result %q, attestation %+v, verify %+v", paid.Result, paid.Attestation, paid.Verify)
		}
		want, got := receiptFacts(t, free.body), receiptFacts(t, []byte(res.Body))
		wb, _ := json.Marshal(want)
		gb, _ := json.Marshal(got)
		if !bytes.Equal(wb, gb) {
			t.Fatalf("paid receipt %s,\nfree receipt %s", gb, wb)
		}
		if out, code := verifyReceipt(t, s, "paid-on-solana.json", []byte(res.Body)); code != 0 {
			t.Fatalf("aov receipt verify: exit %d\n%s", code, out)
		}
		// The check can fail: the receipt edited to name another agent does not verify.
		forged := bytes.Replace([]byte(res.Body), []byte(`"`+agent+`"`), []byte(`"e2e-someone-else"`), 1)
		if out, code := verifyReceipt(t, s, "forged.json", forged); code == 0 {
			t.Fatalf("aov receipt verify accepted an edited receipt\n%s", out)
		}
	})

	t.Run("the payer paid the payee the price once, the fee payer paid the fee", func(t *testing.T) {
		if got := payerBefore - usdcOf(t, chain, payer.Address); got != 20000 {
			t.Fatalf("payer charged %d, want 20000", got)
		}
		if got := usdcOf(t, chain, payee.Address) - payeeBefore; got != 20000 {
			t.Fatalf("payee received %d, want 20000", got)
		}
		if fee := feeBefore - chain.Lamports(chain.FeePayer); fee == 0 || fee > 20000 {
			t.Fatalf("the fee payer spent %d lamports on one payment", fee)
		}
	})

	var second result
	t.Run("a payment from the official client sent twice pays once", func(t *testing.T) {
		payerBefore, payeeBefore := usdcOf(t, chain, payer.Address), usdcOf(t, chain, payee.Address)
		var signed struct {
			Header string `json:"header"`
		}
		interop.Run(t, "x402-client-sign.mjs", nil, map[string]any{
			"solana": solana, "paymentRequired": required,
		}, &signed)
		h := map[string]string{x402.HeaderPaymentSignature: signed.Header}
		r := do(t, http.MethodPost, s.url("/verify/schema"), body, h)
		mustStatus(t, r, http.StatusOK)
		var settle x402.SettleResponse
		if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentResponse), &settle); err != nil || !settle.Success || settle.Network != x402.NetworkSolanaDevnet {
			t.Fatalf("PAYMENT-RESPONSE %+v (%v)", settle, err)
		}
		second = decode[result](t, r)
		mustStatus(t, do(t, http.MethodPost, s.url("/verify/schema"), body, h), http.StatusPaymentRequired)
		if got := payerBefore - usdcOf(t, chain, payer.Address); got != 20000 {
			t.Fatalf("payer charged %d for one payment sent twice, want 20000", got)
		}
		if got := usdcOf(t, chain, payee.Address) - payeeBefore; got != 20000 {
			t.Fatalf("payee received %d for one payment sent twice, want 20000", got)
		}
	})

	t.Run("verifierd recorded the free call and each paid one, paid by the Solana wallet on solana-devnet", func(t *testing.T) {
		recs := s.history(t, agent)
		byID := map[string]store.Verification{}
		free := 0
		for _, rec := range recs {
			if rec.Payment == store.PaymentFree {
				free++
			}
			byID[rec.ID] = rec
		}
		if len(recs) != 3 || free != 1 {
			t.Fatalf("%d records (%d free), want 1 free and 2 paid: %+v", len(recs), free, recs)
		}
		for _, id := range []string{paid.VerificationID, second.VerificationID} {
			rec, ok := byID[id]
			if !ok || rec.Payment != store.PaymentPaid || rec.Payer != payer.Address || rec.Network != x402.NetworkSolanaDevnet {
				t.Errorf("record of paid call %s: %+v", id, rec)
			}
		}
	})
}

// An agent_id owned by a Solana account, through the real stack: the
// CAIP-10 id solana:<devnet genesis>:<address> belongs to that address, so
// a Solana wallet proof made with `aov wallet-auth --chain solana:…` by its
// key authenticates the agent's verifications (recorded and counted toward
// the score); a proof from another Solana wallet naming it, and one from an
// EVM wallet naming it, are refused with 403 before anything is checked or
// recorded, and use no free call.
func TestAgentOwnedBySolanaAccount(t *testing.T) {
	s := newStack(t)
	url := s.url("/verify/schema")
	ownerKey, otherKey := solanaKey(t, "e2e owner"), solanaKey(t, "e2e other")
	ownerAddr := base58.Encode(ownerKey.Public().(ed25519.PublicKey))
	agent := x402.NetworkSolanaDevnet + ":" + ownerAddr
	invoice := bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1)
	failing := bytes.Replace(invoice, []byte(`"total": 129.5`), []byte(`"total": 135.0`), 1)
	if bytes.Equal(failing, invoice) || bytes.Equal(invoice, example(t, "invoice-fixed.json")) {
		t.Fatal("could not make the invoices")
	}
	// proof signs an X-Wallet-Auth header naming agent with `aov wallet-auth`.
	proof := func(t *testing.T, chain string, key []byte) map[string]string {
		t.Helper()
		out, err := exec.Command(bin.aov, "wallet-auth", "--chain", chain, "--key-file", writeFile(t, "key", key),
			"--method", "POST", "--url", url, "--agent-id", agent).Output()
		if err != nil {
			t.Fatalf("aov wallet-auth --chain %s: %v", chain, err)
		}
		return map[string]string{"X-Wallet-Auth": strings.TrimSpace(string(out))}
	}

	// Before the owner has ever used the id: an account id is owned by its
	// address, not by the first wallet to name it.
	for name, h := range map[string]map[string]string{
		"another Solana wallet": proof(t, x402.NetworkSolanaDevnet, []byte(base58.Encode(otherKey))),
		"an EVM wallet":         proof(t, "eip155:1337", []byte(evmfacilitator.DevAccounts()[3].PrivateKeyHex)),
	} {
		t.Run(name+" naming the Solana account's id is 403", func(t *testing.T) {
			r := do(t, http.MethodPost, url, failing, h)
			mustStatus(t, r, http.StatusForbidden)
			if e := decode[apierr.Error](t, r); e.Code != apierr.CodeForbidden || e.Charged {
				t.Fatalf("refusal %+v", e)
			}
			if r.header.Get("Free-Allowance-Remaining") != "" {
				t.Fatalf("a refused call reported allowance %s", r.header.Get("Free-Allowance-Remaining"))
			}
		})
	}

	for range 2 {
		r := do(t, http.MethodPost, url, invoice, proof(t, x402.NetworkSolanaDevnet, []byte(base58.Encode(ownerKey))))
		mustStatus(t, r, http.StatusOK)
		if v := decode[result](t, r); v.Result != "pass" || v.AgentID == nil || *v.AgentID != agent {
			t.Fatalf("the owner's verification: result %q, agent_id %v", v.Result, v.AgentID)
		}
	}
	rep := decode[map[string]any](t, get(t, s.url("/reputation/"+agent)))
	c, _ := rep["counts"].(map[string]any)
	if rep["owned"] != true || c == nil || c["total"] != 2.0 || c["authenticated_pass"] != 2.0 || c["fail"] != 0.0 {
		t.Fatalf("reputation owned %v, counts %v: want the owner's 2 authenticated passes alone", rep["owned"], c)
	}
	for _, e := range rep["verifications"].([]any) {
		if e.(map[string]any)["counts_toward_score"] != true {
			t.Fatalf("an owner's record does not count toward the score: %v", e)
		}
	}
	// 2 owner calls and this one; the 2 refusals cost nothing.
	r := post(t, url, bytes.Replace(invoice, []byte(`"`+agent+`"`), []byte(`"e2e-bystander"`), 1))
	mustStatus(t, r, http.StatusOK)
	if got := r.header.Get("Free-Allowance-Remaining"); got != "97" {
		t.Fatalf("Free-Allowance-Remaining %q after 2 refusals, want 97", got)
	}
	recs := s.history(t, agent)
	if len(recs) != 2 {
		t.Fatalf("%d records, want the owner's 2: %+v", len(recs), recs)
	}
	for _, rec := range recs {
		if !rec.Authenticated || rec.Wallet != ownerAddr || rec.Result != "pass" {
			t.Fatalf("record %+v, want authenticated by %s", rec, ownerAddr)
		}
	}
}

// solanaKey is a Solana wallet's 64-byte key from a public seed text:
// development only.
func solanaKey(t *testing.T, seed string) ed25519.PrivateKey {
	t.Helper()
	s := sha256.Sum256([]byte(seed))
	return ed25519.NewKeyFromSeed(s[:])
}
