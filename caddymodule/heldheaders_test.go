package caddymodule

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/strictjson"
	"github.com/aovhq/aov/x402"
)

// A seller route (x402 settle after, settle_on pass, verify_response) whose
// settlement's reply is lost: the buyer's retry with the same payment is
// served the answer that was held back, with the headers it was released
// with, as README's "What the buyer receives" (passed row) promises:
// Verification-Receipt about its bytes, Verification-Status: pass and
// nosniff, through a Badger and a Redis store alike. (Before: the held
// record kept only the status, Content-Type and body, so the paid,
// verified answer came back without its receipt.)
func TestHeldAnswerKeepsItsVerificationHeaders(t *testing.T) {
	sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	for i, st := range []string{"badger " + gateDir(t), "redis " + servers.StartRedis(t).Addr} {
		t.Run(strings.Fields(st)[0], func(t *testing.T) {
			site := fmt.Sprintf(`:{port} {
	handle /invoices/* {
		x402 {
			accept devnet $0.05 %[3]s
			facilitator faulty_devnet lose_reply
			store %[4]s
			settle_on pass
		}
		verify_response {
			schema %[5]s
			rules %[6]s
			enforce_rules
			agent_id seller-7
			verifier_url %[2]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(agent, "http://"), vf.srv.URL, payTo.Hex(), st, binaries.schemaPath, binaries.rules)
			base := startCaddy(t, site)
			payerIdx := 8 + i
			resp, _ := getBody(t, base+"/invoices/INV-7731", nil)
			if resp.StatusCode != http.StatusPaymentRequired {
				t.Fatalf("unpaid: %d", resp.StatusCode)
			}
			sig := signFor(t, paymentRequired(t, resp), payerIdx)
			resp, body := getBody(t, base+"/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("first try: %d %s", resp.StatusCode, body)
			}
			resp, body = getBody(t, base+"/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
			if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
				t.Fatalf("retry: %d %s", resp.StatusCode, body)
			}
			if resp.Header.Get(HeaderVerificationStatus) != "pass" || resp.Header.Get("X-Content-Type-Options") != "nosniff" ||
				resp.Header.Get("Content-Type") != "application/json" {
				t.Errorf("the paid, verified answer delivered on the retry: Verification-Status %q, X-Content-Type-Options %q, Content-Type %q",
					resp.Header.Get(HeaderVerificationStatus), resp.Header.Get("X-Content-Type-Options"), resp.Header.Get("Content-Type"))
			}
			if cc := resp.Header.Values("Cache-Control"); len(cc) != 1 || cc[0] != "no-store" {
				t.Errorf("Cache-Control %q, want no-store", cc)
			}
			raw, err := base64.StdEncoding.DecodeString(resp.Header.Get(HeaderVerificationReceipt))
			if err != nil || len(raw) == 0 {
				t.Fatalf("no receipt on the retry's answer: %q", resp.Header.Get(HeaderVerificationReceipt))
			}
			tree, err := strictjson.Decode(body, strictjson.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			cb, _ := receipt.AppendCanonical(nil, tree)
			var rc struct {
				OutputHash string `json:"output_hash"`
			}
			if json.Unmarshal(raw, &rc); rc.OutputHash != receipt.Hash(cb) {
				t.Errorf("the receipt's output_hash %q is not the delivered bytes' %q", rc.OutputHash, receipt.Hash(cb))
			}
		})
	}
}

// A seller route that names its own receipt_header and keeps answers
// under a payment_identifier: the answer held for an unknown settlement is
// delivered on the retry with the receipt under that name, and saved under
// the id as it was delivered, so a later retry of the id gets it with the
// receipt too. (Before: the saved copy was made from the held answer on
// the retry, a request no verify_response handled, and so kept only the
// default receipt name: the id's replay came without its receipt.)
func TestHeldAnswerSavedUnderItsIDKeepsACustomReceiptHeader(t *testing.T) {
	sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	site := fmt.Sprintf(`:{port} {
	handle /invoices/* {
		x402 {
			accept devnet $0.05 %[3]s
			facilitator faulty_devnet lose_reply
			store badger %[4]s
			settle_on pass
			payment_identifier
		}
		verify_response {
			schema %[5]s
			rules %[6]s
			enforce_rules
			agent_id seller-7
			verifier_url %[2]s
			receipt_header X-My-Receipt
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(agent, "http://"), vf.srv.URL, payTo.Hex(), gateDir(t), binaries.schemaPath, binaries.rules)
	base := startCaddy(t, site)
	resp, _ := getBody(t, base+"/invoices/INV-7731", nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unpaid: %d", resp.StatusCode)
	}
	sig := signWithID(t, paymentRequired(t, resp), evmfacilitator.DevKey(9), "pay_custom_receipt_held_0001")
	resp, body := getBody(t, base+"/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try (reply lost): %d %s", resp.StatusCode, body)
	}
	for _, try := range []string{"the retry that resolves the held answer", "the replay of the id's saved answer"} {
		resp, body = getBody(t, base+"/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
			t.Fatalf("%s: %d %s", try, resp.StatusCode, body)
		}
		raw, err := base64.StdEncoding.DecodeString(resp.Header.Get("X-My-Receipt"))
		if err != nil || !json.Valid(raw) {
			t.Errorf("%s: X-My-Receipt %q; want the answer's receipt", try, resp.Header.Get("X-My-Receipt"))
		}
		if resp.Header.Get(HeaderVerificationReceipt) != "" || resp.Header.Get(HeaderVerificationStatus) != "pass" {
			t.Errorf("%s: Verification-Receipt %q, Verification-Status %q; want no default receipt, and pass",
				try, resp.Header.Get(HeaderVerificationReceipt), resp.Header.Get(HeaderVerificationStatus))
		}
	}
}
