// Package apierr is the one error shape of the service (SPEC §6), shared by
// verifierd, certd, the gateway modules and the MCP tools.
//
// Handlers return an *Error; Write turns any error into the wire shape. The
// split between what the client is told (Code, Message, Fields) and what is
// only logged (Cause) keeps internal details and client input out of
// responses: no constructor here ever copies request content into a message.
//
// Payment refusals (402) are not errors of this package: their shape belongs
// to the x402 protocol.
package apierr

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Stable error codes. Clients switch on these, so they never change.
const (
	CodeInvalidRequest       = "invalid_request"
	CodePayloadTooLarge      = "payload_too_large"
	CodeURITooLong           = "uri_too_long"
	CodeNotFound             = "not_found"
	CodeMethodNotAllowed     = "method_not_allowed"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeUnauthorized         = "unauthorized"
	CodeRateLimited          = "rate_limited"
	CodeUpstreamUnavailable  = "upstream_unavailable"
	CodeInternal             = "internal_error"
)

// Error is a refusal the client can act on. Its JSON form is the SPEC §6
// shape. Charged is false, as an error is never charged, save the answers
// that tell of a payment made but not served: the gateway's
// settlement_pending for a settlement its store did not record yet, and
// SettledBefore's.
type Error struct {
	Code        string   `json:"code"`
	Message     string   `json:"message"`
	Status      int      `json:"status"`
	Retryable   bool     `json:"retryable"`
	RetryAfter  int      `json:"retry_after,omitempty"`
	Charged     bool     `json:"charged"`
	NextActions []Action `json:"next_actions"`
	Fields      []Field  `json:"fields,omitempty"`

	// Allow lists the methods a 405 answer names in its Allow header.
	Allow []string `json:"-"`
	// Cause is the internal reason, for logs only; it is never sent.
	Cause error `json:"-"`
}

// Field names one problem with one request field and how to fix it.
// Field is a path such as "rules[0].type" or "submitted_output.items[3]".
type Field struct {
	Field   string `json:"field"`
	Problem string `json:"problem"`
	Fix     string `json:"fix"`
}

// Action is a machine-readable next step, so an agent can recover without a
// human. Only the members that apply to the action are set.
type Action struct {
	Action string   `json:"action"`
	Using  string   `json:"using,omitempty"`
	For    string   `json:"for,omitempty"`
	Fields []string `json:"fields,omitempty"`
	After  int      `json:"after_seconds,omitempty"`
}

// Error reports the code and message, plus the first field problem if any.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Code)
	b.WriteString(": ")
	b.WriteString(e.Message)
	if len(e.Fields) > 0 {
		fmt.Fprintf(&b, " (%s %s)", e.Fields[0].Field, e.Fields[0].Problem)
	}
	if e.Cause != nil {
		fmt.Fprintf(&b, ": %v", e.Cause)
	}
	return b.String()
}

// Unwrap exposes the internal cause to errors.Is and errors.As.
func (e *Error) Unwrap() error { return e.Cause }

// Invalid reports a request whose fields break the contract (422). It names
// every field so the caller can fix them all in one round trip; the message
// names the first ("The request is invalid: rules[0].type is not one of the
// allowed values. Nothing was charged; fix the field(s) and send it again.").
// Field names and problems never quote request content (object keys on a
// path aside), so neither does the message.
func Invalid(fields ...Field) *Error {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.Field
	}
	msg := "The request is invalid. Nothing was charged; fix the field(s) and send it again."
	if len(fields) > 0 {
		// The original service's wording: the first problem, named.
		msg = "The request is invalid: " + fields[0].Field + " " + fields[0].Problem + ". Nothing was charged; fix the field(s) and send it again."
	}
	return &Error{
		Code:        CodeInvalidRequest,
		Message:     msg,
		Status:      http.StatusUnprocessableEntity,
		NextActions: []Action{{Action: "fix_request_fields", Fields: names}},
		Fields:      fields,
	}
}

// TooLarge reports a body over the absolute size limit (413), naming the limit.
func TooLarge(limit int64) *Error {
	return &Error{
		Code:        CodePayloadTooLarge,
		Message:     fmt.Sprintf("The request body is larger than the limit of %d bytes and nothing was charged; send a smaller body.", limit),
		Status:      http.StatusRequestEntityTooLarge,
		NextActions: []Action{{Action: "reduce_request_size"}},
	}
}

// URITooLong reports a request URL over the limit of what the service names
// back to the client (414), naming the limit. The URL is not repeated.
func URITooLong(limit int) *Error {
	return &Error{
		Code:        CodeURITooLong,
		Message:     fmt.Sprintf("The request URL (scheme, host and path; the query does not count) is longer than the limit of %d bytes and nothing was charged; send a shorter URL.", limit),
		Status:      http.StatusRequestURITooLong,
		NextActions: []Action{{Action: "shorten_url"}},
	}
}

// NotFound reports an unknown route or record (404).
func NotFound(what string) *Error {
	return &Error{
		Code:        CodeNotFound,
		Message:     fmt.Sprintf("No %s exists here and nothing was charged; check the path against /openapi.json.", what),
		Status:      http.StatusNotFound,
		NextActions: []Action{{Action: "check_path"}},
	}
}

