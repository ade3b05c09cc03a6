package caddymodule

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// signAuthorizationOf signs auth for req and encodes it as a PAYMENT-SIGNATURE.
func signAuthorizationOf(t *testing.T, key int, pr x402.PaymentRequired, auth x402.Authorization) (string, x402.PaymentPayload) {
	t.Helper()
	req := pr.Accepts[0]
	chainID, name, version, token, err := x402.ExactEVMDomain(req)
	if err != nil {
		t.Fatal(err)
	}
	digest, err := x402.TransferWithAuthorizationDigest(chainID, name, version, token, auth)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := crypto.Sign(digest[:], evmfacilitator.DevKey(key))
	if err != nil {
		t.Fatal(err)
	}
	sig[64] += 27
	payload, _ := json.Marshal(x402.ExactEVMPayload{Signature: "0x" + hex.EncodeToString(sig), Authorization: auth})
	p := x402.PaymentPayload{X402Version: x402.Version, Resource: &pr.Resource, Accepted: req, Payload: payload}
	h, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	return h, p
}

// A buyer signs two authorizations of one nonce, same payTo and
// value, overlapping windows (B's validBefore later than A's). B's settle
// at this gate is an unknown outcome (nothing sent: lose_request), so the
// gate holds B. A is settled elsewhere (another gate of the seller, a
// resource server using the facilitator): one transfer. B never executed
// (its nonce is spent by A), so the retry of B is a 402, B unpaid, never
// served by A's transfer (README: "its nonce spent without that transfer
// ...: the claim is released and the retry gets a 402 asking for a new
// payment"). (Before: the gate resolved the held B as paid by A's
// transaction and served it: two paid calls for one transfer.)
func TestHeldPaymentIsNotPaidByAnotherAuthorizationOfItsNonce(t *testing.T) {
	d, facURL := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_request", gateDir(t), ""))
	url := base + "/verify/schema"
	const key = 8
	payer := evmfacilitator.DevAccounts()[key].Address
	before := balance(t, d, payer)
	pr := paymentRequired(t, post(t, url, "", nil))
	req := pr.Accepts[0]
	t.Logf("maxTimeoutSeconds %d", req.MaxTimeoutSeconds)
	var n [32]byte
	rand.Read(n[:])
	now := time.Now().Unix()
	b := x402.Authorization{From: payer.Hex(), To: common.HexToAddress(req.PayTo).Hex(), Value: req.Amount,
		ValidAfter: fmt.Sprint(now - 10), ValidBefore: fmt.Sprint(now + int64(req.MaxTimeoutSeconds)), Nonce: "0x" + hex.EncodeToString(n[:])}
	a := b
	a.ValidBefore = fmt.Sprint(now + int64(req.MaxTimeoutSeconds) - 15)
	sigB, _ := signAuthorizationOf(t, key, pr, b)
	_, pa := signAuthorizationOf(t, key, pr, a)

	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sigB})
	if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || e["code"] != "settlement_pending" {
		t.Fatalf("first try of B: %d %v; want 503 settlement_pending (its settle's outcome lost)", resp.StatusCode, e)
	}

	// A settles elsewhere through the devnet's facilitator.
	ra, err := x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: facURL}).Settle(context.Background(), pa, req)
	if err != nil || !ra.Success {
		t.Fatalf("settle of A elsewhere = %+v, %v", ra, err)
	}
	waitFor := time.Now().Add(10 * time.Second)
	for charged(t, d, payer, before).Sign() == 0 && time.Now().Before(waitFor) {
		time.Sleep(100 * time.Millisecond)
	}

	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sigB})
	body, _ := io.ReadAll(resp.Body)
	var sr x402.SettleResponse
	x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr)
	t.Logf("payer charged %v (price %s) by A's %s; upstream calls %d", charged(t, d, payer, before), req.Amount, ra.Transaction, up.calls.Load())
	if resp.StatusCode == http.StatusOK || strings.EqualFold(sr.Transaction, ra.Transaction) {
		t.Errorf("retry of B (never executed; A's transaction used the nonce and paid A's call) = %d, PAYMENT-RESPONSE %+v, body %.200s; want 402, B unpaid", resp.StatusCode, sr, body)
	}
}

