package evmfacilitator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"

	"github.com/aovhq/aov/x402"
)

// SettlementStatus implements x402.SettlementChecker for EIP-3009 payments,
// knowing nothing of the settlement attempt: SentSettlementStatus with a
// zero x402.SentSettlement.
func (f *Facilitator) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	return f.SentSettlementStatus(ctx, p, req, x402.SentSettlement{})
}

// SentSettlementStatus implements x402.SentSettlementChecker for EIP-3009
// payments settled by this facilitator: SentSettlementStatusBy with our
// relayer as the one signer whose transfers are its own.
func (f *Facilitator) SentSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error) {
	return f.SentSettlementStatusBy(ctx, p, req, sent, Signers{Known: []common.Address{f.relayer}})
}

// Signers tells whose transactions are a settling facilitator's own: the
// one rule of which senders' transfers count as its settlement's
// (ownTransfer).
type Signers struct {
	// Known are the addresses it sends from now (its relayers, a remote
	// facilitator's /supported signers); nil when that cannot be told
	// (a remote that publishes none), and every sender's transfer counts.
	Known []common.Address
	// Again, when set, reads them afresh (a remote's /supported, past
	// what is remembered of it): asked once, for a transfer whose sender
	// is neither in Known nor among the signers recorded with the
	// attempt (x402.SentSettlement.Signers), before it is ruled another
	// settlement's, since a remote that changed its relayer since it was
	// last asked sends from one no list remembered yet. A failed read
	// leaves the outcome unknown.
	Again func(context.Context) ([]common.Address, error)
}

// SentSettlementStatusBy is the status of payment p as settled by a
// facilitator whose transactions are sent from signers: see
// SentSettlementStatus. It sends nothing.
//
// The token's authorizationState(from, nonce) true does not by itself mean
// the transfer happened: the payer can mark the nonce used with
// cancelAuthorization, or with any other authorization of the same nonce
// (a worthless transfer to themselves), and then nothing reaches payTo.
// So a used nonce is judged by the transaction that used it (usedStatus):
// the settlement is done only when that transaction carries the
// authorization's own Transfer(from, payTo, value) and its call executed
// this very authorization (nonceUse.judge); never when the nonce went
// another way; and an error, never done, while that transaction cannot
// be found, read, or told apart from a call of another authorization.
// Unused with validBefore reached by the head block's time means it can
// never happen (the token requires block.timestamp <
// validBefore, and block time never goes back); unused otherwise is
// undecided.
//
// A transfer that happened is the settlement's (done) only when the
// transaction that made it is sent.Transaction (the one the facilitator
// named) or was sent from one of the facilitator's signers, now or when
// the attempt was made (ownTransfer); sent by anyone else, it is another
// settlement's (settledElsewhere): another facilitator settled the same
// authorization for another resource server of payTo, which served it,
// or someone relayed it, and serving it here too would let one transfer
// buy two answers.
//
// Either error, and a failed read of authorizationState, is an
// *x402.UnknownOutcomeError (unknownStatus): the payment may have settled.
// Errors before any chain read (the payment does not pay req) are not.
//
// sent.Transaction, when it names a transaction, is looked at first;
// sent.After bounds the search for the transaction that used the nonce
// (see findNonceLog); sent.SettledOnly answers an unused nonce undecided
// without reading the head block.
//
// Settle's own resolution also concludes "never" when the relayer's nonce
// has moved past its transaction (neverExecutes); this cannot: what the
// gateway keeps is the payment and at most a transaction hash, and a node
// that has dropped a transaction cannot tell its nonce (or sender) from
// its hash. So a settlement whose transaction was lost is undecided here
// until validBefore passes, which the payer chose; the gateway keeps it
// pending no longer than its claim (README: "resolve every unknown
// outcome").
func (f *Facilitator) SentSettlementStatusBy(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement, signers Signers) (x402.SettlementStatus, error) {
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
	token := common.HexToAddress(req.Asset)
	used, err := f.authorizationState(ctx, token, auth.From, auth.Nonce, nil)
	if err != nil {
		return st, unknownStatus(fmt.Errorf("reading authorizationState: %w", err))
	}
	if used {
		var hints []common.Hash
		if b := common.FromHex(sent.Transaction); len(b) == common.HashLength && strings.HasPrefix(sent.Transaction, "0x") {
			hints = f.sentWith(ctx, usedKey{token: token, from: auth.From, nonce: auth.Nonce}, common.BytesToHash(b))
		}
		u, err := f.usedStatus(ctx, token, auth, hints, sent.After)
		if err == nil && u.State == x402.SettlementDone {
			u, err = f.ownTransfer(ctx, u, sent, signers)
		}
		u.Payer = st.Payer
		if err != nil {
			return u, unknownStatus(err)
		}
		return u, nil
	}
	if sent.SettledOnly {
		return st, nil // undecided: not settled, whether it still may be left unread
	}
	head, err := f.headBlock(ctx)
	if err != nil {
		return st, err
	}
	if expiredAt(auth, head) {
		st.State = x402.SettlementNever
	}
	return st, nil
}

