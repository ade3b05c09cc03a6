package caddymodule

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	neturl "net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
	"github.com/caddyserver/caddy/v2"
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

// The gate waits for a facilitator call at most maxFacilitatorWait, even
// where the facilitator's own bound (facilitator http's timeout, evm's
// receipt_timeout) is longer: a settlement that ends after it is answered
// 503 settlement_pending within the server's write timeout, and the retry
// with the same payment gets the content once the outcome is known,
// charged once (a remote facilitator's settlement is read from the chain
// through its rpc). (Before: the gate waited the facilitator's whole bound, 3m10s
// for the default evm, past Caddyfile.example's write 120s: the response was
// cut after the settlement landed and the retry was refused as already
// used.) Scaled down: the gate's wait 2s, write 4s, the settlement's reply
// or receipt after 8s within the facilitator's 60s.
func TestFacilitatorCallPastTheGatesWaitIsPendingThenServed(t *testing.T) {
	old := maxFacilitatorWait
	maxFacilitatorWait = 2 * time.Second
	t.Cleanup(func() { maxFacilitatorWait = old })
	d, fac := sharedDevnet(t)
	t.Run("facilitator http timeout", func(t *testing.T) {
		front := fakeSlowSettleFacilitator(t, fac, 8*time.Second)
		testSlowSettlementPendingThenServed(t, d, 6, fmt.Sprintf(`http %s {
				timeout 60s
				rpc devnet %s
			}`, front.URL, d.RPCURL()))
	})
	t.Run("facilitator evm receipt_timeout", func(t *testing.T) {
		rpc := fakeSlowChainRPC(t, d.RPCURL(), 8*time.Second)
		testSlowSettlementPendingThenServed(t, d, 4, fmt.Sprintf(`evm {
				network devnet
				rpc_url %s
				relayer_key %s
				receipt_timeout 60s
			}`, rpc.URL, evmfacilitator.DevAccounts()[9].PrivateKeyHex))
	})
	// A multi whose first member is a remote without rpc and whose second
	// settles the network embedded: the settlement's status is read by the
	// member that reads its chain. (Before: it was asked of the first
	// member listing the network, the remote, which answered "no rpc
	// endpoint ... stays pending" for ever, and the charged buyer's retry
	// was answered settlement_pending until the claim lapsed.)
	t.Run("facilitator multi, a remote without rpc first", func(t *testing.T) {
		front := fakeSlowSettleFacilitator(t, fac, 8*time.Second)
		testSlowSettlementPendingThenServed(t, d, 3, fmt.Sprintf(`multi {
				http %s {
					timeout 60s
				}
				evm {
					network devnet
					rpc_url %s
					relayer_key %s
				}
			}`, front.URL, d.RPCURL(), evmfacilitator.DevAccounts()[8].PrivateKeyHex))
	})
}

// A gate's remote facilitator whose timeout is above the gate's wait and
// that has no rpc for the gate's network is warned of at load, also as a
// member of a multi: a settlement still running when the gate stops
// waiting is answered settlement_pending, and nothing can read its
// outcome. With rpc for the gate's network, or a timeout within the wait,
// nothing is logged, as it is for a multi's member when another member
// reads the gate's network (memberReads, the rule status reads follow).
func TestRemoteTimeoutAboveTheGatesWaitWithoutRPCIsWarnedOf(t *testing.T) {
	remote := func(block string) string {
		return "http http://127.0.0.1:1 {\n\t\t\t" + block + "\n\t\t}"
	}
	for _, tc := range []struct {
		name, facilitator string
		warn              bool
	}{
		{"timeout 60s, no rpc", remote("timeout 60s"), true},
		{"timeout 60s, rpc", remote("timeout 60s\n\t\t\trpc devnet http://127.0.0.1:1"), false},
		// (Before: rpc for any network, here one the gate does not
		// accept, silenced the Warning.)
		{"timeout 60s, rpc for another network only", remote("timeout 60s\n\t\t\trpc base http://127.0.0.1:1"), true},
		{"a multi's member: timeout 60s, rpc for another network only", "multi {\n\t\t\t" + remote("timeout 60s\n\t\t\trpc base http://127.0.0.1:1") + "\n\t\t\thttp http://127.0.0.1:2\n\t\t}", true},
		{"timeout 30s, no rpc", remote("timeout 30s"), false},
		// (Before: warned although the evm member settles and reads
		// devnet, and the gate's status question goes to it.)
		{"a multi's member: timeout 60s, no rpc, an evm member reads devnet", "multi {\n\t\t\t" + remote("timeout 60s") +
			"\n\t\t\tevm {\n\t\t\t\tnetwork devnet\n\t\t\t\trpc_url http://127.0.0.1:1\n\t\t\t\trelayer_key " +
			evmfacilitator.DevAccounts()[8].PrivateKeyHex + "\n\t\t\t}\n\t\t}", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			loadCaddyServers(t, freePort(t), "", logFile, fmt.Sprintf(`:{port} {
	x402 {
		accept devnet $0.02 %s
		facilitator %s
		store badger {data}/gate
	}
	respond "ok"
}
`, payTo.Hex(), tc.facilitator))
			caddy.Stop()
			warned := false
			for _, l := range logLines(t, logFile) {
				warned = warned || l["level"] == "warn" && strings.HasPrefix(fmt.Sprint(l["msg"]), "timeout above the gate's 30s wait without rpc")
			}
			if warned != tc.warn {
				t.Errorf("warned %v, want %v", warned, tc.warn)
			}
		})
	}
}

