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
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/ethereum/go-ethereum/common"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// One transfer, one answer. A gate whose settlement of payment P ended
// unknown (nothing was sent: lose_request) holds P. Meanwhile the same P
// is presented to an official x402 middleware on the same pay_to and price
// (it verifies, serves and settles through its own facilitator, here an
// evm facilitator with another relayer, as CDP's would be): that settle
// answers success, so the middleware served P's answer. The buyer then
// retries P at the gate, which finds P's transfer on chain, sent by
// another than its facilitator's relayer: settled by another settlement,
// a 402 duplicate_settlement, the claim released and nothing served.
// (Before: the gate served its held answer too, and one transfer bought
// two answers, which README's "One case is not covered" note says the
// gate must not do.)
func TestHeldPaymentSettledByAnotherFacilitatorIsNotServed(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_request", gateDir(t), ""))
	url := base + "/verify/schema"
	const buyer = 3
	payer := evmfacilitator.DevAccounts()[buyer].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), buyer)
	var pl x402.PaymentPayload
	if err := x402.DecodeHeader(sig, &pl); err != nil {
		t.Fatal(err)
	}

	// 1. The gate: verified, upstream ran, settlement outcome unknown.
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("first try at the gate: status %d: %s", resp.StatusCode, b)
	}

	// 2. The official middleware on the same pay_to: verify, serve, settle
	// through its own facilitator (another relayer account).
	m := otherFacilitator(t, d)
	ctx := context.Background()
	if vr, err := m.Verify(ctx, pl, pl.Accepted); err != nil || !vr.IsValid {
		t.Fatalf("middleware verify: %+v %v", vr, err)
	}
	sr, err := m.Settle(ctx, pl, pl.Accepted)
	if err != nil || !sr.Success {
		t.Fatalf("middleware settle: %+v %v", sr, err)
	}
	calls := up.calls.Load()

	// 3. The buyer retries P at the gate.
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	e := readJSON(t, resp)
	if resp.StatusCode != http.StatusPaymentRequired || e["reason"] != x402.ReasonDuplicateSettlement || up.calls.Load() != calls {
		t.Fatalf("retry at the gate after the middleware settled P (%s): %d %v, upstream ran %d more; want 402 %s, nothing run",
			sr.Transaction, resp.StatusCode, e, up.calls.Load()-calls, x402.ReasonDuplicateSettlement)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("payer charged %v, want one payment, 20000", got)
	}
	// The claim is released: a replay is claimed anew, and the gate's
	// facilitator refuses the used nonce; the chain, read again (the
	// settled-earlier check), tells a transfer another settlement made,
	// not the gate's, and the refusal stands. Nothing runs.
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if reason := reasonOf(t, resp); resp.StatusCode != http.StatusPaymentRequired || reason != x402.ReasonExactEVMNonceAlreadyUsed || up.calls.Load() != calls {
		t.Fatalf("a replay after the release: %d %s, upstream ran %d more; want 402 %s", resp.StatusCode, reason, up.calls.Load()-calls, x402.ReasonExactEVMNonceAlreadyUsed)
	}
}

