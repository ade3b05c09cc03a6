package x402

import (
	"context"
	"time"
)

// SettlementState is what a facilitator can tell of an authorization's
// settlement after the fact.
type SettlementState int

const (
	// SettlementUndecided: the transfer has not happened but may still
	// (the authorization is unused and not yet expired). Ask again later.
	SettlementUndecided SettlementState = iota
	// SettlementDone: the transfer happened.
	SettlementDone
	// SettlementNever: the transfer did not happen and can no longer
	// happen (the authorization expired unused, or its nonce was spent
	// without paying: cancelled, or used by another authorization), or it
	// can never be this caller's: it happened for another settlement,
	// which answers for it (Reason duplicate_settlement, naming its
	// Transaction: a Solana payment whose record of its send another
	// facilitator marked answered; an EIP-3009 transfer sent by another
	// than the settling facilitator's signers), and serving it here too
	// would serve one payment twice.
	SettlementNever
)

// SettlementStatus is a facilitator's answer to "did this authorization
// settle?".
type SettlementStatus struct {
	State SettlementState
	// Payer is the paying address, when known.
	Payer string
	// Transaction is the settling transaction, when known ("" otherwise:
	// a done transfer whose transaction the facilitator cannot name).
	Transaction string
	// Reason is why a SettlementNever can never settle, as an x402 reason
	// code, when it is not the payment's expiry ("" otherwise): the buyer
	// is told it with the release.
	Reason string
}

// SettlementChecker is implemented by facilitators that can tell whether a
// payment's authorization settled without settling it again, so that a
// settlement whose outcome was unknown (the facilitator timed out after
// sending) can be resolved: served when the money moved, released when it
// provably never will. For EIP-3009 the evm facilitator reads the token's
// authorizationState(authorizer, nonce) on chain and, when the nonce is
// used, the transaction that used it (a used nonce alone is no payment: the
// payer can cancel it or spend it on another authorization).
type SettlementChecker interface {
	SettlementStatus(ctx context.Context, p PaymentPayload, req PaymentRequirements) (SettlementStatus, error)
}

// SentSettlementChecker is implemented by facilitators (or their clients)
// that judge a settlement also from what the gate knows of the attempt
// (SentSettlement): on Solana the transaction's id is the facilitator's own
// fee-payer signature, which nothing else tells, and without it the
// transaction is searched for on chain, no further back than the attempt;
// on EIP-3009 chains the transaction that used the authorization's nonce is
// searched for in the blocks from the attempt on, to prove it paid. The
// checker must establish that a named transaction is the payment's own
// before it judges by it.
type SentSettlementChecker interface {
	SentSettlementStatus(ctx context.Context, p PaymentPayload, req PaymentRequirements, sent SentSettlement) (SettlementStatus, error)
}

// SentSettlement is what a gate knows of a settlement attempt whose outcome
// is unknown.
type SentSettlement struct {
	// Transaction is the transaction the facilitator named when it reported
	// the outcome unknown (UnknownOutcomeError.Reply.Transaction), "" when
	// it named none (its reply was lost whole).
	Transaction string
	// After is a time before which the settlement was not asked for (zero:
	// not known), so its transaction cannot have landed earlier.
	After time.Time
	// SettledOnly asks only whether the transfer happened: an EIP-3009
	// authorization whose nonce is unused is answered undecided after that
	// one read, without the head block's time that would tell it can
	// never settle. A gate asking about a payment it holds nothing of
	// (settledEarlier) needs no more, and pays no more for a payment that
	// never settled.
	SettledOnly bool
	// Signers are the addresses the settling facilitator sent its
	// transactions from when the attempt was made (an EVM relayer, a
	// remote's /supported signers), as the gate recorded them with the
	// held payment; nil when none were recorded. A transfer one of them
	// sent is the settlement's even when the facilitator signs with
	// others now (a relayer key changed since): judged by today's alone,
	// the gate's own transfer would be another settlement's, and its
	// charged buyer refused.
	Signers []string
}
