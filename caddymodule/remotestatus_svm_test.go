package caddymodule

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// svmFeeKey is the fee payer newSolanaEnv funds and writes to its key file.
func svmFeeKey() ed25519.PrivateKey {
	seed := sha256.Sum256([]byte("caddymodule svm fee payer"))
	return ed25519.NewKeyFromSeed(seed[:])
}

// remoteSVMFacilitator is our Solana facilitator behind the x402 HTTP API,
// on the env's chain: a remote facilitator. It is closed when t ends, so
// its background resolver does not outlive the test and poll the chain's
// address, which a later test's server may be given.
func remoteSVMFacilitator(t *testing.T, e *solanaEnv) string {
	t.Helper()
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: e.chain.URL}, Network: x402.NetworkSolanaDevnet, FeePayer: svmFeeKey()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	srv := httptest.NewServer(x402.NewFacilitatorHandler(f))
	t.Cleanup(srv.Close)
	return srv.URL
}

// solanaSite is a paid Solana route with facilitator fac, its store in
// storeDir.
func solanaSite(up, fac string, e *solanaEnv, storeDir string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept solana-devnet $0.02 %[3]s
			facilitator %[2]s
			store badger %[4]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, e.payee.Address, storeDir)
}

// signSolana has the official client sign the route's Solana offer; it
// returns the header and the transaction id the fee payer's signature will
// give it.
func signSolana(t *testing.T, e *solanaEnv, url string) (header, txid string) {
	t.Helper()
	pr := paymentRequired(t, post(t, url, "", nil))
	var signed struct {
		Header  string              `json:"header"`
		Payload x402.PaymentPayload `json:"payload"`
	}
	interop.Run(t, "x402-client-sign.mjs", nil, map[string]any{"solana": e.clientInput(), "paymentRequired": pr}, &signed)
	tx, err := svmfacilitator.DecodePayload(signed.Payload.Payload)
	if err != nil {
		t.Fatal(err)
	}
	return signed.Header, base58.Encode(ed25519.Sign(svmFeeKey(), tx.Message))
}

// wantPaidWith checks a 200 with the held answer and PAYMENT-RESPONSE naming
// transaction txid and the env's payer.
func wantPaidWith(t *testing.T, e *solanaEnv, resp *http.Response, txid string) {
	t.Helper()
	body := readJSONString(t, resp)
	var sr x402.SettleResponse
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, "paid_content") ||
		x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr) != nil || !sr.Success ||
		sr.Transaction != txid || sr.Network != x402.NetworkSolanaDevnet || sr.Payer != e.payer.Address {
		t.Fatalf("status %d, PAYMENT-RESPONSE %+v (want transaction %s): %s", resp.StatusCode, sr, txid, body)
	}
}

func wantSettlementPending(t *testing.T, resp *http.Response, what string) {
	t.Helper()
	if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || e["code"] != "settlement_pending" {
		t.Fatalf("%s: status %d %v", what, resp.StatusCode, e)
	}
}

