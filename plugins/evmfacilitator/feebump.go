package evmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/params"
)

// The bounds of replace, the most a stuck settlement may cost the relayer
// more than its first quote: constants, since the facilitator's options
// (Config, the Caddyfile's evm block) have no fee settings.
const (
	// maxFeeBumps is how many times one settlement's transaction is
	// replaced: with each bump at least 12.5% (feeBump), five raise its
	// fees at least 1.8 times, and as far as twice the base fee of the
	// moment plus the tip each time.
	maxFeeBumps = 5
	// maxReplacementFeeCap is the highest fee per gas (fee cap, or legacy
	// gas price) a replacement pays, 500 gwei: well above Ethereum
	// mainnet's usual congestion (though not its rarest spikes) and far
	// above Base's fees, while 500,000 gas at it costs 0.25 ETH. A
	// replacement never pays more; one that would need more to be taken
	// by the node (feeBump) is not sent, and the settlement stays pending.
	maxReplacementFeeCap = 500_000_000_000
	// maxBumpWait bounds how long a transaction must have been pending
	// before it is replaced: ReceiptTimeout, its own wait, but no more
	// than 15 s (a block missed on Ethereum, several on Base), since a
	// settle whose caller's deadline (the gate's 30 s) cut its wait short
	// would otherwise leave the replacing to the client's retries.
	maxBumpWait = 15 * time.Second
)

// feeBump raises a fee by 12.5%, rounding up: go-ethereum's pool takes a
// transaction of a nonce it holds only when both its tip and its fee cap
// are at least 10% above the held one's (its default price bump), and the
// extra covers a node configured with a somewhat higher one.
func feeBump(x *big.Int) *big.Int {
	n := new(big.Int).Mul(x, big.NewInt(9))
	return n.Add(n, big.NewInt(7)).Div(n, big.NewInt(8))
}

// replace replaces the latest transaction of settlement s, pending past its
// wait, with the same call from the same nonce at a higher fee, signed by
// the relayer, and says what became of it for the unknown outcome's
// message. The fee was quoted at twice the base fee plus the tip (quote):
// a base fee that rose past it for longer than the wait leaves the
// transaction in the pool unmined, and every later transaction of the
// relayer waits behind its nonce (the nonce manager, and after a restart
// the pending nonce, count it). The replacement pays at least feeBump of
// each fee and at least twice the head's base fee plus the tip the node
// suggests; one is sent only while the transaction is the relayer's next
// to be mined (one waiting behind another of ours is not stuck on its own
// fee) and has been pending for its wait (maxBumpWait: a client retrying
// /settle every second would otherwise raise the fee at each retry, before
// the last replacement could be mined), at most maxFeeBumps times per settlement, and never above
// maxReplacementFeeCap. Every transaction sent is kept in s, whatever the
// node answered but a proven refusal: any of them may be the one mined,
// and its receipt is the settlement's (resolve). Once the authorization
// has expired the call could only revert, at the relayer's gas, yet its
// nonce still holds up the relayer: it is replaced by a cancellation
// instead (s.cancel: nothing, from the relayer to itself, 21,000 gas;
// once, and past maxFeeBumps too, since it frees the relayer; sent again
// while the node does not know it, recancel, and replaced at bumped fees
// while it is stuck itself, bumpCancel), and the
// settlement, its transactions gone, then fails as one that can
// no longer execute (neverExecutes). s's lock serializes replacements of
// one settlement (a retry's resolve and follow's).
func (f *Facilitator) replace(ctx context.Context, c *checked, s *sentSettlement) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.txs[len(s.txs)-1]
	if s.cancel != nil {
		return f.recancel(ctx, s)
	}
	head, err := f.headBlock(ctx)
	if err != nil {
		return "not replaced: " + err.Error()
	}
	expired := expiredAt(c.auth, head)
	if !expired && len(s.txs) > maxFeeBumps {
		return fmt.Sprintf("it was replaced at a higher fee %d times already, the most it is", maxFeeBumps)
	}
	if wait, since := min(f.cfg.ReceiptTimeout, maxBumpWait), now().Sub(s.lastSent); since < wait {
		return fmt.Sprintf("not replaced yet: it was sent %s ago, and is replaced once pending for %s", since.Round(time.Millisecond), wait)
	}
	next, err := f.chain.NonceAt(ctx, f.relayer, head.Number)
	switch {
	case err != nil:
		return fmt.Sprintf("not replaced: reading the relayer's nonce: %v", err)
	case next < old.Nonce():
		return "not replaced: it waits behind an earlier transaction of the relayer"
	case next > old.Nonce():
		return "not replaced: its nonce was used meanwhile"
	}
	q, err := f.bumpedFees(ctx, old, head)
	if err != nil {
		return "not replaced: " + err.Error()
	}
	data := q.tx(f.chainID, old.Nonce(), old.Gas(), *old.To(), old.Data())
	if expired {
		data = q.tx(f.chainID, old.Nonce(), params.TxGas, f.relayer, nil)
	}
	tx, err := types.SignNewTx(f.key, f.signer, data)
	if err != nil {
		return "not replaced: signing: " + err.Error()
	}
	if err := f.onChainOf(ctx, s); err != nil {
		return "not replaced: " + err.Error()
	}
	err = f.chain.SendTransaction(ctx, tx)
	taken, refused, reason := false, false, ""
	if err != nil {
		taken, refused, reason = sendAnswer(err)
	}
	if refused {
		return "replacing it at a higher fee was refused (" + reason + ")"
	}
	s.lastSent = now()
	s.sends++
	if expired {
		s.cancel = tx
		if err != nil && !taken {
			return fmt.Sprintf("its authorization has expired, so it was cancelled by %s, a transfer of nothing to the relayer with its nonce at a higher fee, whose send had no answer (%v): it is sent again when the node does not know it", tx.Hash().Hex(), err)
		}
		return fmt.Sprintf("its authorization has expired, so it was cancelled by %s, a transfer of nothing to the relayer with its nonce at a higher fee", tx.Hash().Hex())
	}
	s.txs = append(s.txs, tx)
	if err != nil && !taken {
		return fmt.Sprintf("it was replaced at a higher fee by %s, whose send had no answer (%v)", tx.Hash().Hex(), err)
	}
	return fmt.Sprintf("it was replaced at a higher fee by %s (replacement %d of at most %d)", tx.Hash().Hex(), len(s.txs)-1, maxFeeBumps)
}