// ownTransfer is st, a transfer that happened, as the status of the
// settlement sent asked about: its own (st) when its transaction is the
// one the settling facilitator named (sent.Transaction) or was sent from
// one of its signers: those it has now (signers.Known), those it had when
// the attempt was made (sent.Signers: a relayer key changed since, or a
// multi's members reordered, sends no more from the one that sent it),
// or, for a sender in neither, those it lists when asked again
// (signers.Again); otherwise another settlement's (settledElsewhere).
// All senders count only when neither list names any (a facilitator
// that publishes no signers, then or now): signers not known now (a
// remote that cannot be read since a restart) leave the recorded ones to
// judge by. The sender is recovered from the transaction's signature,
// read by its hash; a transaction that cannot be read, or signers that
// cannot be asked again, leave the outcome unknown (an error), as the
// settlement may be the asker's.
func (f *Facilitator) ownTransfer(ctx context.Context, st x402.SettlementStatus, sent x402.SentSettlement, signers Signers) (x402.SettlementStatus, error) {
	if signers.Known == nil && len(sent.Signers) == 0 || strings.EqualFold(st.Transaction, sent.Transaction) {
		return st, nil
	}
	from, ok := f.senders.get(common.HexToHash(st.Transaction))
	if !ok {
		tx, err := f.readTransaction(ctx, common.HexToHash(st.Transaction))
		if err != nil {
			return x402.SettlementStatus{}, fmt.Errorf("the authorization was paid by %s, which cannot be read to tell who sent it: %w", st.Transaction, err)
		}
		if from, err = types.Sender(f.signer, tx); err != nil {
			return x402.SettlementStatus{}, fmt.Errorf("the authorization was paid by %s, whose sender cannot be recovered: %w", st.Transaction, err)
		}
	}
	recorded := slices.ContainsFunc(sent.Signers, func(a string) bool {
		return common.IsHexAddress(a) && common.HexToAddress(a) == from
	})
	if slices.Contains(signers.Known, from) || recorded {
		return st, nil
	}
	if signers.Again != nil {
		again, err := signers.Again(ctx)
		if err != nil {
			return x402.SettlementStatus{}, fmt.Errorf("the authorization was paid by %s, sent from %s, which the facilitator's signers as last read do not list, and they cannot be read again: %w", st.Transaction, from.Hex(), err)
		}
		if again == nil || slices.Contains(again, from) {
			return st, nil
		}
	}
	return settledElsewhere(st.Transaction), nil
}

// readTransaction reads the transaction h by its hash and remembers its
// sender (senders) when it can be recovered: a status read reads the
// transaction that used a nonce for its call (nonceUseOf, judgeReceipt)
// and, when it paid, ownTransfer needs its sender, which that one read
// then gives.
func (f *Facilitator) readTransaction(ctx context.Context, h common.Hash) (*types.Transaction, error) {
	tx, _, err := f.chain.TransactionByHash(ctx, h)
	if err != nil {
		return nil, err
	}
	if from, err := types.Sender(f.signer, tx); err == nil {
		f.senders.put(h, from)
	}
	return tx, nil
}

// senderCache remembers the senders of the transactions a status read
// read (readTransaction), by transaction hash: the settled payment is
// public and its payer can sign any number of authorizations of its
// nonce, each a status read of the same transaction (a gate's
// settled-earlier check), which then costs no transaction read (up to 32
// MiB) for its sender beyond the first. A hash commits to the
// transaction's signature, so its sender never changes and an entry never
// goes stale; at most usedCacheMax are kept, an arbitrary one dropped to
// make room.
type senderCache struct {
	mu sync.Mutex
	m  map[common.Hash]common.Address
}

// get returns h's sender, if remembered.
func (c *senderCache) get(h common.Hash) (common.Address, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	from, ok := c.m[h]
	return from, ok
}

