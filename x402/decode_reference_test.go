package x402

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
)

// The decoder before it read payments from strictjson's tree: every object
// split again with encoding/json into raw members. Kept here, in the tests
// only, as the reference the tree-reading decoder must agree with on every
// input: the same payload (byte for byte where bytes are kept) or the same
// refusal.

func refDecodePaymentSignature(h string) (PaymentPayload, error) {
	data, _, _, err := decodeHeaderBytes(h)
	if err != nil {
		return PaymentPayload{}, err
	}
	return refParsePaymentPayload(data, "")
}

func refMembers(raw json.RawMessage, field string) (map[string]json.RawMessage, error) {
	t := bytes.TrimLeft(raw, " \t\r\n")
	if len(t) == 0 || t[0] != '{' {
		return nil, invalid(field, "must be a JSON object")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, invalid(field, "must be a JSON object")
	}
	return m, nil
}

func refParsePaymentPayload(data []byte, prefix string) (PaymentPayload, error) {
	var p PaymentPayload
	m, err := refMembers(data, prefix)
	if err != nil {
		return p, err
	}
	if raw, ok := m["x402Version"]; !ok || string(raw) != "2" {
		return p, &PaymentError{Kind: ErrUnsupportedVersion, Reason: ReasonInvalidX402Version,
			Field: join(prefix, "x402Version"), Problem: "must be 2"}
	}
	p.X402Version = Version

	rawAcc, ok := m["accepted"]
	if !ok {
		return p, invalid(join(prefix, "accepted"), "is required")
	}
	if p.Accepted, err = refParseRequirements(rawAcc, join(prefix, "accepted")); err != nil {
		return p, err
	}

	raw, ok := m["payload"]
	if !ok {
		return p, invalid(join(prefix, "payload"), "is required")
	}
	if raw[0] != '{' {
		return p, invalid(join(prefix, "payload"), "must be a JSON object")
	}
	p.Payload = append(json.RawMessage(nil), raw...)

	if raw, ok := m["resource"]; ok && string(raw) != "null" {
		rm, err := refMembers(raw, join(prefix, "resource"))
		if err != nil {
			return p, err
		}
		var r Resource
		if r.URL, err = refOptStringMember(rm, "url", join(prefix, "resource.url")); err != nil {
			return p, err
		}
		if r.Description, err = refOptStringMember(rm, "description", join(prefix, "resource.description")); err != nil {
			return p, err
		}
		if r.MimeType, err = refOptStringMember(rm, "mimeType", join(prefix, "resource.mimeType")); err != nil {
			return p, err
		}
		p.Resource = &r
	}
	if p.Extensions, err = refObjectMember(m, "extensions", join(prefix, "extensions")); err != nil {
		return p, err
	}
	return p, nil
}

// parseRequirements checks one PaymentRequirements object.
func refParseRequirements(raw json.RawMessage, path string) (PaymentRequirements, error) {
	var r PaymentRequirements
	m, err := refMembers(raw, path)
	if err != nil {
		return r, err
	}
	if r.Scheme, err = refStringMember(m, "scheme", join(path, "scheme")); err != nil {
		return r, err
	}
	if r.Network, err = refStringMember(m, "network", join(path, "network")); err != nil {
		return r, err
	}
	if !ValidCAIP2(r.Network) {
		return r, invalid(join(path, "network"), "must be a CAIP-2 chain id")
	}
	if r.Amount, err = refStringMember(m, "amount", join(path, "amount")); err != nil {
		return r, err
	}
	if !canonicalUint(r.Amount) {
		return r, invalid(join(path, "amount"), "must be a canonical decimal integer string")
	}
	if r.Asset, err = refStringMember(m, "asset", join(path, "asset")); err != nil {
		return r, err
	}
	if r.PayTo, err = refStringMember(m, "payTo", join(path, "payTo")); err != nil {
		return r, err
	}
	if raw, ok := m["maxTimeoutSeconds"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &r.MaxTimeoutSeconds); err != nil || r.MaxTimeoutSeconds < 0 {
			return r, invalid(join(path, "maxTimeoutSeconds"), "must be a non-negative integer")
		}
	}
	if r.Extra, err = refObjectMember(m, "extra", join(path, "extra")); err != nil {
		return r, err
	}
	return r, nil
}

func refStringMember(m map[string]json.RawMessage, name, path string) (string, error) {
	raw, ok := m[name]
	if !ok {
		return "", invalid(path, "is required")
	}
	s, ok := refUnquote(raw)
	if !ok {
		return "", invalid(path, "must be a string")
	}
	if s == "" {
		return "", invalid(path, "must not be empty")
	}
	return s, nil
}

// optStringMember reads an optional string member; absent and null are "".
func refOptStringMember(m map[string]json.RawMessage, name, path string) (string, error) {
	raw, ok := m[name]
	if !ok || string(raw) == "null" {
		return "", nil
	}
	s, ok := refUnquote(raw)
	if !ok {
		return "", invalid(path, "must be a string")
	}
	return s, nil
}

