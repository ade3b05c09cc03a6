package apidocs

import (
	"encoding/json"
	"fmt"
	"strings"

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
	{apierr.CodeInvalidRequest, 422, false, "The request breaks the contract; `fields` names each problem with a concrete fix. Checked before any payment logic: an invalid request is never offered for sale (a payment the gateway cannot read is that payment's 400 whatever the request), but by a gateway too busy to check it, whose 402 then says so in its `error` and whose paid call is still refused with this 422, nothing charged. Seller mode (`verify_response`) answers it with 400, naming `task_id` or `agent_id`, for a request whose URL or headers make that id over 200 characters or not UTF-8 text; the upstream did not run and nothing was charged. A gate answers it with 400, naming `url`, for a request target that is not a path (`*`, or an absolute-form that is opaque or has no path), before any payment logic."},
	{apierr.CodeInvalidMessage, 400, false, "MCP only: the body is not one JSON-RPC 2.0 message the server fully reads (not JSON, a batch, an unknown member, a name twice, two names equal in another letter case in the envelope, `params`, `_meta` or among a tool's own argument names, a member of the wrong type (`params.inputResponses` not an object, `params.requestState` not a string), a long or object id, a numeric id written with a fraction or exponent such as `1.5` or `1e0` or an integer id beyond ±(2^53−1), which the MCP SDK would answer under another id, a number no double holds exactly, such as `1e400` or an integer beyond ±(2^53−1), a string with an unpaired surrogate escape such as `\"\\ud800\"`, or nesting deeper than the 64 levels a tool call's `arguments` may nest (two more for the message around them), anywhere but inside a tool call's `arguments`; or a `Content-Type` that declares a charset other than UTF-8, names a charset twice, or is sent twice, so the gate could not tell which call it is). HTTP 400 as MCP's Streamable HTTP transport requires, with a JSON-RPC error (-32700 parse error or -32600 invalid request, `id` null) whose `data` is this error; `fields` names the member. Nothing was charged and nothing reached a tool. Wrong tool arguments (such a number, string or nesting inside them included, named by their path below `arguments`) are `invalid_request` in an `isError` tool result instead, as REST answers 422."},
	{apierr.CodePayloadTooLarge, 413, false, "The body is over the absolute size limit; the message says the limit."},
	{apierr.CodeURITooLong, 414, false, "The request URL (scheme, host and path; the query does not count) is longer than a 402 may name as its resource (the message says the limit). Checked before any payment logic: nothing was charged, no payment was claimed and no free call was spent."},
	{apierr.CodeUnauthorized, 401, false, "A missing, bad, expired or replayed `X-Wallet-Auth` credential."},
	{"forbidden", 403, false, "The credential is valid but does not grant this (for example a wallet proof for an agent id another wallet owns); a fresh credential of the same caller does not change it."},
	{apierr.CodeNotFound, 404, false, "No such route or record."},
	{apierr.CodeMethodNotAllowed, 405, false, "Known path, wrong method; the `Allow` header lists the right ones."},
	{apierr.CodeUnsupportedMediaType, 415, false, "The body is not declared as JSON; or, at a gate with `validate verify_request`, its `Content-Type` declares a charset other than UTF-8 (`fields` names `Content-Type`), refused before anything is offered, claimed or counted."},
	{"upgrade_unsupported", 400, false, "The request asks to switch protocols (`Connection: Upgrade`, a WebSocket) on a route that cannot sell a tunnel: one whose answers `verify_response` checks, whatever `settle_on` says (a tunnel can be neither held nor verified), or an MCP endpoint priced per tool (`mcp_tool`); or, on any route, `Upgrade` does not name one protocol alone as a token (a list, or a value with other bytes), so the upstream could switch to a protocol the proxy does not relay; or, at any gate, the switch comes over HTTP/2 or HTTP/3 (an extended CONNECT, a WebSocket), which the gateway sells only over HTTP/1.1. Refused before the upstream runs, and before any payment is claimed or verified or a free call counted once the gate knows the route (see `settle_on`; a list, a malformed `Upgrade` or an extended CONNECT always); no free call was counted, and nothing was charged unless `charged` says a payment settled before (`settle before`). Send the request without `Upgrade`, or (for a list) with one protocol."},
	{apierr.CodeRateLimited, 429, true, "Too many requests; retry after `retry_after` seconds."},
	{apierr.CodeInternal, 500, true, "A fault of ours; nothing was charged."},
	{"upstream_answer_unreadable", 502, false, "An MCP tool's answer could not be read by the gateway, or is not one the client takes as its call's answer (it must be application/json, not a stream, and one JSON-RPC 2.0 answer under the call's id, with no method: a result the official SDK decodes as a CallToolResult, or an error alone that it decodes as a JSON-RPC error); the tool's answer was withheld and nothing was charged; the tool ran, so it counts against the client's `rate_limit` as any unsettled call does; tell the operator."},
	{"upstream_response_too_large", 502, false, "The upstream answer exceeded the gateway's buffer; nothing was charged."},
	{"no_upstream", 502, false, "Nothing behind the route's payment gate answered the call: a configuration error of this server (no `reverse_proxy` or other handler that answers after `x402` in its block; `verify_response` only checks an answer). Nothing was charged and no free call was counted; tell the operator."},
	{apierr.CodeUpstreamUnavailable, 503, true, "A daemon, the state store or the payment facilitator is down (in seller mode also the verification service, or the agent card with its receipt keys); retry the same request after `retry_after` seconds. It counts against the client's `rate_limit` when something worked for the call: an upstream or MCP tool that answered an error or ran past its timeout, and any answer withheld because the verification service or the agent card failed or could not be reached (they are asked only once the upstream answered); not when the upstream could not be connected to at all, nor for a state store or facilitator outage (but it does when the client went away while the facilitator verified its payment: the facilitator worked for it)."},
	{apierr.CodeVerificationTimeout, 503, true, "The verification did not finish within its wall-clock limit (verifierd's -verify-timeout, default 5 s) on a loaded machine, or a gateway with validate verify_request did not get the client's turn to compile a schema (one of its requests at a time; for a request whose payment the facilitator verified, its payer's turn and a slot of the gateway's checks of paid requests) within 5 s (that wait counts against the client's `rate_limit` as its 402 would); nothing was charged. Retry after `retry_after` seconds, or send a smaller output or simpler schema. (Deterministic budgets, such as a pattern too costly for its strings, are 422 invalid_request.)"},
	{"output_failed_verification", 502, false, "Seller mode (`verify_response` with `on_fail block`): the seller agent's answer failed verification and was withheld; the body carries the verifier's hints. Nothing was charged."},
	{"response_unverifiable", 503, true, "Seller mode: the seller agent's answer could not be verified (not JSON, compressed, two `Content-Type` or `Content-Encoding` values, two member names of one object equal when letter case is ignored, too large, or the verifier refused it; behind `x402` with `settle_on pass`, also an answer below 400 with a body or a `Location` (a redirect) that no `verify_response` checked); nothing was charged, retry later."},
	{x402.ReasonSettlementPending, 503, true, "A payment was submitted but its settlement outcome is not known yet, or it settled and could not be recorded yet (`charged` true); no content was released. Do not sign a new payment: retry the same request later."},
	// x402's payment-identifier extension (the gate's payment_identifier option).
	{"invalid_payment_identifier", 400, false, "The payment's `extensions[\"payment-identifier\"].info.id` is not a string of 16 to 128 characters from `a-z A-Z 0-9 _ -`; nothing was claimed or charged, send the payment again with a well-formed id."},
	{"payment_identifier_required", 400, false, "The route requires a payment identifier and the payment carries none: echo the `payment-identifier` extension of PAYMENT-REQUIRED with `info.id` set; nothing was claimed or charged."},
	{"payment_identifier_conflict", 409, false, "The payment identifier is already bound to another payment or another request (within the route's window); nothing was charged. Use a new identifier for a new request."},
	{"payment_identifier_in_progress", 409, true, "A call with this payment identifier and this very payment is still being served; nothing was charged for this one. Retry the same request after `retry_after` seconds to get its answer."},
	{"payment_identifier_answer_not_kept", 409, false, "This payment identifier's call was paid and answered, but its answer was over the route's `max_answer` (or streamed, in settle before mode) and was not kept for retries; PAYMENT-RESPONSE names the settlement. Nothing was charged again."},
}

