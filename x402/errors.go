package x402

import (
	"errors"
	"strings"
)

// Kinds of refusal. Each *PaymentError wraps exactly one of them, so callers
// choose a status with errors.Is without parsing messages.
//
// The HTTP mapping the gateway uses: every kind from decoding a
// PAYMENT-SIGNATURE header is a malformed payment (400, nothing is sent to a
// facilitator); ErrUnsupportedVersion differs only in its reason code
// (invalid_x402_version instead of invalid_payload), so a v1 client learns
// that it must upgrade rather than that its bytes were garbled.
var (
	// ErrHeaderTooLarge: the header is longer than MaxHeaderBytes.
	ErrHeaderTooLarge = errors.New("header is larger than the limit")
	// ErrHeaderEncoding: the header is not standard padded base64.
	ErrHeaderEncoding = errors.New("header is not standard padded base64")
	// ErrHeaderJSON: the decoded bytes are not one UTF-8 JSON object with
	// distinct member names.
	ErrHeaderJSON = errors.New("header is not a UTF-8 JSON object")
	// ErrUnsupportedVersion: x402Version is missing or not 2.
	ErrUnsupportedVersion = errors.New("unsupported x402 version")
	// ErrInvalidPayment: the JSON is well-formed but a member is missing or
	// has the wrong type or form.
	ErrInvalidPayment = errors.New("payment payload is invalid")
	// ErrInvalidSignature: a signature is malformed, malleable (high s) or
	// does not recover to a key.
	ErrInvalidSignature = errors.New("signature is invalid")
)

// PaymentError is a refusal of untrusted payment input. It names the rule
// that failed and the JSON member where it failed, and never contains the
// input itself, so it is safe to send to the client.
type PaymentError struct {
	// Kind is one of the Err* sentinels of this package.
	Kind error
	// Reason is the x402 reason code to report (invalid_payload,
	// invalid_x402_version, invalid_exact_evm_signature, ...).
	Reason string
	// Field is the JSON path of the offending member ("accepted.amount",
	// "payload.authorization.nonce"); "" for the whole input.
	Field string
	// Problem says what is wrong with it, in a few words.
	Problem string
}

// Error reports the field and the problem.
func (e *PaymentError) Error() string {
	var b strings.Builder
	b.WriteString("x402: ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	if e.Problem != "" {
		b.WriteString(e.Problem)
	} else {
		b.WriteString(e.Kind.Error())
	}
	return b.String()
}

// Unwrap exposes Kind to errors.Is.
func (e *PaymentError) Unwrap() error { return e.Kind }

func invalid(field, problem string) *PaymentError {
	return &PaymentError{Kind: ErrInvalidPayment, Reason: ReasonInvalidPayload, Field: field, Problem: problem}
}

// ReasonOf returns the x402 reason code for err: the Reason of a
// *PaymentError, otherwise invalid_payload.
func ReasonOf(err error) string {
	var pe *PaymentError
	if errors.As(err, &pe) && pe.Reason != "" {
		return pe.Reason
	}
	return ReasonInvalidPayload
}
