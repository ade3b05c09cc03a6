package x402

import (
	"context"
	"encoding/json"
)

// Version is the only x402 protocol version this package speaks. Version 1
// (X-PAYMENT headers, maxAmountRequired, network names instead of CAIP-2) is
// refused, as the reference v2 servers do.
const Version = 2

// Scheme names. Only "exact" is implemented; the constant exists so callers
// do not spell it by hand.
const SchemeExact = "exact"

// Header names of the HTTP transport. HTTP header names are case-insensitive;
// these are the canonical spellings of the specification.
const (
	HeaderPaymentRequired  = "PAYMENT-REQUIRED"
	HeaderPaymentSignature = "PAYMENT-SIGNATURE"
	HeaderPaymentResponse  = "PAYMENT-RESPONSE"
)

// Resource describes what is being paid for. URL is the resource's own URL
// (for an MCP tool its server's endpoint, or x402's placeholder
// "mcp://tool/<name>").
type Resource struct {
	URL         string `json:"url"`
	Description string `json:"description,omitempty"`
	MimeType    string `json:"mimeType,omitempty"`
}

// PaymentRequirements is one way to pay that a server accepts. Amount is in
// the asset's atomic units as a canonical decimal string, Network is a CAIP-2
// chain id, and Extra carries scheme data (for exact EVM the EIP-712 domain
// "name" and "version" of the token, and optionally "assetTransferMethod").
type PaymentRequirements struct {
	Scheme            string         `json:"scheme"`
	Network           string         `json:"network"`
	Amount            string         `json:"amount"`
	Asset             string         `json:"asset"`
	PayTo             string         `json:"payTo"`
	MaxTimeoutSeconds int            `json:"maxTimeoutSeconds"`
	Extra             map[string]any `json:"extra,omitempty"`
}

// PaymentRequired is the 402 answer, carried base64-encoded in the
// PAYMENT-REQUIRED header. Error is a short human-readable reason
// ("Payment required", or the verify/settle reason on a failed payment).
type PaymentRequired struct {
	X402Version int                   `json:"x402Version"`
	Error       string                `json:"error,omitempty"`
	Resource    Resource              `json:"resource"`
	Accepts     []PaymentRequirements `json:"accepts"`
	Extensions  map[string]any        `json:"extensions,omitempty"`
}

// PaymentPayload is what a client sends in PAYMENT-SIGNATURE: the
// requirements it chose (Accepted, an unmodified copy of one of the server's
// accepts) and the scheme-specific proof (Payload, kept raw so that it is
// forwarded to a facilitator exactly as received).
type PaymentPayload struct {
	X402Version int                 `json:"x402Version"`
	Resource    *Resource           `json:"resource,omitempty"`
	Accepted    PaymentRequirements `json:"accepted"`
	Payload     json.RawMessage     `json:"payload"`
	Extensions  map[string]any      `json:"extensions,omitempty"`
}

// VerifyResponse is a facilitator's verdict on a payment before settlement.
// IsValid false is an answer (the payment is refused with InvalidReason),
// not a failure of the facilitator.
type VerifyResponse struct {
	IsValid        bool           `json:"isValid"`
	InvalidReason  string         `json:"invalidReason,omitempty"`
	InvalidMessage string         `json:"invalidMessage,omitempty"`
	Payer          string         `json:"payer,omitempty"`
	Extensions     map[string]any `json:"extensions,omitempty"`
}

// SettleResponse is a facilitator's report of a settlement; it is also what
// the gateway sends back in PAYMENT-RESPONSE. Transaction is the transaction
// hash, "" when nothing settled. Amount is set only by schemes that settle
// less than the authorized amount.
type SettleResponse struct {
	Success      bool           `json:"success"`
	ErrorReason  string         `json:"errorReason,omitempty"`
	ErrorMessage string         `json:"errorMessage,omitempty"`
	Payer        string         `json:"payer,omitempty"`
	Transaction  string         `json:"transaction"`
	Network      string         `json:"network"`
	Amount       string         `json:"amount,omitempty"`
	Extensions   map[string]any `json:"extensions,omitempty"`
}

// SupportedKind is one (version, scheme, network) a facilitator can verify
// and settle. Extra carries what clients need to build a payment for it
// (for Solana the facilitator's "feePayer").
type SupportedKind struct {
	X402Version int            `json:"x402Version"`
	Scheme      string         `json:"scheme"`
	Network     string         `json:"network"`
	Extra       map[string]any `json:"extra,omitempty"`
}

// SupportedResponse is a facilitator's GET /supported answer. Signers maps a
// CAIP-2 family pattern ("eip155:*") to the addresses that submit
// settlements, so operators can fund and monitor them.
type SupportedResponse struct {
	Kinds      []SupportedKind     `json:"kinds"`
	Extensions []string            `json:"extensions"`
	Signers    map[string][]string `json:"signers"`
}

// FacilitatorRequest is the body of POST /verify and POST /settle. The
// server always sends its own requirements (the offer Match returned), never
// the client's Accepted copy.
type FacilitatorRequest struct {
	X402Version         int                 `json:"x402Version"`
	PaymentPayload      PaymentPayload      `json:"paymentPayload"`
	PaymentRequirements PaymentRequirements `json:"paymentRequirements"`
}

// Facilitator verifies and settles payments. Implementations: the HTTP
// client of a remote facilitator (NewHTTPFacilitator) and the local EVM
// facilitator.
//
// An error means "no answer" (down, timeout, malformed reply): the gateway
// answers 503 retryable and settles nothing. IsValid false and Success false
// are answers, not errors. A facilitator never reports an unknown settlement
// outcome as a failure: it resolves it (for EIP-3009, from the transaction
// that used the authorization's nonce) or returns an *UnknownOutcomeError,
// which the gateway must not turn into "pay again".
type Facilitator interface {
	Verify(ctx context.Context, p PaymentPayload, req PaymentRequirements) (VerifyResponse, error)
	Settle(ctx context.Context, p PaymentPayload, req PaymentRequirements) (SettleResponse, error)
	Supported(ctx context.Context) (SupportedResponse, error)
}
