package evmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
)

// fees are the gas price a settlement transaction pays: an EIP-1559 tip
// and fee cap (twice the head's base fee plus the tip, so that the
// transaction stays includable while the base fee rises for a few blocks),
// or, on a chain without a base fee, a legacy gas price.
type fees struct {
	tip, feeCap *big.Int // EIP-1559
	price       *big.Int // legacy
}

// quote reads the fees of c's settlement once: the simulations of c
// (simulate) run at the fees its transaction will pay (send).
func (f *Facilitator) quote(ctx context.Context, c *checked) (*fees, error) {
	if c.fees != nil {
		return c.fees, nil
	}
	head, err := f.chain.HeaderByNumber(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("reading the chain head: %w", err)
	}
	if head.BaseFee != nil {
		tip, err := f.chain.SuggestGasTipCap(ctx)
		if err != nil {
			return nil, fmt.Errorf("suggesting a gas tip: %w", err)
		}
		c.fees = &fees{tip: tip, feeCap: new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), tip)}
	} else {
		price, err := f.chain.SuggestGasPrice(ctx)
		if err != nil {
			return nil, fmt.Errorf("suggesting a gas price: %w", err)
		}
		c.fees = &fees{price: price}
	}
	return c.fees, nil
}

// callMsg is a call of data to `to` from the relayer with gas and these
// fees, as the settlement transaction would make it.
func (q *fees) callMsg(from, to common.Address, data []byte, gas uint64) ethereum.CallMsg {
	return ethereum.CallMsg{From: from, To: &to, Data: data, Gas: gas, GasPrice: q.price, GasFeeCap: q.feeCap, GasTipCap: q.tip}
}

// tx is the settlement transaction paying these fees.
func (q *fees) tx(chainID *big.Int, nonce, gas uint64, to common.Address, data []byte) types.TxData {
	if q.price != nil {
		return &types.LegacyTx{Nonce: nonce, GasPrice: q.price, Gas: gas, To: &to, Data: data}
	}
	return &types.DynamicFeeTx{ChainID: chainID, Nonce: nonce, GasTipCap: q.tip, GasFeeCap: q.feeCap, Gas: gas, To: &to, Data: data}
}

// errGasCeiling is a simulation or gas estimate that needs more than
// Config.MaxSettlementGas: a refusal of the payment, nothing sent.
var errGasCeiling = errors.New("needs more gas than the settlement gas ceiling")

// simulate runs eth_call of data to `to` from the relayer as c's
// settlement would run it: with at most MaxSettlementGas gas, and at the
// settlement's fees (quote), so that the code a contract payer runs inside
// it (its wallet's isValidSignature) sees the gas price (GASPRICE) the
// transaction pays, not the 0 of a call without one, and cannot pass the
// simulation only to fail (or to run long) in the settlement. A revert is
// *contractError; running out of that gas is errGasCeiling; a relayer
// that cannot pay for the ceiling at those fees is ErrRelayerUnfunded
// (the node refuses the call); anything else is returned wrapped as is
// (classify).
func (f *Facilitator) simulate(ctx context.Context, c *checked, to common.Address, data []byte) ([]byte, error) {
	q, err := f.quote(ctx, c)
	if err != nil {
		return nil, err
	}
	out, err := f.chain.CallContract(ctx, q.callMsg(f.relayer, to, data, f.cfg.MaxSettlementGas), nil)
	if err != nil {
		switch kind, reason := classify(err); {
		case kind == answerReverted:
			return nil, &contractError{reason: reason}
		case kind == answerFailed && outOfGas(reason):
			return nil, fmt.Errorf("%w: %s", errGasCeiling, reason)
		case kind == answerNodeError && isFundsError(reason):
			return nil, fmt.Errorf("%w: %s", ErrRelayerUnfunded, reason)
		}
		return nil, fmt.Errorf("simulating a call to %s: %w", to.Hex(), err)
	}
	return out, nil
}

// outOfGas reports whether a node's message says the execution needed more
// gas than it was given: geth's (and its kin's) "out of gas", Nethermind's
// "OutOfGas", and the gas estimate's "gas required exceeds allowance".
func outOfGas(msg string) bool {
	m := strings.ToLower(msg)
	return strings.Contains(m, "out of gas") || strings.Contains(m, "outofgas") || strings.Contains(m, "gas required exceeds")
}