// A remote Solana facilitator settled and its /settle reply was lost
// whole: nothing names the transaction, and the gate finds it on chain
// from the payment (`rpc solana-devnet`). Two such payments of the same
// buyer are pending at once, so each search passes the other's transfer
// (another message: not taken): each retry gets its held answer with its
// own transaction, the buyer is charged exactly twice, history says paid.
func TestRemoteSolanaLostReplyFoundOnChain(t *testing.T) {
	e := newSolanaEnv(t)
	up := newReportingUpstream(t)
	proxy := newLossyProxy(t, remoteSVMFacilitator(t, e), "lose_reply")
	fac := fmt.Sprintf("http %s {\n\t\t\t\ttimeout 5s\n\t\t\t\trpc solana-devnet %s\n\t\t\t}", proxy.URL, e.chain.URL)
	url := startCaddy(t, solanaSite(up.URL, fac, e, gateDir(t))) + "/verify/schema"
	payerBefore, payeeBefore := e.usdc(t, e.payer.Address), e.usdc(t, e.payee.Address)

	first, firstTx := signSolana(t, e, url)
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: first}), "first payment")
	second, secondTx := signSolana(t, e, url)
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: second}), "second payment")
	if firstTx == secondTx || proxy.settles.Load() != 2 {
		t.Fatalf("%d settlements forwarded, transactions %s %s", proxy.settles.Load(), firstTx, secondTx)
	}

	wantPaidWith(t, e, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: second}), secondTx)
	wantPaidWith(t, e, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: first}), firstTx)
	// Again: the same answer, never a second charge.
	wantPaidWith(t, e, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: first}), firstTx)
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 40000 {
		t.Fatalf("payer charged %d, want two payments of 20000", got)
	}
	if got := e.usdc(t, e.payee.Address) - payeeBefore; got != 40000 {
		t.Fatalf("payee received %d", got)
	}
	if up.n.Load() != 2 || proxy.settles.Load() != 2 {
		t.Fatalf("upstream ran %d times, %d settlements forwarded; the held answers should have been served", up.n.Load(), proxy.settles.Load())
	}
	waitOutcomes(t, up, "v-1=paid", "v-2=paid")
}

// A remote Solana facilitator never got the /settle (the request was lost):
// the retry is told to wait while the payment's blockhash is valid; once it
// expired the claim is released (402, nothing charged, history unpaid), and
// a new payment pays.
func TestRemoteSolanaLostRequestReleasedOnceExpired(t *testing.T) {
	e := newSolanaEnv(t)
	up := newReportingUpstream(t)
	proxy := newLossyProxy(t, remoteSVMFacilitator(t, e), "lose_request")
	fac := fmt.Sprintf("http %s {\n\t\t\t\ttimeout 5s\n\t\t\t\trpc solana-devnet %s\n\t\t\t}", proxy.URL, e.chain.URL)
	url := startCaddy(t, solanaSite(up.URL, fac, e, gateDir(t))) + "/verify/schema"
	payerBefore := e.usdc(t, e.payer.Address)

	sig, _ := signSolana(t, e, url)
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), "first try")
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), "retry, blockhash valid")
	e.chain.ExpireBlockhash()
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if b := readJSONString(t, resp); resp.StatusCode != http.StatusPaymentRequired || strings.Contains(b, "paid_content") {
		t.Fatalf("retry, blockhash expired: status %d: %s", resp.StatusCode, b)
	}
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 0 || proxy.settles.Load() != 0 {
		t.Fatalf("charged %d (%d settlements forwarded) for a settlement that never happened", got, proxy.settles.Load())
	}
	waitOutcomes(t, up, "v-1=unpaid")

	proxy.pass.Store(true)
	next, nextTx := signSolana(t, e, url)
	wantPaidWith(t, e, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: next}), nextTx)
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("payer charged %d, want the new payment only", got)
	}
}

