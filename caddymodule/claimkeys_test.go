package caddymodule

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// The claim keys name an authorization by its exact header and by payer and
// nonce: a re-encoded copy of the same authorization gets another header
// key but the same authorization key, and the claim lasts until the
// authorization can no longer settle, as its values (the ones the gate read
// and the token will judge) say.
func TestClaimKeysNameTheAuthorization(t *testing.T) {
	usdc, _ := x402.USDC(x402.NetworkBase)
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkBase, Amount: "20000", Asset: usdc.Address, PayTo: "0x1111111111111111111111111111111111111111", MaxTimeoutSeconds: 60, Extra: usdc.Extra()}
	signed := time.Now()
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(1), offer, &x402.Resource{URL: "http://example.com/verify/schema"}, signed)
	if err != nil {
		t.Fatal(err)
	}
	var ev x402.ExactEVMPayload
	if err := json.Unmarshal(p.Payload, &ev); err != nil {
		t.Fatal(err)
	}
	v, err := x402.ExactEVMValues(p)
	if err != nil {
		t.Fatal(err)
	}
	header, _ := x402.EncodeHeader(p)
	keys, until := claimKeys(header, offer, &v, nil)
	auth := strings.ToLower("x402/auth/" + offer.Network + "/" + offer.Asset + "/" + ev.Authorization.From + "/" + ev.Authorization.Nonce)
	if len(keys) != 2 || !strings.HasPrefix(keys[0], claimPayloadPrefix) || len(keys[0]) != len(claimPayloadPrefix)+64 || keys[1] != auth {
		t.Fatalf("keys %q, want the header's hash and %q", keys, auth)
	}
	if vb := time.Unix(mustInt(t, ev.Authorization.ValidBefore), 0); until.Before(vb) {
		t.Errorf("the claim lapses at %v, before the authorization expires at %v", until, vb)
	}

	// The same authorization with its members in another order, another
	// letter case and whitespace: another header, the same authorization
	// key.
	a := ev.Authorization
	p2 := p
	p2.Payload = json.RawMessage(`{ "authorization": {"nonce": "0X` + strings.ToUpper(a.Nonce[2:]) + `", "from": "` + strings.ToLower(a.From) + `",
		"to": "` + a.To + `", "value": "` + a.Value + `", "validAfter": "` + a.ValidAfter + `", "validBefore": "` + a.ValidBefore + `"}, "signature": "` + ev.Signature + `"}`)
	v2, err := x402.ExactEVMValues(p2)
	if err != nil {
		t.Fatal(err)
	}
	header2, _ := x402.EncodeHeader(p2)
	keys2, _ := claimKeys(header2, offer, &v2, nil)
	if len(keys2) != 2 || keys2[0] == keys[0] || keys2[1] != auth {
		t.Fatalf("re-encoded: keys %q, want a new header key and %q", keys2, auth)
	}

	// An authorization valid for ever is claimed for maxClaimHold, not
	// less (its validBefore does not fit an int64).
	far := v
	far.ValidBefore = new(big.Int).Lsh(big.NewInt(1), 200)
	if _, until := claimKeys(header, offer, &far, nil); until.Before(now().Add(maxClaimHold-time.Minute)) || until.After(now().Add(maxClaimHold)) {
		t.Errorf("validBefore 2^200: the claim lapses at %v, want maxClaimHold from now", until)
	}

	// Nothing read (a scheme the gate does not read): the header alone
	// names it.
	if keys4, until4 := claimKeys("other", offer, nil, nil); len(keys4) != 1 || until4.After(now().Add(time.Duration(offer.MaxTimeoutSeconds)*time.Second+2*time.Minute)) {
		t.Fatalf("no authorization: keys %q until %v", keys4, until4)
	}
}