// otherFacilitator is another facilitator of the devnet, with its own
// relayer (dev account 5): an official middleware's.
func otherFacilitator(t *testing.T, d *evmfacilitator.Devnet) *evmfacilitator.Facilitator {
	t.Helper()
	m, err := evmfacilitator.New(evmfacilitator.Config{Chain: d.Client(), Network: evmfacilitator.DevnetNetwork,
		RelayerKey: evmfacilitator.DevKey(5), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// heldBuyer is a devnet buyer's payment whose first try the gate held
// (503 settlement_pending): its signature and payload, and the payer's
// balance before it.
type heldBuyer struct {
	sig    string
	pl     x402.PaymentPayload
	payer  common.Address
	before *big.Int
}

// holdBuyer signs buyer's payment for url's offer and sends it once,
// which the gate must hold.
func holdBuyer(t *testing.T, d *evmfacilitator.Devnet, url string, buyer int) heldBuyer {
	t.Helper()
	h := heldBuyer{payer: evmfacilitator.DevAccounts()[buyer].Address}
	h.before = balance(t, d, h.payer)
	h.sig = signFor(t, paymentRequired(t, post(t, url, "", nil)), buyer)
	if err := x402.DecodeHeader(h.sig, &h.pl); err != nil {
		t.Fatal(err)
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: h.sig})
	if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || e["code"] != x402.ReasonSettlementPending {
		t.Fatalf("first try: %d %v; want 503 %s", resp.StatusCode, e, x402.ReasonSettlementPending)
	}
	return h
}

// The same through the remote path: the gate's facilitator is a remote
// one (facilitator http, with the gate's own rpc for status reads)
// answering /settle as the official npm facilitator does for a gas
// estimate that reverted before anything was sent (README: a contract
// wallet whose isValidSignature reverts at settlement, "so a payer can
// cause it at will"): success false, invalid_exact_evm_transaction_failed,
// transaction "". The gate holds the payment (503 settlement_pending).
// The payer then has the payment settled elsewhere: an official x402
// middleware on the same pay_to verifies and settles it through its own
// facilitator, over HTTP, and serves it. The gate's retry finds the
// transfer, sent by an address the remote does not list among its
// signers (GET /supported): settled by another settlement, 402. A remote
// that lists no signers leaves the gate unable to tell, and it serves
// the transfer as its own, as README says. (Before: served either way.)
func TestRemoteHeldPaymentSettledByAnotherFacilitatorIsNotServed(t *testing.T) {
	d, fac := sharedDevnet(t)
	m := httptest.NewServer(x402.NewFacilitatorHandler(otherFacilitator(t, d)))
	t.Cleanup(m.Close)
	for i, publishes := range []bool{true, false} {
		t.Run(fmt.Sprintf("signers published %v", publishes), func(t *testing.T) {
			remote := newLossyProxy(t, fac, "refuse", func(s map[string]any) {
				if !publishes {
					delete(s, "signers")
				}
			}).URL
			up := newUpstream(t)
			base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
				rpc devnet %[4]s
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote, payTo.Hex(), d.RPCURL()))
			url := base + "/verify/schema"
			h := holdBuyer(t, d, url, 4+i)
			payer, before, sig, pl := h.payer, h.before, h.sig, h.pl
			// The official middleware: /verify then /settle at its facilitator.
			call := func(path string, out any) {
				b, _ := json.Marshal(map[string]any{"x402Version": 2, "paymentPayload": pl, "paymentRequirements": pl.Accepted})
				resp, err := http.Post(m.URL+path, "application/json", bytes.NewReader(b))
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
					t.Fatal(err)
				}
			}
			var vr x402.VerifyResponse
			if call("/verify", &vr); !vr.IsValid {
				t.Fatalf("middleware /verify: %+v", vr)
			}
			var sr x402.SettleResponse
			if call("/settle", &sr); !sr.Success {
				t.Fatalf("middleware /settle: %+v", sr)
			}
			calls := up.calls.Load()
			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			b, _ := io.ReadAll(resp.Body)
			if got := charged(t, d, payer, before); got.Cmp(big.NewInt(10000)) != 0 {
				t.Fatalf("payer charged %v, want one payment, 10000", got)
			}
			served := resp.StatusCode == http.StatusOK && up.calls.Load() == calls+1
			switch {
			case publishes && (resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b), x402.ReasonDuplicateSettlement) || up.calls.Load() != calls):
				t.Fatalf("retry at the gate after the middleware settled P (%s): %d, upstream ran %d more: %.300s; want 402 %s",
					sr.Transaction, resp.StatusCode, up.calls.Load()-calls, b, x402.ReasonDuplicateSettlement)
			case !publishes && !served:
				t.Fatalf("retry at the gate of a remote without signers: %d, upstream ran %d more: %.300s; want it served", resp.StatusCode, up.calls.Load()-calls, b)
			}
		})
	}
}

// A remote's held payment keeps the remote's signers with its record.
// Another resource server's facilitator then settles it, and the gate
// restarts while the remote's GET /supported does not answer: the
// signers recorded judge the transfer, sent by an address they do not
// list, and the sender cannot be asked about, so the payment stays
// settlement_pending, nothing served; once /supported answers again it is
// settled by another settlement, 402. (Before: with no signers known
// after the restart every sender counted, and the other facilitator's
// transfer was served as the gate's own.)
func TestHeldRemotePaymentKeepsItsSignersWhileTheRemoteIsDown(t *testing.T) {
	d, fac := sharedDevnet(t)
	remote := newLossyProxy(t, fac, "refuse")
	up := newUpstream(t)
	site := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator http {
				url %[2]s
				rpc devnet %[4]s
			}
			store badger %[5]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote.URL, payTo.Hex(), d.RPCURL(), gateDir(t))
	url := startCaddy(t, site) + "/verify/schema"
	h := holdBuyer(t, d, url, 6)
	payer, before, sig, pl := h.payer, h.before, h.sig, h.pl
	if sr, err := otherFacilitator(t, d).Settle(t.Context(), pl, pl.Accepted); err != nil || !sr.Success {
		t.Fatalf("the other facilitator's settle: %+v %v", sr, err)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	remote.supportedDown.Store(true)
	url = startCaddy(t, site) + "/verify/schema"
	calls := up.calls.Load()
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || e["code"] != x402.ReasonSettlementPending {
		t.Fatalf("retry after the restart, /supported down: %d %v; want 503 %s", resp.StatusCode, e, x402.ReasonSettlementPending)
	}
	remote.supportedDown.Store(false)
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if e := readJSON(t, resp); resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(fmt.Sprint(e), x402.ReasonDuplicateSettlement) {
		t.Fatalf("retry once /supported answers: %d %v; want 402 %s", resp.StatusCode, e, x402.ReasonDuplicateSettlement)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(10000)) != 0 || up.calls.Load() != calls {
		t.Fatalf("charged %v, upstream ran %d more; want one payment (10000) and nothing served", got, up.calls.Load()-calls)
	}
}

