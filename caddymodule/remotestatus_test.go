package caddymodule

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// relayTo sends r (its method, path and headers, with body) on to the real
// facilitator at target, for a fake in front of it, and returns its reply
// read whole; one that cannot be reached is answered 502 here (ok false).
func relayTo(w http.ResponseWriter, r *http.Request, target string, body []byte) (resp *http.Response, reply []byte, ok bool) {
	req, _ := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.Path, bytes.NewReader(body))
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return nil, nil, false
	}
	reply, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, reply, true
}

// passOn answers w with resp's status and content type and reply, as
// relayTo read them.
func passOn(w http.ResponseWriter, resp *http.Response, reply []byte) {
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	w.Write(reply)
}

// lossyProxy is a FAKE FOR A FAULT that cannot otherwise be caused on
// demand: a network path to a real remote facilitator (the devnet
// facilitator's x402 HTTP API) that loses a /settle. In mode "lose_reply" it
// forwards /settle, lets the facilitator settle, and then drops the
// connection instead of passing the answer on (a facilitator that times out
// after sending); in mode "lose_request" it drops the connection without
// forwarding (nothing settles); in mode "refuse" it answers as the official
// npm facilitator does for a gas estimate that reverted before anything
// was sent: success false, invalid_exact_evm_transaction_failed,
// transaction "" (the outcome unknown to the gate, nothing sent); in mode
// "redirect" it forwards /settle, lets the facilitator settle, and answers
// 303 See Other to a result URL that is not there (processed, the result
// elsewhere: the outcome unknown to a gate that follows no redirect). Every
// other call is forwarded unchanged, /supported's answer through supported
// when given (a 503 while supportedDown is set), and so is /settle once
// pass is set (the path healed). The mode may be changed while it runs.
type lossyProxy struct {
	*httptest.Server
	settles       atomic.Int64 // /settle calls forwarded
	pass          atomic.Bool
	mode          atomic.Value // string
	supportedDown atomic.Bool
}

func newLossyProxy(t *testing.T, facURL, mode string, supported ...func(map[string]any)) *lossyProxy {
	t.Helper()
	p := &lossyProxy{}
	p.mode.Store(mode)
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		drop := func() {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}
		settle := strings.HasSuffix(r.URL.Path, "/settle") && !p.pass.Load()
		mode := p.mode.Load()
		switch {
		case strings.HasSuffix(r.URL.Path, "/supported") && p.supportedDown.Load():
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		case settle && mode == "lose_request":
			drop()
			return
		case settle && mode == "refuse":
			var req struct {
				PaymentPayload x402.PaymentPayload `json:"paymentPayload"`
			}
			json.Unmarshal(body, &req)
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(map[string]any{"success": false, "errorReason": x402.ReasonExactEVMTransactionFailed,
				"errorMessage": "execution reverted", "transaction": "", "network": req.PaymentPayload.Accepted.Network})
			return
		}
		resp, reply, ok := relayTo(w, r, facURL, body)
		if !ok {
			return
		}
		if settle {
			p.settles.Add(1)
			if mode == "redirect" {
				w.Header().Set("Location", "/settle/result/1")
				w.WriteHeader(http.StatusSeeOther)
				return
			}
			drop()
			return
		}
		if strings.HasSuffix(r.URL.Path, "/supported") {
			for _, rewrite := range supported {
				var s map[string]any
				json.Unmarshal(reply, &s)
				rewrite(s)
				reply, _ = json.Marshal(s)
			}
		}
		passOn(w, resp, reply)
	}))
	t.Cleanup(p.Close)
	return p
}

// remoteSite is a paid route whose gate reaches its facilitator through
// `facilitator http`, with rpc (an `rpc <network> <url>` line, or ""),
// inside `facilitator multi` when multi is set.
func remoteSite(up, facURL, rpc, storeDir string, multi ...bool) string {
	fac := fmt.Sprintf("http %s {\n\t\t\t\ttimeout 5s\n\t\t\t\t%s\n\t\t\t}", facURL, rpc)
	if len(multi) > 0 && multi[0] {
		fac = "multi {\n\t\t\t\t" + fac + "\n\t\t\t}"
	}
	return killSite(up, fac, storeDir)
}

