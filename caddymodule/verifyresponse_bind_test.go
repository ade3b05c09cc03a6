package caddymodule

import (
	"bytes"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// rewritingVerifier (FAULT: a proxy on the gateway's hop to the
// verification service, the threat the gateway checks receipt signatures
// against) forwards every call to the real verification service, with
// the first from in the verification request's body replaced by to. The
// real service then signs a genuine receipt of the request it was given.
func rewritingVerifier(t *testing.T, real, from, to string) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if from != "" {
			body = bytes.Replace(body, []byte(from), []byte(to), 1)
		}
		req, _ := http.NewRequest(r.Method, real+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		copyHeader(w.Header(), resp.Header)
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(s.Close)
	return s
}

// A receipt is attached, and counted as a pass or fail, only when it is
// about the request the gateway sent: besides the hashes, its task_id,
// agent_id, strict_content_check and enforce_rules must be the gateway's.
// Otherwise someone on the verifier hop turns enforce_rules off, the real
// service signs a genuine "pass" for an output that breaks the enforced
// rules (violations become warnings), and settle_on pass charges for it.
// Such a receipt is treated as one about other bytes: the output is
// withheld with upstream_unavailable, and nothing is charged.
func TestVerifyResponseAttachesOnlyReceiptsOfTheRequestItSent(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	keys := vf.keys(t)
	for _, tc := range []struct {
		desc, from, to string
	}{
		{"rules enforced turned into warnings", `"enforce_rules":true`, `"enforce_rules":false`},
		{"strict content check turned on", `"strict_content_check":false`, `"strict_content_check":true`},
		{"another task", `"task_id":"invoice-`, `"task_id":"other-`},
		{"another agent", `"agent_id":"seller-7"`, `"agent_id":"seller-8"`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			hop := rewritingVerifier(t, vf.srv.URL, tc.from, tc.to)
			clean := rewritingVerifier(t, vf.srv.URL, "", "")
			base := startCaddy(t, ":{port} {"+sellerRoute("/inv", agent, &verifierFixture{srv: hop}, "")+
				sellerRoute("/control", agent, &verifierFixture{srv: clean}, "")+"}")
			// The control: the hop rewriting nothing, the failing
			// invoice goes out with its genuine fail receipt.
			resp, body := getBody(t, base+"/control/invoices/INV-7732", nil)
			if resp.StatusCode != 200 || resp.Header.Get(HeaderVerificationStatus) != "fail" {
				t.Fatalf("control: status %d, Verification-Status %q: %s", resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
			}
			checkReceipt(t, keys, headerReceipt(t, resp, HeaderVerificationReceipt), body)

			for _, path := range []string{"/inv/invoices/INV-7732", "/inv/invoices/INV-7731"} {
				resp, body := getBody(t, base+path, nil)
				var e apierr.Error
				if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Code != apierr.CodeUpstreamUnavailable {
					t.Fatalf("%s: status %d, Verification-Status %q: %s", path, resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
				}
				if resp.Header.Get(HeaderVerificationReceipt) != "" || strings.Contains(string(body), "INV-77") {
					t.Fatalf("%s: a receipt of another request, or the output, reached the client: %s", path, body)
				}
			}
		})
	}
}

// The money side: under settle_on pass, a genuine "pass" made with the
// rules not enforced is never charged for an output that breaks them.
func TestSettleOnPassNeverChargesAReceiptOfAWeakerRequest(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	hop := rewritingVerifier(t, vf.srv.URL, `"enforce_rules":true`, `"enforce_rules":false`)
	base := startCaddy(t, sellerPaidSite(agent, fac, &verifierFixture{srv: hop}))
	payerIdx := 6
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	before := balance(t, d, payer)
	resp, _ := getBody(t, base+"/invoices/INV-7732", nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unpaid call: status %d, want 402", resp.StatusCode)
	}
	sig := signFor(t, paymentRequired(t, resp), payerIdx)
	resp, body := getBody(t, base+"/invoices/INV-7732", map[string]string{x402.HeaderPaymentSignature: sig})
	var e apierr.Error
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(body, &e) != nil || e.Code != apierr.CodeUpstreamUnavailable || e.Charged {
		t.Fatalf("status %d, Verification-Status %q: %s", resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
	}
	if resp.Header.Get(x402.HeaderPaymentResponse) != "" || strings.Contains(string(body), "INV-7732") {
		t.Fatalf("the output, or a receipt of payment, reached the buyer: %s", body)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Sign() != 0 {
		t.Fatalf("charged %v for an output whose enforced rules fail", got)
	}
}