// PaymentCode documents one refusal reason of a payment: the `reason`
// member of a 402 body (or of a 400 for a payment header that does not
// decode), `_meta.reason` of an MCP payment-required result, and the
// facilitator's invalidReason / errorReason. Meaning says what happened and
// what the payer should do.
type PaymentCode struct {
	Code    string
	Meaning string
}

// PaymentCodes are every payment reason the code base can send: the
// gateway's own, then those of a payment header that does not decode, then
// the facilitator's verdicts (x402 names, as the specification and the
// reference facilitators spell them). A test walks the source for reason
// and code constants and fails when one is missing here.
var PaymentCodes = []PaymentCode{
	// The gateway's own.
	{"free_trial_exhausted", "Today's free allowance is used; pay with x402 or come back after `free_trial.resets_at` (next UTC midnight)."},
	{x402.ReasonPaymentAlreadyUsed, "This authorization was already settled; sign a new payment (new nonce). You were not charged again."},
	{"payment_in_flight", "Another request is using this authorization right now; never reuse a payment, sign a new one if you need a second call."},
	{"no_matching_requirements", "The `accepted` requirements in PAYMENT-SIGNATURE match none of the offers in PAYMENT-REQUIRED; copy one offer of the latest PAYMENT-REQUIRED unchanged into `accepted` and sign that."},

	// A payment header that does not decode (400, nothing sent to a facilitator).
	{x402.ReasonInvalidPayload, "PAYMENT-SIGNATURE is not valid base64 JSON of an x402 v2 PaymentPayload (a 400), or its payload is malformed; rebuild it with an x402 v2 client."},
	{x402.ReasonInvalidVersion, "PAYMENT-SIGNATURE is not x402 version 2 (a 400); send `x402Version: 2` in the PAYMENT-SIGNATURE header (version 1's X-PAYMENT is not accepted)."},

	// Verdicts of the facilitator, passed on as it names them.
	{x402.ReasonInvalidX402Version, "The facilitator refuses the x402 version; pay with x402 version 2."},
	{x402.ReasonInvalidV2Payload, "The facilitator finds the v2 payment payload malformed; rebuild it with an x402 v2 client."},
	{x402.ReasonInvalidV2Requirements, "The facilitator finds the offer malformed: a configuration fault of this server; tell its operator."},
	{x402.ReasonInvalidPaymentRequirements, "The facilitator finds the offer malformed: a configuration fault of this server; tell its operator."},
	{x402.ReasonInvalidNetwork, "The payment is for a network the facilitator does not serve; pay with an offer of PAYMENT-REQUIRED."},
	{x402.ReasonNoFacilitatorForNetwork, "No facilitator is configured for the payment's network; pay with another offer of PAYMENT-REQUIRED."},
	{x402.ReasonInvalidScheme, "The payment's scheme is not the offer's; pay with scheme `exact` as offered."},
	{x402.ReasonUnsupportedScheme, "The facilitator does not support this scheme; pay with an offer of PAYMENT-REQUIRED."},
	{x402.ReasonUnsupportedPayloadType, "The payload type is not supported (for example Permit2); sign an EIP-3009 `transferWithAuthorization`."},
	{x402.ReasonInsufficientFunds, "The payer's balance is below the price; fund the wallet and sign a new payment."},
	{x402.ReasonInvalidTransactionState, "The payment transaction is in a state the facilitator cannot settle; sign a new payment."},
	{x402.ReasonUnexpectedVerifyError, "The facilitator could not check the payment for a reason it did not name; nothing was charged, try again."},
	{x402.ReasonUnexpectedSettleError, "Settlement failed for a reason the facilitator did not name; nothing was charged."},
	{x402.ReasonFacilitatorUnavailable, "The facilitator could not settle the payment now and sent nothing (its configuration was being unloaded, or it could not read its chain or store); nothing was charged, send the same payment again."},
	{x402.ReasonExactEVMScheme, "The payment is not an `exact` EVM payment; pay with an offer of PAYMENT-REQUIRED."},
	{x402.ReasonExactEVMNetworkMismatch, "The payment is for another chain than the offer; sign it for the offer's `network`."},
	{x402.ReasonExactEVMRecipientMismatch, "`authorization.to` is not the offer's `payTo`; sign a payment to `payTo`."},
	{x402.ReasonSpecRecipientMismatch, "The x402 specification's name for a recipient other than `payTo`; sign a payment to `payTo`."},
	{x402.ReasonExactEVMValueMismatch, "The authorized value is not exactly the offer's `amount`; sign exactly `amount`."},
	{x402.ReasonExactEVMValidBefore, "The authorization has expired or expires within 6 seconds; sign a new one with a later `validBefore`."},
	{x402.ReasonExactEVMValidAfter, "The authorization is not valid yet (`validAfter` is in the future); sign one valid now."},
	{x402.ReasonExactEVMMissingEIP712Domain, "The offer lacks the token's EIP-712 `name` and `version`: a configuration fault of this server; tell its operator."},
	{x402.ReasonExactEVMTokenNameMismatch, "The EIP-712 domain name is not the token's; sign with `extra.name` of the offer."},
	{x402.ReasonExactEVMTokenVersionMismatch, "The EIP-712 domain version is not the token's; sign with `extra.version` of the offer."},
	{x402.ReasonExactEVMSignature, "The EIP-3009 signature is malformed, malleable (high s) or not the payer's; sign again with the payer's key."},
	{x402.ReasonSpecSignature, "The x402 specification's name for a signature that does not verify; sign again with the payer's key."},
	{x402.ReasonExactEVMUndeployedSmartWallet, "The payer is a smart wallet that is not deployed yet; deploy it (or use an ERC-6492 signature) and sign again."},
	{x402.ReasonSmartWalletDeploymentFailed, "Deploying the payer's smart wallet failed; nothing was charged."},
	{x402.ReasonExactEVMEIP3009NotSupported, "The asset does not support EIP-3009 `transferWithAuthorization`; pay with an offer whose asset does (USDC)."},
	{x402.ReasonExactEVMNonceAlreadyUsed, "The chain has already used this authorization's nonce. When the answer names a `transaction`, this very payment was already settled by it: do not pay again (a retry of /settle after a lost reply gets this, and so does a second, concurrent /settle of the same payment, or one outrun by another facilitator's or anyone's transaction of it, which answers for it). Otherwise the payer cancelled it or spent the nonce on another authorization; sign a new payment with a fresh nonce. A gate that can read the chain answers its payer's payment that its own facilitator settled `payment_already_used` instead, or `settlement_pending` while the transaction that used the nonce cannot be found or read."},
	{x402.ReasonExactEVMInsufficientBalance, "The payer's token balance is below the price; fund the wallet and sign a new payment."},
	{x402.ReasonExactEVMSimulationFailed, "The transfer would fail on chain (simulation), or needs more gas than the facilitator spends on one settlement (a contract wallet whose signature check is too costly); check the balance and the authorization, then sign a new payment."},
	{x402.ReasonExactEVMTransactionFailed, "The settlement transaction reverted or transferred nothing; nothing was charged, sign a new payment."},
	{x402.ReasonExactEVMFailedToExecuteTransfer, "The token refused the transfer; nothing was charged, check the balance and sign a new payment."},
	{x402.ReasonExactEVMFailedToGetReceipt, "The settlement was sent but its receipt could not be read: the outcome is unknown, so no content was released (503); do not pay again, retry the same request later."},
	{"invalid_exact_evm_payer_failure_budget_exhausted", "This payer's recent settlements reverted on chain (by default 3 within an hour), each at the relayer's gas, or too many of its settlements are in flight at once (by default 16; for a payer whose account has code (a contract, or an account delegating its code under EIP-7702), its settlements in flight count with its reverts against the 3); nothing was charged or sent. Pay again after the window, or once your settlements in flight are confirmed; keep the tokens and the authorization in place until a payment settles."},
	// Solana (exact scheme, the facilitator of plugins/svmfacilitator; names as the reference TypeScript facilitator spells them).
	{"invalid_exact_svm_unsupported_scheme", "The Solana payment is not an `exact` payment; pay with an offer of PAYMENT-REQUIRED."},
	{"invalid_exact_svm_network_mismatch", "The Solana payment is for another cluster than the offer; sign it for the offer's `network`."},
	{"invalid_exact_svm_payload_missing_fee_payer", "The offer names no fee payer (`extra.feePayer`): a configuration fault of this server; tell its operator."},
	{"invalid_exact_svm_fee_payer_not_managed_by_facilitator", "The transaction's fee payer is not one of the facilitator's; build it with the offer's `extra.feePayer`."},
	{"invalid_exact_svm_fee_payer_mismatch", "The transaction's fee payer is not the offer's `extra.feePayer`; build it with that fee payer."},
	{"invalid_exact_svm_payload_transaction_could_not_be_decoded", "The payload's transaction does not decode; build it with an x402 Solana client."},
	{"invalid_exact_svm_payload_signature_invalid", "A required signature of the transaction is missing or does not verify; sign again with the payer's key."},
	{"invalid_exact_svm_payload_excessive_signers", "The transaction asks for more signers than a payment needs; build a plain payment transaction."},
	{"invalid_exact_svm_payload_transaction_instructions_length", "The transaction has too few or too many instructions for a payment; build a plain payment transaction."},
	{"invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction", "The compute-unit limit instruction is missing or malformed; build the transaction with an x402 Solana client."},
	{"invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction_too_high", "The compute-unit limit is above what the facilitator pays for; lower it."},
	{"invalid_exact_svm_payload_transaction_instructions_compute_price_instruction", "The compute-unit price instruction is missing or malformed; build the transaction with an x402 Solana client."},
	{"invalid_exact_svm_payload_transaction_instructions_compute_price_instruction_too_high", "The compute-unit price is above what the facilitator pays; lower it."},
	{"invalid_exact_svm_payload_no_transfer_instruction", "The transaction has no token transfer; sign a transfer of `amount` to `payTo`."},
	{"invalid_exact_svm_payload_transaction_fee_payer_transferring_funds", "The fee payer appears in a transfer; only the payer's tokens may move."},
	{"invalid_exact_svm_payload_mint_mismatch", "The transfer moves another token than the offer's `asset`; pay in that mint."},
	{"invalid_exact_svm_payload_recipient_mismatch", "The transfer pays someone other than `payTo`; sign a transfer to `payTo`."},
	{"invalid_exact_svm_payload_amount_mismatch", "The transfer is not exactly the offer's `amount`; sign exactly `amount`."},
	{"invalid_exact_svm_payload_unknown_fourth_instruction", "The transaction's fourth instruction is not one a payment may carry; build a plain payment transaction."},
	{"invalid_exact_svm_payload_unknown_fifth_instruction", "The transaction's fifth instruction is not one a payment may carry; build a plain payment transaction."},
	{"invalid_exact_svm_payload_unknown_sixth_instruction", "The transaction's sixth instruction is not one a payment may carry; build a plain payment transaction."},
	{"invalid_exact_svm_payload_unknown_seventh_instruction", "The transaction's seventh instruction is not one a payment may carry; build a plain payment transaction."},
	{"invalid_exact_svm_payload_memo_count", "The transaction carries more memos than allowed; send at most one."},
	{"invalid_exact_svm_payload_memo_mismatch", "The memo is not the one the offer asks for; use the offer's memo."},
	{"invalid_exact_svm_smart_wallet_alt_resolution_not_available", "The transaction uses address lookup tables, which a payment never needs; build it without them."},
	{"invalid_exact_svm_transaction_simulation_failed", "The transaction would fail on chain (simulation) for something of the payer's (its token balance, its accounts, the blockhash, the signatures); check the balance and the transaction, then sign a new payment; a priority fee larger than the facilitator's fee payer can pay is refused too: sign one with a lower priority fee. A fee payer that cannot pay even a payment's base fee is no refusal: the server answers 503 and nothing is charged (at verify; one drained between verify and settle leaves the payment `settlement_pending`: settled once the fee payer is funded again while its blockhash is valid, else a new payment is asked for once it expired)."},
	{"invalid_exact_svm_transaction_failed", "The settlement transaction failed on chain; nothing was charged, sign a new payment."},
	{"invalid_exact_svm_payer_failure_budget_exhausted", "This payer's recent settlements failed on chain (by default 3 within an hour), each at the fee payer's cost, or too many of its settlements are in flight at once (by default 16); nothing was charged or sent. Pay again after the window, or once your settlements in flight are confirmed; keep the tokens in place until a payment settles."},
	{"invalid_exact_svm_failure_budget_priority_fee_too_high", "Settlements that failed on chain have used the facilitator's budget for failures for now (by default 0.005 SOL within an hour), so a payment may ask for a priority fee (compute unit limit × price) of at most a small cap (by default 5,000 lamports; the message says the cap); nothing was charged or sent. Sign a new payment with a lower compute unit price: the official client's (1 micro-lamport per unit) always passes."},
	{"duplicate_settlement", "The facilitator has already settled (or is settling) this exact transaction; never reuse a payment, sign a new one."},
}

