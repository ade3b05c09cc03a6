package evmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/params"
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

// settlementRules are the fork rules a settlement's calldata is priced
// by: Prague's, whose EIP-7623 floor (10 gas per calldata token, 4 tokens
// a nonzero byte) is live on Ethereum and Base. On a chain without the
// floor it only makes intrinsicGas higher than the chain's own, so a
// payment refused for it is one whose calldata is some 12 KB or more.
var settlementRules = params.Rules{IsHomestead: true, IsEIP150: true, IsEIP155: true, IsEIP158: true, IsEIP2929: true,
	IsByzantium: true, IsConstantinople: true, IsPetersburg: true, IsIstanbul: true, IsBerlin: true, IsLondon: true,
	IsMerge: true, IsShanghai: true, IsCancun: true, IsPrague: true}

// intrinsicGas is the least gas a transaction calling a contract with data
// (no value, no access list) must be given before any code runs: its
// intrinsic gas or, when higher, its EIP-7623 calldata floor. A node
// refuses a call or transaction given less as malformed ("intrinsic gas
// too low", "insufficient gas for floor data gas cost"), an error that
// says nothing of the payment; simulate refuses such a payment itself.
func intrinsicGas(data []byte) (uint64, error) {
	gas, floor, err := calldataGas(data)
	return max(gas, floor), err
}

// calldataGas is data's intrinsic gas and EIP-7623 floor, as
// settlementRules price a call of a contract with it. The floor bounds a
// transaction's whole gas from below; the intrinsic gas is paid before
// its execution.
func calldataGas(data []byte) (intrinsic, floor uint64, err error) {
	var to common.Address
	if intrinsic, err = core.IntrinsicGas(data, nil, nil, common.Address{}, &to, nil, settlementRules); err != nil {
		return 0, 0, err
	}
	floor, err = core.FloorDataGas(settlementRules, common.Address{}, &to, nil, data, nil)
	return intrinsic, floor, err
}

// transferExecutionGas is what an EOA's transferWithAuthorization (the
// v,r,s overload) needs past its intrinsic gas, to a payee holding none of
// the token yet, whose balance the transfer writes to a new storage slot:
// 62,772, measured as eth_estimateGas less the call's intrinsic gas
// (86,536 - 23,764) for the test token on a devnet with Osaka's gas
// schedule (TestMinSettlementGasSettlesAnEOAPayment). To a payee already
// holding it, 45,584 (69,552 - 23,968). USDC on Ethereum and Base needs
// somewhat more.
const transferExecutionGas = 62_772

// MinSettlementGas is the least Config.MaxSettlementGas New accepts: what
// an EOA's transferWithAuthorization to a fresh payee needs, its
// calldata's intrinsic gas at its most (4 + 9 × 32 bytes, every one priced
// as nonzero) plus transferExecutionGas, or the calldata's EIP-7623 floor
// if higher, with the headroom the settlement's gas limit adds to its
// estimate (withHeadroom): 106,132. Under it such a payment would be
// refused, or settle with less headroom than under any higher ceiling;
// below the transfer's need no payment could settle, and below the
// intrinsic gas alone every simulation would be the node's malformed-call
// error.
var MinSettlementGas = func() uint64 {
	data := make([]byte, 4+9*32)
	for i := range data {
		data[i] = 0xff
	}
	intrinsic, floor, err := calldataGas(data)
	if err != nil {
		panic(err)
	}
	return withHeadroom(max(intrinsic+transferExecutionGas, floor))
}()

// withHeadroom is a settlement's gas limit for its estimate (never above
// the ceiling: send): 20% more, as state can change between the estimate
// and inclusion (a payee's first balance, a warmer or colder slot).
func withHeadroom(estimate uint64) uint64 { return estimate + estimate/5 }

// simulate runs eth_call of data to `to` from the relayer as c's
// settlement would run it: with at most MaxSettlementGas gas, and at the
// settlement's fees (quote), so that the code a contract payer runs inside
// it (its wallet's isValidSignature) sees the gas price (GASPRICE) the
// transaction pays, not the 0 of a call without one, and cannot pass the
// simulation only to fail (or to run long) in the settlement. A revert is
// *contractError; running out of that gas, or calldata whose intrinsic gas
// alone exceeds it (intrinsicGas), is errGasCeiling; a relayer
// that cannot pay for the ceiling at those fees is ErrRelayerUnfunded
// (the node refuses the call); anything else is returned wrapped as is
// (classify).
func (f *Facilitator) simulate(ctx context.Context, c *checked, to common.Address, data []byte) ([]byte, error) {
	// A payer's signature is its own bytes (up to 16 KiB): its calldata
	// alone can need more than the ceiling, which the node would answer
	// as a malformed call, not as the payment's refusal.
	if need, err := intrinsicGas(data); err != nil || need > f.cfg.MaxSettlementGas {
		return nil, fmt.Errorf("%w: its %d bytes of calldata alone need %d gas (intrinsic gas with the EIP-7623 floor)", errGasCeiling, len(data), need)
	}
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