// unquote decodes a JSON string value. Strings without escapes (almost all
// of them) are sliced rather than decoded; the document is already known to
// be valid UTF-8 JSON.
func refUnquote(raw json.RawMessage) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw[1 : len(raw)-1]), true
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// objectMember reads an optional JSON object member as a map; absent and
// null give nil.
func refObjectMember(m map[string]json.RawMessage, name, path string) (map[string]any, error) {
	raw, ok := m[name]
	if !ok || string(raw) == "null" {
		return nil, nil
	}
	if len(raw) == 0 || raw[0] != '{' {
		return nil, invalid(path, "must be a JSON object")
	}
	// UseNumber keeps numbers exactly as sent, so re-encoding the map
	// (to forward it to a facilitator) does not round them through float64.
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		return nil, invalid(path, "must be a JSON object")
	}
	return v, nil
}
func refParseExactEVMPayload(raw json.RawMessage) (ExactEVMPayload, error) {
	var p ExactEVMPayload
	if _, _, err := checkJSONObject(raw); err != nil {
		return p, invalid("", "must be a JSON object with distinct member names")
	}
	m, err := refMembers(raw, "")
	if err != nil {
		return p, err
	}
	if _, permit2 := m["permit2Authorization"]; permit2 {
		return p, &PaymentError{Kind: ErrInvalidPayment, Reason: ReasonUnsupportedPayloadType,
			Field: "permit2Authorization", Problem: "Permit2 payloads are not supported; use an EIP-3009 authorization"}
	}
	for k := range m {
		if k != "signature" && k != "authorization" {
			return p, invalid("", "must have only the members signature and authorization")
		}
	}
	if p.Signature, err = refStringMember(m, "signature", "signature"); err != nil {
		return p, err
	}
	if _, err := ParseSignature(p.Signature); err != nil {
		return p, err
	}
	rawAuth, ok := m["authorization"]
	if !ok {
		return p, invalid("authorization", "is required")
	}
	am, err := refMembers(rawAuth, "authorization")
	if err != nil {
		return p, err
	}
	for k := range am {
		switch k {
		case "from", "to", "value", "validAfter", "validBefore", "nonce":
		default:
			return p, invalid("authorization", "must have only the members from, to, value, validAfter, validBefore and nonce")
		}
	}
	a := &p.Authorization
	for _, f := range []struct {
		name string
		dst  *string
	}{{"from", &a.From}, {"to", &a.To}, {"value", &a.Value}, {"validAfter", &a.ValidAfter}, {"validBefore", &a.ValidBefore}, {"nonce", &a.Nonce}} {
		if *f.dst, err = refStringMember(am, f.name, "authorization."+f.name); err != nil {
			return p, err
		}
	}
	if _, err := a.Values(); err != nil {
		return p, err
	}
	return p, nil
}

// sameDecode fails t when the decoder and the reference disagree on h.
func sameDecode(t *testing.T, h string) {
	t.Helper()
	got, gerr := DecodePaymentSignature(h)
	want, werr := refDecodePaymentSignature(h)
	sameResult(t, got, gerr, want, werr)
	if gerr == nil {
		g, gerr := ParseExactEVMPayload(got.Payload)
		w, werr := refParseExactEVMPayload(got.Payload)
		sameResult(t, g, gerr, w, werr)
	}
}

func sameResult[T any](t *testing.T, got T, gerr error, want T, werr error) {
	t.Helper()
	if (gerr == nil) != (werr == nil) {
		t.Fatalf("decoder: %v, reference: %v", gerr, werr)
	}
	if gerr != nil {
		var g, w *PaymentError
		if !errors.As(gerr, &g) || !errors.As(werr, &w) || *g != *w {
			t.Fatalf("refusals differ: decoder %#v, reference %#v", gerr, werr)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("results differ:\ndecoder   %#v\nreference %#v", got, want)
	}
}

// FuzzDecodeMatchesReference: the decoder and the reference agree on every
// header (given as the JSON inside it).
func FuzzDecodeMatchesReference(f *testing.F) {
	for _, name := range []string{"base.json", "base-sepolia.json"} {
		if data, err := base64.StdEncoding.DecodeString(loadOfficial(f, name).Header); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(validPayloadJSON))
	f.Add([]byte(`{"x402Version":2,"accepted":{"scheme":"exact","network":"eip155:1","amount":"1","asset":"a","payTo":"b","maxTimeoutSeconds":-0,"extra":{"n":1.50,"e":1e3}},"payload":{"a":[1,{"b":null}]},"resource":{"url":"\u00e9","description":null},"extensions":{"x":{"y":"z"}}}`))
	f.Add([]byte(`{"x402Version":2.0,"accepted":{},"payload":{}}`))
	f.Add([]byte(`{"x402Version":2,"accepted":{"scheme":"exact","network":"eip155:1","amount":"1","asset":"a","payTo":"b","maxTimeoutSeconds":1.0},"payload":{}}`))
	f.Add([]byte(`{"x402Version":2,"accepted":{"scheme":"exact","network":"eip155:1","amount":"1","asset":"a","payTo":"b","maxTimeoutSeconds":"60"},"payload":[]}`))
	f.Add([]byte(`{"x402Version":2,"accepted":{"scheme":"exact","network":"eip155:1","amount":"1","asset":"a","payTo":"b"},"payload":{},"resource":[],"extensions":1}`))
	f.Add([]byte(`{"x402Version":2,"accepted":{"scheme":"\"q\"","network":"eip155:1","amount":"1","asset":"a","payTo":""},"payload":{}}`))
	f.Add([]byte(`{"x402Version":2,"accepted":"x","payload":{}}`))
	f.Add([]byte(`{"x402Version":2,"Payload":{},"accepted":{"scheme":"exact","network":"eip155:1","amount":"1","asset":"a","payTo":"b"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > MaxHeaderBytes/2 {
			return
		}
		sameDecode(t, base64.StdEncoding.EncodeToString(data))
	})
}