// newDroppingSolanaRPC is a FAKE FOR A FAULT that cannot otherwise be caused on
// demand: the path from the embedded facilitator to the chain, which
// forwards sendTransaction and then loses its reply, and answers
// getSignatureStatuses with "unknown" (the node has not seen it yet), so the
// facilitator's Settle ends with an unknown outcome although the transfer
// landed. Everything else is forwarded.
func newDroppingSolanaRPC(t *testing.T, chain string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		resp, err := http.Post(chain, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		reply, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case bytes.Contains(body, []byte(`"sendTransaction"`)):
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
			return
		case bytes.Contains(body, []byte(`"getSignatureStatuses"`)):
			reply = []byte(`{"jsonrpc":"2.0","id":1,"result":{"context":{"slot":1},"value":[null]}}`)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(reply)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The embedded Solana facilitator lost a settlement's outcome, and the
// gateway restarted: the new facilitator remembers nothing, signs the
// transaction's id again from its key and finds it on chain, so the retry
// gets the held answer with that transaction, charged once.
func TestEmbeddedSolanaResolvedAfterARestart(t *testing.T) {
	e := newSolanaEnv(t)
	up := newReportingUpstream(t)
	rpc := newDroppingSolanaRPC(t, e.chain.URL)
	dir := gateDir(t)
	svm := func(url string) string {
		return fmt.Sprintf("svm {\n\t\t\t\tnetwork solana-devnet\n\t\t\t\trpc_url %s\n\t\t\t\tfee_payer_key_file %s\n\t\t\t\tconfirm_timeout 1s\n\t\t\t}", url, e.keyFile)
	}
	base := startCaddy(t, solanaSite(up.URL, svm(rpc), e, dir))
	url := base + "/verify/schema"
	payerBefore := e.usdc(t, e.payer.Address)
	sig, txid := signSolana(t, e, url)
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), "first try")
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("the transfer did not land (charged %d); the test needs it to", got)
	}
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), "retry while the node hides it")

	// Restarted on its address, as a gateway is; only the facilitator's
	// node changes, which renames no gate (withoutGateSettings).
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	loadCaddy(t, portOf(t, base), solanaSite(up.URL, svm(e.chain.URL), e, dir))
	wantPaidWith(t, e, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), txid)
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 || up.n.Load() != 1 {
		t.Fatalf("charged %d, upstream ran %d times; want one payment, one run", got, up.n.Load())
	}
	waitOutcomes(t, up, "v-1=paid")
}

// The embedded Solana facilitator lost a settlement's outcome (its node
// hid it), and a /settle of the same payment through another facilitator
// on the same store of sends (another instance with the fee payer) adopts
// its record, marks it and answers success. The gateway's retry, its node
// answering again, reads the status: settled by another settlement, which
// answers for it. The 402 says so (duplicate_settlement): this request is
// not served, and nothing more is charged. (Before: it said the payment
// could no longer settle and nothing was charged, for tokens that moved.)
func TestEmbeddedSolanaSettledByAnotherSettlementSaysSo(t *testing.T) {
	e := newSolanaEnv(t)
	up := newReportingUpstream(t)
	sent := servers.StartRedis(t)
	dropping := newDroppingSolanaRPC(t, e.chain.URL)
	var blind atomic.Bool
	blind.Store(true)
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		target := e.chain.URL
		if blind.Load() {
			target = dropping
		}
		resp, err := http.Post(target, "application/json", r.Body)
		if err != nil { // the send's reply lost: lost here too
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", "application/json")
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(node.Close)
	svm := fmt.Sprintf("svm {\n\t\t\t\tnetwork solana-devnet\n\t\t\t\trpc_url %s\n\t\t\t\tfee_payer_key_file %s\n\t\t\t\tconfirm_timeout 1s\n\t\t\t\tstore redis %s\n\t\t\t}", node.URL, e.keyFile, sent.Addr)
	url := startCaddy(t, solanaSite(up.URL, svm, e, gateDir(t))) + "/verify/schema"
	payerBefore := e.usdc(t, e.payer.Address)
	sig, txid := signSolana(t, e, url)
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), "first try")
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("the transfer did not land (charged %d); the test needs it to", got)
	}
	runs := up.n.Load()

	var pp x402.PaymentPayload
	if err := x402.DecodeHeader(sig, &pp); err != nil {
		t.Fatal(err)
	}
	other, stop := provisionSVMWith(t, e, e.chain.URL, fmt.Sprintf(`{"type":"redis","addresses":[%q]}`, sent.Addr), `,"confirm_timeout":"2s"`)
	defer stop()
	if s, err := other.Settle(t.Context(), pp, pp.Accepted); err != nil || !s.Success || s.Transaction != txid {
		t.Fatalf("settle through another facilitator: %+v %v; want success naming %s", s, err, txid)
	}

	blind.Store(false)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body := readJSON(t, resp)
	msg, _ := body["error"].(string)
	if resp.StatusCode != http.StatusPaymentRequired || body["reason"] != svmfacilitator.ReasonDuplicateSettlement ||
		!strings.Contains(msg, "settled by another settlement") || strings.Contains(msg, "nothing was charged") {
		t.Fatalf("retry after the other settlement: status %d %v; want 402 %s saying it was settled by another settlement", resp.StatusCode, body, svmfacilitator.ReasonDuplicateSettlement)
	}
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 || up.n.Load() != runs {
		t.Fatalf("charged %d, upstream ran %d more times; want one payment, no run for the retry", got, up.n.Load()-runs)
	}
}

