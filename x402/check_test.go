package x402

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
)

func TestCheckExactEVM(t *testing.T) {
	key := testKey(t)
	payer := crypto.PubkeyToAddress(key.PublicKey)
	now := time.Unix(1_800_000_000, 0)
	req := devnetRequirements()
	signed, err := SignExactEVM(key, req, nil, now)
	if err != nil {
		t.Fatal(err)
	}
	// resign builds a payment whose authorization was changed by f and is
	// signed correctly, so only the changed rule can refuse it.
	resign := func(f func(a *Authorization)) PaymentPayload {
		ep, _ := ParseExactEVMPayload(signed.Payload)
		f(&ep.Authorization)
		chainID, name, version, token, _ := ExactEVMDomain(req)
		d, err := TransferWithAuthorizationDigest(chainID, name, version, token, ep.Authorization)
		if err != nil {
			t.Fatal(err)
		}
		sig, _ := crypto.Sign(d[:], key)
		sig[64] += 27
		ep.Signature = hexutilEncode(sig)
		p := signed
		p.Payload, _ = json.Marshal(ep)
		return p
	}
	withPayload := func(f func(ep *ExactEVMPayload)) PaymentPayload {
		ep, _ := ParseExactEVMPayload(signed.Payload)
		f(&ep)
		p := signed
		p.Payload, _ = json.Marshal(ep)
		return p
	}
	withReq := func(f func(r *PaymentRequirements)) PaymentRequirements {
		r := req
		r.Extra = map[string]any{"name": "USDC", "version": "2"}
		f(&r)
		return r
	}
	other, _ := crypto.GenerateKey()
	for _, tc := range []struct {
		desc   string
		p      PaymentPayload
		req    PaymentRequirements
		at     time.Time
		reason string // "" = valid
	}{
		{"a payment signed for the requirements is valid", signed, req, now, ""},
		{"it stays valid until six seconds before validBefore", signed, req, now.Add(54 * time.Second), ""},
		{"a payment with version 1 is refused", func() PaymentPayload { p := signed; p.X402Version = 1; return p }(), req, now, ReasonInvalidX402Version},
		{"a scheme other than exact is refused", signed, withReq(func(r *PaymentRequirements) { r.Scheme = "upto" }), now, ReasonExactEVMScheme},
		{"a payment for another network is refused", signed, withReq(func(r *PaymentRequirements) { r.Network = NetworkBase }), now, ReasonExactEVMNetworkMismatch},
		{"a Solana requirement is refused", func() PaymentPayload { p := signed; p.Accepted.Network = NetworkSolana; return p }(), withReq(func(r *PaymentRequirements) { r.Network = NetworkSolana }), now, ReasonInvalidNetwork},
		{"a Permit2 transfer method is refused", signed, withReq(func(r *PaymentRequirements) { r.Extra["assetTransferMethod"] = "permit2" }), now, ReasonUnsupportedPayloadType},
		{"a payload without an authorization is refused", func() PaymentPayload { p := signed; p.Payload = []byte(`{"signature":"0x00"}`); return p }(), req, now, ReasonInvalidPayload},
		{"a payment to another recipient is refused", resign(func(a *Authorization) { a.To = "0x0000000000000000000000000000000000000001" }), req, now, ReasonExactEVMRecipientMismatch},
		{"a payment of less than the amount is refused", resign(func(a *Authorization) { a.Value = "19999" }), req, now, ReasonExactEVMValueMismatch},
		{"a payment of more than the amount is refused", resign(func(a *Authorization) { a.Value = "20001" }), req, now, ReasonExactEVMValueMismatch},
		{"a payment expiring within six seconds is refused", signed, req, now.Add(55 * time.Second), ReasonExactEVMValidBefore},
		{"an expired payment is refused", signed, req, now.Add(time.Hour), ReasonExactEVMValidBefore},
		{"a payment not yet valid is refused", resign(func(a *Authorization) { a.ValidAfter = "1800000001" }), req, now, ReasonExactEVMValidAfter},
		{"requirements without the EIP-712 name are refused", signed, withReq(func(r *PaymentRequirements) { delete(r.Extra, "name") }), now, ReasonExactEVMMissingEIP712Domain},
		{"a signature for another token domain is refused", signed, withReq(func(r *PaymentRequirements) { r.Extra["name"] = "USD Coin" }), now, ReasonExactEVMSignature},
		{"a signature by another key is refused", withPayload(func(ep *ExactEVMPayload) {
			chainID, name, version, token, _ := ExactEVMDomain(req)
			d, _ := TransferWithAuthorizationDigest(chainID, name, version, token, ep.Authorization)
			sig, _ := crypto.Sign(d[:], other)
			ep.Signature = hexutilEncode(sig)
		}), req, now, ReasonExactEVMSignature},
		{"an authorization altered after signing is refused", withPayload(func(ep *ExactEVMPayload) { ep.Authorization.ValidBefore = "1900000000" }), req, now, ReasonExactEVMSignature},
		{"a malformed signature is refused", withPayload(func(ep *ExactEVMPayload) { ep.Signature = "0x1234" }), req, now, ReasonInvalidPayload},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			c, err := CheckExactEVM(tc.p, tc.req, tc.at)
			if tc.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				if !c.Recovered || c.Values.From != payer {
					t.Fatalf("check %+v did not prove the payer", c)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			if got := ReasonOf(err); got != tc.reason {
				t.Fatalf("reason %q (%v), want %q", got, err, tc.reason)
			}
			r := InvalidResponse(err, c.Values.From)
			if r.IsValid || r.InvalidReason != tc.reason || r.InvalidMessage == "" {
				t.Fatalf("answer %+v", r)
			}
		})
	}
	t.Run("a smart-wallet signature is left to the chain", func(t *testing.T) {
		p := withPayload(func(ep *ExactEVMPayload) { ep.Signature += "00" })
		c, err := CheckExactEVM(p, req, now)
		if err != nil {
			t.Fatal(err)
		}
		if c.Recovered {
			t.Fatal("a 66-byte signature was reported as recovered")
		}
	})
	t.Run("a refusal's field says where", func(t *testing.T) {
		_, err := CheckExactEVM(withPayload(func(ep *ExactEVMPayload) { ep.Authorization.Nonce = "0x12" }), req, now)
		var pe *PaymentError
		if !errors.As(err, &pe) || pe.Field != "payload.authorization.nonce" {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("the zero payer is left out of an answer", func(t *testing.T) {
		if r := InvalidResponse(errors.New("x"), common.Address{}); r.Payer != "" || r.InvalidReason != ReasonInvalidPayload {
			t.Fatalf("answer %+v", r)
		}
	})
}

func TestAuthorizationValues(t *testing.T) {
	max := "115792089237316195423570985008687907853269984665640564039457584007913129639935"
	for _, tc := range []struct {
		desc  string
		f     func(a *Authorization)
		field string // "" = valid
	}{
		{"the sample authorization parses", func(a *Authorization) {}, ""},
		{"addresses in any case parse", func(a *Authorization) { a.From = "0x857B06519E91E3A54538791BDBB0E22373E36B66" }, ""},
		{"the largest uint256 value parses", func(a *Authorization) { a.Value = max }, ""},
		{"a from address of 19 bytes is refused", func(a *Authorization) { a.From = a.From[:40] }, "authorization.from"},
		{"a to address without 0x is refused", func(a *Authorization) { a.To = "00" + a.To[2:] }, "authorization.to"},
		{"a value beyond uint256 is refused", func(a *Authorization) { a.Value = max[:len(max)-1] + "6" }, "authorization.value"},
		{"a negative value is refused", func(a *Authorization) { a.Value = "-1" }, "authorization.value"},
		{"a hex value is refused", func(a *Authorization) { a.Value = "0x10" }, "authorization.value"},
		{"a validAfter with a leading zero is refused", func(a *Authorization) { a.ValidAfter = "01" }, "authorization.validAfter"},
		{"an empty validBefore is refused", func(a *Authorization) { a.ValidBefore = "" }, "authorization.validBefore"},
		{"a 31-byte nonce is refused", func(a *Authorization) { a.Nonce = a.Nonce[:64] }, "authorization.nonce"},
		{"a 33-byte nonce is refused", func(a *Authorization) { a.Nonce += "00" }, "authorization.nonce"},
		{"a nonce without 0x is refused", func(a *Authorization) { a.Nonce = "00" + a.Nonce[2:] }, "authorization.nonce"},
		{"a nonce with a non-hex digit is refused", func(a *Authorization) { a.Nonce = a.Nonce[:65] + "g" }, "authorization.nonce"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			a := sampleAuth
			tc.f(&a)
			_, err := a.Values()
			if tc.field == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var pe *PaymentError
			if !errors.As(err, &pe) || pe.Field != tc.field || pe.Reason != ReasonInvalidPayload {
				t.Fatalf("got %v, want a refusal of %s", err, tc.field)
			}
		})
	}
}

func TestParseExactEVMPayload(t *testing.T) {
	var whole map[string]json.RawMessage
	json.Unmarshal([]byte(validPayloadJSON), &whole)
	good := string(whole["payload"])
	for _, tc := range []struct {
		desc, in, reason, field string
	}{
		{"the official client's payload parses", good, "", ""},
		// The official @x402/evm facilitator routes on the payload's shape:
		// "permit2Authorization" in payload is a Permit2 payment whatever
		// else it carries. An accepted payload must mean one thing to it.
		{"a Permit2 member beside an authorization is an unsupported payload type", `{"permit2Authorization":{},` + good[1:], ReasonUnsupportedPayloadType, "permit2Authorization"},
		{"a member the scheme does not define is refused", `{"x":1,` + good[1:], ReasonInvalidPayload, ""},
		{"a member the scheme does not define in the authorization is refused", strings.Replace(good, `"authorization":{`, `"authorization":{"x":1,`, 1), ReasonInvalidPayload, "authorization"},
		// BigInt reads these as numbers the signature may cover; Values reads
		// canonical decimal only, so they are refused, never misread.
		{"a hex validBefore is refused", strings.Replace(good, `"validBefore":"1795988428"`, `"validBefore":"0x6b0cc6cc"`, 1), ReasonInvalidPayload, "authorization.validBefore"},
		{"a padded validBefore is refused", strings.Replace(good, `"validBefore":"1795988428"`, `"validBefore":" 1795988428"`, 1), ReasonInvalidPayload, "authorization.validBefore"},
		{"a signed validAfter is refused", strings.Replace(good, `"validAfter":"0"`, `"validAfter":"+0"`, 1), ReasonInvalidPayload, "authorization.validAfter"},
		{"an empty value is refused", strings.Replace(good, `"value":"20000"`, `"value":""`, 1), ReasonInvalidPayload, "authorization.value"},
		{"a Permit2 payload is an unsupported payload type", `{"signature":"0x` + repeat("11", 65) + `","permit2Authorization":{}}`, ReasonUnsupportedPayloadType, "permit2Authorization"},
		{"a missing signature is refused", `{"authorization":{}}`, ReasonInvalidPayload, "signature"},
		{"a numeric signature is refused", `{"signature":5}`, ReasonInvalidPayload, "signature"},
		{"a signature of odd hex length is refused", `{"signature":"0x123"}`, ReasonInvalidPayload, "signature"},
		{"a 64-byte signature is refused", `{"signature":"0x` + repeat("11", 64) + `"}`, ReasonInvalidPayload, "signature"},
		{"a missing authorization is refused", `{"signature":"0x` + repeat("11", 65) + `"}`, ReasonInvalidPayload, "authorization"},
		{"an authorization missing its nonce is refused", `{"signature":"0x` + repeat("11", 65) + `","authorization":{"from":"a","to":"b","value":"1","validAfter":"0","validBefore":"1"}}`, ReasonInvalidPayload, "authorization.nonce"},
		{"a numeric value is refused", `{"signature":"0x` + repeat("11", 65) + `","authorization":{"from":"0x857b06519e91e3a54538791bdbb0e22373e36b66","to":"0x857b06519e91e3a54538791bdbb0e22373e36b66","value":1,"validAfter":"0","validBefore":"1","nonce":"0x` + repeat("00", 32) + `"}}`, ReasonInvalidPayload, "authorization.value"},
		{"duplicate names are refused", `{"signature":"a","Signature":"b"}`, ReasonInvalidPayload, ""},
		{"an array is refused", `[]`, ReasonInvalidPayload, ""},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			p, err := ParseExactEVMPayload([]byte(tc.in))
			if tc.reason == "" {
				if err != nil {
					t.Fatal(err)
				}
				if p.Authorization.Value != "20000" {
					t.Fatalf("parsed %+v", p)
				}
				return
			}
			var pe *PaymentError
			if !errors.As(err, &pe) || pe.Reason != tc.reason || pe.Field != tc.field {
				t.Fatalf("got %#v, want reason %s field %s", err, tc.reason, tc.field)
			}
		})
	}
}