// recancel looks after s's cancellation, under s.mu, when a transaction
// of s is still pending (resolve): its send may have had no answer, or the
// node may have lost it, and then nothing frees the nonce. One the node
// does not know is sent again, the same signed transaction (as rebroadcast
// sends a lost settlement transaction); one it refuses is forgotten, and
// the next resolve cancels afresh at the fees of the moment. A rate limit
// says nothing of it: it is sent again at the next resolve.
func (f *Facilitator) recancel(ctx context.Context, s *sentSettlement) string {
	_, _, err := f.chain.TransactionByHash(ctx, s.cancel.Hash())
	switch {
	case err == nil:
		return "it was cancelled already, by " + s.cancel.Hash().Hex()
	case !errors.Is(err, ethereum.NotFound):
		return fmt.Sprintf("it was cancelled by %s, which cannot be looked up: %v", s.cancel.Hash().Hex(), err)
	}
	if err := f.onChainOf(ctx, s); err != nil {
		return "its cancellation " + s.cancel.Hash().Hex() + " was not sent again: " + err.Error()
	}
	err = f.chain.SendTransaction(ctx, s.cancel)
	s.lastSent = now()
	s.sends++
	if err == nil {
		return "its cancellation " + s.cancel.Hash().Hex() + ", unknown to the node, was sent again"
	}
	if limited, reason := rateLimited(err); limited {
		return "sending its cancellation " + s.cancel.Hash().Hex() + " again was rate-limited (" + reason + "); it is sent again at the next resolve"
	}
	switch taken, refused, reason := sendAnswer(err); {
	case taken:
		return "its cancellation " + s.cancel.Hash().Hex() + " was sent again, and the node has it"
	case refused:
		h := s.cancel.Hash().Hex()
		s.cancel = nil
		return "sending its cancellation " + h + " again was refused (" + reason + "); the next resolve cancels it afresh"
	}
	return "sending its cancellation " + s.cancel.Hash().Hex() + " again: " + err.Error()
}

// bumpedFees are the fees of a replacement of old at head (replace).
func (f *Facilitator) bumpedFees(ctx context.Context, old *types.Transaction, head *types.Header) (*fees, error) {
	limit := big.NewInt(maxReplacementFeeCap)
	if old.Type() == types.LegacyTxType {
		price, err := f.chain.SuggestGasPrice(ctx)
		if err != nil {
			return nil, fmt.Errorf("suggesting a gas price: %w", err)
		}
		price = bigMax(feeBump(old.GasPrice()), price)
		if price.Cmp(limit) > 0 {
			price = limit
		}
		if price.Cmp(feeBump(old.GasPrice())) < 0 {
			return nil, fmt.Errorf("a replacement would pay more than %d wei per gas", maxReplacementFeeCap)
		}
		return &fees{price: price}, nil
	}
	if head.BaseFee == nil {
		return nil, fmt.Errorf("the head block %d has no base fee", head.Number)
	}
	tip, err := f.chain.SuggestGasTipCap(ctx)
	if err != nil {
		return nil, fmt.Errorf("suggesting a gas tip: %w", err)
	}
	minTip, minCap := feeBump(old.GasTipCap()), feeBump(old.GasFeeCap())
	tip = bigMax(minTip, tip)
	feeCap := bigMax(minCap, new(big.Int).Add(new(big.Int).Mul(head.BaseFee, big.NewInt(2)), tip))
	if feeCap.Cmp(limit) > 0 {
		feeCap = limit
	}
	if tip.Cmp(feeCap) > 0 {
		tip = new(big.Int).Set(feeCap)
	}
	if feeCap.Cmp(minCap) < 0 || tip.Cmp(minTip) < 0 {
		return nil, fmt.Errorf("a replacement would pay more than %d wei per gas", maxReplacementFeeCap)
	}
	return &fees{tip: tip, feeCap: feeCap}, nil
}

func bigMax(a, b *big.Int) *big.Int {
	if a.Cmp(b) >= 0 {
		return a
	}
	return b
}
