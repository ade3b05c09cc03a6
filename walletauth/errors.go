package walletauth

import (
	"errors"

	"github.com/aovhq/aov/apierr"
)

// Kinds of refusal, for errors.Is. Every refusal is an *Error wrapping one
// of them; the gateway answers each with 401.
var (
	// ErrMalformed: the header does not decode or a field breaks its syntax.
	ErrMalformed = errors.New("walletauth: malformed proof")
	// ErrWrongRequest: the proof is for another domain, origin, method or path.
	ErrWrongRequest = errors.New("walletauth: proof is for another request")
	// ErrExpired: the proof's time is over (or, for sign-in-with-x, it was
	// issued too long ago).
	ErrExpired = errors.New("walletauth: proof expired")
	// ErrNotYetValid: issued in the future, or before not_before.
	ErrNotYetValid = errors.New("walletauth: proof not yet valid")
	// ErrLifetime: expiration_time is further from issued_at than allowed.
	ErrLifetime = errors.New("walletauth: proof lives too long")
	// ErrBadSignature: the signature is not the address's.
	ErrBadSignature = errors.New("walletauth: signature does not match the address")
	// ErrReplayed: the nonce was already used.
	ErrReplayed = errors.New("walletauth: nonce already used")
	// ErrMissing: a route that requires a wallet got no proof.
	ErrMissing = errors.New("walletauth: no proof")
)

// ErrChainCheck marks the failure of a chain call about a contract
// wallet's address (eth_getCode, eth_call): the proof could not be checked,
// which is no refusal (the gateway answers 503, retryable), but the client
// chose the address, and each check costs the operator's RPC calls. A
// failure to learn the chain's id is not marked: that one call is shared
// by every request and is about no address.
var ErrChainCheck = errors.New("walletauth: the contract wallet check failed at the chain")

// Error is a refused proof. Its text names the header, the field and the
// problem, never the field's value, so it can be sent to the client as is.
type Error struct {
	Kind    error  // one of the Err* kinds above
	Header  string // HeaderName or SIWXHeaderName
	Field   string // the JSON member at fault; "" for the header as a whole
	Problem string // what is wrong, e.g. "is in the past"
	Fix     string // what the client should do
}

func (e *Error) Error() string {
	where := e.Header
	if e.Field != "" {
		where += " " + e.Field
	}
	return where + " " + e.Problem
}

// Unwrap exposes the kind to errors.Is.
func (e *Error) Unwrap() error { return e.Kind }

// APIError is the SPEC §6 answer for the refusal: 401 unauthorized, the
// reason in the message and the field in fields.
func (e *Error) APIError() *apierr.Error {
	ae := apierr.Unauthorized(e.Error())
	field := e.Header
	if e.Field != "" {
		field += "." + e.Field
	}
	ae.Fields = []apierr.Field{{Field: field, Problem: e.Problem, Fix: e.Fix}}
	ae.Cause = e
	return ae
}

func refuse(kind error, header, field, problem, fix string) *Error {
	return &Error{Kind: kind, Header: header, Field: field, Problem: problem, Fix: fix}
}
