package x402

// Reason codes travel in VerifyResponse.InvalidReason,
// SettleResponse.ErrorReason and PaymentRequired.Error. They are stable
// strings that clients switch on, so they are spelled exactly as the x402
// specification and the reference implementations spell them; the few this
// product adds are marked as ours.
const (
	// Specification §9 codes.
	ReasonInsufficientFunds          = "insufficient_funds"
	ReasonInvalidNetwork             = "invalid_network"
	ReasonInvalidPayload             = "invalid_payload"
	ReasonInvalidPaymentRequirements = "invalid_payment_requirements"
	ReasonInvalidScheme              = "invalid_scheme"
	ReasonUnsupportedScheme          = "unsupported_scheme"
	ReasonInvalidX402Version         = "invalid_x402_version"
	ReasonInvalidTransactionState    = "invalid_transaction_state"
	ReasonUnexpectedVerifyError      = "unexpected_verify_error"
	ReasonUnexpectedSettleError      = "unexpected_settle_error"

	// Specification §9 names for the exact EVM checks.
	ReasonSpecValidAfter        = "invalid_exact_evm_payload_authorization_valid_after"
	ReasonSpecValidBefore       = "invalid_exact_evm_payload_authorization_valid_before"
	ReasonSpecValueMismatch     = "invalid_exact_evm_payload_authorization_value_mismatch"
	ReasonSpecSignature         = "invalid_exact_evm_payload_signature"
	ReasonSpecRecipientMismatch = "invalid_exact_evm_payload_recipient_mismatch"

	// Exact EVM codes of the reference facilitators (Go SDK names; where the
	// TypeScript SDK differs the comment says so). The local EVM facilitator
	// emits these, so its answers read like the reference's.
	ReasonExactEVMScheme                  = "invalid_exact_evm_scheme"
	ReasonExactEVMNetworkMismatch         = "invalid_exact_evm_network_mismatch"
	ReasonExactEVMRecipientMismatch       = "invalid_exact_evm_recipient_mismatch"
	ReasonExactEVMValueMismatch           = ReasonSpecValueMismatch // TS: invalid_exact_evm_authorization_value
	ReasonExactEVMValidBefore             = ReasonSpecValidBefore
	ReasonExactEVMValidAfter              = ReasonSpecValidAfter
	ReasonExactEVMMissingEIP712Domain     = "invalid_exact_evm_missing_eip712_domain"
	ReasonExactEVMSignature               = "invalid_exact_evm_signature"
	ReasonExactEVMUndeployedSmartWallet   = "invalid_exact_evm_payload_undeployed_smart_wallet"
	ReasonExactEVMEIP3009NotSupported     = "invalid_exact_evm_eip3009_not_supported"
	ReasonExactEVMNonceAlreadyUsed        = "invalid_exact_evm_nonce_already_used"
	ReasonExactEVMTokenNameMismatch       = "invalid_exact_evm_token_name_mismatch"
	ReasonExactEVMTokenVersionMismatch    = "invalid_exact_evm_token_version_mismatch"
	ReasonExactEVMInsufficientBalance     = "invalid_exact_evm_insufficient_balance"
	ReasonExactEVMSimulationFailed        = "invalid_exact_evm_transaction_simulation_failed"
	ReasonExactEVMTransactionFailed       = "invalid_exact_evm_transaction_failed"
	ReasonExactEVMFailedToExecuteTransfer = "invalid_exact_evm_failed_to_execute_transfer"
	ReasonExactEVMFailedToGetReceipt      = "invalid_exact_evm_failed_to_get_receipt"
	ReasonUnsupportedPayloadType          = "unsupported_payload_type"
	ReasonSmartWalletDeploymentFailed     = "smart_wallet_deployment_failed"

	// Exact SVM codes of the reference TypeScript facilitator that a
	// client of any facilitator must tell apart (HTTPFacilitator.Settle):
	// the Solana facilitator's own list is in its package.
	ReasonExactSVMTransactionFailed = "invalid_exact_svm_transaction_failed"
	ReasonDuplicateSettlement       = "duplicate_settlement"

	// Reference Go core codes.
	ReasonInvalidVersion          = "invalid_version"
	ReasonInvalidV2Payload        = "invalid_v2_payload"
	ReasonInvalidV2Requirements   = "invalid_v2_requirements"
	ReasonNoFacilitatorForNetwork = "no_facilitator_for_network"

	// ReasonNoMatchingRequirements is the PaymentRequired.Error text the
	// reference servers send when the client's accepted matches no offer.
	ReasonNoMatchingRequirements = "No matching payment requirements"

	// ReasonPaymentAlreadyUsed is ours (also used by traefik-x402): the
	// gateway has already seen this authorization, either settled or in
	// flight in a concurrent request, so it refuses the replay before asking
	// any facilitator. The payer is not charged again; a fresh payment with a
	// new nonce is needed.
	ReasonPaymentAlreadyUsed = "payment_already_used"

	// ReasonFacilitatorUnavailable is ours: the facilitator could not
	// settle the payment now (its configuration was unloaded, its chain or
	// store could not be read before anything was sent) and sent nothing.
	// Nothing was charged; the same payment may be sent again. Unlike
	// unexpected_settle_error, which the official facilitators also
	// answer for sends they could not see through, it never means the
	// payment may have settled.
	ReasonFacilitatorUnavailable = "facilitator_unavailable"

	// ReasonSettlementPending is ours (later reference SDKs use the same
	// name): the settlement was submitted but its outcome is not known yet.
	// It is never a reason to pay again.
	ReasonSettlementPending = "settlement_pending"
)
