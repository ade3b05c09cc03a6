package caddymodule

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// fakeLaxRemote is a FAKE FOR A FAULT that no facilitator of ours has: a
// remote facilitator (the devnet facilitator's x402 HTTP API behind it)
// that judges a payment by its signed authorization alone, as if the
// requirements asked for what the authorization pays, so it verifies and
// settles a payment of another value or to another account. It counts the
// /verify and /settle calls it gets.
func fakeLaxRemote(t *testing.T, facURL string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.Method == http.MethodPost {
			calls.Add(1)
			var m map[string]any
			if json.Unmarshal(body, &m) == nil {
				pp, _ := m["paymentPayload"].(map[string]any)
				pl, _ := pp["payload"].(map[string]any)
				au, _ := pl["authorization"].(map[string]any)
				for _, req := range []any{m["paymentRequirements"], pp["accepted"]} {
					if rq, ok := req.(map[string]any); ok && au != nil {
						rq["amount"], rq["payTo"] = au["value"], au["to"]
					}
				}
				body, _ = json.Marshal(m)
			}
		}
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, facURL+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		req.ContentLength = int64(len(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		reply, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		w.Write(reply)
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

// The gate checks that a signed EVM authorization pays the offer its
// accepted copy matched (authorization.to = payTo, value = amount) before
// it claims the payment or asks its facilitator: one that does not is a
// 402 with the reference reason, nothing charged, the facilitator never
// asked, and nothing claimed (the payer's payment of the same nonce that
// does pay is served). (Before: the gate relied on the facilitator's
// verdict, and a lax remote's got the call served for 1 atom.)
func TestGateRefusesAnAuthorizationThatDoesNotPayItsOffer(t *testing.T) {
	d, facURL := sharedDevnet(t)
	const key = 7
	payer := evmfacilitator.DevAccounts()[key].Address
	remote, calls := fakeLaxRemote(t, facURL)
	up := newReportingUpstream(t)
	base := startCaddy(t, remoteSite(up.URL, remote.URL, "rpc devnet "+d.RPCURL(), filepath.Join(t.TempDir(), "gate")))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	offer := pr.Accepts[0]
	var nonce [32]byte
	rand.Read(nonce[:])
	now := time.Now().Unix()
	pays := x402.Authorization{From: payer.Hex(), To: common.HexToAddress(offer.PayTo).Hex(), Value: offer.Amount,
		ValidAfter: fmt.Sprint(now - 60), ValidBefore: fmt.Sprint(now + 3600), Nonce: "0x" + hex.EncodeToString(nonce[:])}
	underpays, elsewhere := pays, pays
	underpays.Value = "1"
	elsewhere.To = payer.Hex()
	before := balance(t, d, payer)
	for _, tc := range []struct {
		desc   string
		auth   x402.Authorization
		reason string
	}{
		{"a value of 1 atom", underpays, x402.ReasonExactEVMValueMismatch},
		{"a transfer to another account", elsewhere, x402.ReasonExactEVMRecipientMismatch},
	} {
		sig, _ := signAuthorizationOf(t, key, pr, tc.auth)
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		body := readJSONString(t, resp)
		if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(body, `"reason":"`+tc.reason+`"`) {
			t.Fatalf("%s: status %d: %s; want 402 %s", tc.desc, resp.StatusCode, body, tc.reason)
		}
		if n := calls.Load(); n != 0 {
			t.Fatalf("%s: the facilitator was asked %d times", tc.desc, n)
		}
		if got := charged(t, d, payer, before); got.Sign() != 0 {
			t.Fatalf("%s: charged %v", tc.desc, got)
		}
	}
	sig, _ := signAuthorizationOf(t, key, pr, pays)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if body := readJSONString(t, resp); resp.StatusCode != http.StatusOK {
		t.Fatalf("the payment of the same nonce that pays the offer: status %d: %s", resp.StatusCode, body)
	}
	if got := charged(t, d, payer, before); got.String() != offer.Amount {
		t.Fatalf("charged %v, want %s", got, offer.Amount)
	}
}