// put remembers from as h's sender.
func (c *senderCache) put(h common.Hash, from common.Address) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[common.Hash]common.Address{}
	}
	if _, ok := c.m[h]; !ok && len(c.m) >= usedCacheMax {
		for k := range c.m {
			delete(c.m, k)
			break
		}
	}
	c.m[h] = from
}

// settledElsewhere is the status of a payment whose transfer transaction
// tx made for another settlement than the one asked about: it can never
// settle for this caller (SettlementNever, Reason duplicate_settlement,
// as the Solana facilitator answers a transaction another settlement
// answered), so a gate holding it releases its claim and serves nothing.
func settledElsewhere(tx string) x402.SettlementStatus {
	return x402.SettlementStatus{State: x402.SettlementNever, Transaction: tx, Reason: x402.ReasonDuplicateSettlement}
}

// sentWith returns h and, when h is a transaction of a settlement of the
// authorization k this process keeps (its outcome unknown when its settle
// answered), every other transaction sent for it: a replacement at a
// higher fee may be the one mined, and the answer the gateway kept named
// the one sent first.
//
// The settlements kept are those of the chain f's endpoint was last found
// to reach (confirmChain; it sends nothing, so no fresh reading is
// needed): a chain it cannot identify keeps none it can tell, and the
// search then starts from h alone, as it does for another process's
// settlement.
func (f *Facilitator) sentWith(ctx context.Context, k usedKey, h common.Hash) []common.Hash {
	if f.key == nil { // a StatusReader's: it sends nothing
		return []common.Hash{h}
	}
	n, err := f.confirmChain(ctx, anyAge)
	if err != nil {
		return []common.Hash{h}
	}
	defer n.unhold()
	if s, ok := n.sentOf(k, now()); ok && s.has(h) {
		return s.hashes()
	}
	return []common.Hash{h}
}

// unknownStatus marks err, a failure to tell whether a payment settled
// once the payer's signature and the requirements were read (the chain
// did not answer, or the nonce is used by a transaction that cannot be
// found or judged), as an unknown outcome: the payment may have settled,
// so its payer must not be asked to pay again (x402.UnknownOutcomeError).
// A caller that asked about a payment it knows nothing of (a gate's
// settled-earlier check) tells it apart from an answer this way.
func unknownStatus(err error) error {
	return &x402.UnknownOutcomeError{Op: "status", Err: err}
}

// expiredAt reports whether a can no longer execute from head on: the token
// requires block.timestamp < validBefore, and block time never goes back.
func expiredAt(a x402.AuthorizationValues, head *types.Header) bool {
	return a.ValidBefore.Cmp(new(big.Int).SetUint64(head.Time)) <= 0
}

var (
	_ x402.SettlementChecker     = (*Facilitator)(nil)
	_ x402.SentSettlementChecker = (*Facilitator)(nil)
)

// The bounds of the search for the transaction that used a nonce.
var (
	// sentSlack is how far before the settlement attempt's time the search
	// starts: block timestamps and the gate's clock disagree by seconds,
	// and the embedded facilitator's own resolution may end after the
	// gate's deadline for the attempt (resolveTimeout).
	sentSlack = 5 * time.Minute
	// logChunkBlocks is the block range of one eth_getLogs: providers
	// refuse wide ranges (some above 500 or 1,000 blocks).
	logChunkBlocks uint64 = 500
	// maxLogBlocks bounds one search: at most maxLogBlocks/logChunkBlocks
	// eth_getLogs (10), so at most maxLogBlocks blocks: from the attempt's
	// time on, or both ends of a validity window whose blocks need more
	// calls (findInValidity, where the runs of blocks between those
	// searched before each end in a partial call, so fewer blocks may be
	// searched). A nonce used beyond is not looked for: the outcome stays
	// unknown rather than guessed. On Base (2 s blocks) 5,000 blocks is
	// almost 3 hours, more than a payment's validity window as x402 clients
	// sign it.
	maxLogBlocks uint64 = 5000
)

