package caddymodule

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// The record a paid call writes with its claim carries the payment as the
// gate received it (its JSON) and the offer as encoded at provision, not
// the structs encoded anew; it reads back as the same payment and offer.
// Before, every paid call encoded the whole PaymentPayload and the offer
// (their extra maps included) into the record and the resolver decoded
// them again.
func TestPaidRecordKeepsThePaymentAsReceived(t *testing.T) {
	g, offer := directGate(t, store.Options{NoSync: true}, nil)
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(1), offer, &x402.Resource{URL: "http://example.com/<verify>&schema"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c := claimSigned(t, g, offer, p)
	pay, note := c.pay, c.note
	var members map[string]json.RawMessage
	if err := json.Unmarshal([]byte(note), &members); err != nil {
		t.Fatal(err)
	}
	if _, ok := members["payload"]; ok || !bytes.Equal(members["payment"], pay.JSON) {
		t.Fatalf("the record carries %s as the payment, want the payment's JSON as received (HTML unescaped):\n%s", members["payment"], pay.JSON)
	}
	h := decodeOrFail(t, note)
	if !reflect.DeepEqual(h.offer, offer) {
		t.Fatalf("the record's offer reads back as %+v, want %+v", h.offer, offer)
	}
	if h.payload.Accepted.Amount != p.Accepted.Amount || !bytes.Equal(h.payload.Payload, p.Payload) || h.payload.Resource.URL != p.Resource.URL {
		t.Fatalf("the record's payment reads back as %+v", h.payload)
	}
}

// signedClaim is a payment claimed at a gate as servePaid claims it, with
// the request it came on and what the claim wrote.
type signedClaim struct {
	pay   x402.Payment
	keys  []string
	req   *http.Request
	claim store.Claim
	note  string
}

// claimSigned claims payment p, signed for g's offer, at g (claimPaid), as
// a call to /verify/schema, and ends the claim's live mark as a finished
// call does.
func claimSigned(t *testing.T, g *Gate, offer x402.PaymentRequirements, p x402.PaymentPayload) signedClaim {
	t.Helper()
	header, _ := x402.EncodeHeader(p)
	pay, err := x402.DecodePayment(header)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := pay.ExactEVMValues()
	if err != nil {
		t.Fatal(err)
	}
	keys, until := claimKeys(header, offer, &auth, nil)
	req := httptest.NewRequest(http.MethodPost, "http://example.com/verify/schema", strings.NewReader(validRequest))
	claim, note, err := g.claimPaid(req, keys, until, pay, g.liveOffers().offerJSON(0), nil)
	if err != nil {
		t.Fatal(err)
	}
	endLive(decodeOrFail(t, note).Token)
	return signedClaim{pay: pay, keys: keys, req: req, claim: claim, note: note}
}

func decodeOrFail(t *testing.T, note string) *heldRecord {
	t.Helper()
	h, ok := decodeHeld(note)
	if !ok {
		t.Fatalf("not a held record: %.300s", note)
	}
	return h
}

// A record in the shape the version before wrote (the payment and the
// offer encoded as structs, "payload" and "offer"), found in the store
// after an upgrade, is resolved as any other: the settlement whose reply
// was lost is found on chain and the buyer's retry gets the answer held
// back, charged once.
func TestRecordOfThePreviousVersionIsResolved(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := gateDir(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", storeDir, ""))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[7].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 7)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d %s; want settlement_pending", resp.StatusCode, b)
	}
	calls := up.calls.Load()
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}

	// Rewrite the record as the version before wrote it.
	db, err := store.Open(storeDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pay, err := x402.DecodePayment(sig)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := db.Claims().Lookup(ctx, claimKeyOf(sig))
	if err != nil {
		t.Fatal(err)
	}
	h := decodeOrFail(t, st.Note)
	var old map[string]json.RawMessage
	json.Unmarshal([]byte(st.Note), &old)
	delete(old, "payment")
	delete(old, "header") // records before kept the Content-Type alone
	old["payload"], _ = json.Marshal(pay.PaymentPayload)
	old["offer"], _ = json.Marshal(h.offer)
	oldNote, _ := json.Marshal(old)
	if err := db.Claims().(store.HeldClaims).Hold(ctx, h.claim(), string(oldNote)); err != nil {
		t.Fatal(err)
	}
	db.Close()

	base = startCaddy(t, pendingSite(up.URL, "lose_reply", storeDir, ""))
	for i := range 2 {
		resp = post(t, base+"/verify/schema", validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || !strings.Contains(string(b), `"payment":"paid"`) {
			t.Fatalf("retry %d after the upgrade: %d %s; want the answer held back", i+1, resp.StatusCode, b)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Fatalf("retry %d after the upgrade: Content-Type %q, want the record's application/json", i+1, ct)
		}
	}
	if n := up.calls.Load() - calls; n != 0 {
		t.Fatalf("the upstream ran %d more time(s); the held answer should have been served", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want one transfer", got)
	}
}

// claimKeyOf is the claim key of a payment's exact header (claimKeys).
func claimKeyOf(header string) string {
	keys, _ := claimKeys(header, x402.PaymentRequirements{}, nil, nil)
	return keys[0]
}
