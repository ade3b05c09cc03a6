package x402

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// FuzzDecodePaymentSignature feeds arbitrary header values to the decoder.
// Properties: it never panics; every refusal is a *PaymentError of one of
// the package's kinds with a reason code; every accepted payload survives an
// encode/decode round trip unchanged, and its scheme payload, when it parses
// as an exact EVM payload, yields a digest without error.
func FuzzDecodePaymentSignature(f *testing.F) {
	for _, name := range []string{"base.json", "base-sepolia.json"} {
		f.Add(loadOfficial(f, name).Header)
	}
	f.Add(b64(validPayloadJSON))
	f.Add(b64(`{"x402Version":1}`))
	f.Add(b64(`{"x402Version":2,"accepted":{},"payload":{}}`))
	f.Add(b64(`{"a":1,"A":2}`))
	f.Add(b64(`{"\u212a":1,"k":2}`))
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