// usedStatus judges an authorization whose nonce is used, by the
// transaction that used it: done (naming that transaction) when it carries
// the authorization's Transfer; never when the nonce was cancelled or spent
// without it, since the authorization can no longer execute; an error,
// never done, when that transaction cannot be found or read. hints are
// transactions that may be it (our own settlement's, its replacements
// included, or the one the facilitator named and those sent for the same
// settlement), looked at first by their receipts; without one, or when
// none is it, the nonce's log is searched for from after on and the
// transaction judged by its logs and its call (findNonceUse), never by its
// receipt, which whoever sent it chose the size of. The embedded
// facilitator's Settle and every status reader judge by this one function,
// so they agree.
//
// Without after (zero: a caller that knows nothing of the attempt, such as
// a gate asking whether a refused payment settled earlier) the search
// covers the authorization's validity window (findInValidity), the only
// blocks its transfer can have executed in; searched whole without finding
// the nonce's log, the nonce was spent otherwise: never, the plain
// refusal. What such searches learn is remembered (withinValidity), as
// alreadyUsed's answers are and for the same reason: the settled
// authorization is public in its transaction's calldata and its payer can
// sign any number of others of the spent nonce, each otherwise a head
// read, header bisections, up to 10 eth_getLogs and two authorizationState
// reads. A found log is remembered per token, payer and nonce (a nonce is
// used once), and so are the blocks searched without finding it, which no
// other window of the nonce needs searched again. A search cut short by maxLogBlocks stays an
// error (the outcome is unknown), remembered for its window; one that
// failed, or whose logs lag the nonce's state (logsCaughtUp), is not
// remembered.
func (f *Facilitator) usedStatus(ctx context.Context, token common.Address, a x402.AuthorizationValues, hints []common.Hash, after time.Time) (x402.SettlementStatus, error) {
	for _, h := range hints {
		if r, err := f.receipt(ctx, h); err == nil {
			if st, found, err := f.judgeReceipt(ctx, nil, r, token, a); found || err != nil {
				return st, err
			}
		}
	}
	var u nonceUse
	var err error
	if after.IsZero() {
		u, err = f.withinValidity.lookup(usedKey{token: token, from: a.From, nonce: a.Nonce}, a, now(), func(done []span) (nonceUse, []span, error) {
			l, spans, err := f.findInValidity(ctx, token, a, done)
			if err != nil {
				return nonceUse{}, spans, usedByUnknown(err)
			}
			u, err := f.nonceUseOf(ctx, token, a, l)
			return u, nil, err
		})
	} else {
		u, err = f.findNonceUse(ctx, token, a, after)
	}
	if err != nil {
		return x402.SettlementStatus{}, err
	}
	return u.judge(token, a)
}

// nonceUse is what the chain says of a used nonce, whatever authorization
// of it is asked about: the token's log that marked it used or cancelled,
// the token's Transfer logs from the authorizer in the transaction that
// emitted it, and, for a use, the call that transaction made (usedCall).
// The logs are got with two filtered eth_getLogs, each reply bounded by
// the few logs that match: a transaction that used the nonce may carry any
// number of other logs (a batch's, or an attacker's who spent their own
// nonce in a transaction of 5000 logs, a receipt of 1.8 MiB, and then asks
// to settle authorizations of it again and again), and its receipt is not
// read.
//
// Of those Transfers, the one right after the nonce's log (the
// authorization's own, when it paid) is kept, and maxOtherTransfers
// others; more marks that there were more, so that the judgement, which
// must know whether a matching Transfer is among them, stays undecided
// instead of guessing, and what usedCache keeps of a nonce stays small.
type nonceUse struct {
	log       *types.Log
	transfers []types.Log
	more      bool
	// call is what the transaction that emitted log called, read when
	// log is an AuthorizationUsed (a cancellation is never whatever it
	// called).
	call usedCall
}

// usedCall is which authorization a transaction that used a nonce
// executed, read from its input: the logs cannot tell it. Two
// authorizations of one nonce, payer, payTo and value whose validity
// windows overlap (they differ in validAfter or validBefore, so in their
// signatures) log the same AuthorizationUsed and the same Transfer in any
// block both windows hold; only the one executed was paid, and judged by
// the logs the other would be answered paid by the same transfer. A
// direct call of the token's transferWithAuthorization (either form: v, r,
// s or a bytes signature) names every member of the authorization it
// executes, so it tells them apart; receiveWithAuthorization is signed as
// another type than any x402 payment, so it never executes one. Any other
// transaction (a smart wallet's or a relayer contract's, whose call
// reached the token inside) is unknown: its input is its contract's to
// read, and what it asked of the token is not seen.
type usedCall struct {
	auth    *x402.AuthorizationValues // nil when unknown
	receive bool                      // receiveWithAuthorization
	why     string                    // why auth is unknown
}

