package x402

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
)

// MaxHeaderBytes caps the length of an encoded PAYMENT-* header (64 KiB, the
// cap other x402 gateways use). An exact EVM payment is about 1.5 KiB
// encoded; the margin leaves room for extensions while keeping a hostile
// header from costing more than a bounded decode.
const MaxHeaderBytes = 64 << 10

// EncodeHeader returns the header value for v: standard padded base64 of its
// UTF-8 JSON, the only form the x402 HTTP transport defines. It refuses
// values whose encoding exceeds MaxHeaderBytes, since no peer following this
// package's rules would accept them.
func EncodeHeader(v any) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "", fmt.Errorf("encoding x402 header: %w", err)
	}
	data := bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
	if base64.StdEncoding.EncodedLen(len(data)) > MaxHeaderBytes {
		return "", fmt.Errorf("encoding x402 header: %w", ErrHeaderTooLarge)
	}
	return base64.StdEncoding.EncodeToString(data), nil
}

// DecodeHeader decodes a PAYMENT-* header value into v.
//
// The value must be standard base64 (alphabet A–Z a–z 0–9 + /) with its "="
// padding and zero trailing bits, nothing else: no URL-safe alphabet, no
// whitespace or line breaks (which Go's decoder would otherwise skip), no
// missing padding. Every peer encodes this way, and one canonical form per
// payment means one payment cannot arrive under two spellings. The decoded
// bytes must be one UTF-8 JSON object whose member names are distinct even
// under case folding (see checkJSONObject). v is then filled with
// encoding/json rules.
//
// Errors are *PaymentError wrapping ErrHeaderTooLarge, ErrHeaderEncoding or
// ErrHeaderJSON.
func DecodeHeader(h string, v any) error {
	data, _, _, err := decodeHeaderBytes(h)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return &PaymentError{Kind: ErrHeaderJSON, Reason: ReasonInvalidPayload, Problem: "does not have the expected JSON shape"}
	}
	return nil
}

// decodeHeaderBytes returns the JSON of a header, and the object and its
// members' bytes as checkJSONObject read them.
func decodeHeaderBytes(h string) ([]byte, map[string]any, map[string][]byte, error) {
	if len(h) > MaxHeaderBytes {
		return nil, nil, nil, &PaymentError{Kind: ErrHeaderTooLarge, Reason: ReasonInvalidPayload,
			Problem: fmt.Sprintf("is longer than %d bytes", MaxHeaderBytes)}
	}
	if !canonicalBase64(h) {
		return nil, nil, nil, &PaymentError{Kind: ErrHeaderEncoding, Reason: ReasonInvalidPayload,
			Problem: "is not standard padded base64"}
	}
	data, err := base64.StdEncoding.Strict().DecodeString(h)
	if err != nil { // non-zero trailing bits
		return nil, nil, nil, &PaymentError{Kind: ErrHeaderEncoding, Reason: ReasonInvalidPayload,
			Problem: "is not canonical base64"}
	}
	obj, spans, err := checkJSONObject(data)
	if err != nil {
		return nil, nil, nil, err
	}
	return data, obj, spans, nil
}

// canonicalBase64 reports whether h uses only the standard alphabet, has a
// length that is a multiple of four and "=" only as its final padding.
func canonicalBase64(h string) bool {
	if len(h) == 0 || len(h)%4 != 0 {
		return false
	}
	n := len(h)
	pad := 0
	if h[n-1] == '=' {
		pad++
		if h[n-2] == '=' {
			pad++
		}
	}
	for i := 0; i < n-pad; i++ {
		c := h[i]
		if !('A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '+' || c == '/') {
			return false
		}
	}
	return true
}

// DecodePaymentSignature decodes and checks a PAYMENT-SIGNATURE header.
//
// Beyond DecodeHeader's rules: x402Version must be the number 2 (otherwise
// ErrUnsupportedVersion with reason invalid_x402_version, checked first so a
// v1 client is told to upgrade); accepted must be an object whose scheme,
// asset and payTo are non-empty strings, whose network is a CAIP-2 id and
// whose amount is a canonical atomic amount (ErrInvalidPayment otherwise);
// payload must be a JSON object; resource and extensions, when present, must
// be objects.
//
// Members this package does not know are ignored, at every level. The
// specification lets clients add extensions and newer clients add members;
// refusing them would break payments for no safety gain, because the
// gateway acts only on the members checked here and forwards the scheme
// payload byte for byte. Names are matched exactly (not case-insensitively),
// as JavaScript peers do.
func DecodePaymentSignature(h string) (PaymentPayload, error) {
	p, err := DecodePayment(h)
	return p.PaymentPayload, err
}

// Payment is a payment as a gate reads it, from one strict parse of its
// JSON: the PaymentPayload, the JSON itself, and the scheme payload as
// that parse found it. A gate reads an exact EVM payment's authorization
// before it claims it (Payment.ExactEVMValues); reading it from this parse
// instead of parsing the payload's bytes again was a sixth of the gate's
// allocations per paid call.
type Payment struct {
	PaymentPayload
	// JSON is the object the payment was read from: the header's decoded
	// bytes, or the object ParsePayment was given. ParsePayment reads it
	// again as the same payment, which is how a gate keeps a payment it
	// may have to resolve later without encoding it anew.
	JSON []byte
	// scheme is the payload member as the parse read it (numbers as
	// json.Number), nil in a Payment made by hand.
	scheme map[string]any
}

// DecodePayment is DecodePaymentSignature, returning the Payment it read.
func DecodePayment(h string) (Payment, error) {
	data, obj, spans, err := decodeHeaderBytes(h)
	if err != nil {
		return Payment{}, err
	}
	return readPayment(data, obj, spans)
}

