package apierr

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"
)

// CodeVerificationTimeout is a verification stopped at its wall-clock
// limit (or because the caller went away). The deterministic budgets (steps,
// regular-expression work) answer 422 invalid_request; this one depends on
// the machine's load, so it is a retryable 503.
const CodeVerificationTimeout = "verification_timeout"

// Timeout reports a verification that did not finish within limit (503,
// retryable after 1 second). cause is the context's error, for logs.
func Timeout(limit time.Duration, cause error) *Error {
	secs := int(math.Ceil(limit.Seconds()))
	msg := fmt.Sprintf("The verification did not finish within its time limit of %s and nothing was charged; retry after %s, or send a smaller output or a simpler schema.", Seconds(secs), Seconds(1))
	if errors.Is(cause, context.Canceled) {
		msg = "The verification was stopped because the request was cancelled, and nothing was charged; send it again."
	}
	return &Error{
		Code:        CodeVerificationTimeout,
		Message:     msg,
		Status:      http.StatusServiceUnavailable,
		Retryable:   true,
		RetryAfter:  1,
		NextActions: []Action{{Action: "retry", After: 1}},
		Cause:       cause,
	}
}

// Seconds words a duration in whole seconds: "1 second", "5 seconds".
func Seconds(n int) string {
	if n == 1 {
		return "1 second"
	}
	return fmt.Sprintf("%d seconds", n)
}