// callOf reads tx's call of token (usedCall).
func callOf(tx *types.Transaction, token common.Address) usedCall {
	data := tx.Data()
	switch {
	case tx.To() == nil:
		return usedCall{why: "it created a contract"}
	case *tx.To() != token:
		return usedCall{why: "it called " + tx.To().Hex() + ", not the token (a contract that called the token in its turn)"}
	case len(data) < 4:
		return usedCall{why: "its input names no method of the token"}
	}
	m, err := tokenABI.MethodById(data[:4])
	if err != nil || (m.RawName != "transferWithAuthorization" && m.RawName != "receiveWithAuthorization") {
		return usedCall{why: "it called another method of the token than transferWithAuthorization"}
	}
	args, err := m.Inputs.Unpack(data[4:])
	if err != nil {
		return usedCall{why: "its call of " + m.RawName + " does not decode: " + err.Error()}
	}
	a := x402.AuthorizationValues{}
	var ok [6]bool
	a.From, ok[0] = args[0].(common.Address)
	a.To, ok[1] = args[1].(common.Address)
	a.Value, ok[2] = args[2].(*big.Int)
	a.ValidAfter, ok[3] = args[3].(*big.Int)
	a.ValidBefore, ok[4] = args[4].(*big.Int)
	a.Nonce, ok[5] = args[5].([32]byte)
	if ok != [6]bool{true, true, true, true, true, true} {
		return usedCall{why: "its call of " + m.RawName + " does not decode as an authorization"}
	}
	return usedCall{auth: &a, receive: m.RawName == "receiveWithAuthorization"}
}

// executed judges a, whose Transfer the logs of u's transaction carry
// right after the nonce's log, by the call that transaction made: done
// only when it executed a itself (every member the same, so the same
// EIP-712 digest: one authorization, however its signature is encoded);
// never when it provably executed another authorization of the nonce;
// an error (unknown, never done) when its call is not read as one
// (usedCall).
func (u nonceUse) executed(a x402.AuthorizationValues) (x402.SettlementStatus, error) {
	tx := u.log.TxHash.Hex()
	c := u.call
	switch {
	case c.auth == nil:
		return x402.SettlementStatus{}, fmt.Errorf("the transaction %s used the nonce with a matching Transfer, but %s: which authorization it executed is unknown", tx, c.why)
	case c.auth.From != a.From || c.auth.Nonce != a.Nonce:
		return x402.SettlementStatus{}, fmt.Errorf("the transaction %s logged the nonce's use, but its call executes another payer's or nonce's authorization", tx)
	case c.receive, c.auth.To != a.To, c.auth.Value.Cmp(a.Value) != 0,
		c.auth.ValidAfter.Cmp(a.ValidAfter) != 0, c.auth.ValidBefore.Cmp(a.ValidBefore) != 0:
		return never(), nil
	}
	return x402.SettlementStatus{State: x402.SettlementDone, Transaction: tx}, nil
}

// maxOtherTransfers bounds the Transfers a nonceUse keeps besides the one
// right after the nonce's log: a payment's transaction carries its own, a
// batch's one per payment, few of them from one payer.
const maxOtherTransfers = 16

// findNonceUse finds the log that marked a's nonce used, from after on
// (findNonceLog), and its nonceUse (nonceUseOf).
func (f *Facilitator) findNonceUse(ctx context.Context, token common.Address, a x402.AuthorizationValues, after time.Time) (nonceUse, error) {
	l, err := f.findNonceLog(ctx, token, a, after)
	if err != nil {
		return nonceUse{}, usedByUnknown(err)
	}
	return f.nonceUseOf(ctx, token, a, l)
}

// usedByUnknown is err, a search for a used nonce's log that did not find
// it, as the reason the nonce's transaction is unknown.
func usedByUnknown(err error) error {
	return fmt.Errorf("the authorization's nonce is used, but by which transaction is unknown: %w", err)
}