// waitOutcomes waits until the upstream has heard exactly the outcomes
// want, each at least once (the retry and the background pass may both
// report one; a repeat changes nothing upstream).
func waitOutcomes(t *testing.T, up *reportingUpstream, want ...string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := up.got()
		slices.Sort(got)
		got = slices.Compact(got)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("outcomes reported %v, want %v", got, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The same with the official @x402/svm facilitator as the remote one (its
// own fee payer): the search needs nothing of our facilitator, only the
// payment and the chain.
func TestRemoteSolanaLostReplyOfTheOfficialFacilitator(t *testing.T) {
	e := newSolanaEnv(t)
	seed := sha256.Sum256([]byte("official facilitator fee payer"))
	key := ed25519.NewKeyFromSeed(seed[:])
	e.chain.Airdrop(base58.Encode(key.Public().(ed25519.PublicKey)), 10_000_000_000)
	var ready struct {
		URL string `json:"url"`
	}
	interop.Start(t, "svm-facilitator-server.mjs", []string{"RPC_URL=" + e.chain.URL, "SECRET_KEY=" + base58.Encode(key)}, &ready)
	up := newReportingUpstream(t)
	proxy := newLossyProxy(t, ready.URL, "lose_reply")
	fac := fmt.Sprintf("http %s {\n\t\t\t\ttimeout 10s\n\t\t\t\trpc solana-devnet %s\n\t\t\t}", proxy.URL, e.chain.URL)
	url := startCaddy(t, solanaSite(up.URL, fac, e, gateDir(t))) + "/verify/schema"
	payerBefore := e.usdc(t, e.payer.Address)

	sig, _ := signSolana(t, e, url)
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), "first try")
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 || proxy.settles.Load() != 1 {
		t.Fatalf("charged %d with %d settlements forwarded; the test needs the one transfer", got, proxy.settles.Load())
	}
	var pp x402.PaymentPayload
	if err := x402.DecodeHeader(sig, &pp); err != nil {
		t.Fatal(err)
	}
	tx, err := svmfacilitator.DecodePayload(pp.Payload)
	if err != nil {
		t.Fatal(err)
	}
	wantPaidWith(t, e, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), base58.Encode(ed25519.Sign(key, tx.Message)))
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 || up.n.Load() != 1 {
		t.Fatalf("charged %d, upstream ran %d times", got, up.n.Load())
	}
	waitOutcomes(t, up, "v-1=paid")
}

// multi { http <remote, fee payer F, no rpc>; svm <the same fee payer F> }:
// the remote, listed first, settles the payment and its reply is lost
// (503 settlement_pending, the buyer charged). The status question goes to
// the svm member, which reads F's payments but never sent this one: it
// reads the chain for the transaction, which the remote sent under F's
// signature, and the retry is served with it. (Before: finding the
// transaction landed with no record of its own in its store, it answered
// "settled by another settlement", and the charged buyer was refused 402
// duplicate_settlement.)
func TestMultiSiblingsSolanaSendReadByTheEmbeddedMember(t *testing.T) {
	e := newSolanaEnv(t)
	multiLostReplyThenServed(t, e, remoteSVMFacilitator(t, e), e.svmBlock(), nil)
}

