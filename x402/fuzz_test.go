package x402

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// FuzzDecodePaymentSignature feeds arbitrary header values to the decoder.
// Properties: it never panics; every refusal is a *PaymentError of one of
// the package's kinds with a reason code; every accepted payload survives an
// encode/decode round trip unchanged, and its scheme payload, when it parses
// as an exact EVM payload, yields a digest without error; a payload a gate
// accepts for an EVM offer is plain EIP-3009 with canonical numbers
// (checkGateReads).
func FuzzDecodePaymentSignature(f *testing.F) {
	for _, name := range []string{"base.json", "base-sepolia.json"} {
		f.Add(loadOfficial(f, name).Header)
	}
	f.Add(b64(validPayloadJSON))
	f.Add(b64(`{"x402Version":1}`))
	f.Add(b64(`{"x402Version":2,"accepted":{},"payload":{}}`))
	f.Add(b64(`{"a":1,"A":2}`))
	f.Add(b64(`{"\u212a":1,"k":2}`))
	f.Add(b64(strings.Replace(validPayloadJSON, `"payload":{`, `"payload":{"permit2Authorization":{"nonce":"7"},`, 1)))
	f.Add(b64(strings.Replace(validPayloadJSON, `"validBefore":"1795988428"`, `"validBefore":"0x6b0cc6cc"`, 1)))
	f.Add("e30=")
	f.Add("e31=")
	f.Add("e30")
	f.Add("")
	f.Fuzz(checkDecode)
}

// FuzzPaymentPayloadJSON fuzzes the JSON inside the header (the mutator
// rarely turns base64 into JSON by itself), with the same properties.
func FuzzPaymentPayloadJSON(f *testing.F) {
	f.Add([]byte(validPayloadJSON))
	f.Add([]byte(`{"x402Version":2,"accepted":{"scheme":"exact","network":"eip155:1","amount":"1","asset":"a","payTo":"b"},"payload":{}}`))
	f.Add([]byte(`{"x402Version":2,"x402version":2}`))
	f.Add([]byte(`{"x402Version":2,"payload":{"authorization":{"from":"0x0000000000000000000000000000000000000000"}}}`))
	f.Add([]byte(strings.Replace(validPayloadJSON, `"authorization":{`, `"authorization":{"extra":1,`, 1)))
	f.Add([]byte(strings.Replace(validPayloadJSON, `"value":"20000"`, `"value":" 20000"`, 1)))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > MaxHeaderBytes/2 {
			return
		}
		checkDecode(t, base64.StdEncoding.EncodeToString(data))
	})
}

