package caddymodule

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/internal/interop"
	"github.com/aovhq/aov/x402"
)

// officialSVMFacilitatorCounted starts the official @x402/svm facilitator
// (its fee payer the env's, so signSolana's transaction id is the one it
// lands) behind a proxy that counts the /verify and /settle calls it gets.
func officialSVMFacilitatorCounted(t *testing.T, e *solanaEnv) (facURL string, verifies, settles *atomic.Int32) {
	t.Helper()
	var ready struct {
		URL string `json:"url"`
	}
	interop.Start(t, "svm-facilitator-server.mjs", []string{"RPC_URL=" + e.chain.URL, "SECRET_KEY=" + base58.Encode(svmFeeKey())}, &ready)
	target, err := url.Parse(ready.URL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	verifies, settles = new(atomic.Int32), new(atomic.Int32)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/verify"):
			verifies.Add(1)
		case strings.HasSuffix(r.URL.Path, "/settle"):
			settles.Add(1)
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, verifies, settles
}

// respellings are other spellings of the base64 canon of a transaction:
// the first three read, for @solana/kit's base64 encoder (which the
// official facilitator reads payload.transaction with), as the very same
// bytes; a line break is skipped by Go's decoder.
func respellings(canon string) map[string]string {
	out := map[string]string{
		"one more '='":  canon + "=",
		"two more '='":  canon + "==",
		"a line break":  canon[:8] + "\n" + canon[8:],
		"a trailing LF": canon + "\n",
	}
	if pad := strings.TrimRight(canon, "="); pad != canon {
		out["no padding"] = pad
		// The last character before the padding carries bits past the
		// data, zero in the canon: set the lowest.
		const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
		last := strings.IndexByte(alphabet, pad[len(pad)-1])
		out["non-zero trailing bits"] = pad[:len(pad)-1] + string(alphabet[last|1]) + canon[len(pad):]
	}
	return out
}

// withTransaction is the payment header with payload.transaction spelt tx.
func withTransaction(t *testing.T, header, tx string) string {
	t.Helper()
	p, err := x402.DecodePaymentSignature(header)
	if err != nil {
		t.Fatal(err)
	}
	p.Payload, _ = json.Marshal(map[string]string{"transaction": tx})
	h, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// transactionOf is the header's payload.transaction, as written.
func transactionOf(t *testing.T, header string) string {
	t.Helper()
	p, err := x402.DecodePaymentSignature(header)
	if err != nil {
		t.Fatal(err)
	}
	var pl struct {
		Transaction string `json:"transaction"`
	}
	if err := json.Unmarshal(p.Payload, &pl); err != nil {
		t.Fatal(err)
	}
	return pl.Transaction
}

// wantUnreadableSolanaPayment checks a 400 invalid_payload naming
// payload.transaction, without echoing it.
func wantUnreadableSolanaPayment(t *testing.T, what string, resp *http.Response, tx string) {
	t.Helper()
	m := readJSON(t, resp)
	msg := fmt.Sprint(m["error"])
	if resp.StatusCode != http.StatusBadRequest || m["reason"] != x402.ReasonInvalidPayload ||
		!strings.Contains(msg, "payload.transaction") || strings.Contains(msg, tx[:16]) {
		t.Errorf("%s: %d %v %q, want 400 invalid_payload naming payload.transaction", what, resp.StatusCode, m["reason"], msg)
	}
}

// A Solana payment has one spelling at the gate: its transaction in
// standard padded base64 with zero trailing bits. Any other spelling,
// though the official facilitator reads several as the same transaction,
// is 400 invalid_payload before it is claimed or forwarded, charging
// nothing, both before the canonical one is paid and as a copy of it
// after; the canonical one is paid and names its payer.
func TestSolanaPaymentHasOneSpelling(t *testing.T) {
	e := newSolanaEnv(t)
	facURL, verifies, settles := officialSVMFacilitatorCounted(t, e)
	up := newUpstream(t)
	u := startCaddy(t, solanaSite(up.URL, "http "+facURL, e, gateDir(t))) + "/verify/schema"
	header, txid := signSolana(t, e, u)
	canon := transactionOf(t, header)
	before := e.usdc(t, e.payer.Address)

	spellings := respellings(canon)
	for what, tx := range spellings {
		wantUnreadableSolanaPayment(t, what+", before it is paid", post(t, u, validRequest, map[string]string{x402.HeaderPaymentSignature: withTransaction(t, header, tx)}), tx)
	}
	if v, s, n := verifies.Load(), settles.Load(), up.calls.Load(); v != 0 || s != 0 || n != 0 {
		t.Fatalf("respelled payments reached the facilitator (%d /verify, %d /settle) or the upstream (%d runs); want none", v, s, n)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 0 {
		t.Fatalf("respelled payments charged %d", got)
	}

	resp := post(t, u, validRequest, map[string]string{x402.HeaderPaymentSignature: header})
	body := readJSONString(t, resp)
	var sr x402.SettleResponse
	if resp.StatusCode != http.StatusOK || x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr) != nil ||
		sr.Transaction != txid || sr.Payer != e.payer.Address || !strings.Contains(body, `"payer":"`+e.payer.Address+`"`) {
		t.Fatalf("the canonical spelling: %d, PAYMENT-RESPONSE %+v, upstream saw %.300s; want paid, naming payer %s", resp.StatusCode, sr, body, e.payer.Address)
	}
	v0, s0 := verifies.Load(), settles.Load()
	for what, tx := range spellings {
		wantUnreadableSolanaPayment(t, what+", once paid", post(t, u, validRequest, map[string]string{x402.HeaderPaymentSignature: withTransaction(t, header, tx)}), tx)
	}
	if v, s, n := verifies.Load()-v0, settles.Load()-s0, up.calls.Load(); v != 0 || s != 0 || n != 1 {
		t.Fatalf("copies of the paid payment: %d more /verify, %d more /settle, upstream ran %d times; want 0, 0, 1", v, s, n)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 20000 {
		t.Fatalf("charged %d, want 20000", got)
	}
}

// One Solana payment sent at once in several spellings, each of which the
// official facilitator reads as the same transaction, runs the upstream
// once and is sent to /settle once: only its canonical spelling is
// claimed and forwarded.
func TestSolanaPaymentInManySpellingsAtOnceRunsOnce(t *testing.T) {
	e := newSolanaEnv(t)
	facURL, _, settles := officialSVMFacilitatorCounted(t, e)
	up := newUpstream(t)
	u := startCaddy(t, solanaSite(up.URL, "http "+facURL, e, gateDir(t))) + "/verify/schema"
	header, _ := signSolana(t, e, u)
	canon := transactionOf(t, header)
	headers := []string{header}
	for _, tx := range []string{canon + "=", canon + "==", canon + "===", strings.TrimRight(canon, "=") + "===="} {
		headers = append(headers, withTransaction(t, header, tx))
	}
	before := e.usdc(t, e.payer.Address)
	var wg sync.WaitGroup
	status := make([]int, len(headers))
	for i, h := range headers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest(http.MethodPost, u, strings.NewReader(validRequest))
			req.Header.Set(x402.HeaderPaymentSignature, h)
			resp, err := testClient.Do(req)
			if err != nil {
				return
			}
			resp.Body.Close()
			status[i] = resp.StatusCode
		}()
	}
	wg.Wait()
	charged := before - e.usdc(t, e.payer.Address)
	if n, s := up.calls.Load(), settles.Load(); n != 1 || s != 1 || charged != 20000 {
		t.Fatalf("statuses %v: the upstream ran %d times, %d /settle, charged %d; want 1, 1, 20000", status, n, s, charged)
	}
	for i, s := range status[1:] {
		if s != http.StatusBadRequest {
			t.Errorf("respelling %d: status %d, want 400", i+1, s)
		}
	}
}
