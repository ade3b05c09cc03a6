package x402

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

// referencePattern is the reference packages' rule, spelled as they spell
// it (PAYMENT_ID_PATTERN plus the length bounds).
var referencePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

func referenceValid(id string) bool {
	return len(id) >= PaymentIDMinLength && len(id) <= PaymentIDMaxLength && referencePattern.MatchString(id)
}

func TestPaymentID(t *testing.T) {
	ext := func(info any) PaymentPayload {
		return PaymentPayload{Extensions: map[string]any{PaymentIdentifierExtension: map[string]any{"info": info}}}
	}
	for _, c := range []struct {
		desc string
		p    PaymentPayload
		id   string
		err  error
	}{
		{"no extensions", PaymentPayload{}, "", nil},
		{"other extensions only", PaymentPayload{Extensions: map[string]any{"bazaar": map[string]any{}}}, "", nil},
		{"the declaration echoed without an id", ext(map[string]any{"required": false}), "", nil},
		{"an id", ext(map[string]any{"required": true, "id": "pay_7d5d747be160e280504c099d984bcfe0"}), "pay_7d5d747be160e280504c099d984bcfe0", nil},
		{"16 characters", ext(map[string]any{"id": strings.Repeat("a", 16)}), strings.Repeat("a", 16), nil},
		{"128 characters", ext(map[string]any{"id": strings.Repeat("Z", 128)}), strings.Repeat("Z", 128), nil},
		{"15 characters", ext(map[string]any{"id": strings.Repeat("a", 15)}), "", ErrInvalidPaymentID},
		{"129 characters", ext(map[string]any{"id": strings.Repeat("a", 129)}), "", ErrInvalidPaymentID},
		{"a dot", ext(map[string]any{"id": "pay_7d5d747be160e2.0"}), "", ErrInvalidPaymentID},
		{"a non-ASCII letter", ext(map[string]any{"id": "pay_7d5d747be160é280"}), "", ErrInvalidPaymentID},
		{"a number", ext(map[string]any{"id": 1234567890123456}), "", ErrInvalidPaymentID},
		{"null", ext(map[string]any{"id": nil}), "", ErrInvalidPaymentID},
		{"info not an object", ext("pay_7d5d747be160e280504c"), "", ErrInvalidPaymentID},
		{"extension not an object", PaymentPayload{Extensions: map[string]any{PaymentIdentifierExtension: "x"}}, "", ErrInvalidPaymentID},
	} {
		id, err := PaymentID(c.p)
		if id != c.id || !errors.Is(err, c.err) {
			t.Errorf("%s: PaymentID = %q, %v; want %q, %v", c.desc, id, err, c.id, c.err)
		}
	}
}

func TestDeclarePaymentIdentifierIsTheReferenceShape(t *testing.T) {
	d := DeclarePaymentIdentifier(true)
	if info := d["info"].(map[string]any); info["required"] != true || len(info) != 1 {
		t.Fatalf("info %v", info)
	}
	s := d["schema"].(map[string]any)
	id := s["properties"].(map[string]any)["id"].(map[string]any)
	if id["pattern"] != referencePattern.String() || id["minLength"] != 16 || id["maxLength"] != 128 {
		t.Fatalf("schema id %v", id)
	}
}

// FuzzValidPaymentID checks the hand-written rule against the reference's
// regular expression on the same bytes.
func FuzzValidPaymentID(f *testing.F) {
	for _, s := range []string{"pay_7d5d747be160e280504c099d984bcfe0", strings.Repeat("a", 15), strings.Repeat("-", 16), "pay_7d5d747be160e2\n0", "pay_7d5d747be160e\x00280", "ﬀﬀﬀﬀﬀﬀﬀﬀ"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		if got, want := ValidPaymentID(id), referenceValid(id); got != want {
			t.Fatalf("ValidPaymentID(%q) = %v, the reference rule says %v", id, got, want)
		}
	})
}

// FuzzPaymentIDFromPayload reads the id of arbitrary payment payloads as
// the gate does (ParsePaymentPayload, then PaymentID): never a panic, and
// an id it returns always obeys the reference rule.
func FuzzPaymentIDFromPayload(f *testing.F) {
	const head = `{"x402Version":2,"accepted":{"scheme":"exact","network":"eip155:8453","amount":"1","asset":"0xa","payTo":"0xb"},"payload":{},"extensions":`
	for _, ext := range []string{
		`{"payment-identifier":{"info":{"required":false,"id":"pay_7d5d747be160e280504c099d984bcfe0"}}}`,
		`{"payment-identifier":{"info":{"id":"short"}}}`,
		`{"payment-identifier":{"info":{"id":null}}}`,
		`{"payment-identifier":{"info":[]}}`,
		`{"payment-identifier":[]}`,
		`{"payment-identifier":{"info":{"id":"pay_7d5d747be160e2\u00e9280504c0"}}}`,
		`{}`,
	} {
		f.Add([]byte(head + ext + "}"))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePaymentPayload(data)
		if err != nil {
			return
		}
		id, err := PaymentID(p)
		if err == nil && id != "" && !referenceValid(id) {
			t.Fatalf("PaymentID returned %q, which the reference rule refuses", id)
		}
	})
}