// nonceUseOf is the nonceUse of l, the log that marked a's nonce used:
// when it is not a cancellation, the token's Transfer logs from a's
// authorizer in the same transaction, read from that log's block by its
// hash (a block reorganised away since is an error, not an answer), and
// the call its transaction made (usedCall), which judging any
// authorization of the nonce paid by it needs.
func (f *Facilitator) nonceUseOf(ctx context.Context, token common.Address, a x402.AuthorizationValues, l *types.Log) (nonceUse, error) {
	if l.Topics[0] == authorizationCanceledEventID {
		return nonceUse{log: l}, nil
	}
	block := l.BlockHash
	logs, err := f.chain.FilterLogs(ctx, ethereum.FilterQuery{BlockHash: &block, Addresses: []common.Address{token},
		Topics: [][]common.Hash{{transferEventID}, {common.BytesToHash(a.From.Bytes())}}})
	if err != nil {
		return nonceUse{}, fmt.Errorf("the authorization's nonce was used by %s, whose transfers cannot be read: %w", l.TxHash.Hex(), err)
	}
	tx, err := f.readTransaction(ctx, l.TxHash)
	if err != nil {
		return nonceUse{}, fmt.Errorf("the authorization's nonce was used by %s, whose call cannot be read: %w", l.TxHash.Hex(), err)
	}
	u := keepTransfers(l, logs)
	u.call = callOf(tx, token)
	return u, nil
}

// keepTransfers is the nonceUse of nonce log l, whose block's Transfers
// from the authorizer are logs: those of l's transaction, bounded as
// nonceUse says.
func keepTransfers(l *types.Log, logs []types.Log) nonceUse {
	u := nonceUse{log: l}
	others := 0
	for _, t := range logs {
		switch {
		case t.TxHash != l.TxHash || t.Removed:
		case t.Index == l.Index+1:
			u.transfers = append(u.transfers, t)
		case others == maxOtherTransfers:
			u.more = true
		default:
			others++
			u.transfers = append(u.transfers, t)
		}
	}
	return u
}

// judge judges authorization a (of the nonce u is about), from the logs
// eth_getLogs found or from its transaction's receipt (judgeReceipt), the
// one rule every path that names a transaction for an authorization by its
// nonce keeps (alreadyUsed, usedStatus with or without the attempt's
// time, a hint's receipt, our own transaction's): no log is never;
// cancelled is never; used, it paid only when the token's next log, the
// one right after the nonce's in the block, is a's Transfer(from, payTo,
// value) and the transaction's call executed a itself (executed: the
// nonce is used once, and another authorization of it, the same payer,
// payTo and value in another validity window, logs the same Transfer, so
// one transfer would answer two payments); a matching Transfer elsewhere
// in the transaction is an error (it may be another payment's, and the
// money may have moved); otherwise never. A transaction that failed has
// no logs, so none is found.
func (u nonceUse) judge(token common.Address, a x402.AuthorizationValues) (x402.SettlementStatus, error) {
	if u.log == nil || u.log.Topics[0] == authorizationCanceledEventID {
		return never(), nil
	}
	matching := false
	for i := range u.transfers {
		if t := &u.transfers[i]; isTransfer(t, token, a) {
			if t.Index == u.log.Index+1 {
				return u.executed(a)
			}
			matching = true
		}
	}
	switch {
	case matching:
		return x402.SettlementStatus{}, fmt.Errorf("the transaction %s used the nonce and carries a matching Transfer that is not the authorization's own", u.log.TxHash.Hex())
	case u.more:
		return x402.SettlementStatus{}, fmt.Errorf("the transaction %s used the nonce without the authorization's own Transfer, and carries more than %d other Transfers from the payer, not all looked at", u.log.TxHash.Hex(), maxOtherTransfers)
	}
	return never(), nil
}

func never() x402.SettlementStatus {
	return x402.SettlementStatus{State: x402.SettlementNever, Reason: x402.ReasonExactEVMNonceAlreadyUsed}
}

// judgeReceipt judges an authorization by a receipt that may carry its
// nonce's AuthorizationUsed or AuthorizationCanceled log (found false when
// it carries neither), as nonceUse.judge judges the same logs read by
// eth_getLogs: one judge, so that a settlement and every status reader
// agree. Of a receipt already read, every Transfer from the payer is kept,
// none is left undecided. For an AuthorizationUsed the call of the
// receipt's transaction is read, as nonceUseOf reads it: tx when the
// caller has it (our own), by its hash otherwise, since the receipt may
// be a hint (the transaction a gate kept, or one a facilitator named) of
// another authorization of the nonce, which judge tells apart by it; a
// transaction that cannot be read is an error. A failed transaction that
// logged the nonce is an error, not a judgement (a failed transaction has
// no logs).
func (f *Facilitator) judgeReceipt(ctx context.Context, tx *types.Transaction, r *types.Receipt, token common.Address, a x402.AuthorizationValues) (x402.SettlementStatus, bool, error) {
	for _, l := range r.Logs {
		if !isNonceLog(l, token, a) {
			continue
		}
		if r.Status != types.ReceiptStatusSuccessful {
			return x402.SettlementStatus{}, true, fmt.Errorf("the transaction %s that used the nonce failed, yet logged it", r.TxHash.Hex())
		}
		u := nonceUse{log: l}
		if l.Topics[0] == authorizationUsedEventID {
			if tx == nil {
				var err error
				if tx, err = f.readTransaction(ctx, r.TxHash); err != nil {
					return x402.SettlementStatus{}, true, fmt.Errorf("the authorization's nonce was used by %s, whose call cannot be read: %w", r.TxHash.Hex(), err)
				}
			}
			u.call = callOf(tx, token)
		}
		for _, t := range r.Logs {
			if t.Address == token && !t.Removed && len(t.Topics) == 3 && t.Topics[0] == transferEventID && t.Topics[1] == common.BytesToHash(a.From.Bytes()) {
				u.transfers = append(u.transfers, *t)
			}
		}
		st, err := u.judge(token, a)
		return st, true, err
	}
	return x402.SettlementStatus{}, false, nil
}

