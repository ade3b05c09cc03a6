package caddymodule

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/plugins/svmfacilitator"
	"github.com/aovhq/aov/x402"
)

// fakeLaxRemote is a FAKE FOR A FAULT that no facilitator of ours has: a
// remote facilitator (one of ours behind its x402 HTTP API, at facURL)
// that judges a payment by what is signed alone: judge rewrites the
// requirements (and the accepted copy) into what the payload pays, so it
// verifies and settles a payment of another amount or to another account.
// It counts the /verify and /settle calls it gets.
func fakeLaxRemote(t *testing.T, facURL string, judge func(req, payload map[string]any)) (*httptest.Server, *atomic.Int32) {
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
				for _, req := range []any{m["paymentRequirements"], pp["accepted"]} {
					if rq, ok := req.(map[string]any); ok && pl != nil {
						judge(rq, pl)
					}
				}
				body, _ = json.Marshal(m)
			}
		}
		if resp, reply, ok := relayTo(w, r, facURL, body); ok {
			passOn(w, resp, reply)
		}
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
	remote, calls := fakeLaxRemote(t, facURL, func(req, payload map[string]any) {
		if au, ok := payload["authorization"].(map[string]any); ok {
			req["amount"], req["payTo"] = au["value"], au["to"]
		}
	})
	up := newReportingUpstream(t)
	base := startCaddy(t, remoteSite(up.URL, remote.URL, "rpc devnet "+d.RPCURL(), gateDir(t)))
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

// The same on Solana: a transaction whose transfer is not the offer's
// amount is a 402 with the facilitator's reason, nothing charged, the
// facilitator never asked. (Before: a lax remote's verdict got the call served for 1 atom.)
func TestGateRefusesASolanaTransactionThatDoesNotPayItsOffer(t *testing.T) {
	e := newSolanaEnv(t)
	remote, calls := fakeLaxRemote(t, remoteSVMFacilitator(t, e), func(req, _ map[string]any) { req["amount"] = "1" })
	base := startCaddy(t, solanaSite(newUpstream(t).URL, "http "+remote.URL, e, gateDir(t)))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	p := e.paymentOf(t, pr.Accepts[0])
	p.Amount = 1
	before := e.usdc(t, e.payer.Address)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: svmHeader(t, pr, p.Transaction())})
	body := readJSONString(t, resp)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(body, `"reason":"`+svmfacilitator.ReasonAmountMismatch+`"`) {
		t.Fatalf("a transfer of 1 atom: status %d: %s; want 402 %s", resp.StatusCode, body, svmfacilitator.ReasonAmountMismatch)
	}
	if n := calls.Load(); n != 0 {
		t.Fatalf("the facilitator was asked %d times", n)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 0 {
		t.Fatalf("charged %d", got)
	}
}

// A Solana transaction that uses an address lookup table is a 402 with the
// facilitator's reason for it, nothing charged, even when its transfer's
// destination is an address of the table, which the gate cannot read.
// (Before: the gate's check of the transfer read the account index past
// the transaction's keys and the handler panicked: no answer, the
// connection cut.)
func TestGateRefusesALookupTablePayment(t *testing.T) {
	e := newSolanaEnv(t)
	base := startCaddy(t, solanaSite(newUpstream(t).URL, e.svmBlock(), e, gateDir(t)))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	p := e.paymentOf(t, pr.Accepts[0])
	before := e.usdc(t, e.payer.Address)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: svmHeader(t, pr, transferFromLookupTable(t, p))})
	body := readJSONString(t, resp)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(body, `"reason":"`+svmfacilitator.ReasonLookupTables+`"`) {
		t.Fatalf("status %d: %s; want 402 %s", resp.StatusCode, body, svmfacilitator.ReasonLookupTables)
	}
	if got := before - e.usdc(t, e.payer.Address); got != 0 {
		t.Fatalf("charged %d", got)
	}
}

// paymentOf is a payment of offer by e's payer, as the official client
// builds it.
func (e *solanaEnv) paymentOf(t *testing.T, offer x402.PaymentRequirements) svmfacilitator.Payment {
	t.Helper()
	sk, err := base58.Decode(e.payer.SecretKey)
	if err != nil || len(sk) != 64 {
		t.Fatalf("payer key: %v", err)
	}
	amount, err := strconv.ParseUint(offer.Amount, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	fee, _ := offer.Extra["feePayer"].(string)
	feePub, _ := svmfacilitator.ParsePublicKey(fee)
	payTo, _ := svmfacilitator.ParsePublicKey(offer.PayTo)
	mint, _ := svmfacilitator.ParsePublicKey(offer.Asset)
	bh, _ := svmfacilitator.ParsePublicKey(e.chain.LatestBlockhash())
	return svmfacilitator.Payment{FeePayer: feePub, Authority: ed25519.PrivateKey(sk), Mint: mint, Program: svmfacilitator.TokenProgram,
		PayTo: payTo, Amount: amount, Decimals: 6, Blockhash: bh}
}

// svmHeader is the PAYMENT-SIGNATURE header of the transaction raw for
// pr's first offer.
func svmHeader(t *testing.T, pr x402.PaymentRequired, raw []byte) string {
	t.Helper()
	pp := svmfacilitator.Payload(raw, pr.Accepts[0])
	pp.Resource = &pr.Resource
	hdr, err := x402.EncodeHeader(pp)
	if err != nil {
		t.Fatal(err)
	}
	return hdr
}

// transferFromLookupTable is p's transaction made to use an address lookup
// table of one writable address, which its transfer names as destination
// (account index len(AccountKeys), past the transaction's keys), signed
// again by p's authority.
func transferFromLookupTable(t *testing.T, p svmfacilitator.Payment) []byte {
	t.Helper()
	raw := p.Transaction()
	tx, err := svmfacilitator.DecodeTransaction(raw)
	if err != nil || tx.LookupTables != 0 || raw[len(raw)-1] != 0 {
		t.Fatalf("not a payment without lookup tables: %v", err)
	}
	// The transfer's accounts and data, found by their bytes.
	ix := tx.Instructions[2]
	enc := append(append([]byte{byte(len(ix.Accounts))}, ix.Accounts...), byte(len(ix.Data)))
	at := bytes.Index(raw, append(enc, ix.Data...))
	if at < 0 {
		t.Fatal("the transfer is not in the transaction's bytes")
	}
	raw[at+1+2] = byte(len(tx.AccountKeys)) // the destination
	raw = append(raw[:len(raw)-1], 1)       // one lookup table:
	raw = append(raw, make([]byte, 32)...)  // its address,
	raw = append(raw, 1, 0, 0)              // one writable index, no read-only one
	if tx, err = svmfacilitator.DecodeTransaction(raw); err != nil {
		t.Fatal(err)
	}
	copy(tx.Signatures[1], ed25519.Sign(p.Authority, tx.Message))
	return raw
}
