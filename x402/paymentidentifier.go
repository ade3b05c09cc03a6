package x402

import "errors"

// The payment-identifier extension (x402 specs/extensions/payment_identifier.md):
// a server declares it in PaymentRequired.extensions, and a client that
// wants its retries to be idempotent echoes the declaration in its
// PaymentPayload with info.id, an identifier it chose, added. The same id
// with the same payment gets the answer already paid for; the same id with
// another payment is a conflict.
const (
	PaymentIdentifierExtension = "payment-identifier"
	PaymentIDMinLength         = 16
	PaymentIDMaxLength         = 128
)

// paymentIdentifierSchema is the JSON Schema of the extension's info, as
// the reference packages declare it (paymentIdentifierSchema in
// @x402/extensions, PaymentIdentifierSchema in the Go SDK).
var paymentIdentifierSchema = map[string]any{
	"$schema": "https://json-schema.org/draft/2020-12/schema",
	"type":    "object",
	"properties": map[string]any{
		"required": map[string]any{"type": "boolean"},
		"id": map[string]any{
			"type":      "string",
			"minLength": PaymentIDMinLength,
			"maxLength": PaymentIDMaxLength,
			"pattern":   "^[a-zA-Z0-9_-]+$",
		},
	},
	"required": []string{"required"},
}

// DeclarePaymentIdentifier is the extension's declaration for
// PaymentRequired.extensions["payment-identifier"]: {info: {required},
// schema}, as the reference declarePaymentIdentifierExtension builds it.
func DeclarePaymentIdentifier(required bool) map[string]any {
	return map[string]any{
		"info":   map[string]any{"required": required},
		"schema": paymentIdentifierSchema,
	}
}

// ErrInvalidPaymentID reports a payment-identifier extension whose id is
// not a string of 16 to 128 characters from [a-zA-Z0-9_-], or whose
// extension or info is not an object.
var ErrInvalidPaymentID = errors.New("x402: invalid payment identifier")

// PaymentID returns the payment identifier a client sent in p
// (extensions["payment-identifier"].info.id), "" when it sent none (no
// extension, or the extension without an id). A present but malformed one
// is ErrInvalidPaymentID: a client that asked for idempotency must not
// silently lose it. The info's other members (the echoed required flag)
// are the client's copy of the server's declaration and are not read.
func PaymentID(p PaymentPayload) (string, error) {
	raw, ok := p.Extensions[PaymentIdentifierExtension]
	if !ok || raw == nil {
		return "", nil
	}
	ext, ok := raw.(map[string]any)
	if !ok {
		return "", ErrInvalidPaymentID
	}
	rawInfo, ok := ext["info"]
	if !ok || rawInfo == nil {
		return "", nil
	}
	info, ok := rawInfo.(map[string]any)
	if !ok {
		return "", ErrInvalidPaymentID
	}
	rawID, ok := info["id"]
	if !ok {
		return "", nil
	}
	id, ok := rawID.(string)
	if !ok || !ValidPaymentID(id) {
		return "", ErrInvalidPaymentID
	}
	return id, nil
}

// ValidPaymentID reports whether id is a well-formed payment identifier:
// 16 to 128 characters, each an ASCII letter, digit, '_' or '-' (the
// reference's ^[a-zA-Z0-9_-]+$ with its length bounds).
func ValidPaymentID(id string) bool {
	if len(id) < PaymentIDMinLength || len(id) > PaymentIDMaxLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