// errorCodeTable is the markdown table of ErrorCodes, as llms.txt and the
// OpenAPI description show it.
func errorCodeTable() string {
	var b strings.Builder
	b.WriteString("| code | HTTP | retryable | meaning |\n|---|---|---|---|\n")
	for _, e := range ErrorCodes {
		fmt.Fprintf(&b, "| `%s` | %d | %s | %s |\n", e.Code, e.Status, yesNo(e.Retryable), e.Meaning)
	}
	return b.String()
}

// paymentCodeTable is the markdown table of PaymentCodes.
func paymentCodeTable() string {
	var b strings.Builder
	b.WriteString("| reason | meaning and what to do |\n|---|---|\n")
	for _, p := range PaymentCodes {
		fmt.Fprintf(&b, "| `%s` | %s |\n", p.Code, p.Meaning)
	}
	return b.String()
}

// errorCodeEnum lists the codes of ErrorCodes, for the Error schema.
func errorCodeEnum() []any {
	out := make([]any, len(ErrorCodes))
	for i, e := range ErrorCodes {
		out[i] = e.Code
	}
	return out
}

// exampleInvalid is the 422 the docs show: the real answer to an unknown
// rule type, built by apierr, so the example cannot drift from what the
// service sends.
func exampleInvalid() *apierr.Error {
	return apierr.Invalid(apierr.Field{
		Field:   "rules[0].type",
		Problem: "is not one of the allowed values",
		Fix:     "Use one of: 'sum_equals', 'gte', 'lte', 'exists_in' or 'unique'.",
	})
}

// exampleJSON is v as indented JSON, for examples in markdown.
func exampleJSON(v any) string {
	b, _ := json.MarshalIndent(v, "", "  ") // the fixed examples above always marshal
	return string(b)
}
