package apidocs

import (
	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/x402"
)

// ErrorCode documents one stable error code of the SPEC §6 shape.
type ErrorCode struct {
	Code      string
	Status    int
	Retryable bool
	Meaning   string
}

// ErrorCodes are the codes of the one error shape, in the order the docs
// list them. Clients switch on them, so the docs must name every one the
// service sends.
var ErrorCodes = []ErrorCode{
	{apierr.CodeInvalidRequest, 422, false, "The request breaks the contract; `fields` names each problem with a concrete fix. Checked before any payment logic: an invalid request is never offered for sale."},
	{apierr.CodePayloadTooLarge, 413, false, "The body is over the absolute size limit; the message says the limit."},
	{apierr.CodeUnauthorized, 401, false, "A missing, bad, expired or replayed `X-Wallet-Auth` credential."},
	{apierr.CodeNotFound, 404, false, "No such route or record."},
	{apierr.CodeMethodNotAllowed, 405, false, "Known path, wrong method; the `Allow` header lists the right ones."},
	{apierr.CodeUnsupportedMediaType, 415, false, "The body is not declared as JSON."},
	{apierr.CodeRateLimited, 429, true, "Too many requests; retry after `retry_after` seconds."},
	{apierr.CodeInternal, 500, true, "A fault of ours; nothing was charged."},
	{"upstream_response_too_large", 502, false, "The upstream answer exceeded the gateway's buffer; nothing was charged."},
	{apierr.CodeUpstreamUnavailable, 503, true, "A daemon, the state store or the payment facilitator is down; retry the same request after `retry_after` seconds."},
	{x402.ReasonSettlementPending, 503, true, "A payment was submitted but its settlement outcome is not known yet; no content was released. Do not sign a new payment: retry the same request later."},
}

// PaymentCode documents one refusal reason of a 402 (or a 400 for a payment
// header that does not decode): the `reason` member of the body.
type PaymentCode struct {
	Code    string
	Meaning string
}

// PaymentCodes are the refusal reasons a 402 body carries in `reason`
// (x402 reasons plus the gateway's own); the free allowance's
// free_trial_exhausted also appears in `free_trial.code`.
var PaymentCodes = []PaymentCode{
	{"free_trial_exhausted", "Today's free allowance is used; pay with x402 or come back after `free_trial.resets_at` (next UTC midnight)."},
	{x402.ReasonPaymentAlreadyUsed, "This authorization was already settled; sign a new payment (new nonce). You were not charged again."},
	{"payment_in_flight", "Another request is using this authorization right now; never reuse a payment, sign a new one if you need a second call."},
	{"no_matching_requirements", "The `accepted` requirements in PAYMENT-SIGNATURE match none of the offers in PAYMENT-REQUIRED."},
	{x402.ReasonInvalidPayload, "PAYMENT-SIGNATURE is not valid base64 JSON of an x402 v2 PaymentPayload (a 400), or its payload is malformed."},
	{x402.ReasonInvalidVersion, "PAYMENT-SIGNATURE is not x402 version 2 (a 400)."},
	{x402.ReasonInsufficientFunds, "The payer's balance is below the price."},
	{x402.ReasonExactEVMInsufficientBalance, "The payer's token balance is below the price (exact EVM)."},
	{x402.ReasonExactEVMSignature, "The EIP-3009 signature does not recover to the payer."},
	{x402.ReasonExactEVMValueMismatch, "The authorized value differs from the price."},
	{x402.ReasonExactEVMRecipientMismatch, "The authorization pays someone other than `payTo`."},
	{x402.ReasonExactEVMValidBefore, "The authorization expires too soon (or has expired)."},
	{x402.ReasonExactEVMValidAfter, "The authorization is not valid yet."},
	{x402.ReasonExactEVMNonceAlreadyUsed, "The EIP-3009 nonce was already used on chain."},
	{x402.ReasonUnexpectedSettleError, "Settlement failed for a reason the facilitator did not name; nothing was charged."},
}
