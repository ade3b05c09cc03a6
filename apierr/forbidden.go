package apierr

import (
	"fmt"
	"net/http"
)

// CodeForbidden is a request whose credential is valid but does not grant
// what it asks for (403): a wallet proof for an agent id another wallet
// owns, or a paid route reached without the gateway.
const CodeForbidden = "forbidden"

// Forbidden reports a refusal that a fresh credential of the same caller
// cannot change (403). reason says what is not allowed, without echoing
// the request; action is the machine-readable next step.
func Forbidden(reason, action string, fields ...Field) *Error {
	return &Error{
		Code:        CodeForbidden,
		Message:     fmt.Sprintf("The request is not allowed (%s) and nothing was charged.", reason),
		Status:      http.StatusForbidden,
		NextActions: []Action{{Action: action}},
		Fields:      fields,
	}
}