// FuzzParseExactEVMPayload fuzzes the exact EVM payload parser: it never
// panics, refuses with a *PaymentError, and what it accepts has a digest
// and a signature of at least 65 bytes.
func FuzzParseExactEVMPayload(f *testing.F) {
	var whole map[string]json.RawMessage
	json.Unmarshal([]byte(validPayloadJSON), &whole)
	f.Add([]byte(whole["payload"]))
	f.Add([]byte(`{"signature":"0x00","authorization":{}}`))
	f.Add([]byte(`{"signature":"0x","permit2Authorization":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseExactEVMPayload(data)
		if err != nil {
			var pe *PaymentError
			if !errors.As(err, &pe) || pe.Reason == "" {
				t.Fatalf("refusal %v is not a *PaymentError with a reason", err)
			}
			return
		}
		if _, err := TransferWithAuthorizationDigest(bigOne, "n", "v", [20]byte{}, p.Authorization); err != nil {
			t.Fatalf("a parsed authorization has no digest: %v", err)
		}
		sig, err := ParseSignature(p.Signature)
		if err != nil || len(sig) < 65 {
			t.Fatalf("a parsed payload has a bad signature: %v", err)
		}
		if len(sig) == 65 {
			RecoverAuthorizer([32]byte{1}, sig) // must not panic
		}
	})
}

// checkDecode holds the decoder's properties for one header value.
func checkDecode(t *testing.T, h string) {
	p, err := DecodePaymentSignature(h)
	if err != nil {
		var pe *PaymentError
		if !errors.As(err, &pe) || pe.Reason == "" {
			t.Fatalf("refusal %v is not a *PaymentError with a reason", err)
		}
		switch pe.Kind {
		case ErrHeaderTooLarge, ErrHeaderEncoding, ErrHeaderJSON, ErrUnsupportedVersion, ErrInvalidPayment:
		default:
			t.Fatalf("unexpected kind %v", pe.Kind)
		}
		return
	}
	again, err := EncodeHeader(p)
	if err != nil {
		if errors.Is(err, ErrHeaderTooLarge) {
			return // unknown members were dropped, escapes may have grown it
		}
		t.Fatalf("re-encoding an accepted payload: %v", err)
	}
	q, err := DecodePaymentSignature(again)
	if err != nil {
		t.Fatalf("re-decoding an accepted payload: %v", err)
	}
	if !reflect.DeepEqual(normalize(t, p), normalize(t, q)) {
		t.Fatalf("round trip changed the payload:\n%+v\n%+v", p, q)
	}
	if ep, err := ParseExactEVMPayload(p.Payload); err == nil {
		if _, err := TransferWithAuthorizationDigest(bigOne, "n", "v", [20]byte{}, ep.Authorization); err != nil {
			t.Fatalf("a parsed authorization has no digest: %v", err)
		}
	}
	checkGateReads(t, p)
	checkPaymentReads(t, h, p)
}

// checkPaymentReads holds that the gate's one-parse read of an exact EVM
// payment (DecodePayment, then Payment.ExactEVMValues from that parse)
// accepts and refuses exactly what ExactEVMValues does on the payload's
// bytes, with the same values and the same refusal.
func checkPaymentReads(t *testing.T, h string, p PaymentPayload) {
	pay, err := DecodePayment(h)
	if err != nil {
		t.Fatalf("DecodePayment refused what DecodePaymentSignature accepted: %v", err)
	}
	got, gerr := pay.ExactEVMValues()
	want, werr := ExactEVMValues(p)
	if fmt.Sprint(gerr) != fmt.Sprint(werr) || !reflect.DeepEqual(got, want) {
		t.Fatalf("read from the parse: %+v, %v; from the payload's bytes: %+v, %v", got, gerr, want, werr)
	}
	again, err := ParsePayment(pay.JSON)
	if err != nil || !reflect.DeepEqual(normalize(t, again.PaymentPayload), normalize(t, p)) {
		t.Fatalf("the payment's JSON does not read back as the payment: %v", err)
	}
}

// checkGateReads holds, for a decoded payment, what a gate that accepts it
// for an EVM offer (ExactEVMValues) relies on: the payload is read the same
// way by every facilitator. It has no permit2Authorization (the official
// facilitator would take it for Permit2) and no member the scheme does not
// define, and each number is written as its canonical decimal, the one
// spelling BigInt and Values agree on.
func checkGateReads(t *testing.T, p PaymentPayload) {
	v, err := ExactEVMValues(p)
	if err != nil {
		var pe *PaymentError
		if !errors.As(err, &pe) || pe.Reason == "" || !strings.HasPrefix(pe.Field, "payload") {
			t.Fatalf("gate refusal %#v is not a *PaymentError under payload", err)
		}
		return
	}
	var members, auth map[string]json.RawMessage
	if err := json.Unmarshal(p.Payload, &members); err != nil {
		t.Fatalf("an accepted payload is not an object: %v", err)
	}
	if _, ok := members["permit2Authorization"]; ok || len(members) != 2 {
		t.Fatalf("the gate accepted a payload with members %v", slices.Collect(maps.Keys(members)))
	}
	if err := json.Unmarshal(members["authorization"], &auth); err != nil || len(auth) != 6 {
		t.Fatalf("the gate accepted an authorization with members %v", slices.Collect(maps.Keys(auth)))
	}
	for name, n := range map[string]*big.Int{"value": v.Value, "validAfter": v.ValidAfter, "validBefore": v.ValidBefore} {
		var s string
		if err := json.Unmarshal(auth[name], &s); err != nil || s != n.String() {
			t.Fatalf("authorization.%s %s was accepted, but it is not the canonical decimal %s", name, auth[name], n)
		}
	}
}

// normalize compares payloads by their JSON form (json.RawMessage
// whitespace and map number types may differ).
func normalize(t *testing.T, p PaymentPayload) any {
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	json.Unmarshal(b, &v)
	return v
}