// ExactEVMValues is what a gate reads before it claims a payment: the
// numbers of an accepted payload, and refusals named from the header's root
// (the gate's 400 names payload.authorization.validBefore, not a path the
// client cannot place).
func TestExactEVMValues(t *testing.T) {
	var p PaymentPayload
	if err := json.Unmarshal([]byte(validPayloadJSON), &p); err != nil {
		t.Fatal(err)
	}
	v, err := ExactEVMValues(p)
	if err != nil || v.ValidBefore.Int64() != 1795988428 || v.Value.Int64() != 20000 || v.From != common.HexToAddress("0x2c7536E3605D9C16a7a3D7b1898e529396a65c23") {
		t.Fatalf("values %+v, %v", v, err)
	}
	p.Payload = json.RawMessage(strings.Replace(string(p.Payload), `"validBefore":"1795988428"`, `"validBefore":"0x6b0cc6cc"`, 1))
	_, err = ExactEVMValues(p)
	var pe *PaymentError
	if !errors.As(err, &pe) || pe.Reason != ReasonInvalidPayload || pe.Field != "payload.authorization.validBefore" || strings.Contains(err.Error(), "0x6b0cc6cc") {
		t.Fatalf("a hex validBefore: %#v, want invalid_payload at payload.authorization.validBefore, not echoing it", err)
	}
}

func repeat(s string, n int) string {
	out := ""
	for i := 0; i < n; i++ {
		out += s
	}
	return out
}

func hexutilEncode(b []byte) string { return "0x" + common.Bytes2Hex(b) }