// receipt reads h's receipt, refusing one that lists a null log (an odd
// or hostile endpoint's answer, which ethclient decodes without complaint
// into a nil *types.Log that every judgement of the receipt would
// dereference): the receipt is then unreadable, as if the endpoint had
// failed.
func (f *Facilitator) receipt(ctx context.Context, h common.Hash) (*types.Receipt, error) {
	r, err := f.chain.TransactionReceipt(ctx, h)
	if err != nil {
		return nil, err
	}
	if slices.Contains(r.Logs, nil) {
		return nil, fmt.Errorf("the receipt of %s lists a null log", h.Hex())
	}
	return r, nil
}

// isNonceLog reports whether l is the token's AuthorizationUsed or
// AuthorizationCanceled for a's authorizer and nonce.
func isNonceLog(l *types.Log, token common.Address, a x402.AuthorizationValues) bool {
	return l.Address == token && !l.Removed && len(l.Topics) == 3 &&
		(l.Topics[0] == authorizationUsedEventID || l.Topics[0] == authorizationCanceledEventID) &&
		l.Topics[1] == common.BytesToHash(a.From.Bytes()) && l.Topics[2] == common.Hash(a.Nonce)
}

// findNonceLog finds the log that marked a's nonce used, from the first
// block whose time is at or after after less sentSlack (the nonce was
// unused when the payment was verified just before the settlement was
// sent, and no settlement was sent before after) forward to the head, in
// at most maxLogBlocks blocks (searchRuns, all its calls from the start).
//
// Not finding the log in blocks searched whole is an error wrapping
// errNoNonceLog, which the caller never takes for a transfer; a search cut
// short by maxLogBlocks wraps errSearchCut instead: the log may lie in the
// blocks left out. A caller that knows nothing of the attempt searches
// the authorization's validity window instead (findInValidity).
func (f *Facilitator) findNonceLog(ctx context.Context, token common.Address, a x402.AuthorizationValues, after time.Time) (*types.Log, error) {
	head, err := f.headBlock(ctx)
	if err != nil {
		return nil, err
	}
	from := after.Add(-sentSlack)
	lo, err := f.firstBlockAt(ctx, from, head)
	if err != nil {
		return nil, err
	}
	hi := head.Number.Uint64()
	if lo > hi {
		return nil, fmt.Errorf("%w: no block at or after %s yet", errNoNonceLog, from.UTC().Format(time.RFC3339))
	}
	l, r, err := f.searchRuns(ctx, token, a, []span{{lo: lo, hi: hi}}, maxLogBlocks/logChunkBlocks)
	if l != nil || err != nil {
		return l, err
	}
	if r.cut {
		return nil, fmt.Errorf("%w: not in the %d blocks searched from block %d", errSearchCut, r.searched, lo)
	}
	return nil, fmt.Errorf("%w: not in blocks %d to %d", errNoNonceLog, lo, hi)
}

