package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// fakeSlowSettleFacilitator is a FAKE FOR A FAULT (a slow chain) in front of
// the real devnet facilitator fac: /settle is forwarded at once, so the
// transfer is sent, and its reply is held back for delay, as a
// facilitator's is while it waits for a slow confirmation.
func fakeSlowSettleFacilitator(t *testing.T, fac string, delay time.Duration) *httptest.Server {
	u, _ := neturl.Parse(fac)
	rp := httputil.NewSingleHostReverseProxy(u)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/settle") {
			rp.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r.WithContext(context.WithoutCancel(r.Context())))
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(front.Close)
	return front
}

// fakeSlowChainRPC is a FAKE FOR A FAULT (a slow chain) in front of the
// devnet's JSON-RPC endpoint: a transaction sent through it is mined at
// once, but until delay after the first was sent the chain is shown as
// before it (no receipt, every EIP-3009 authorization unused), as on a
// chain whose next block comes late.
func fakeSlowChainRPC(t *testing.T, rpc string, delay time.Duration) *httptest.Server {
	var mu sync.Mutex
	var sentAt time.Time
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var call struct {
			ID     json.RawMessage   `json:"id"`
			Method string            `json:"method"`
			Params []json.RawMessage `json:"params"`
		}
		if json.Unmarshal(body, &call) == nil {
			mu.Lock()
			if call.Method == "eth_sendRawTransaction" && sentAt.IsZero() {
				sentAt = time.Now()
			}
			late := !sentAt.IsZero() && time.Since(sentAt) < delay
			mu.Unlock()
			var result string
			switch {
			case !late:
			case call.Method == "eth_getTransactionReceipt":
				result = "null"
			case call.Method == "eth_call" && len(call.Params) > 0:
				var tx struct{ Data, Input string }
				json.Unmarshal(call.Params[0], &tx)
				if strings.HasPrefix(tx.Data+tx.Input, "0xe94a0102") { // authorizationState(address,bytes32)
					result = `"0x` + strings.Repeat("0", 64) + `"`
				}
			}
			if result != "" {
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"jsonrpc":"2.0","id":%s,"result":%s}`, call.ID, result)
				return
			}
		}
		relayRPC(w, rpc, bytes.NewReader(body))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// A facilitator's own configured bound on its calls is the gate's: a
// settlement that takes 35 s to confirm, within the 60 s the operator gave
// the facilitator (facilitator http's timeout, evm's receipt_timeout), is
// answered with the content paid for. (Before: the gate cut every
// facilitator call at its own fixed 30 s, so the buyer was charged and
// told settlement_pending.)
func TestFacilitatorCallsEndByTheFacilitatorsOwnTimeout(t *testing.T) {
	d, fac := sharedDevnet(t)
	t.Run("facilitator http timeout", func(t *testing.T) {
		front := fakeSlowSettleFacilitator(t, fac, 35*time.Second)
		testSlowSettlementAnswered(t, d, 6, fmt.Sprintf(`http %s {
				timeout 60s
			}`, front.URL))
	})
	t.Run("facilitator evm receipt_timeout", func(t *testing.T) {
		rpc := fakeSlowChainRPC(t, d.RPCURL(), 35*time.Second)
		testSlowSettlementAnswered(t, d, 4, fmt.Sprintf(`evm {
				network devnet
				rpc_url %s
				relayer_key %s
				receipt_timeout 60s
			}`, rpc.URL, evmfacilitator.DevAccounts()[9].PrivateKeyHex))
	})
}

// testSlowSettlementAnswered pays a gate settled by facilitator with
// development account payerIdx and wants the paid answer, charged once.
func testSlowSettlementAnswered(t *testing.T, d *evmfacilitator.Devnet, payerIdx int, facilitator string) {
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept {
				network devnet
				price $0.02
				pay_to %[3]s
				max_timeout 120s
			}
			facilitator %[2]s
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), facilitator, payTo.Hex()))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), payerIdx)
	start := time.Now()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(x402.HeaderPaymentSignature, sig)
	resp, err := (&http.Client{Timeout: 90 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Errorf("a settlement confirmed after 35 s, within the facilitator's 60 s: %d after %v %.200s; want the paid answer",
			resp.StatusCode, took.Round(time.Second), b)
	}
	if took < 30*time.Second {
		t.Errorf("answered after %v: the slow chain was not in the way", took.Round(time.Second))
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Errorf("charged %v, want 20000", got)
	}
}