// A multi of a remote that lists no signers and an embedded evm member:
// the remote member sends a held payment's transfer, its reply lost, and
// then its GET /supported stops answering. The claim's record keeps what
// the multi's signers are (memberSigners): none, as a member lists none,
// so every sender's transfer counts and the charged buyer's retry is
// served, /supported down or not. (Before: the record kept the embedded
// member's relayer alone, which ruled the remote's sender out, and the
// buyer waited on a /supported that had nothing to tell, 503.)
func TestMultiRemoteWithoutSignersServedWhileItsSupportedIsDown(t *testing.T) {
	for _, down := range []bool{false, true} {
		t.Run(fmt.Sprintf("supportedDown=%v", down), func(t *testing.T) {
			d, fac := sharedDevnet(t)
			remote := newLossyProxy(t, fac, "lose_reply", func(s map[string]any) {
				s["signers"] = map[string][]string{}
			})
			up := newUpstream(t)
			evm9 := fmt.Sprintf("evm {\n\t\t\t\t\tnetwork devnet\n\t\t\t\t\trpc_url %s\n\t\t\t\t\trelayer_key %s\n\t\t\t\t}", d.RPCURL(), evmfacilitator.DevAccounts()[9].PrivateKeyHex)
			base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator multi {
				http %[2]s {
					timeout 5s
					rpc devnet %[4]s
				}
				%[5]s
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote.URL, payTo.Hex(), d.RPCURL(), evm9))
			url := base + "/verify/schema"
			buyer := 3
			if down {
				buyer = 7
			}
			h := holdBuyer(t, d, url, buyer)
			if remote.settles.Load() == 0 {
				t.Fatalf("the remote member did not settle")
			}
			remote.supportedDown.Store(down)
			retryServed(t, d, up, url, h.sig, h.payer, h.before, "(the remote member, which lists no signers, sent the transfer)")
		})
	}
}

// In a multi, the member that reads a payment's chain need not be the one
// that sent it: here the remote (no rpc) settles and its reply is lost,
// and the embedded evm member, with a relayer of its own, reads the
// outcome. The transfer, sent by the remote's signer, is the multi's own
// (the signers of every member count, read from their /supported), and
// the charged buyer is served, not refused as settled by another
// settlement.
func TestMultiHeldPaymentSentByTheRemoteMemberIsServed(t *testing.T) {
	d, fac := sharedDevnet(t)
	u, _ := neturl.Parse(fac)
	rp := httputil.NewSingleHostReverseProxy(u)
	remote := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/settle" {
			rp.ServeHTTP(w, r)
			return
		}
		rp.ServeHTTP(httptest.NewRecorder(), r) // settled, and the reply lost
		http.Error(w, "bad gateway", http.StatusBadGateway)
	}))
	t.Cleanup(remote.Close)
	up := newUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.01 %[3]s
			facilitator multi {
				http %[2]s
				evm {
					network devnet
					rpc_url %[4]s
					relayer_key %[5]s
				}
			}
			store badger %[6]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), remote.URL, payTo.Hex(), d.RPCURL(), evmfacilitator.DevAccounts()[7].PrivateKeyHex, gateDir(t)))
	url := base + "/verify/schema"
	h := holdBuyer(t, d, url, 6)
	payer, before, sig := h.payer, h.before, h.sig
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the charged buyer's retry: %d %.300s; want the paid answer", resp.StatusCode, b)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(10000)) != 0 {
		t.Fatalf("charged %v in all, want 10000", got)
	}
}

// A remote's /supported that lists more than maxSigners signers under a
// key is taken as listing none, with a warning: a list of up to 1 MiB of
// addresses cost a quadratic deduplication on every status read of a held
// payment, and a megabyte in its record. Up to the bound every address is
// read, once each.
func TestSignersListedPastTheBoundAreNotRead(t *testing.T) {
	const network = "eip155:1337"
	for _, c := range []struct {
		key    string
		listed int
		want   int
	}{{"eip155:*", maxSigners, maxSigners}, {network, maxSigners, maxSigners}, {"eip155:*", maxSigners + 1, 0}, {network, maxSigners + 1, 0}} {
		list := []string{}
		for i := range c.listed {
			list = append(list, fmt.Sprintf("0x%040x", i+1))
		}
		if c.listed > 1 {
			list[1] = list[0] // a duplicate counts once
			c.want--
		}
		body, _ := json.Marshal(map[string]any{"kinds": []any{}, "extensions": []any{}, "signers": map[string][]string{c.key: list}})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write(body) }))
		core, logs := observer.New(zap.WarnLevel)
		m := &HTTPFacilitator{f: x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: srv.URL, Timeout: 5 * time.Second}),
			status: remoteStatus{signers: &remoteSigners{}}, logger: zap.New(core)}
		got := m.evmSigners(context.Background(), network)
		srv.Close()
		warned := logs.FilterMessageSnippet("lists more signers than the gate reads").Len() > 0
		if len(got) != max(c.want, 0) || warned != (c.listed > maxSigners) {
			t.Errorf("%d signers listed under %s: %d read, warned %v; want %d", c.listed, c.key, len(got), warned, max(c.want, 0))
		}
	}
}
