package caddymodule

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// A wallet_auth written after the gate in a route block still reads the
// proofs the client sent, and the settlement report the gate makes from a
// paid call through the handlers after it (a POST of the gateway's own to
// the path the upstream named in X-Aov-Settlement-Report) carries none of
// them: the wallet_auth passes the report on like a request without a
// proof, and the upstream hears that the call was paid. (Before: the
// report shared the call's set-aside credentials, so that wallet_auth
// checked the buyer's X-Wallet-Auth, signed for GET /paid/x, against POST
// /report and refused the report 401, with a wallet_auth before the gate
// that had checked the proof already or without one.)
func TestWalletAuthAfterTheGatePassesTheSettlementReport(t *testing.T) {
	_, fac := sharedDevnet(t)
	const walletAuth = `wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}`
	for i, before := range []string{"", walletAuth} {
		var reports atomic.Int32
		up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost && r.URL.Path == "/report" {
				reports.Add(1)
				w.WriteHeader(http.StatusNoContent)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set(headerSettlementReport, "/report")
			fmt.Fprintf(w, `{"verification_id":"ver_report_wallet_auth_%d","wallet":%q}`, i, r.Header.Get(HeaderUpstreamWallet))
		}))
		t.Cleanup(up.Close)
		base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /paid/* {
		%[4]s
		x402 {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		%[5]s
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), before, walletAuth))
		url := base + "/paid/x"
		key := 7 + i
		st, _, body := walletCall(t, "GET", url, "", paidProofCall(t, url, key))
		if st != 200 || body["wallet"] != walletAddr(key) {
			t.Fatalf("wallet_auth before the gate %t: the paid call with a proof: %d %v, want 200 as %s", before != "", st, body, walletAddr(key))
		}
		waitFor(t, "the paid call's settlement report at the upstream", func() bool { return reports.Load() > 0 })
	}
}
