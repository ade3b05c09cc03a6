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
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/walletauth"
	"github.com/aovhq/aov/x402"
)

// rewritingFacilitator (FAULT: a lying or buggy remote facilitator, which
// our own facilitator never is) forwards every call to the real devnet
// facilitator, so the payment is really verified and the money really
// moves, and sets each member of set in a valid /verify and a successful
// /settle reply.
func rewritingFacilitator(t *testing.T, real string, set map[string]any) *httptest.Server {
	t.Helper()
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req, _ := http.NewRequest(r.Method, real+r.URL.Path, bytes.NewReader(body))
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if (r.URL.Path == "/settle" || r.URL.Path == "/verify") && json.Unmarshal(raw, &m) == nil && (m["success"] == true || m["isValid"] == true) {
			for k, v := range set {
				m[k] = v
			}
			raw, _ = json.Marshal(m)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		w.Write(raw)
	}))
	t.Cleanup(s.Close)
	return s
}

// payThroughRewritingFacilitator serves a route paid through
// rewritingFacilitator(set) that records payers for sign-in-with-x, has
// development account 6 pay for it, and returns the route's URL, the
// buyer's answer (200, else the test fails), its PAYMENT-RESPONSE (read
// as a SettleResponse, and whole as told) and a sign-in-with-x header
// signer for the route. Caddy logs to logFile ("" discards it).
func payThroughRewritingFacilitator(t *testing.T, logFile string, set map[string]any) (url string, offer x402.PaymentRequirements, answer map[string]any, sr x402.SettleResponse, told map[string]any, signIn func(i int) string) {
	t.Helper()
	_, fac := sharedDevnet(t)
	liar := rewritingFacilitator(t, fac, set)
	up := newUpstream(t)
	base := startCaddyServers(t, "", logFile, siwxPaidSite(up.URL, liar.URL))
	url = base + "/report/q3"
	host := strings.TrimPrefix(base, "http://")
	signIn = func(i int) string {
		s := walletauth.SIWXFromChallenge(walletauth.SIWXChallenge(host, url, []string{x402.NetworkDevnet}, time.Now())["info"].(map[string]any), x402.NetworkDevnet)
		if err := s.Sign(walletKey(i)); err != nil {
			t.Fatal(err)
		}
		h, err := s.Encode()
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	st, hdr, body := walletCall(t, "GET", url, "", nil)
	if st != http.StatusPaymentRequired {
		t.Fatalf("unpaid: %d %v", st, body)
	}
	var pr x402.PaymentRequired
	if err := x402.DecodeHeader(hdr.Get(x402.HeaderPaymentRequired), &pr); err != nil {
		t.Fatal(err)
	}
	st, hdr, answer = walletCall(t, "GET", url, "", map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 6)})
	if st != http.StatusOK {
		t.Fatalf("payment by wallet 6 through a facilitator that rewrites %v: %d %v (want it delivered: the money moved)", set, st, answer)
	}
	if err := x402.DecodeHeader(hdr.Get(x402.HeaderPaymentResponse), &sr); err != nil {
		t.Fatalf("PAYMENT-RESPONSE: %v", err)
	}
	if err := x402.DecodeHeader(hdr.Get(x402.HeaderPaymentResponse), &told); err != nil {
		t.Fatalf("PAYMENT-RESPONSE: %v", err)
	}
	return url, pr.Accepts[0], answer, sr, told, signIn
}