func mustInt(t *testing.T, s string) int64 {
	t.Helper()
	var n int64
	if err := json.Unmarshal([]byte(s), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A Solana payment's claim outlives its transaction's blockhash and the
// passes that judge it "never" after that: it lasts svmClaimHold at the
// least, although its offer's maxTimeoutSeconds alone would end it sooner.
// The transaction is the smallest legacy one that decodes: one signer, no
// instruction (the claim keys read the message, not what it does).
func TestSolanaClaimOutlivesItsBlockhash(t *testing.T) {
	raw := []byte{1}
	raw = append(raw, make([]byte, 64)...) // the fee payer's signature slot
	raw = append(raw, 1, 0, 0, 1)          // header; one account key
	raw = append(raw, make([]byte, 32)...) // the key
	raw = append(raw, make([]byte, 32)...) // recent blockhash
	raw = append(raw, 0)                   // no instruction
	payload, _ := json.Marshal(map[string]string{"transaction": base64.StdEncoding.EncodeToString(raw)})
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkSolanaDevnet, Amount: "10000", MaxTimeoutSeconds: 60}
	tx, err := readSVMPayment(x402.PaymentPayload{X402Version: 2, Accepted: offer, Payload: payload})
	if err != nil {
		t.Fatal(err)
	}
	start := now()
	keys, until := claimKeys("header", offer, nil, tx)
	if len(keys) != 2 || !strings.HasPrefix(keys[1], "x402/svm/"+offer.Network+"/") {
		t.Fatalf("keys %q, want the header's and the message's", keys)
	}
	if until.Before(start.Add(svmClaimHold)) {
		t.Errorf("the claim lapses %v after it is made, before svmClaimHold (%v)", until.Sub(start), svmClaimHold)
	}
	if until.After(now().Add(svmClaimHold + time.Second)) {
		t.Errorf("the claim lasts %v, longer than svmClaimHold", until.Sub(start))
	}
}

// fakeOfficialFacilitator is a fake of the official @x402/evm facilitator's
// documented routing, for the tests that need what the devnet cannot give: a
// Permit2 payment that verifies and settles (Permit2 and x402's proxy are not
// deployed there). @x402/evm 2.27.0 decides the payment type by the payload's
// shape alone (dist/esm/chunk-BPTXPSEK.mjs, exact/facilitator/index.mjs):
//
//	function isPermit2Payload(payload) {
//	  return "permit2Authorization" in payload;
//	}
//	...
//	const isPermit2 = isPermit2Payload(rawPayload);
//	if (isPermit2) {
//	  return verifyPermit2(this.signer, payload, requirements, rawPayload, context);
//	}
//	...
//	nonce: BigInt(permit2Payload.permit2Authorization.nonce),
//	validBefore: BigInt(eip3009Payload.authorization.validBefore),
//
// so it says isValid to any payload (a Permit2 one as the real one would
// after its on-chain checks; an EIP-3009 one whose numbers BigInt reads) and
// settles a Permit2 nonce, read as a number, once. It counts what it is
// asked.
type fakeOfficialFacilitator struct {
	*httptest.Server
	verifies, settles atomic.Int64
}

func newFakeOfficialFacilitator(t *testing.T) *fakeOfficialFacilitator {
	f := &fakeOfficialFacilitator{}
	var mu sync.Mutex
	settled := map[string]bool{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			PaymentPayload struct {
				Payload map[string]any `json:"payload"`
			} `json:"paymentPayload"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		p2, _ := req.PaymentPayload.Payload["permit2Authorization"].(map[string]any)
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/verify":
			f.verifies.Add(1)
			fmt.Fprint(w, `{"isValid":true,"payer":"0x2222222222222222222222222222222222222222"}`)
		case "/settle":
			f.settles.Add(1)
			nonce, _ := new(big.Int).SetString(fmt.Sprint(p2["nonce"]), 0) // BigInt("0x7") == BigInt("7")
			mu.Lock()
			dup := settled[nonce.String()]
			settled[nonce.String()] = true
			mu.Unlock()
			if dup {
				fmt.Fprint(w, `{"success":false,"errorReason":"permit2_invalid_nonce","transaction":"","network":"eip155:84532"}`)
				return
			}
			fmt.Fprint(w, `{"success":true,"payer":"0x2222222222222222222222222222222222222222","transaction":"0x`+strings.Repeat("ab", 32)+`","network":"eip155:84532"}`)
		default:
			fmt.Fprint(w, `{"kinds":[{"x402Version":2,"scheme":"exact","network":"eip155:84532"}],"extensions":[],"signers":{}}`)
		}
	}))
	t.Cleanup(f.Close)
	return f
}

// permit2Site is a gate on Base Sepolia USDC behind a remote facilitator.
func permit2Site(up, fac string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept base-sepolia $0.01 %[3]s
			route "POST /verify/schema"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex())
}

// A Permit2 payment has no EIP-3009 payer and nonce to be claimed by, so
// every spelling of it (member order, whitespace, nonce "7" or "0x7") was a
// new claim: behind a facilitator that takes Permit2 by the payload's shape,
// one authorization, re-spelt while the first request was upstream, ran the
// upstream twice. A made-up authorization beside it named the claim by a
// payer and nonce nobody signed. Our offers advertise EIP-3009 only: the gate
// now refuses any payload with permit2Authorization before it claims or
// forwards anything.
func TestPermit2PaymentIsRefusedBeforeItIsClaimed(t *testing.T) {
	usdc, _ := x402.USDC(x402.NetworkBaseSepolia)
	fac := newFakeOfficialFacilitator(t)
	up := newUpstream(t)
	base := startCaddy(t, permit2Site(up.URL, fac.URL))

	accepted := map[string]any{"scheme": "exact", "network": "eip155:84532", "amount": "10000",
		"asset": usdc.Address, "payTo": payTo.Hex(), "maxTimeoutSeconds": 60,
		"extra": map[string]any{"name": usdc.Name, "version": usdc.Version}}
	header := func(nonce, pad string, authorization any) string {
		payload := map[string]any{"signature": "0x" + strings.Repeat("11", 65),
			"permit2Authorization": map[string]any{
				"from":      "0x2222222222222222222222222222222222222222",
				"permitted": map[string]any{"token": usdc.Address, "amount": "10000"},
				"spender":   "0x4020615294c913F045dc10f0a5cdEbd86c280001",
				"nonce":     nonce, "deadline": "99999999999",
				"witness": map[string]any{"to": payTo.Hex(), "validAfter": "0", "extra": "0x"}}}
		if authorization != nil {
			payload["authorization"] = authorization
		}
		b, _ := json.Marshal(map[string]any{"x402Version": 2, "accepted": accepted, "payload": payload})
		return base64.StdEncoding.EncodeToString(append(b, pad...))
	}
	madeUp := map[string]any{"from": "0x3333333333333333333333333333333333333333", "to": payTo.Hex(),
		"value": "10000", "validAfter": "0", "validBefore": "99999999999", "nonce": "0x" + strings.Repeat("cd", 32)}

	refused := func(desc, h string) {
		t.Helper()
		resp := post(t, base+"/verify/schema", validRequest, map[string]string{x402.HeaderPaymentSignature: h})
		m := readJSON(t, resp)
		if resp.StatusCode != http.StatusBadRequest || m["reason"] != x402.ReasonUnsupportedPayloadType ||
			!strings.Contains(fmt.Sprint(m["error"]), "permit2Authorization") {
			t.Errorf("%s: %d %v (%v), want 400 %s", desc, resp.StatusCode, m["reason"], m["error"], x402.ReasonUnsupportedPayloadType)
		}
	}
	// While the first request would be upstream, the same Permit2
	// authorization arrives spelt differently.
	up.during = func() {
		if up.calls.Load() == 1 {
			refused("the same Permit2 payment re-spelt, in flight", header("0x7", " ", nil))
		}
	}
	refused("a Permit2 payment", header("7", "", nil))
	refused("a Permit2 payment re-spelt", header("0x7", " ", nil))
	refused("a Permit2 payment beside a made-up authorization", header("8", "", madeUp))
	if fac.verifies.Load() != 0 || fac.settles.Load() != 0 || up.calls.Load() != 0 {
		t.Fatalf("Permit2 payments were forwarded: %d verifies, %d settles, the upstream ran %d times; want none",
			fac.verifies.Load(), fac.settles.Load(), up.calls.Load())
	}
}

// The official facilitator reads an authorization's numbers with BigInt
// ("0x6b13c98e", " 1796458894", "+1796458894" and "" are numbers to it, and
// the signature covers the number), so such a payment verifies and settles;
// the gate read validBefore with ParseInt for the claim's lifetime and the
// unknown-outcome reader with Values (canonical decimal only), so the claim
// lapsed early and an unknown outcome could never be judged. The gate now
// reads every EVM payment with Values before the claim and refuses what it
// cannot read, naming the member and echoing nothing; a member the scheme
// does not define is refused the same way.
func TestNonCanonicalAuthorizationIsRefusedBeforeItIsClaimed(t *testing.T) {
	usdc, _ := x402.USDC(x402.NetworkBaseSepolia)
	fac := newFakeOfficialFacilitator(t)
	up := newUpstream(t)
	base := startCaddy(t, permit2Site(up.URL, fac.URL))
	offer := x402.PaymentRequirements{Scheme: "exact", Network: x402.NetworkBaseSepolia, Amount: "10000",
		Asset: usdc.Address, PayTo: payTo.Hex(), MaxTimeoutSeconds: 60, Extra: usdc.Extra()}
	signed, err := x402.SignExactEVM(evmfacilitator.DevKey(1), offer, nil, time.Now().Add(50*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var ev x402.ExactEVMPayload
	json.Unmarshal(signed.Payload, &ev)
	vb := ev.Authorization.ValidBefore
	n, _ := strconv.ParseInt(vb, 10, 64)
	for _, c := range []struct{ member, from, to string }{
		{"validBefore", `"validBefore":"` + vb + `"`, `"validBefore":"0x` + strconv.FormatInt(n, 16) + `"`},
		{"validBefore", `"validBefore":"` + vb + `"`, `"validBefore":" ` + vb + `"`},
		{"validBefore", `"validBefore":"` + vb + `"`, `"validBefore":"+` + vb + `"`},
		{"validAfter", `"validAfter":"` + ev.Authorization.ValidAfter + `"`, `"validAfter":""`},
		{"value", `"value":"10000"`, `"value":"0x2710"`},
		{"", `"authorization":{`, `"authorization":{"memo":"x",`},
	} {
		p := signed
		p.Payload = json.RawMessage(strings.Replace(string(signed.Payload), c.from, c.to, 1))
		h, err := x402.EncodeHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		resp := post(t, base+"/verify/schema", validRequest, map[string]string{x402.HeaderPaymentSignature: h})
		m := readJSON(t, resp)
		msg := fmt.Sprint(m["error"])
		if resp.StatusCode != http.StatusBadRequest || m["reason"] != x402.ReasonInvalidPayload ||
			!strings.Contains(msg, "payload.authorization"+map[bool]string{true: "." + c.member}[c.member != ""]+":") ||
			strings.Contains(msg, c.to) {
			t.Errorf("%s: %d %v %q, want 400 invalid_payload naming the member, not echoing it", c.to, resp.StatusCode, m["reason"], msg)
		}
	}
	if fac.verifies.Load() != 0 || up.calls.Load() != 0 {
		t.Fatalf("unreadable payments were forwarded: %d verifies, the upstream ran %d times; want none", fac.verifies.Load(), up.calls.Load())
	}
}