// No fault at all. The seller's two gates (separate stores: two
// instances, or two routes), one on the devnet's facilitator over HTTP,
// one on an embedded one (another relayer key). The buyer pays gate 1
// with A and gate 2 with B, one nonce, overlapping windows, at once. One
// transaction lands; one gate serves, and only its answer names it.
// (Before: both gates could serve, both naming it, and the loser's
// answer named the winner's transaction as its payment's.)
func TestTwoGatesServeOneOfTwoAuthorizationsOfOneNonce(t *testing.T) {
	d, facURL := sharedDevnet(t)
	up := newUpstream(t)
	dir := t.TempDir()
	site := fmt.Sprintf(`:{port} {
	route /one/verify/schema {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http {
				url %[3]s
			}
			store badger %[4]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
	route /two/verify/schema {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator faulty_devnet none
			store badger %[5]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), payTo.Hex(), facURL, filepath.Join(dir, "one"), filepath.Join(dir, "two"))
	base := startCaddy(t, site)
	// Both calls are verified before either settles: the upstream holds
	// each until both are in (the window between verify and settle).
	var wg sync.WaitGroup
	wg.Add(2)
	up.during = func() {
		wg.Done()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
	const key = 7
	payer := evmfacilitator.DevAccounts()[key].Address
	before := balance(t, d, payer)
	pr1 := paymentRequired(t, post(t, base+"/one/verify/schema", "", nil))
	pr2 := paymentRequired(t, post(t, base+"/two/verify/schema", "", nil))
	req := pr1.Accepts[0]
	var n [32]byte
	rand.Read(n[:])
	now := time.Now().Unix()
	a := x402.Authorization{From: payer.Hex(), To: common.HexToAddress(req.PayTo).Hex(), Value: req.Amount,
		ValidAfter: fmt.Sprint(now - 10), ValidBefore: fmt.Sprint(now + int64(req.MaxTimeoutSeconds) - 15), Nonce: "0x" + hex.EncodeToString(n[:])}
	b := a
	b.ValidBefore = fmt.Sprint(now + int64(req.MaxTimeoutSeconds))
	sigA, _ := signAuthorizationOf(t, key, pr1, a)
	sigB, _ := signAuthorizationOf(t, key, pr2, b)
	type res struct {
		status int
		sr     x402.SettleResponse
	}
	call := func(url, sig string, out chan<- res) {
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		io.Copy(io.Discard, resp.Body)
		var sr x402.SettleResponse
		x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr)
		out <- res{resp.StatusCode, sr}
	}
	c1, c2 := make(chan res, 1), make(chan res, 1)
	go call(base+"/one/verify/schema", sigA, c1)
	go call(base+"/two/verify/schema", sigB, c2)
	r1, r2 := <-c1, <-c2
	spent := charged(t, d, payer, before)
	t.Logf("gate 1 (A): %d %+v", r1.status, r1.sr)
	t.Logf("gate 2 (B): %d %+v", r2.status, r2.sr)
	t.Logf("payer charged %v (price %s); upstream calls %d", spent, req.Amount, up.calls.Load())
	if r1.status == http.StatusOK && r2.status == http.StatusOK {
		t.Errorf("two paid calls served for one transfer (charged %v): A's PAYMENT-RESPONSE %s, B's %s", spent, r1.sr.Transaction, r2.sr.Transaction)
	}
	if r1.sr.Transaction != "" && strings.EqualFold(r1.sr.Transaction, r2.sr.Transaction) {
		t.Errorf("both payments' answers name one transfer, %s, as theirs (charged %v)", r1.sr.Transaction, spent)
	}
}
