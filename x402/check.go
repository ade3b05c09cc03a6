package x402

import (
	"errors"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// ValidBeforeMargin is how long an authorization must stay valid after
// verification (the reference facilitator's 6 seconds): time for the
// settlement transaction to be mined before it expires.
const ValidBeforeMargin = 6 * time.Second

// ExactEVMCheck is what CheckExactEVM proved about a payment.
type ExactEVMCheck struct {
	Payload   ExactEVMPayload
	Values    AuthorizationValues
	Signature []byte
	// Recovered reports that Signature is a 65-byte EOA signature that
	// recovers to Values.From. When false the signature is longer (ERC-1271
	// or ERC-6492) and only the chain can check it.
	Recovered bool
}

// CheckExactEVM runs every check of an exact EVM EIP-3009 payment that
// needs no chain, in the reference facilitator's order: version, scheme,
// network, payload form, transfer method, recipient = payTo, value = amount,
// validBefore ≥ now + ValidBeforeMargin, validAfter ≤ now, EIP-712 domain
// present, and the signature (recovered for 65-byte signatures). req is the
// server's own requirements. What remains for a facilitator is on chain:
// nonce unused, balance, smart-wallet signatures, simulation.
//
// A refusal is a *PaymentError whose Reason is the reference code
// (invalid_exact_evm_recipient_mismatch, ..._valid_before, ...); turn it into
// an answer with InvalidResponse. It does not bound validBefore from above:
// the reference Go client signs for an hour whatever maxTimeoutSeconds says,
// so a gateway that wants a shorter window enforces it itself.
func CheckExactEVM(p PaymentPayload, req PaymentRequirements, now time.Time) (ExactEVMCheck, error) {
	var c ExactEVMCheck
	fail := func(reason, field, problem string) (ExactEVMCheck, error) {
		return c, &PaymentError{Kind: ErrInvalidPayment, Reason: reason, Field: field, Problem: problem}
	}
	if p.X402Version != Version {
		return fail(ReasonInvalidX402Version, "x402Version", "must be 2")
	}
	if p.Accepted.Scheme != SchemeExact || req.Scheme != SchemeExact {
		return fail(ReasonExactEVMScheme, "accepted.scheme", "must be exact")
	}
	if p.Accepted.Network != req.Network {
		return fail(ReasonExactEVMNetworkMismatch, "accepted.network", "differs from the requirements' network")
	}
	if _, err := ChainID(req.Network); err != nil {
		return fail(ReasonInvalidNetwork, "network", "is not an eip155 network")
	}
	if m, ok := req.Extra["assetTransferMethod"]; ok && m != "eip3009" {
		return fail(ReasonUnsupportedPayloadType, "extra.assetTransferMethod", "only eip3009 is supported")
	}
	ep, values, err := parseExactEVM(p.Payload)
	if err != nil {
		return c, prefixField(err, "payload")
	}
	c.Payload, c.Values = ep, values
	if err := values.CheckPays(req); err != nil {
		return c, err
	}
	if c.Values.ValidBefore.Cmp(big.NewInt(now.Add(ValidBeforeMargin).Unix())) < 0 {
		return fail(ReasonExactEVMValidBefore, "payload.authorization.validBefore", "is too soon: the authorization expires before it can settle")
	}
	if c.Values.ValidAfter.Cmp(big.NewInt(now.Unix())) > 0 {
		return fail(ReasonExactEVMValidAfter, "payload.authorization.validAfter", "is in the future")
	}
	chainID, name, version, token, err := ExactEVMDomain(req)
	if err != nil {
		return c, err
	}
	if c.Signature, err = ParseSignature(ep.Signature); err != nil {
		return c, prefixField(err, "payload")
	}
	if len(c.Signature) != 65 {
		return c, nil
	}
	digest := TypedDataDigest(DomainSeparator(chainID, name, version, token), c.Values.StructHash())
	signer, err := RecoverAuthorizer(digest, c.Signature)
	if err != nil {
		return c, prefixField(err, "payload")
	}
	if signer != c.Values.From {
		return fail(ReasonExactEVMSignature, "payload.signature", "was not made by the authorization's from address")
	}
	c.Recovered = true
	return c, nil
}

// CheckPays checks that the authorization v pays req: to is its payTo and
// value exactly its amount, CheckExactEVM's checks that need neither the
// clock nor the signature (the signature binds the asset and chain of req,
// as the facilitator recovers it against them). A gate runs it on the
// authorization it read before it claims the payment: a facilitator that
// judged the authorization by itself would settle, and report success
// for, a payment of another value or to another account. A refusal is a
// *PaymentError with the reference reason.
func (v AuthorizationValues) CheckPays(req PaymentRequirements) error {
	if !isHexAddress(req.PayTo) || common.HexToAddress(req.PayTo) != v.To {
		return &PaymentError{Kind: ErrInvalidPayment, Reason: ReasonExactEVMRecipientMismatch, Field: "payload.authorization.to", Problem: "is not the requirements' payTo"}
	}
	if amount, ok := parseUint256(req.Amount); !ok || v.Value == nil || v.Value.Cmp(amount) != 0 {
		return &PaymentError{Kind: ErrInvalidPayment, Reason: ReasonExactEVMValueMismatch, Field: "payload.authorization.value", Problem: "is not the required amount"}
	}
	return nil
}

// prefixField returns err with its *PaymentError field under prefix.
func prefixField(err error, prefix string) error {
	var pe *PaymentError
	if errors.As(err, &pe) {
		cp := *pe
		cp.Field = join(prefix, pe.Field)
		return &cp
	}
	return err
}

// InvalidResponse turns a refusal into the facilitator's answer: isValid
// false with the error's reason code and message. payer is the
// authorization's from address when known (the zero address is omitted).
func InvalidResponse(err error, payer common.Address) VerifyResponse {
	r := VerifyResponse{IsValid: false, InvalidReason: ReasonOf(err), InvalidMessage: err.Error()}
	if payer != (common.Address{}) {
		r.Payer = payer.Hex()
	}
	return r
}