// TestFacilitatorNamingAnotherPayerIsNotBelieved: wallet 6 signs and pays;
// the remote facilitator says wallet 7 paid. The payer of a payment is
// what its signed payload names, whoever settles it: the buyer is served
// (the money moved), the upstream and PAYMENT-RESPONSE name wallet 6, and
// sign-in-with-x lets wallet 6 in and keeps wallet 7, which never paid,
// out.
func TestFacilitatorNamingAnotherPayerIsNotBelieved(t *testing.T) {
	d, _ := sharedDevnet(t)
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	url, offer, answer, sr, _, signIn := payThroughRewritingFacilitator(t, "", map[string]any{"payer": walletAddr(7)})
	if !sr.Success || sr.Payer != walletAddr(6) {
		t.Errorf("PAYMENT-RESPONSE %+v, want success with payer %s, the signer of the payment", sr, walletAddr(6))
	}
	if answer["payer"] != walletAddr(6) {
		t.Errorf("the upstream was told the payer is %v (X-Aov-Payer), want %s", answer["payer"], walletAddr(6))
	}
	price, _ := new(big.Int).SetString(offer.Amount, 10)
	if got := new(big.Int).Sub(before, balance(t, d, payer)); got.Cmp(price) != 0 {
		t.Errorf("wallet 6 paid %s, want %s", got, price)
	}
	if st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: signIn(7)}); st != http.StatusPaymentRequired {
		t.Errorf("wallet 7, which never paid, signing in: %d %v (want 402)", st, body)
	}
	if st, _, body := walletCall(t, "GET", url, "", map[string]string{walletauth.SIWXHeaderName: signIn(6)}); st != http.StatusOK {
		t.Errorf("wallet 6, which paid, signing in: %d %v (want 200)", st, body)
	}
}

// TestFacilitatorNamingAnotherNetworkIsNotPassedOn: the remote
// facilitator settles a devnet payment and says it settled on Base
// mainnet. The buyer's PAYMENT-RESPONSE names the network of the offer
// the gate verified and settled, as does X-Aov-Network.
func TestFacilitatorNamingAnotherNetworkIsNotPassedOn(t *testing.T) {
	_, offer, answer, sr, _, _ := payThroughRewritingFacilitator(t, "", map[string]any{"network": "eip155:8453"})
	if sr.Network != offer.Network {
		t.Errorf("PAYMENT-RESPONSE network %q, want the offer's %q (the network paid on)", sr.Network, offer.Network)
	}
	if answer["network"] != offer.Network {
		t.Errorf("X-Aov-Network %v, want %q", answer["network"], offer.Network)
	}
}

// wantToldSettlement fails t unless told, a PAYMENT-RESPONSE read whole,
// is SPEC's {success: true, transaction, network, payer} of a payment by
// wallet 6 on offer's network, and nothing else.
func wantToldSettlement(t *testing.T, told map[string]any, offer x402.PaymentRequirements) {
	t.Helper()
	var members []string
	for k := range told {
		members = append(members, k)
	}
	sort.Strings(members)
	if got := strings.Join(members, ","); got != "network,payer,success,transaction" {
		t.Errorf("PAYMENT-RESPONSE members %s (%v); want network, payer, success, transaction, as SPEC has them", got, told)
	}
	if told["success"] != true || told["payer"] != walletAddr(6) || told["network"] != offer.Network {
		t.Errorf("PAYMENT-RESPONSE %v; want success, wallet 6's payment, on %s", told, offer.Network)
	}
}

// TestFacilitatorsOtherSettleClaimsAreNotPassedOn: the remote facilitator
// settles the payment and says it charged 1000 USDC (the price is $0.01),
// adds extensions of its own (a "refund" URL) and a message. The gate
// tells the buyer SPEC's PAYMENT-RESPONSE, {success, transaction, network,
// payer}: none of the facilitator's other claims reach the buyer.
func TestFacilitatorsOtherSettleClaimsAreNotPassedOn(t *testing.T) {
	_, offer, _, sr, told, _ := payThroughRewritingFacilitator(t, "", map[string]any{
		"amount":       "1000000000",
		"extensions":   map[string]any{"refund": map[string]any{"url": "https://refund.example/claim"}},
		"errorMessage": "call https://refund.example/claim for your money back",
	})
	wantToldSettlement(t, told, offer)
	if !strings.HasPrefix(sr.Transaction, "0x") {
		t.Errorf("PAYMENT-RESPONSE transaction %q; want the settlement's", sr.Transaction)
	}
}

