package evmfacilitator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strings"

	"github.com/ethereum/go-ethereum/common"

	"github.com/aovhq/aov/x402"
)

// SettlementStatus implements x402.SettlementChecker for EIP-3009 payments:
// the token's authorizationState(from, nonce) true means the transfer
// happened (the authorization fixes the recipient and the amount, so
// whoever submitted it paid req.PayTo); false with validBefore reached by the
// head block's time means it can never happen (the token requires
// block.timestamp < validBefore, and block time never goes back); false
// otherwise is undecided. It sends nothing.
func (f *Facilitator) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	var st x402.SettlementStatus
	if req.Network != f.network {
		return st, fmt.Errorf("this facilitator settles on %s, not %s", f.network, req.Network)
	}
	var pl x402.ExactEVMPayload
	if err := json.Unmarshal(p.Payload, &pl); err != nil {
		return st, fmt.Errorf("payment payload: %w", err)
	}
	auth, err := pl.Authorization.Values()
	if err != nil {
		return st, err
	}
	if !strings.EqualFold(auth.To.Hex(), req.PayTo) || !common.IsHexAddress(req.Asset) {
		return st, errors.New("the authorization does not pay these requirements")
	}
	st.Payer = auth.From.Hex()
	used, err := f.authorizationState(ctx, common.HexToAddress(req.Asset), auth.From, auth.Nonce)
	if err != nil {
		return st, fmt.Errorf("reading authorizationState: %w", err)
	}
	if used {
		st.State = x402.SettlementDone
		return st, nil
	}
	head, err := f.chain.HeaderByNumber(ctx, nil)
	if err != nil {
		return st, fmt.Errorf("reading the head block: %w", err)
	}
	if auth.ValidBefore.Cmp(new(big.Int).SetUint64(head.Time)) <= 0 {
		st.State = x402.SettlementNever
	}
	return st, nil
}

var _ x402.SettlementChecker = (*Facilitator)(nil)

// StatusReader tells whether EIP-3009 authorizations settled, from a chain
// endpoint alone: it holds no key and sends nothing. A gateway whose
// facilitator is remote uses it to resolve a settlement whose outcome the
// facilitator could not tell (the x402 facilitator API has no status
// call); the judgement is Facilitator.SettlementStatus's, so the embedded
// and the remote case agree.
type StatusReader struct{ f *Facilitator }

// NewStatusReader reads the chain of network (a CAIP-2 eip155 id) through
// chain (an *ethclient.Client of any endpoint).
func NewStatusReader(chain Chain, network string) (*StatusReader, error) {
	if chain == nil {
		return nil, errors.New("evm status reader: no chain client")
	}
	if _, err := x402.ChainID(network); err != nil {
		return nil, fmt.Errorf("evm status reader: network %q: %w", network, err)
	}
	return &StatusReader{f: &Facilitator{chain: chain, network: network}}, nil
}

// SettlementStatus implements x402.SettlementChecker.
func (r *StatusReader) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	return r.f.SettlementStatus(ctx, p, req)
}

var _ x402.SettlementChecker = (*StatusReader)(nil)