// searchLogs finds the log that marked a's nonce used in blocks lo to hi
// (nil when it is not there), with eth_getLogs filtered by the token and
// both indexed topics, logChunkBlocks blocks a call.
func (f *Facilitator) searchLogs(ctx context.Context, token common.Address, a x402.AuthorizationValues, lo, hi uint64) (*types.Log, error) {
	q := ethereum.FilterQuery{Addresses: []common.Address{token}, Topics: [][]common.Hash{
		{authorizationUsedEventID, authorizationCanceledEventID},
		{common.BytesToHash(a.From.Bytes())},
		{common.Hash(a.Nonce)},
	}}
	for start := lo; start <= hi; start += logChunkBlocks {
		end := min(start+logChunkBlocks-1, hi)
		q.FromBlock, q.ToBlock = new(big.Int).SetUint64(start), new(big.Int).SetUint64(end)
		logs, err := f.chain.FilterLogs(ctx, q)
		if err != nil {
			return nil, fmt.Errorf("reading the token's logs of blocks %d to %d: %w", start, end, err)
		}
		for i := range logs {
			if isNonceLog(&logs[i], token, a) {
				return &logs[i], nil
			}
		}
		if end == hi {
			break
		}
	}
	return nil, nil
}

// errNoNonceLog is a search for a nonce's log that finished without
// finding it in the blocks it covers: an answer, unlike a search that
// failed (a provider's error, a deadline) or was cut short (errSearchCut),
// which says nothing.
var errNoNonceLog = errors.New("the nonce's log was not found")

// errSearchCut is a search for a nonce's log that stopped at maxLogBlocks
// without finding it: the log may be in the blocks it left out.
var errSearchCut = errors.New("the nonce's log was not found in the blocks searched, and more were left out")

// firstBlockAt returns the number of the first block whose time is at or
// after t (head's number plus one when there is none yet). It gallops back
// from the head, then bisects: about 2·log2(blocks between t and the head)
// header reads, each under ctx, so a recent t costs few.
func (f *Facilitator) firstBlockAt(ctx context.Context, t time.Time, head *types.Header) (uint64, error) {
	target := uint64(max(t.Unix(), 0))
	hi := head.Number.Uint64()
	if head.Time < target {
		return hi + 1, nil
	}
	timeOf := func(n uint64) (uint64, error) {
		h, err := f.chain.HeaderByNumber(ctx, new(big.Int).SetUint64(n))
		if err != nil {
			return 0, fmt.Errorf("reading block %d: %w", n, err)
		}
		return h.Time, nil
	}
	// hi is at or after t; find lo before it.
	var lo uint64
	for step := uint64(1); ; step *= 2 {
		if hi == 0 {
			return 0, nil
		}
		n := hi - min(step, hi)
		bt, err := timeOf(n)
		if err != nil {
			return 0, err
		}
		if bt < target {
			lo = n
			break
		}
		hi = n
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		bt, err := timeOf(mid)
		if err != nil {
			return 0, err
		}
		if bt < target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi, nil
}

// StatusReader tells whether EIP-3009 authorizations settled, from a chain
// endpoint alone: it holds no key and sends nothing. A gateway whose
// facilitator is remote uses it to resolve a settlement whose outcome the
// facilitator could not tell (the x402 facilitator API has no status
// call); the judgement is Facilitator.SentSettlementStatusBy's, so the
// embedded and the remote case agree.
type StatusReader struct{ f *Facilitator }

// NewStatusReader reads the chain of network (a CAIP-2 eip155 id) through
// chain (an *ethclient.Client of any endpoint).
func NewStatusReader(chain Chain, network string) (*StatusReader, error) {
	if chain == nil {
		return nil, errors.New("evm status reader: no chain client")
	}
	chainID, err := x402.ChainID(network)
	if err != nil {
		return nil, fmt.Errorf("evm status reader: network %q: %w", network, err)
	}
	return &StatusReader{f: &Facilitator{chain: chain, network: network, chainID: chainID, signer: types.LatestSignerForChainID(chainID)}}, nil
}

// SettlementStatus implements x402.SettlementChecker.
func (r *StatusReader) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	return r.SentSettlementStatus(ctx, p, req, x402.SentSettlement{})
}

// SentSettlementStatus implements x402.SentSettlementChecker, counting a
// transfer of any sender as the settlement's: SentSettlementStatusBy
// without signers.
func (r *StatusReader) SentSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error) {
	return r.f.SentSettlementStatusBy(ctx, p, req, sent, Signers{})
}

// SentSettlementStatusBy is the status of a payment settled by a
// facilitator whose transactions are sent from signers
// (Facilitator.SentSettlementStatusBy).
func (r *StatusReader) SentSettlementStatusBy(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement, signers Signers) (x402.SettlementStatus, error) {
	return r.f.SentSettlementStatusBy(ctx, p, req, sent, signers)
}

var (
	_ x402.SettlementChecker     = (*StatusReader)(nil)
	_ x402.SentSettlementChecker = (*StatusReader)(nil)
)