// With a remote facilitator that settled and lost its answer, the gate
// reads the outcome from the chain it is given (rpc): the buyer's retry
// with the same payment gets the held answer with PAYMENT-RESPONSE, charged
// once, and the upstream hears "paid". Without rpc the gate cannot tell,
// and the retry is still told to wait (never served, never asked to pay
// again). A settle answered with a redirect is such an unknown outcome
// too. (Before: the gate followed the 303 with a GET, read its 404 as
// "nothing settled" and released the payment: the buyer, charged, got 503
// upstream_unavailable and then payment_already_used.)
func TestRemoteUnknownSettlementResolvedFromTheChain(t *testing.T) {
	d, facURL := sharedDevnet(t)
	payer := evmfacilitator.DevAccounts()[8].Address
	for _, tc := range []struct {
		name           string
		withRPC, multi bool
		mode           string // lossyProxy's
	}{
		{"rpc", true, false, "lose_reply"},
		{"rpc, inside multi", true, true, "lose_reply"},
		{"no rpc", false, false, "lose_reply"},
		{"rpc, settle answered 303 See Other", true, false, "redirect"},
	} {
		withRPC := tc.withRPC
		t.Run(tc.name, func(t *testing.T) {
			up := newReportingUpstream(t)
			proxy := newLossyProxy(t, facURL, tc.mode)
			rpc := ""
			if withRPC {
				rpc = "rpc devnet " + d.RPCURL()
			}
			base := startCaddy(t, remoteSite(up.URL, proxy.URL, rpc, gateDir(t), tc.multi))
			url := base + "/verify/schema"
			before := balance(t, d, payer)
			sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)

			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || e["code"] != "settlement_pending" {
				t.Fatalf("first try: status %d %v", resp.StatusCode, e)
			}
			if got := charged(t, d, payer, before); proxy.settles.Load() != 1 || got.Cmp(big.NewInt(20000)) != 0 {
				t.Fatalf("%d settlements forwarded, %v charged; want the one transfer", proxy.settles.Load(), got)
			}

			resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			body := readJSONString(t, resp)
			if !withRPC {
				if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(body, "settlement_pending") || strings.Contains(body, "paid_content") {
					t.Fatalf("retry without rpc: status %d: %s", resp.StatusCode, body)
				}
				if got := up.got(); len(got) != 0 {
					t.Fatalf("reported %v without knowing the outcome", got)
				}
				return
			}
			var sr x402.SettleResponse
			if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"v-1"`) ||
				x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr) != nil || !sr.Success {
				t.Fatalf("retry: status %d, PAYMENT-RESPONSE %+v: %s", resp.StatusCode, sr, body)
			}
			paidBy(t, d, sr.Transaction)
			if got := charged(t, d, payer, before); proxy.settles.Load() != 1 || got.Cmp(big.NewInt(20000)) != 0 {
				t.Fatalf("after the retry: %d settlements forwarded, %v charged", proxy.settles.Load(), got)
			}
			if up.n.Load() != 1 {
				t.Fatalf("the upstream ran %d times; the held answer should have been served", up.n.Load())
			}
			waitReports(t, up, "v-1=paid")
		})
	}
}

// waitReports waits until the upstream has received exactly want.
func waitReports(t *testing.T, up *reportingUpstream, want ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := up.got()
		slices.Sort(got)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("reports %v, want %v", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The background pass resolves unknown settlements of a remote facilitator
// from the chain and reports each outcome to the upstream at once, with no
// retry by the buyer: a transfer that happened as paid, an authorization
// that expired unused as unpaid (its claim released, nothing charged).
func TestBackgroundResolutionIsReportedAtOnce(t *testing.T) {
	old := resolveInterval
	resolveInterval = 100 * time.Millisecond
	t.Cleanup(func() { resolveInterval = old })
	d, facURL := sharedDevnet(t)
	rpc := "rpc devnet " + d.RPCURL()

	t.Run("settled: paid", func(t *testing.T) {
		up := newReportingUpstream(t)
		proxy := newLossyProxy(t, facURL, "lose_reply")
		base := startCaddy(t, remoteSite(up.URL, proxy.URL, rpc, gateDir(t)))
		url := base + "/verify/schema"
		sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
		if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("first try: status %d", resp.StatusCode)
		}
		waitReports(t, up, "v-1=paid")
	})

	t.Run("expired unused: unpaid", func(t *testing.T) {
		// A devnet of its own: the shared one's head time leaps ahead while
		// other tests seal blocks, which would expire this short payment
		// before the facilitator verifies it.
		d, facURL := ownDevnet(t)
		rpc := "rpc devnet " + d.RPCURL()
		up := newReportingUpstream(t)
		proxy := newLossyProxy(t, facURL, "lose_request")
		base := startCaddy(t, remoteSite(up.URL, proxy.URL, rpc, gateDir(t)))
		url := base + "/verify/schema"
		payer := evmfacilitator.DevAccounts()[4].Address
		before := balance(t, d, payer)
		// 9 s: 3 s of slack past the facilitator's margin for the seconds
		// the chain head or the clock move on before it verifies.
		sig := signExpiring(t, d, paymentRequired(t, post(t, url, "", nil)), 4, 9)
		if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("first try: status %d: %s", resp.StatusCode, readJSONString(t, resp))
		}
		// Idle blocks come every 2 s; the head passes validBefore within
		// about 10 s.
		deadline := time.Now().Add(40 * time.Second)
		for len(up.got()) == 0 && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		waitReports(t, up, "v-1=unpaid")
		if got := charged(t, d, payer, before); got.Sign() != 0 || proxy.settles.Load() != 0 {
			t.Fatalf("charged %v (%d settlements forwarded) for a settlement that never happened", got, proxy.settles.Load())
		}
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		if b := readJSONString(t, resp); resp.StatusCode != http.StatusPaymentRequired || strings.Contains(b, "paid_content") {
			t.Fatalf("retry after the release: status %d: %s", resp.StatusCode, b)
		}
	})
}

// ownDevnet is a devnet and its facilitator for one test, stopped with it.
func ownDevnet(t *testing.T) (*evmfacilitator.Devnet, string) {
	t.Helper()
	d, url, stop, err := startDevnetFacilitator()
	if err != nil {
		t.Fatalf("starting devnet: %v", err)
	}
	t.Cleanup(stop)
	return d, url
}

// The http facilitator reads outcomes on EVM and Solana chains, once per
// network, and refuses a network it does not know.
func TestRemoteStatusRPCConfig(t *testing.T) {
	ok := &HTTPFacilitator{}
	if err := unmarshalAndProvision(t, ok, "http http://127.0.0.1:1 {\nrpc devnet http://127.0.0.1:1\nrpc solana-devnet http://127.0.0.1:2\n}"); err != nil {
		t.Fatalf("an EVM and a Solana rpc: %v", err)
	}
	for _, tc := range []struct{ rpc, want string }{
		{"rpc nowhere http://127.0.0.1:1", "rpc nowhere"},
		{"rpc devnet http://127.0.0.1:1\nrpc eip155:1337 http://127.0.0.1:2", "named twice"},
		{"rpc devnet http://127.0.0.1:1 extra", "wrong argument count"},
	} {
		m := &HTTPFacilitator{}
		err := unmarshalAndProvision(t, m, "http http://127.0.0.1:1 {\n"+tc.rpc+"\n}")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %q", tc.rpc, err, tc.want)
		}
	}
}

func unmarshalAndProvision(t *testing.T, m *HTTPFacilitator, input string) error {
	t.Helper()
	if err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(input)); err != nil {
		return err
	}
	defer m.Cleanup()
	return m.Provision(caddy.Context{})
}

// After a restart the in-memory way to report a held payment's outcome is
// gone; the background pass of the new gateway resolves it from the store
// and reports it through the first request the same offer's gate serves,
// not only on the buyer's own retry. (Caddy runs in this process, so the
// restart is a stop and a fresh start on the same state, with the
// reporters a real restart loses forgotten by hand.)
func TestResolvedAfterARestartIsReported(t *testing.T) {
	old := resolveInterval
	resolveInterval = time.Hour // only the pass each gateway runs when it starts
	t.Cleanup(func() { resolveInterval = old })
	d, facURL := sharedDevnet(t)
	rpc := "rpc devnet " + d.RPCURL()
	up := newReportingUpstream(t)
	proxy := newLossyProxy(t, facURL, "lose_reply")
	dir := gateDir(t)

	base := startCaddy(t, remoteSite(up.URL, proxy.URL, rpc, dir))
	url := base + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 9)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: status %d: %s", resp.StatusCode, readJSONString(t, resp))
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	resolvers.Lock()
	clear(resolvers.via)
	resolvers.Unlock()

	// The same config, on the same port: a gate's name covers its
	// server's listeners.
	loadCaddy(t, portOf(t, base), remoteSite(up.URL, proxy.URL, rpc, dir))
	time.Sleep(time.Second) // the new gateway's first pass resolves the payment
	if got := up.got(); len(got) != 0 {
		t.Fatalf("reported %v before the gate had a way to its upstream", got)
	}
	// Anyone's request shows the gate the way; a 402 is enough.
	if resp := post(t, base+"/verify/schema", "", nil); resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("probe: status %d", resp.StatusCode)
	}
	waitReports(t, up, "v-1=paid")
}
