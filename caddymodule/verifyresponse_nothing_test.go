package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// A gate whose route has verify_response but nothing behind it that
// answers (the proxy written in another, exclusive handle block) is
// refused 502 no_upstream and charges nothing, as a gate with nothing
// behind it at all is (TestGateWithNothingBehindItChargesNothing): no
// payment settles, no free call is spent, an error is logged, and under
// settle before the answer says the payment settled first. (Before:
// verify_response made the end of the handler chain an empty 200 it had
// not checked, which the gate took for an answer: under settle_on any it
// settled the payment for it, under the default it handed it over and
// spent the free call.)
func TestVerifyResponseWithNothingBehindItChargesNothing(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	up := newUpstream(t)
	vr := fmt.Sprintf(`verify_response {
			schema %s
			verifier_url %s
			card_url %s
		}`, binaries.schemaPath, vf.srv.URL, vf.cardURL)
	gate := func(opts string) string {
		return fmt.Sprintf(`x402 {
			accept devnet $0.02 %s
			facilitator http %s
			%s
		}`, payTo.Hex(), fac, opts)
	}
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	base := startCaddyServers(t, "", logFile, fmt.Sprintf(`:{port} {
	handle /invoices/any {
		%[1]s
		%[5]s
	}
	handle /invoices/pass {
		%[2]s
		%[5]s
	}
	handle /invoices/free {
		%[3]s
		%[5]s
	}
	handle /invoices/before {
		%[4]s
		%[5]s
	}
	handle /invoices/* {
		reverse_proxy %[6]s
	}
}
`, gate("store badger {data}/any\n\t\t\tsettle_on any"), gate("store badger {data}/pass"),
		gate("store badger {data}/free\n\t\t\tfree_allowance {\n\t\t\t\tper_day 1\n\t\t\t}"),
		gate("store badger {data}/before\n\t\t\tsettle before"), vr, strings.TrimPrefix(up.URL, "http://")))

	refused := func(t *testing.T, what string, resp *http.Response, body []byte, charged bool) {
		t.Helper()
		var m map[string]any
		json.Unmarshal(body, &m)
		if resp.StatusCode != http.StatusBadGateway || m["code"] != codeNoUpstream || m["charged"] != charged {
			t.Fatalf("%s: status %d, PAYMENT-RESPONSE %t, body %q; want 502 %s with charged %t", what,
				resp.StatusCode, resp.Header.Get(x402.HeaderPaymentResponse) != "", body, codeNoUpstream, charged)
		}
	}
	for i, path := range []string{"/invoices/any", "/invoices/pass"} {
		t.Run("paid "+path, func(t *testing.T) {
			url := base + path
			account := 5 + i
			payer := evmfacilitator.DevAccounts()[account].Address
			before := balance(t, d, payer)
			resp, _ := getBody(t, url, nil)
			sig := signFor(t, paymentRequired(t, resp), account)
			resp, body := getBody(t, url, map[string]string{x402.HeaderPaymentSignature: sig})
			if got := charged(t, d, payer, before); got.Sign() != 0 {
				t.Fatalf("charged %v on chain for %d %q", got, resp.StatusCode, body)
			}
			refused(t, "paid call", resp, body, false)
			if resp.Header.Get(x402.HeaderPaymentResponse) != "" {
				t.Fatalf("a PAYMENT-RESPONSE went out for nothing settled")
			}
		})
	}

	t.Run("free allowance", func(t *testing.T) {
		// Two calls on an allowance of one: the first gave its call back.
		for i := range 2 {
			resp, body := getBody(t, base+"/invoices/free", nil)
			refused(t, fmt.Sprintf("free call %d", i+1), resp, body, false)
		}
	})

	t.Run("settle before", func(t *testing.T) {
		url := base + "/invoices/before"
		payer := evmfacilitator.DevAccounts()[7].Address
		before := balance(t, d, payer)
		resp, _ := getBody(t, url, nil)
		sig := signFor(t, paymentRequired(t, resp), 7)
		resp, body := getBody(t, url, map[string]string{x402.HeaderPaymentSignature: sig})
		if got := charged(t, d, payer, before); got.Sign() == 0 {
			t.Fatalf("nothing settled before the upstream ran: %d %q", resp.StatusCode, body)
		}
		refused(t, "settle before", resp, body, true)
		if sr := settlementOf(t, resp); !sr.Success {
			t.Fatalf("PAYMENT-RESPONSE %+v, want the settlement", sr)
		}
	})

	if up.calls.Load() != 0 {
		t.Fatalf("the upstream of the other block ran %d times", up.calls.Load())
	}
	wantLogged(t, logFile, "nothing after this x402 gate answered the call")
}

// verify_response with nothing behind it and no gate in front is answered
// as the end of Caddy's handler chain always is: an empty 200 without a
// verification header, counted as unchecked.
func TestVerifyResponseWithNothingBehindItAndNoGateAnswersEmpty(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	handle /alone {
		verify_response {
			schema %s
			verifier_url %s
			card_url %s
		}
	}
}
`, binaries.schemaPath, vf.srv.URL, vf.cardURL))
	unchecked := func() float64 {
		var mv dto.Metric
		if err := verifyMetrics.WithLabelValues(outcomeUnchecked).Write(&mv); err != nil {
			t.Fatal(err)
		}
		return mv.GetCounter().GetValue()
	}
	before := unchecked()
	resp, body := getBody(t, base+"/alone", nil)
	if resp.StatusCode != http.StatusOK || len(body) != 0 || resp.Header.Get(HeaderVerificationStatus) != "" {
		t.Fatalf("status %d, Verification-Status %q, body %q; want an empty 200", resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
	}
	if got := unchecked() - before; got != 1 {
		t.Fatalf("counted %v unchecked answers, want 1", got)
	}
}