// TestFacilitatorsTransactionOfNoTransactionsShapeIsNotPassedOn: the
// remote facilitator settles the payment and names, as its transaction,
// 80 KB of text (its reply is within x402's 1 MiB). The buyer, charged,
// is served with PAYMENT-RESPONSE all the same, {success, transaction:
// "", network, payer}, and the operator is told once, by the value's
// length, never the value. (Before: the transaction was passed on as it
// came, the encoded header went past x402.MaxHeaderBytes and was dropped:
// the buyer was charged and served without proof of payment.)
func TestFacilitatorsTransactionOfNoTransactionsShapeIsNotPassedOn(t *testing.T) {
	d, _ := sharedDevnet(t)
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	huge := "0x" + strings.Repeat("ab", 40000)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	_, offer, _, sr, told, _ := payThroughRewritingFacilitator(t, logFile, map[string]any{"transaction": huge})
	wantToldSettlement(t, told, offer)
	if sr.Transaction != "" {
		t.Errorf("PAYMENT-RESPONSE transaction of %d bytes; want none told", len(sr.Transaction))
	}
	price, _ := new(big.Int).SetString(offer.Amount, 10)
	if got := charged(t, d, payer, before); got.Cmp(price) != 0 {
		t.Errorf("wallet 6 paid %s, want %s", got, price)
	}
	caddy.Stop()
	raw, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(strings.Repeat("ab", 32))) {
		t.Error("the log carries the facilitator's transaction")
	}
	var logged []map[string]any
	for _, l := range logLines(t, logFile) {
		if l["level"] == "error" && strings.Contains(fmt.Sprint(l["msg"]), "transaction") {
			logged = append(logged, l)
		}
	}
	if len(logged) != 1 || logged[0]["transaction_bytes"] != float64(len(huge)) {
		t.Errorf("want one error naming the transaction's length %d; got %v", len(huge), logged)
	}
}

// TestSavedAnswerIsToldAsTheGateTellsIt: a payment identifier's answer
// saved by an older gateway, which passed a facilitator's settle reply on
// as it came (its amount, extensions, message, payer and network), is
// replayed to the same payment's retry with the settlement the gate
// builds: SPEC's members, the payment's payer, the offer's network, the
// saved transaction. Nothing is charged.
func TestSavedAnswerIsToldAsTheGateTellsIt(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := gateDir(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator http {
				url %[2]s
			}
			store badger %[4]s
			payment_identifier
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), fac, payTo.Hex(), storeDir))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	const id = "pay_saved_by_an_older_gw1"
	sig := signWithID(t, pr, walletKey(6), id)

	// The binding and answer an older gateway saved for this very call,
	// under the fingerprint it made (over the payment as sent: legacy).
	req := httptest.NewRequest("POST", "/verify/schema", strings.NewReader(validRequest))
	pay, err := x402.DecodePayment(sig)
	if err != nil {
		t.Fatal(err)
	}
	_, fp, err := (&Gate{MaxBody: 1 << 20}).fingerprint(req, pay, sig)
	if err != nil || fp == "" {
		t.Fatalf("legacy fingerprint %q: %v", fp, err)
	}
	const tx = "0x1111111111111111111111111111111111111111111111111111111111111111"
	saved, err := json.Marshal(savedAnswer{Settlement: x402.SettleResponse{Success: true, Transaction: tx,
		Network: "eip155:8453", Payer: walletAddr(7), Amount: "1000000000", ErrorMessage: "see extensions",
		Extensions: map[string]any{"refund": map[string]any{"url": "https://refund.example/claim"}}},
		Kept: true, Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"saved":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	db, err := store.Shared(storeDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour)
	if _, _, err := db.PaymentIDs().Bind(context.Background(), id, fp, until); err != nil {
		t.Fatal(err)
	}
	if err := db.PaymentIDs().Save(context.Background(), id, fp, saved, until); err != nil {
		t.Fatal(err)
	}
	db.Close()

	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	body := readJSON(t, resp)
	if resp.StatusCode != http.StatusOK || body["saved"] != true {
		t.Fatalf("the retry: %d %v; want the saved answer", resp.StatusCode, body)
	}
	var told map[string]any
	if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &told); err != nil {
		t.Fatalf("PAYMENT-RESPONSE: %v", err)
	}
	wantToldSettlement(t, told, pr.Accepts[0])
	if told["transaction"] != tx {
		t.Errorf("PAYMENT-RESPONSE transaction %v; want the saved %s", told["transaction"], tx)
	}
	if got := charged(t, d, payer, before); got.Sign() != 0 || up.calls.Load() != 0 {
		t.Errorf("the replay charged %v and ran the upstream %d times; want neither", got, up.calls.Load())
	}
}