// multiLostReplyThenServed runs a gate on multi { http <remote, through a
// proxy losing its settle replies>; svm (the member's block) }: the
// remote settles the buyer's first try once and its reply is lost (503
// settlement_pending, the buyer charged), afterLoss (when not nil) changes
// what happens next (the remote goes down, say), and the retry is served
// with the transaction, the buyer charged once.
func multiLostReplyThenServed(t *testing.T, e *solanaEnv, remote, svm string, afterLoss func(*lossyProxy)) {
	t.Helper()
	up := newReportingUpstream(t)
	proxy := newLossyProxy(t, remote, "lose_reply")
	fac := fmt.Sprintf("multi {\n\t\t\t\thttp %s {\n\t\t\t\t\ttimeout 5s\n\t\t\t\t}\n\t\t\t\t%s\n\t\t\t}", proxy.URL, svm)
	url := startCaddy(t, solanaSite(up.URL, fac, e, gateDir(t))) + "/verify/schema"
	payerBefore := e.usdc(t, e.payer.Address)

	sig, txid := signSolana(t, e, url)
	wantSettlementPending(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}), "first try (reply lost)")
	if n := proxy.settles.Load(); n != 1 {
		t.Fatalf("%d settlements reached the remote, want 1", n)
	}
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("payer charged %d after the lost reply, want 20000", got)
	}
	if afterLoss != nil {
		afterLoss(proxy)
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	for i := 0; i < 4 && resp.StatusCode == http.StatusServiceUnavailable; i++ {
		// Not confirmed yet when asked: again.
		resp.Body.Close()
		time.Sleep(500 * time.Millisecond)
		resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	}
	wantPaidWith(t, e, resp, txid)
	if got := payerBefore - e.usdc(t, e.payer.Address); got != 20000 {
		t.Errorf("payer charged %d in all, want 20000 (once)", got)
	}
}

// multi { http <remote, fee payer F>; svm <the same fee payer F> } whose
// members remember their sends in one store, as instances sharing a fee
// payer are told to: the remote settles the payment, marks its record
// answered, and its reply is lost (503 settlement_pending, the buyer
// charged). The svm member asked for the status finds the remote's
// record, marked by another, and still reads the chain for the transaction
// the record names: the retry is served with it. (Before: the record found
// marked was answered "settled by another settlement", and the charged
// buyer was refused 402 duplicate_settlement.)
func TestMultiSiblingsSolanaSendReadThroughASharedRecordsStore(t *testing.T) {
	e := newSolanaEnv(t)
	dir := filepath.Join(t.TempDir(), "svm-records")
	db, err := store.Shared(dir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: e.chain.URL}, Network: x402.NetworkSolanaDevnet,
		FeePayer: svmFeeKey(), Sent: db.Claims().(svmfacilitator.SentStore)})
	if err != nil {
		t.Fatal(err)
	}
	remote := httptest.NewServer(x402.NewFacilitatorHandler(f))
	t.Cleanup(remote.Close)
	svm := fmt.Sprintf("svm {\n\t\t\t\t\tnetwork solana-devnet\n\t\t\t\t\trpc_url %s\n\t\t\t\t\tfee_payer_key_file %s\n\t\t\t\t\tstore badger %s\n\t\t\t\t}", e.chain.URL, e.keyFile, dir)
	multiLostReplyThenServed(t, e, remote.URL, svm, nil)
}

// multi { http <remote, fee payer F>; svm <the same fee payer F> }: the
// remote settles the payment and its reply is lost (503
// settlement_pending, the buyer charged), and the remote then stays down
// past the 5 minutes its /supported is remembered (the crash that lost the
// reply; after a restart with the remote down it is so from the start).
// The member that settles F's payments is then the svm one (the remote no
// longer answers), and the status question goes to it as if it had sent
// the payment: it still reads the chain for the remote's transaction, and
// the retry is served with it. (Before: read as its own, the landed send
// it has no record of was "settled by another settlement", and the charged
// buyer was refused 402 duplicate_settlement.)
func TestMultiSiblingsSolanaSendReadByTheEmbeddedMemberOnceTheRemoteIsDown(t *testing.T) {
	e := newSolanaEnv(t)
	multiLostReplyThenServed(t, e, remoteSVMFacilitator(t, e), e.svmBlock(), func(proxy *lossyProxy) {
		proxy.Close()
		now = func() time.Time { return time.Now().Add(multiSupportedTTL + time.Minute) }
		t.Cleanup(func() { now = time.Now })
	})
}

