package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// A buyer who hangs up while verify_response checks the agent's answer
// (here verifierd takes 2 s) is not charged: the check runs to its end
// (verifierd records it either way), and the gate, finding the buyer gone,
// settles nothing and releases the payment, as when a buyer hangs up while
// the agent works (499). Its retry with the same payment is served and
// charged once. (Before: the gate settled, the buyer was charged for an
// answer it never received, and its retry got payment_already_used.)
func TestBuyerGoneDuringCheckIsNotCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	slow := delayedVerifier(t, vf, 2*time.Second)
	site := fmt.Sprintf(`:{port} {
	handle /invoices/* {
		x402 {
			accept devnet $0.05 %[3]s
			facilitator http %[2]s
			store badger {data}/gate
		}
		verify_response {
			schema %[5]s
			rules %[6]s
			enforce_rules
			agent_id seller-7
			verifier_url %[4]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(agent, "http://"), fac, payTo.Hex(), slow.URL, binaries.schemaPath, binaries.rules)
	base := startCaddy(t, site)
	payerIdx := 8
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	resp, _ := getBody(t, base+"/invoices/INV-7731", nil)
	sig := signFor(t, paymentRequired(t, resp), payerIdx)
	before := balance(t, d, payer)
	gone := counterValue(t, "client_gone_not_settled")
	req, _ := http.NewRequest(http.MethodGet, base+"/invoices/INV-7731", nil)
	req.Header.Set(x402.HeaderPaymentSignature, sig)
	impatient := &http.Client{Timeout: time.Second}
	if resp, err := impatient.Do(req); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("the buyer got an answer before hanging up: %d %.100s", resp.StatusCode, b)
	}
	// The check runs on after the buyer left; once it ends, the gate finds
	// the buyer gone and releases the payment.
	waitFor(t, "the gate to find the buyer gone once the check ended", func() bool {
		return counterValue(t, "client_gone_not_settled") > gone
	})
	got := charged(t, d, payer, before)
	resp, body := getBody(t, base+"/invoices/INV-7731", map[string]string{x402.HeaderPaymentSignature: sig})
	if got.Sign() != 0 {
		t.Errorf("charged %v for an answer the buyer never received (it hung up during the check); its retry got %d", got, resp.StatusCode)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || resp.Header.Get(HeaderVerificationStatus) != "pass" {
		t.Errorf("the retry with the same payment: %d %.200s; want the verified answer, paid", resp.StatusCode, body)
	}
}

// deafUpstream is a fake upstream handler, for a moment a real one leaves
// only by a race a test cannot time: the buyer leaving after the upstream
// answered and before the gate settles. It answers after a pause, whatever
// its context says, as a handler that does not watch it would.
type deafUpstream struct{}

func (deafUpstream) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_deaf_answer", New: func() caddy.Module { return new(deafUpstream) }}
}

func (deafUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	time.Sleep(1500 * time.Millisecond)
	w.Header().Set("Content-Type", "application/json")
	_, err := w.Write([]byte(`{"deaf":true}`))
	return err
}

func init() {
	caddy.RegisterModule(deafUpstream{})
	httpcaddyfile.RegisterHandlerDirective("test_deaf_answer", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return deafUpstream{}, nil
	})
}

// A gate without verify_response: a buyer who hangs up after the upstream
// began and before its answer is settled (the upstream here does not watch
// its context, and answers after the buyer left) is not charged, and its
// retry with the same payment is served, charged once; a free call whose
// client left so gives its unit back, and the next one is still free.
// (Before: the gate settled for the buyer who had left.)
func TestBuyerGoneBeforeSettleIsNotCharged(t *testing.T) {
	d, fac := sharedDevnet(t)
	site := fmt.Sprintf(`:{port} {
	route /deaf {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http %[1]s
			store badger {data}/gate
			free_allowance {
				pool deaf
				per_day 1
			}
		}
		test_deaf_answer
	}
}
`, fac, payTo.Hex())
	base := startCaddy(t, site)
	impatient := &http.Client{Timeout: 500 * time.Millisecond}
	hangUp := func(hdr map[string]string) {
		t.Helper()
		gone := counterValue(t, "client_gone_not_settled")
		req, _ := http.NewRequest(http.MethodGet, base+"/deaf", nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		if resp, err := impatient.Do(req); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			t.Fatalf("the client got an answer before hanging up: %d %.100s", resp.StatusCode, b)
		}
		// The upstream answers after the client left, and the gate gives
		// the charge back.
		waitFor(t, "the gate to give back the charge of the call whose client left", func() bool {
			return counterValue(t, "client_gone_not_settled") > gone
		})
	}

	// Free: the unit of a call whose client left is given back.
	hangUp(nil)
	resp, body := getBody(t, base+"/deaf", nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "0" {
		t.Fatalf("the free call after one whose client left: %d %q %.200s; want 200, the day's one free call", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining), body)
	}

	// Paid: nothing is charged, and the payment can be sent again.
	resp, _ = getBody(t, base+"/deaf", nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("past the free call: %d, want 402", resp.StatusCode)
	}
	payerIdx := 9
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	sig := signFor(t, paymentRequired(t, resp), payerIdx)
	before := balance(t, d, payer)
	hangUp(map[string]string{x402.HeaderPaymentSignature: sig})
	if got := charged(t, d, payer, before); got.Sign() != 0 {
		t.Errorf("charged %v for an answer the buyer left before", got)
	}
	resp, body = getBody(t, base+"/deaf", map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || string(body) != `{"deaf":true}` {
		t.Errorf("the retry with the same payment: %d %.200s; want the answer, paid", resp.StatusCode, body)
	}
}
