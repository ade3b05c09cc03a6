package caddymodule

import (
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// foldedInvoice passes the example schema and rules as an exact reader
// reads it ("total" 129.5 = 87 + 42.5), while a reader that matches names
// in any letter case (Go's encoding/json, the last twin winning) reads
// "Total": 1 and a line total of 0: values nobody verified.
const foldedInvoice = `{"invoice_id":"INV-7731","currency":"USD","line_items":[{"sku":"A-100","qty":2,"line_total":87.0,"LINE_TOTAL":0},{"sku":"B-200","qty":1,"line_total":42.5}],"total":129.5,"Total":1}`

// An answer with member names equal under case folding is not verified,
// receipted or charged: it is an answer that cannot be verified, withheld
// with 503 under on_error fail_closed (the message says why, without the
// names) and let through unverified, without a receipt and uncharged,
// under fail_open.
func TestCaseFoldedTwinsInAnAnswerAreUnverifiable(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, foldedInvoice)
	}))
	t.Cleanup(agent.Close)
	var inv struct {
		Total float64 `json:"total"`
	}
	if err := json.Unmarshal([]byte(foldedInvoice), &inv); err != nil || inv.Total != 1 {
		t.Fatalf("encoding/json reads total %v (%v): the fixture no longer shows the difference", inv.Total, err)
	}

	base := startCaddy(t, sellerPaidSite(agent.URL, fac, vf))
	payerIdx := 5
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	before := balance(t, d, payer)
	resp, _ := getBody(t, base+"/invoices/INV-7731", nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unpaid: status %d", resp.StatusCode)
	}
	sig := signFor(t, paymentRequired(t, resp), payerIdx)
	calls := vf.calls.Load()
	resp, body := getBody(t, base+"/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
	var e struct {
		Code, Message string
		Charged       bool
	}
	json.Unmarshal(body, &e)
	if charged := new(big.Int).Sub(before, balance(t, d, payer)); charged.Sign() != 0 || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Errorf("charged %v for an answer with case-folded twins", charged)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || e.Code != codeResponseUnverifiable || e.Charged ||
		!strings.Contains(e.Message, "equal when letter case is ignored") || strings.Contains(e.Message, "otal") {
		t.Errorf("status %d, body %s; want 503 response_unverifiable naming the case-folded names, not echoing them", resp.StatusCode, body)
	}
	if resp.Header.Get(HeaderVerificationReceipt) != "" || vf.calls.Load() != calls {
		t.Errorf("the answer was sent to the verification service (%d calls) or receipted", vf.calls.Load()-calls)
	}

	open := startCaddy(t, ":{port} {"+sellerRoute("/open", agent.URL, vf, "on_error fail_open")+"}")
	resp, body = getBody(t, open+"/open/INV-7731", nil)
	if resp.StatusCode != 200 || resp.Header.Get(HeaderVerificationStatus) != outcomeUnverified || resp.Header.Get(HeaderVerificationReceipt) != "" || string(body) != foldedInvoice {
		t.Errorf("fail_open: status %d, Verification-Status %q, receipt %t", resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), resp.Header.Get(HeaderVerificationReceipt) != "")
	}
}