// MethodNotAllowed reports a known path called with the wrong method (405);
// Write sets the Allow header from allow.
func MethodNotAllowed(allow ...string) *Error {
	return &Error{
		Code:        CodeMethodNotAllowed,
		Message:     fmt.Sprintf("This path does not accept that method and nothing was charged; use %s.", strings.Join(allow, " or ")),
		Status:      http.StatusMethodNotAllowed,
		NextActions: []Action{{Action: "change_method"}},
		Allow:       allow,
	}
}

// UnsupportedMediaType reports a body that is not declared as JSON (415).
func UnsupportedMediaType() *Error {
	return &Error{
		Code:        CodeUnsupportedMediaType,
		Message:     "The request body must be JSON and nothing was charged; send it with Content-Type: application/json.",
		Status:      http.StatusUnsupportedMediaType,
		NextActions: []Action{{Action: "set_content_type"}},
	}
}

// UnsupportedCharset reports a JSON body whose Content-Type declares a
// charset other than UTF-8 (415, the code of UnsupportedMediaType): a gate
// that reads the body to decide what it charges reads it as UTF-8, and the
// field says why the label is not taken.
func UnsupportedCharset(f Field) *Error {
	e := UnsupportedMediaType()
	e.Message = "The request body must be UTF-8 JSON and nothing was charged: " + f.Field + " " + f.Problem + "; send it as UTF-8, with no charset or charset=utf-8."
	e.Fields = []Field{f}
	return e
}

// Unauthorized reports a missing, bad, expired or replayed credential (401).
// reason says which, without echoing the credential.
func Unauthorized(reason string) *Error {
	return &Error{
		Code:        CodeUnauthorized,
		Message:     fmt.Sprintf("The request was not authorized (%s) and nothing was charged; sign a fresh credential and send it again.", reason),
		Status:      http.StatusUnauthorized,
		NextActions: []Action{{Action: "sign_fresh_credential"}},
	}
}

// RateLimited reports too many requests (429); the caller may retry after
// retryAfter seconds.
func RateLimited(retryAfter int) *Error {
	return &Error{
		Code:        CodeRateLimited,
		Message:     "Too many requests and nothing was charged; retry after " + Seconds(retryAfter) + ".",
		Status:      http.StatusTooManyRequests,
		Retryable:   true,
		RetryAfter:  retryAfter,
		NextActions: []Action{{Action: "retry", After: retryAfter}},
	}
}

// Unavailable reports that a component the answer depends on (a daemon, the
// store, the facilitator) is down (503). The same request can succeed later.
func Unavailable(what string, retryAfter int, cause error) *Error {
	return &Error{
		Code:        CodeUpstreamUnavailable,
		Message:     fmt.Sprintf("The %s is unavailable and nothing was charged; retry after %s.", what, Seconds(retryAfter)),
		Status:      http.StatusServiceUnavailable,
		Retryable:   true,
		RetryAfter:  retryAfter,
		NextActions: []Action{{Action: "retry", After: retryAfter}},
		Cause:       cause,
	}
}

// SettledBefore returns a copy of e for an answer whose payment was
// settled before the failure it reports (a gate that settles before its
// upstream runs, then a seller-mode check withholds the output): the
// buyer was charged, so the answer must not say otherwise.
//
// Nor may it ask for a retry: the same payment is spent, so a retry is a
// new payment.
func (e *Error) SettledBefore() *Error {
	c := *e
	c.Charged = true
	c.Message = strings.Replace(c.Message, "nothing was charged", "the payment, settled before this answer, is not refunded", 1)
	if i := strings.Index(c.Message, "; retry"); i >= 0 {
		c.Message = c.Message[:i] + "; a new request needs a new payment."
	}
	c.Retryable, c.RetryAfter = false, 0
	c.NextActions = slices.DeleteFunc(slices.Clone(c.NextActions), func(a Action) bool { return a.Action == "retry" })
	return &c
}

// Internal reports a fault of ours (500). The cause is logged, never sent.
func Internal(cause error) *Error {
	return &Error{
		Code:        CodeInternal,
		Message:     "An internal error occurred and nothing was charged; retry later or report the problem.",
		Status:      http.StatusInternalServerError,
		Retryable:   true,
		RetryAfter:  1,
		NextActions: []Action{{Action: "retry", After: 1}},
		Cause:       cause,
	}
}

// From returns err as an *Error, wrapping anything else as Internal.
func From(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return Internal(err)
}

// Write sends err in the SPEC §6 shape with its status and the Retry-After
// and Allow headers where they apply.
func Write(w http.ResponseWriter, err error) {
	e := From(err)
	body, merr := json.Marshal(e)
	if merr != nil { // cannot happen: every member is a plain value
		body = []byte(`{"code":"internal_error","status":500,"charged":false}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	if len(e.Allow) > 0 {
		h.Set("Allow", strings.Join(e.Allow, ", "))
	}
	w.WriteHeader(e.Status)
	w.Write(append(body, '\n'))
}
