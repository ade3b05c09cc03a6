package caddymodule

import (
	"bufio"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/verifierd/server"
	"github.com/aovhq/aov/x402"
)

// scoreSettleBeforeSite is the score route of Caddyfile.example with
// settle before, in front of a real verifierd.
func scoreSettleBeforeSite(verifier, fac string) string {
	return fmt.Sprintf(`:{port} {
	route /score/* {
		x402 {
			accept devnet $0.01 %[3]s
			route "GET /score/{agent_id}"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			validate score_request
			settle before
		}
		reverse_proxy %[1]s {
			header_up X-Aov-Gateway-Token %[4]s
		}
	}
}
`, strings.TrimPrefix(verifier, "http://"), fac, payTo.Hex(), verifierToken)
}

// A score path verifierd does not route (a trailing slash, an empty or dot
// segment, which it answers 404) is refused by validate score_request with
// 422 naming agent_id, before any 402, and a payment sent with it is not
// settled. (Before: the gate took "seller-7/" as the agent id, offered it
// for sale, and with settle before the buyer paid for verifierd's 404.)
func TestScorePathVerifierdDoesNotRouteIsRefusedBeforePayment(t *testing.T) {
	d, fac := sharedDevnet(t)
	vf := startVerifier(t)
	base := startCaddy(t, scoreSettleBeforeSite(vf.srv.URL, fac))
	// A payment signed for a path that is for sale, sent with each one
	// that is not.
	offer := getScore(t, base+"/score/seller-7", "")
	if offer.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("GET /score/seller-7 unpaid: status %d, want 402", offer.StatusCode)
	}
	pr := paymentRequired(t, offer)
	offer.Body.Close()
	for i, path := range []string{"/score/seller-7/", "/score/seller-7%2F", "/score/a//b", "/score/a/./b", "/score/a%2F..%2Fb"} {
		who := 3 + i
		payer := evmfacilitator.DevAccounts()[who].Address
		t.Run(path, func(t *testing.T) {
			resp := getScore(t, base+path, "")
			m := readJSON(t, resp)
			if resp.StatusCode != http.StatusUnprocessableEntity || m["code"] != "invalid_request" || resp.Header.Get(x402.HeaderPaymentRequired) != "" ||
				!strings.Contains(fmt.Sprint(m["fields"]), "agent_id") {
				t.Errorf("GET %s unpaid: status %d %v %v (PAYMENT-REQUIRED sent: %v), want 422 invalid_request naming agent_id and no offer",
					path, resp.StatusCode, m["code"], m["fields"], resp.Header.Get(x402.HeaderPaymentRequired) != "")
			}
			calls := vf.calls.Load()
			before := balance(t, d, payer)
			paid := getScore(t, base+path, signFor(t, pr, who))
			m = readJSON(t, paid)
			charged := new(big.Int).Sub(before, balance(t, d, payer))
			if paid.StatusCode != http.StatusUnprocessableEntity || charged.Sign() != 0 || paid.Header.Get(x402.HeaderPaymentResponse) != "" {
				t.Errorf("GET %s paid: status %d %v, charged %v (PAYMENT-RESPONSE %v); want 422 and nothing charged",
					path, paid.StatusCode, m["code"], charged, paid.Header.Get(x402.HeaderPaymentResponse) != "")
			}
			if n := vf.calls.Load() - calls; n != 0 {
				t.Errorf("GET %s paid: verifierd was called %d times, want none", path, n)
			}
		})
	}
}

// FuzzScorePathAgreesWithVerifierd runs the gate's score_request check and
// verifierd's own router on the same request target: the gate lets through
// exactly the score paths verifierd serves, and refuses every one it would
// refuse, so no refused path is ever sold.
func FuzzScorePathAgreesWithVerifierd(f *testing.F) {
	vf := startVerifier(f)
	g := &Gate{Validator: validateScore, Route: "GET /score/{agent_id}"}
	for _, s := range []string{"seller-7", "seller-7/", "seller-7%2F", "a//b", "a/./b", "a/../b", "..", ".", "a%2Fb%20c",
		"test-x", "", "/", "%2e%2e", "a%2F%2Fb", strings.Repeat("é", 200), strings.Repeat("é", 201), "%FF", "a?b", "a#b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, rest string) {
		target := "/score/" + rest
		req, err := http.ReadRequest(bufio.NewReader(strings.NewReader("GET " + target + " HTTP/1.1\r\nHost: x\r\n\r\n")))
		if err != nil {
			return // not a request: neither sees it
		}
		gateErr := g.checkScorePath(req)
		w := httptest.NewRecorder()
		req.Header.Set(server.HeaderGatewayToken, verifierToken)
		vf.srv.Config.Handler.ServeHTTP(w, req)
		served := w.Code == http.StatusOK
		if (gateErr == nil) != served {
			t.Fatalf("GET %q: gate check %v, verifierd %d %.200s", target, gateErr, w.Code, w.Body)
		}
	})
}