// multi { http <remote settling Solana with fee payer X, no rpc>; svm
// <fee payer Y> }: a Solana payment is read by a member only when that
// member manages the payment's fee payer, as it is settled only by one.
// X's payment is settled by the remote, which cannot read it: it counts
// unreadable (marked, never asked of the buyer again) and its status
// question goes to the remote, whose answer says why. Y's is read by the
// svm member. (Before: the svm member counted as reading X's payments
// too, so the payment counted readable and its status question went to
// the svm member, which answered "fee payer is not this facilitator's"
// for ever.) The svm member reads Y's as a sibling's send, as the remote
// may have sent it; in a multi of embedded members only, as its own.
func TestMultiReadsASolanaPaymentOnlyThroughItsFeePayersManager(t *testing.T) {
	f, err := svmfacilitator.New(svmfacilitator.Config{RPC: &svmfacilitator.RPC{URL: "http://127.0.0.1:1"},
		Network: x402.NetworkSolanaDevnet, FeePayer: svmfacilitator.DevFeePayer()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	svm := &SVMFacilitator{f: f}
	seed := sha256.Sum256([]byte("caddymodule remote fee payer"))
	var x svmfacilitator.PublicKey
	copy(x[:], ed25519.NewKeyFromSeed(seed[:]).Public().(ed25519.PublicKey))
	fac := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"kinds":[{"x402Version":2,"scheme":"exact","network":%q,"extra":{"feePayer":%q}}],"extensions":[],"signers":{}}`,
			x402.NetworkSolanaDevnet, x)
	}))
	t.Cleanup(fac.Close)
	remote := &HTTPFacilitator{f: x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: fac.URL})}
	m := &MultiFacilitator{fs: []x402.Facilitator{remote, svm}}
	m.ready()
	ctx := context.Background()
	offer := func(feePayer svmfacilitator.PublicKey) x402.PaymentRequirements {
		return x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet, Extra: map[string]any{"feePayer": feePayer.String()}}
	}
	req := offer(x)
	if got, _ := m.pick(ctx, req); got != x402.Facilitator(remote) {
		t.Fatalf("fee payer X's payment is settled by %T; want the remote, X's manager", got)
	}
	if m.readsSettlements(ctx, req) {
		t.Error("fee payer X's payment counts readable; want unreadable: only the remote settles it and it has no rpc")
	}
	raw := svmfacilitator.Compile(x, [32]byte{1}, []svmfacilitator.Ix{svmfacilitator.MemoIx("pay")})
	if _, err := m.SentSettlementStatus(ctx, svmfacilitator.Payload(raw, req), req, x402.SentSettlement{}); err == nil || !strings.Contains(err.Error(), "no rpc endpoint") {
		t.Errorf("fee payer X's status question answered %v; want the remote's \"no rpc endpoint\"", err)
	}
	own := offer(f.FeePayer())
	if !m.readsSettlements(ctx, own) {
		t.Error("the svm member's own fee payer's payment counts unreadable; want it read by the svm member")
	}
	if got, sibling, _ := m.statusMember(ctx, own); got != x402.Facilitator(svm) || !sibling {
		t.Errorf("the svm member's own fee payer's status question goes to %T, as a sibling's send %v; want the svm member, reading it as a sibling's: the remote may have sent it", got, sibling)
	}
	embedded := &MultiFacilitator{fs: []x402.Facilitator{svm}}
	embedded.ready()
	if got, sibling, _ := embedded.statusMember(ctx, own); got != x402.Facilitator(svm) || sibling {
		t.Errorf("with embedded members only, the status question goes to %T, as a sibling's send %v; want the svm member, reading it as its own", got, sibling)
	}
}
