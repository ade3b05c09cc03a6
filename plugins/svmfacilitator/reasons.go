package svmfacilitator

import "github.com/aovhq/aov/x402"

// Reason codes, spelled as the reference TypeScript facilitator
// (@x402/svm 2.27, exact scheme) spells them, so clients and gateways that
// switch on them read our answers like the reference's. The Go SDK spells
// the same checks invalid_exact_solana_*.
const (
	ReasonUnsupportedScheme            = "invalid_exact_svm_unsupported_scheme"
	ReasonNetworkMismatch              = "invalid_exact_svm_network_mismatch"
	ReasonMissingFeePayer              = "invalid_exact_svm_payload_missing_fee_payer"
	ReasonFeePayerNotManaged           = "invalid_exact_svm_fee_payer_not_managed_by_facilitator"
	ReasonTransactionCouldNotBeDecoded = "invalid_exact_svm_payload_transaction_could_not_be_decoded"
	ReasonSignatureInvalid             = "invalid_exact_svm_payload_signature_invalid"
	ReasonExcessiveSigners             = "invalid_exact_svm_payload_excessive_signers"
	ReasonInstructionsLength           = "invalid_exact_svm_payload_transaction_instructions_length"
	ReasonComputeLimitInstruction      = "invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction"
	ReasonComputeLimitTooHigh          = "invalid_exact_svm_payload_transaction_instructions_compute_limit_instruction_too_high"
	ReasonComputePriceInstruction      = "invalid_exact_svm_payload_transaction_instructions_compute_price_instruction"
	ReasonComputePriceTooHigh          = "invalid_exact_svm_payload_transaction_instructions_compute_price_instruction_too_high"
	ReasonNoTransferInstruction        = "invalid_exact_svm_payload_no_transfer_instruction"
	ReasonFeePayerTransferringFunds    = "invalid_exact_svm_payload_transaction_fee_payer_transferring_funds"
	ReasonMintMismatch                 = "invalid_exact_svm_payload_mint_mismatch"
	ReasonRecipientMismatch            = "invalid_exact_svm_payload_recipient_mismatch"
	ReasonAmountMismatch               = "invalid_exact_svm_payload_amount_mismatch"
	ReasonUnknownFourthInstruction     = "invalid_exact_svm_payload_unknown_fourth_instruction"
	ReasonUnknownFifthInstruction      = "invalid_exact_svm_payload_unknown_fifth_instruction"
	ReasonUnknownSixthInstruction      = "invalid_exact_svm_payload_unknown_sixth_instruction"
	ReasonUnknownSeventhInstruction    = "invalid_exact_svm_payload_unknown_seventh_instruction"
	ReasonMemoCount                    = "invalid_exact_svm_payload_memo_count"
	ReasonMemoMismatch                 = "invalid_exact_svm_payload_memo_mismatch"
	ReasonSimulationFailed             = "invalid_exact_svm_transaction_simulation_failed"
	ReasonFeePayerMismatch             = "invalid_exact_svm_fee_payer_mismatch"
	ReasonTransactionFailed            = x402.ReasonExactSVMTransactionFailed
	ReasonDuplicateSettlement          = x402.ReasonDuplicateSettlement
	ReasonSettlementPending            = x402.ReasonSettlementPending
	// ReasonLookupTables is the reference's code for a transaction with
	// address lookup tables it cannot resolve; a payment needs none, so
	// this facilitator refuses every such transaction with it.
	ReasonLookupTables = "invalid_exact_svm_smart_wallet_alt_resolution_not_available"
	// ReasonPayerFailureBudget and ReasonFailureBudgetPriorityFee are this
	// facilitator's own (budget.go): a payer whose settlements keep failing
	// on chain, each at the fee payer's cost, is refused for a while, and
	// while failures overall are past their budget a payment may ask the
	// fee payer for a small priority fee only.
	ReasonPayerFailureBudget       = "invalid_exact_svm_payer_failure_budget_exhausted"
	ReasonFailureBudgetPriorityFee = "invalid_exact_svm_failure_budget_priority_fee_too_high"
)
