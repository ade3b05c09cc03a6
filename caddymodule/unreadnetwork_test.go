package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/x402"
)

// fakeHederaRemote is a FAKE FOR A FAULT no facilitator of ours can show,
// as none of ours settles a network other than eip155 or solana: a remote
// facilitator for hedera:testnet that judges a payment by what its payload
// says alone (as fakeLaxRemote does on EVM and Solana), so it verifies and
// settles a payment of 1 atom to another account. It counts its /settle
// calls.
func fakeHederaRemote(t *testing.T) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var settles atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/verify":
			fmt.Fprint(w, `{"isValid":true,"payer":"0.0.777"}`)
		case "/settle":
			settles.Add(1)
			fmt.Fprint(w, `{"success":true,"payer":"0.0.777","transaction":"0.0.777@1700000000.123456789","network":"hedera:testnet"}`)
		default:
			fmt.Fprint(w, `{"kinds":[{"x402Version":2,"scheme":"exact","network":"hedera:testnet"}],"extensions":[],"signers":{}}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &settles
}

// unreadNetworkWarned reports whether the log file holds the load's
// warning of an accept on network.
func unreadNetworkWarned(t *testing.T, logFile, network string) bool {
	t.Helper()
	for _, l := range logLines(t, logFile) {
		if l["level"] == "warn" && strings.HasPrefix(fmt.Sprint(l["msg"]), "the gateway cannot read a payment on this accept's network") && l["network"] == network {
			return true
		}
	}
	return false
}

// An accept on a network the gate cannot read (neither eip155 nor solana:
// a CAIP-2 id behind a remote facilitator) is warned of at load: the gate
// checks nothing of what a payment on it signs, so its facilitator's
// verdict alone decides what the payment pays, here one whose payload
// says it pays 1 atom to another account, which is served. An accept the
// gate reads is not warned of. (Before: nothing was logged, and README
// said that what is signed must pay the offer on every network.)
func TestAcceptOnANetworkTheGateCannotReadIsWarnedOf(t *testing.T) {
	remote, settles := fakeHederaRemote(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	base := startCaddyServers(t, "", logFile, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept {
				network hedera:testnet
				amount 10000
				asset 0.0.456858
				asset_decimals 6
				pay_to 0.0.1234
			}
			facilitator http %[2]s
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(newUpstream(t).URL, "http://"), remote.URL))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	hdr, err := x402.EncodeHeader(x402.PaymentPayload{X402Version: 2, Accepted: pr.Accepts[0], Resource: &pr.Resource,
		Payload: json.RawMessage(`{"transaction":"pays 1 atom to 0.0.666"}`)})
	if err != nil {
		t.Fatal(err)
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: hdr})
	if body := readJSONString(t, resp); resp.StatusCode != http.StatusOK || settles.Load() != 1 {
		t.Fatalf("a payment its facilitator settles: status %d, %d settlements: %.200s", resp.StatusCode, settles.Load(), body)
	}
	caddy.Stop()
	if !unreadNetworkWarned(t, logFile, "hedera:testnet") {
		t.Error("the accept on hedera:testnet was not warned of")
	}

	logFile = filepath.Join(t.TempDir(), "caddy.log")
	loadCaddyServers(t, freePort(t), "", logFile, fmt.Sprintf(`:{port} {
	x402 {
		accept devnet $0.02 %s
		facilitator http http://127.0.0.1:1
		store badger {data}/gate
	}
	respond "ok"
}
`, payTo.Hex()))
	caddy.Stop()
	if unreadNetworkWarned(t, logFile, x402.NetworkDevnet) {
		t.Error("the accept on devnet was warned of")
	}
}