// multi { http <remote, fee payer X, timeout 60s, no rpc>; svm <fee payer
// Y> } on solana-devnet: the gate's offer is built around the fee payer
// the multi learns at load, and the Warning follows who reads it
// (memberReads, by managesFeePayer): with the remote first, the offer is
// X's, which the svm member never reads, and the remote is warned of; with
// the svm member first, the offer is Y's, which it reads, and nothing is
// logged.
func TestRemoteTimeoutWarningFollowsTheOffersFeePayer(t *testing.T) {
	seed := sha256.Sum256([]byte("caddymodule remote fee payer"))
	x := base58.Encode(ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey))
	seed = sha256.Sum256([]byte("caddymodule payee"))
	payee := base58.Encode(ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey))
	fac := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"kinds":[{"x402Version":2,"scheme":"exact","network":%q,"extra":{"feePayer":%q}}],"extensions":[],"signers":{}}`,
			x402.NetworkSolanaDevnet, x)
	}))
	t.Cleanup(fac.Close)
	remote := "http " + fac.URL + " {\n\t\t\t\ttimeout 60s\n\t\t\t}"
	svm := "svm {\n\t\t\t\tnetwork solana-devnet\n\t\t\t\trpc_url http://127.0.0.1:1\n\t\t\t\tdev_fee_payer\n\t\t\t}"
	for _, tc := range []struct {
		name, members string
		warn          bool
	}{
		{"the remote first", remote + "\n\t\t\t" + svm, true},
		{"the svm member first", svm + "\n\t\t\t" + remote, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			loadCaddyServers(t, freePort(t), "", logFile, fmt.Sprintf(`:{port} {
	x402 {
		accept solana-devnet $0.02 %s
		facilitator multi {
			%s
		}
		store badger {data}/gate
	}
	respond "ok"
}
`, payee, tc.members))
			caddy.Stop()
			warned := false
			for _, l := range logLines(t, logFile) {
				warned = warned || l["level"] == "warn" && strings.HasPrefix(fmt.Sprint(l["msg"]), "timeout above the gate's 30s wait without rpc")
			}
			if warned != tc.warn {
				t.Errorf("warned %v, want %v", warned, tc.warn)
			}
		})
	}
}

// The gate's wait is the facilitator's bound where that is shorter, and
// maxFacilitatorWait where it is longer.
func TestGateWaitsForAFacilitatorCallAtMostMaxFacilitatorWait(t *testing.T) {
	for timeout, want := range map[time.Duration]time.Duration{10 * time.Second: 10 * time.Second, 90 * time.Second: maxFacilitatorWait} {
		g := &Gate{facilitator: &HTTPFacilitator{f: x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: "http://127.0.0.1:1", Timeout: timeout})}}
		if v, s := g.callTimeouts(); v != want || s != want {
			t.Errorf("facilitator http timeout %v: the gate waits %v for a verify, %v for a settle; want %v", timeout, v, s, want)
		}
	}
}

// testSlowSettlementPendingThenServed pays a gate settled by facilitator
// (whose settlement takes longer than the gate waits) with development
// account payerIdx, behind a server whose write timeout is 4s: the call is
// answered 503 settlement_pending, and the same payment's retry the paid
// answer once the settlement is known, charged once.
func testSlowSettlementPendingThenServed(t *testing.T, d *evmfacilitator.Devnet, payerIdx int, facilitator string) {
	up := newUpstream(t)
	base := startCaddyServers(t, "\t\ttimeouts {\n\t\t\twrite 4s\n\t\t}", "", fmt.Sprintf(`:{port} {
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
	do := func() (*http.Response, []byte, error) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(x402.HeaderPaymentSignature, sig)
		resp, err := (&http.Client{Timeout: 90 * time.Second}).Do(req)
		if err != nil {
			return nil, nil, err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, b, nil
	}
	resp, b, err := do()
	if err != nil {
		t.Fatalf("the paid call's response was cut: %v", err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), "settlement_pending") {
		t.Fatalf("a settlement slower than the gate's wait: %d %.200s; want 503 settlement_pending", resp.StatusCode, b)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		resp, b, err = do()
		if err == nil && resp.StatusCode == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			t.Fatalf("the retry 30 s after the settlement: %d %.200s err=%v; want the paid answer", code, b, err)
		}
	}
	if resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Errorf("the paid answer of the retry has no %s", x402.HeaderPaymentResponse)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Errorf("charged %v, want 20000", got)
	}
}