// ParsePayment is ParsePaymentPayload, returning the Payment it read.
func ParsePayment(data []byte) (Payment, error) {
	if len(data) > MaxHeaderBytes {
		return Payment{}, &PaymentError{Kind: ErrHeaderTooLarge, Reason: ReasonInvalidPayload,
			Problem: fmt.Sprintf("is longer than %d bytes", MaxHeaderBytes)}
	}
	obj, spans, err := checkJSONObject(data)
	if err != nil {
		return Payment{}, err
	}
	return readPayment(data, obj, spans)
}

func readPayment(data []byte, obj map[string]any, spans map[string][]byte) (Payment, error) {
	p, err := parsePaymentPayload(obj, spans["payload"], "")
	if err != nil {
		return Payment{}, err
	}
	scheme, _ := obj["payload"].(map[string]any) // an object: parsePaymentPayload checked
	return Payment{PaymentPayload: p, JSON: data, scheme: scheme}, nil
}

// ExactEVMValues is the package's ExactEVMValues for p, read from the
// parse that decoded p: the rules and the errors are the same (the whole
// document, the payload included, was checked as checkJSONObject checks
// the payload alone).
func (p Payment) ExactEVMValues() (AuthorizationValues, error) {
	if p.scheme == nil {
		return ExactEVMValues(p.PaymentPayload)
	}
	_, v, err := exactEVMObject(p.scheme)
	if err != nil {
		return v, prefixField(err, "payload")
	}
	return v, nil
}

// ParsePaymentPayload checks a PaymentPayload given as a JSON object rather
// than a header, as the MCP transport carries it in
// params._meta["x402/payment"]. The rules are DecodePaymentSignature's.
func ParsePaymentPayload(data []byte) (PaymentPayload, error) {
	p, err := ParsePayment(data)
	return p.PaymentPayload, err
}

// parsePaymentPayload checks a PaymentPayload object: v as
// checkJSONObject read it, payload the bytes of its payload member (the
// scheme payload is kept byte for byte). prefix is the JSON path of the
// object ("" for a header, "paymentPayload" in a facilitator request).
func parsePaymentPayload(v any, payload []byte, prefix string) (PaymentPayload, error) {
	var p PaymentPayload
	m, err := object(v, prefix)
	if err != nil {
		return p, err
	}
	if n, ok := m["x402Version"].(json.Number); !ok || n != "2" {
		return p, &PaymentError{Kind: ErrUnsupportedVersion, Reason: ReasonInvalidX402Version,
			Field: join(prefix, "x402Version"), Problem: "must be 2"}
	}
	p.X402Version = Version

	acc, ok := m["accepted"]
	if !ok {
		return p, invalid(join(prefix, "accepted"), "is required")
	}
	if p.Accepted, err = parseRequirements(acc, join(prefix, "accepted")); err != nil {
		return p, err
	}

	pl, ok := m["payload"]
	if !ok {
		return p, invalid(join(prefix, "payload"), "is required")
	}
	if _, ok := pl.(map[string]any); !ok {
		return p, invalid(join(prefix, "payload"), "must be a JSON object")
	}
	if len(payload) == 0 || payload[0] != '{' {
		return p, invalid(join(prefix, "payload"), "must be a JSON object")
	}
	p.Payload = append(json.RawMessage(nil), payload...)

	if rv, ok := m["resource"]; ok && rv != nil {
		rpath := join(prefix, "resource")
		rm, err := object(rv, rpath)
		if err != nil {
			return p, err
		}
		var r Resource
		if r.URL, err = optStringMember(rm, rpath, "url"); err != nil {
			return p, err
		}
		if r.Description, err = optStringMember(rm, rpath, "description"); err != nil {
			return p, err
		}
		if r.MimeType, err = optStringMember(rm, rpath, "mimeType"); err != nil {
			return p, err
		}
		p.Resource = &r
	}
	if p.Extensions, err = objectMember(m, prefix, "extensions"); err != nil {
		return p, err
	}
	return p, nil
}

// parseRequirements checks one PaymentRequirements object, v as
// checkJSONObject read it.
func parseRequirements(v any, path string) (PaymentRequirements, error) {
	var r PaymentRequirements
	m, err := object(v, path)
	if err != nil {
		return r, err
	}
	if r.Scheme, err = stringMember(m, path, "scheme"); err != nil {
		return r, err
	}
	if r.Network, err = stringMember(m, path, "network"); err != nil {
		return r, err
	}
	if !ValidCAIP2(r.Network) {
		return r, invalid(join(path, "network"), "must be a CAIP-2 chain id")
	}
	if r.Amount, err = stringMember(m, path, "amount"); err != nil {
		return r, err
	}
	if !canonicalUint(r.Amount) {
		return r, invalid(join(path, "amount"), "must be a canonical decimal integer string")
	}
	if r.Asset, err = stringMember(m, path, "asset"); err != nil {
		return r, err
	}
	if r.PayTo, err = stringMember(m, path, "payTo"); err != nil {
		return r, err
	}
	if tv, ok := m["maxTimeoutSeconds"]; ok && tv != nil {
		// As encoding/json reads an int: an integer literal, no fraction
		// or exponent.
		n, isNum := tv.(json.Number)
		t, err := strconv.Atoi(string(n))
		if !isNum || err != nil || t < 0 {
			return r, invalid(join(path, "maxTimeoutSeconds"), "must be a non-negative integer")
		}
		r.MaxTimeoutSeconds = t
	}
	if r.Extra, err = objectMember(m, path, "extra"); err != nil {
		return r, err
	}
	return r, nil
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}
