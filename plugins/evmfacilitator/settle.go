package evmfacilitator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"math/big"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"golang.org/x/sync/singleflight"

	"github.com/aovhq/aov/x402"
)

// Settle re-verifies the payment, submits transferWithAuthorization from the
// relayer and waits for its receipt, which must carry the token's Transfer
// of the authorized value from the payer to payTo.
//
// Guarantees:
//   - A payment that does not meet the caller's own requirements (amount,
//     payTo, network, asset, EIP-712 domain, time window) or whose
//     signature is not the payer's (for a contract account, one its wallet
//     refuses) is refused with its reason before anything else (but for
//     validBefore, whose margin is time to mine a transaction sent now:
//     one that misses only validBefore is answered from what is kept of
//     it, or, with nothing kept, as nonce_already_used when the chain
//     reports its nonce used, since neither sends anything new, and is
//     refused for time otherwise): it neither
//     waits for nor leads a concurrent settlement of the same
//     authorization, so it is never answered with another caller's
//     success, and valid callers are never answered with its refusal.
//   - One payment is one send and one success per process. Concurrent
//     settles of one authorization (its EIP-712 digest: the transfer)
//     that pass those checks send at most one transaction, whatever
//     encoding of the payer's signature each carries (v as 27/28 or 0/1,
//     or any bytes a contract account's wallet accepts: each would
//     otherwise be a transaction of its own, all but one reverting at the
//     relayer's gas); the later callers wait for the first's outcome
//     (joined). A success is the
//     first caller's alone: the others get nonce_already_used naming its
//     transaction (settledBy), as a settle after it landed does. A
//     resource server that verifies, serves and then settles (the x402
//     middleware, with no claim of its own) would otherwise serve one
//     payment once per concurrent request carrying it. A failure or an
//     unknown outcome is shared: nobody was answered success.
//   - A settle of an authorization whose transaction, sent by any
//     facilitator of the relayer key in the process, has an unknown
//     outcome (a retry, as the caller is told to make) sends no second
//     transaction of it: that settlement's outcome is resolved from the
//     chain (resolve; kept by nonceManager.noteSent until known, or until
//     validBefore), and a transaction of it stuck pending is replaced at a
//     higher fee with its own nonce (replace), which only one of them can
//     use. Of the settles that learn that settlement paid (the one that
//     sent it, retries at once through several facilitators), the first
//     is answered success and every other nonce_already_used naming its
//     transaction (oneSuccess).
//   - A settlement whose transaction lost the authorization to another
//     one that paid payTo is a duplicate, answered as a joined settle is
//     (resolveUsed), whoever sent it: our relayer (another instance or
//     process with the same key settled the same payment), another
//     facilitator settling the same authorization for another resource
//     server, or anyone relaying it; a success is answered only for a
//     transaction this settlement sent.
//   - A refusal (success false) is returned only when nothing was sent or
//     the sent transaction certainly did not transfer.
//   - When the outcome is unknown (the receipt did not arrive in time, the
//     connection broke after sending), the chain decides. A used nonce is
//     not proof (the payer can cancel it, or spend it on another
//     authorization): settled (success, naming the transaction) only when
//     the transaction that used it carries the authorization's Transfer
//     to payTo, its call executed this very authorization (another of the
//     nonce, in an overlapping window, logs the same Transfer:
//     nonceUse.judge) and it is ours (another's is nonce_already_used
//     naming it, as above); not settled when the nonce was
//     spent without it, or is unused while our transaction can no longer
//     execute (its receipt shows it reverted, or it is not found while the
//     authorization has expired or the relayer's nonce has moved past it);
//     otherwise the result is an *x402.UnknownOutcomeError, never a failure
//     and never a success.
//   - Any other error (chain unreachable before sending, relayer unfunded,
//     ctx ended while another settlement of the relayer was sending, the
//     work before the send outlasting prepareTimeout, ctx ended while
//     waiting for a concurrent settle of the same authorization that had
//     sent nothing yet) means nothing was sent.
//
// Whatever ctx's deadline (the x402_facilitator handler's has none), the
// reads before the send, the wait for the relayer's turn included, end
// after prepareTimeout; the send itself after submitTimeout, the receipt
// wait after ReceiptTimeout and the resolution of an unknown outcome after
// resolveTimeout. So a stalled RPC endpoint holds neither a settle, nor
// the payer's reservation (budget), nor the authorization's place in
// flight, for longer; but for a payer with code, whose reservation an
// unknown outcome holds for another ReceiptTimeout and resolveTimeout
// while follow learns it.
func (f *Facilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	// Shared outcomes are keyed on the authorization, so each caller's
	// requirements and signature must be held against the payment before
	// it may share one: unchecked, a settle asking ten times its value,
	// naming another payTo, or carrying a signature the payer's wallet
	// refuses, would be answered with a concurrent valid settle's success,
	// and one arriving first would make the valid ones fail.
	pre, cancel := context.WithTimeout(ctx, f.prepareTimeout)
	defer cancel()
	c := f.checkOwn(pre, p, req)
	if c.invalid {
		return f.failure(c.resp.InvalidReason, c.resp.Payer, c.resp.InvalidMessage, ""), nil
	}
	switch r, err := f.checkSigner(pre, c); {
	case err != nil:
		return x402.SettleResponse{}, fmt.Errorf("verifying before settlement: %w", err)
	case r != nil:
		return f.failure(r.resp.InvalidReason, r.resp.Payer, r.resp.InvalidMessage, ""), nil
	}
	key := c.digest
	f.inflightMu.Lock()
	if call, busy := f.inflight[key]; busy {
		call.waiters++
		f.inflightMu.Unlock()
		select {
		case <-call.done:
			return f.joined(c, call.resp, call.err)
		case <-ctx.Done():
			if !call.sent.Load() {
				// Nothing was sent for this caller. Its leader sends
				// within its own prepareTimeout, which began before this
				// settle, or never (its reads before signing, the nonce
				// read under the relayer's lock included, end with it:
				// nonceManager.submit): a caller whose deadline is no
				// shorter (the gateway's) gets the leader's outcome
				// instead of this.
				return x402.SettleResponse{}, fmt.Errorf("waiting for a concurrent settlement of the same authorization, which has sent nothing yet: %w", ctx.Err())
			}
			return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: fmt.Errorf("waiting for a concurrent settlement of the same authorization: %w", ctx.Err())}
		}
	}
	call := &settleCall{done: make(chan struct{})}
	f.inflight[key] = call
	f.inflightMu.Unlock()
	// Deferred, so that a panic (a chain client's bug, recovered by the
	// HTTP server) neither leaves the authorization in flight, every later
	// settle of it waiting for good, nor answers its waiters with an empty
	// response as if it were the outcome.
	finished := false
	defer func() {
		if !finished {
			call.resp, call.err = x402.SettleResponse{}, errSettlePanicked
			if call.sent.Load() {
				call.err = &x402.UnknownOutcomeError{Op: "settle", Err: errSettlePanicked}
			}
		}
		f.inflightMu.Lock()
		delete(f.inflight, key)
		f.inflightMu.Unlock()
		close(call.done)
	}()
	call.resp, call.err = f.settle(ctx, pre, c, &call.sent)
	finished = true
	return call.resp, call.err
}

// errSettlePanicked is what the settles that joined a settlement whose
// leader panicked are told: nothing was sent, or, once the leader had
// sent, that the outcome is unknown.
var errSettlePanicked = errors.New("the concurrent settlement of the same authorization failed unexpectedly")

// joined is the answer to a settle that joined, and waited for, a
// settlement of the same payment in flight whose outcome is resp, err: a
// success is its leader's, so this caller is told that the payment was
// already settled, by that transaction (settledBy); anything else is
// shared, since a failure (nothing moved) is this caller's too, and an
// unknown outcome answered nobody success (a status check decides it
// later, for each caller alike).
func (f *Facilitator) joined(c *checked, resp x402.SettleResponse, err error) (x402.SettleResponse, error) {
	if err == nil && resp.Success {
		return f.settledBy(c.payer, resp.Transaction), nil
	}
	return resp, err
}

// settledBy is the answer to a settle of a payment that another settle of
// it (a joined one, a retry, another instance with the same relayer)
// settled, by transaction tx: the reference facilitator's
// nonce_already_used, which its second send of one authorization gets
// ("authorization is used"), naming tx so that the caller can tell it from
// a cancelled authorization. Never success: the settle whose transaction
// paid answers that, once.
func (f *Facilitator) settledBy(payer, tx string) x402.SettleResponse {
	return f.failure(x402.ReasonExactEVMNonceAlreadyUsed, payer, "this authorization was already settled by another settle of it, in transaction "+tx+"; it pays once, and nothing more was charged", tx)
}

// oneSuccess is a settle's answer resp, err about settlement s: a success
// is answered once per settlement, to the first settle that learns it;
// any other (the settle that sent it, a retry that found it kept, through
// whichever facilitator of the key) is told it was already settled by
// that transaction (settledBy), as a settle after the payment landed is.
func (f *Facilitator) oneSuccess(c *checked, s *sentSettlement, resp x402.SettleResponse, err error) (x402.SettleResponse, error) {
	if err == nil && resp.Success && !s.succeeded.CompareAndSwap(false, true) {
		return f.settledBy(c.payer, resp.Transaction), nil
	}
	return resp, err
}

// nonceTaken is the answer to a settle of c whose token, payer and nonce
// a kept settlement of another authorization holds (sentFor): the same
// nonce in another validity window, or to another payTo or value. That
// transaction is not c's, whose transfer it never executes, so it answers
// nothing of c: not its success, which would have one transfer answer two
// payments (and a kept authorization that expired before the other's
// block reaches this, checkOwn), nor its pending outcome; and c is not
// sent, a second transaction of one nonce that reverts at the relayer's
// gas. It is the plain nonce_already_used, naming no transaction.
func (f *Facilitator) nonceTaken(c *checked) x402.SettleResponse {
	return f.failure(x402.ReasonExactEVMNonceAlreadyUsed, c.payer, "the authorization nonce is taken by another authorization of it, whose settlement was sent earlier; this one is not sent", "")
}

// settle settles a payment checkOwn and checkSigner passed; pre bounds the
// work before the send, and sent is set once the settlement transaction
// may have reached the node.
func (f *Facilitator) settle(ctx, pre context.Context, c *checked, sent *atomic.Bool) (resp x402.SettleResponse, err error) {
	// The nonce is unused when checkChain reads it: whatever uses it lands
	// after start, which bounds the search for it (resolve).
	start := now()
	k := usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}
	n, err := f.relayerNonces(pre)
	if err != nil {
		// What is kept of the authorization is looked up all the same: a
		// retry of a settlement whose outcome was unknown must not be told
		// that nothing was sent (the outage that made it unknown often
		// fails this read too), since its transaction may still land, and
		// the look-after sends it again once the node answers.
		if s, ok := keptOnAnyChain(f.chainID, f.relayer, k, c.keptAt, nil); ok {
			if !s.sentFor(c) {
				return f.nonceTaken(c), nil
			}
			sent.Store(true)
			return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: fmt.Errorf("an earlier settle of this authorization sent %s, and its outcome was unknown; it is neither resolved nor sent again until the chain's identity can be read: %w", s.last().Hash().Hex(), err)}
		}
		if c.tooSoon != nil {
			return f.settleTooSoon(ctx, pre, c, start)
		}
		return x402.SettleResponse{}, fmt.Errorf("settling: %w", err)
	}
	// n's set is held until the settle answers (after noteSent, deferred
	// below), or, for a payer with code whose outcome is unknown, until
	// follow, which keeps the settlement there until it learns it, ends.
	held := true
	defer func() {
		if held {
			n.unhold()
		}
	}()
	if s, ok := n.sentOf(k, c.keptAt); ok {
		if !s.sentFor(c) {
			return f.nonceTaken(c), nil
		}
		// A retry after an unknown outcome: the chain decides that
		// settlement's outcome (resolve), and nothing more is sent but a
		// replacement of its transaction at a higher fee.
		sent.Store(true)
		resp, err = f.resolve(c, s, fmt.Errorf("an earlier settle of this authorization sent %s, and its outcome was unknown", s.last().Hash().Hex()))
		n.noteSent(k, s, err, now())
		return f.oneSuccess(c, s, resp, err)
	}
	if s, ok := f.keptOnFormerChain(k, c.keptAt, n); ok {
		if !s.sentFor(c) {
			return f.nonceTaken(c), nil
		}
		// Sent on a chain the endpoint no longer reaches: its outcome
		// cannot be read here, and the authorization, unused on this
		// chain, is not sent on it (a second payment of one).
		sent.Store(true)
		return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: fmt.Errorf("an earlier settle of this authorization sent %s on another chain of chain ID %s, which this facilitator's endpoint no longer reaches (its node now serves a chain of another genesis block): its outcome cannot be read here, and it is not sent on this chain", s.last().Hash().Hex(), f.chainID)}
	}
	if c.tooSoon != nil {
		// Nothing of it is kept: too close to validBefore to send.
		return f.settleTooSoon(ctx, pre, c, start)
	}
	c.settling = true
	c, err = f.checkChain(pre, c)
	if err != nil {
		return x402.SettleResponse{}, fmt.Errorf("verifying before settlement: %w", err)
	}
	if c.invalid {
		if c.spent {
			return f.alreadyUsed(ctx, c, start)
		}
		return f.failure(c.resp.InvalidReason, c.resp.Payer, c.resp.InvalidMessage, ""), nil
	}
	// Held by checkChain, and ended here once the outcome is known. The
	// settlement of a payer with code whose outcome is unknown may still
	// revert at the relayer's gas once mined: its flight stays held while
	// follow learns its outcome, so that it bounds the reverts of one
	// wallet all the same, and a failure is recorded only if it reverted
	// or its outcome stays unknown. An account without code runs none in
	// its settlement, which can revert only at the gas its estimate needed
	// (the payer moved its tokens or spent the nonce): its flight ends
	// with the answer, counting nothing.
	// sentSet may have reached the node: it is kept for the retries
	// (noteSent) from the moment its transaction is signed, before it is
	// sent and long before its receipt, since from then on a joined
	// settle whose deadline ends, or an HTTP client that stops waiting,
	// is told the outcome is unknown and retries, maybe through another
	// facilitator of the key; finding nothing kept, that retry would send
	// the authorization again. A retry that resolves it before the send
	// returns may send the same signed transaction once more (rebroadcast),
	// which is the same transaction: one hash, one nonce.
	var sentSet *sentSettlement
	defer func() {
		if sentSet != nil {
			sentSet.settling.Store(false)
			n.noteSent(k, sentSet, err, now())
			resp, err = f.oneSuccess(c, sentSet, resp, err)
		}
		var ue *x402.UnknownOutcomeError
		if errors.As(err, &ue) && sentSet != nil && f.mayRunCode(c) {
			held = false
			go func() {
				defer n.unhold()
				f.follow(c, sentSet, ue.Err)
			}()
			return
		}
		f.budget.end(c.flight, c.failed)
	}()
	tx, err := f.send(ctx, pre, c, n, func(tx *types.Transaction) {
		if sentSet != nil { // its send was refused with a nonce error
			sentSet.sending.Store(false)
		}
		sentSet = newSentSettlement(tx, start, c.auth.ValidBefore)
		sentSet.owner.Store(f) // for watch
		sentSet.c = *c
		sentSet.settling.Store(true)
		sentSet.sending.Store(true)
		n.keep(k, sentSet, now())
		sent.Store(true)
	})
	if sentSet != nil {
		sentSet.sending.Store(false)
	}
	if err != nil {
		var ce *contractError
		var ue *unknownSend
		switch {
		case errors.As(err, &ce): // the gas estimate reverted: nothing sent
			return f.failure(revertReason(ce.reason, x402.ReasonExactEVMFailedToExecuteTransfer), c.payer, "the transfer would revert: "+ce.reason, ""), nil
		case errors.Is(err, errGasCeiling): // nothing sent
			r := f.refuseGas(c.payer, "the settlement transaction", err)
			return f.failure(r.resp.InvalidReason, c.payer, r.resp.InvalidMessage, ""), nil
		case errors.As(err, &ue): // sentSet is ue.tx's
			return f.resolve(c, sentSet, ue.err)
		case sentSet != nil && sentSet.resolvedWhileSending.Load():
			// A refusal of our send, but a retry may have sent the same
			// transaction meanwhile, and the node took that: the chain
			// decides, as after an unanswered send.
			return f.resolve(c, sentSet, fmt.Errorf("%w, while a retry of this authorization may have sent it again", err))
		default:
			return x402.SettleResponse{}, err
		}
	}
	tx, rcpt, err := f.waitReceipt(ctx, sentSet) // sentSet is tx's
	if err != nil {
		return f.resolve(c, sentSet, err)
	}
	if rcpt.Status != types.ReceiptStatusSuccessful {
		return f.reverted(ctx, c, sentSet, tx, rcpt)
	}
	if !hasTransfer(rcpt, c.token, c.auth) {
		return f.failure(x402.ReasonExactEVMTransactionFailed, c.payer, "the settlement transaction has no matching Transfer event", tx.Hash().Hex()), nil
	}
	return f.success(c, tx.Hash().Hex()), nil
}

// settleTooSoon answers a settle of c, which misses only validBefore
// (checked.tooSoon) and of which nothing is kept, sending nothing: a
// nonce the chain reports used as checkChain's is (alreadyUsed, naming
// this payment's own transaction when its transfer used it), the
// margin's refusal otherwise (refuseTooSoon).
func (f *Facilitator) settleTooSoon(ctx, pre context.Context, c *checked, start time.Time) (x402.SettleResponse, error) {
	r, err := f.refuseTooSoon(pre, c)
	switch {
	case err != nil:
		return x402.SettleResponse{}, fmt.Errorf("verifying before settlement: %w", err)
	case r.spent:
		return f.alreadyUsed(ctx, r, start)
	}
	return f.failure(r.resp.InvalidReason, c.payer, r.resp.InvalidMessage, ""), nil
}

// follow learns the outcome of s, c's settlement of a payer with code,
// which settle answered as unknown (cause), and only then ends c's flight:
// a receipt of any of its transactions is awaited for another
// ReceiptTimeout, whatever
// became of settle's caller (its deadline, the gateway's settle deadline,
// is often shorter), and judged as settle judges it (judgeOwn); without
// one, the chain is read once more (resolve). A round in which a
// replacement or cancellation was sent for it (resolve's own, or the
// relayer's look-after: watch.go) leaves the outcome to that transaction:
// follow waits for a receipt again, as long, at most maxFeeBumps+2 rounds,
// since a replacement sent and judged unknown in one step is no outcome.
// A settlement that paid
// payTo, or never executed, records nothing; one that reverted is
// recorded as reverted judges it; one whose outcome is still unknown, or
// whose judgement panicked, counts as a failure: it may revert unseen, at
// the relayer's gas.
func (f *Facilitator) follow(c *checked, s *sentSettlement, cause error) {
	failed := true
	defer func() {
		if rec := recover(); rec != nil {
			log.Printf("evm facilitator: following settlement %s panicked: %v", s.last().Hash().Hex(), rec)
		}
		f.budget.end(c.flight, failed)
	}()
	var err error
	var ue *x402.UnknownOutcomeError
	for round := 0; ; round++ {
		sends := s.sendCount()
		tx, rcpt, werr := f.waitReceipt(context.Background(), s)
		if werr == nil {
			_, err = f.judgeOwn(context.Background(), c, s, tx, rcpt, cause)
			break
		}
		_, err = f.resolve(c, s, fmt.Errorf("%v; then %w", cause, werr))
		if !errors.As(err, &ue) || s.sendCount() == sends || round > maxFeeBumps {
			break
		}
	}
	failed = c.failed || errors.As(err, &ue)
	s.nonceManager(f).noteSent(usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}, s, err, now())
}

// mayRunCode reports whether c's checks found code at its payer (payerCode
// read it because the budget's answer depended on it), which then runs
// inside its settlement. It reads nothing: a read here, after the answer
// is decided, would hold the caller up to resolveTimeout more, and while
// the chain's RPC is down it fails, which would have to be taken as
// "has code" and count an ordinary account's paid settlements as reverts.
// A payer whose code was not read had nothing in flight and no recent
// revert, so the stricter rule already held for it.
func (f *Facilitator) mayRunCode(c *checked) bool { return c.codeRead && c.hasCode }

// alreadyUsed refuses an authorization whose nonce the token reports used,
// telling apart the case that matters to a caller retrying /settle after a
// lost reply (this instance restarted, or another settled it): when the
// nonce was used by this authorization's own transfer to payTo (judged as
// usedStatus judges it, by its logs and by the call its transaction made:
// nonceUse.judge), the answer names that transaction and says the payment
// was already settled. Another authorization of the nonce (the same
// payer, payTo and value, another validity window, overlapping this one's
// or not) carries the same logs but was never this payment: named, it
// would tell a payer charged nothing for it that it paid, and a gate would
// serve two calls for one transfer. The reason stays
// the reference facilitator's nonce_already_used. The search covers the
// blocks from sentSlack before now (findNonceLog), where such a retry's
// settlement is; one further back leaves the plain refusal, which tells
// the payer its authorization was cancelled or spent elsewhere. A search
// that fails (the provider's error, its deadline) is not that answer: the
// payment may be the one that used the nonce, so the outcome is unknown
// (*x402.UnknownOutcomeError: do not pay again, retry later), and nothing
// is remembered.
//
// Anyone can replay /settle of a settled authorization (it is public on
// chain), or sign any number of authorizations of a nonce they spent
// themselves, and the search costs a dozen or more reads of the caller's
// RPC provider: so it runs under resolveTimeout whatever the caller's
// context (the x402_facilitator handler's has no deadline), and a finished
// search's logs are remembered for usedCacheTTL by what they are about,
// the token, authorizer and nonce (usedCache), not by the authorization,
// which its signer varies for free: every authorization of one used nonce
// costs one search a window, and the checks' reads alone otherwise.
func (f *Facilitator) alreadyUsed(ctx context.Context, c *checked, now time.Time) (x402.SettleResponse, error) {
	k := usedKey{token: c.token, from: c.auth.From, nonce: c.auth.Nonce}
	u, err := f.usedCache.lookup(k, now, func() (nonceUse, error) {
		ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		defer cancel()
		return f.findNonceUse(ctx, c.token, c.auth, now)
	})
	if err != nil {
		return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: err} // findNonceUse's error says what is unknown
	}
	switch st, err := u.judge(c.token, c.auth); {
	case err != nil:
		return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: err}
	case st.State == x402.SettlementDone:
		return f.settledBy(c.resp.Payer, st.Transaction), nil
	}
	return f.failure(c.resp.InvalidReason, c.resp.Payer, c.resp.InvalidMessage, ""), nil
}

// The bounds of usedCache.
const (
	// usedCacheTTL is how long a finished search's logs are remembered:
	// long enough that replays cost one search a minute.
	usedCacheTTL = time.Minute
	// usedCacheMax bounds the nonces a usedCache remembers: each is a
	// nonce its payer spent on chain, and a payer rotating nonces evicts
	// older answers, never grows the cache past it.
	usedCacheMax = 4096
)

// usedKey is the used nonce a usedCache or validityCache entry is about.
type usedKey struct {
	token, from common.Address
	nonce       [32]byte
}

// usedCache remembers, per used nonce, the logs a finished search found
// of it, or that it found none (a zero nonceUse), and runs one search at
// a time per nonce (lookup).
type usedCache struct {
	mu     sync.Mutex
	m      map[usedKey]usedEntry
	flight singleflight.Group // by usedKey.flightKey
}

type usedEntry struct {
	use nonceUse
	at  time.Time
}

// flightKey is k as a singleflight key.
func (k usedKey) flightKey() string {
	return string(k.token[:]) + string(k.from[:]) + string(k.nonce[:])
}

// lookup returns what u remembers of k's nonce at t or, when it remembers
// nothing, runs search, shared by the lookups of k that arrive while it
// runs, and remembers its finished answer: the use found or, when search
// ends in errNoNonceLog, the zero nonceUse. A search that failed (a
// provider's error, a deadline) or was cut short (errSearchCut) says
// nothing of the nonce: it is returned and not remembered, so the next
// lookup searches again.
func (u *usedCache) lookup(k usedKey, t time.Time, search func() (nonceUse, error)) (nonceUse, error) {
	if use, ok := u.get(k, t); ok {
		return use, nil
	}
	v, err, _ := u.flight.Do(k.flightKey(), func() (any, error) {
		use, err := search()
		switch {
		case err == nil:
		case errors.Is(err, errNoNonceLog):
			use = nonceUse{}
		default:
			return nil, err
		}
		u.put(k, use, t)
		return use, nil
	})
	if err != nil {
		return nonceUse{}, err
	}
	return v.(nonceUse), nil
}

func (u *usedCache) get(k usedKey, t time.Time) (nonceUse, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	e, ok := u.m[k]
	if !ok || !fresh(e.at, t) {
		return nonceUse{}, false
	}
	return e.use, true
}

// put remembers use for k (makeRoom).
func (u *usedCache) put(k usedKey, use nonceUse, t time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.m == nil {
		u.m = map[usedKey]usedEntry{}
	}
	if _, ok := u.m[k]; !ok {
		makeRoom(u.m, func(e usedEntry) bool { return !fresh(e.at, t) })
	}
	u.m[k] = usedEntry{use: use, at: t}
}

// makeRoom makes room for one more entry in m when it holds usedCacheMax:
// it first drops the entries expired says are, then, if none was, any one.
func makeRoom[V any](m map[usedKey]V, expired func(V) bool) {
	if len(m) < usedCacheMax {
		return
	}
	for k, e := range m {
		if expired(e) {
			delete(m, k)
		}
	}
	for k := range m {
		if len(m) < usedCacheMax {
			break
		}
		delete(m, k)
	}
}

func (f *Facilitator) failure(reason, payer, msg, txHash string) x402.SettleResponse {
	return x402.SettleResponse{Success: false, ErrorReason: reason, ErrorMessage: msg, Payer: payer, Transaction: txHash, Network: f.network}
}

func (f *Facilitator) success(c *checked, txHash string) x402.SettleResponse {
	return x402.SettleResponse{Success: true, Payer: c.payer, Transaction: txHash, Network: f.network}
}

// hasTransfer reports whether the receipt carries the token's
// Transfer(from, to, value) for the authorization.
func hasTransfer(r *types.Receipt, token common.Address, a x402.AuthorizationValues) bool {
	for _, l := range r.Logs {
		if isTransfer(l, token, a) {
			return true
		}
	}
	return false
}

// isTransfer reports whether l is the token's Transfer(from, to, value) for
// the authorization.
func isTransfer(l *types.Log, token common.Address, a x402.AuthorizationValues) bool {
	return l.Address == token && len(l.Topics) == 3 && l.Topics[0] == transferEventID &&
		common.BytesToAddress(l.Topics[1].Bytes()) == a.From && common.BytesToAddress(l.Topics[2].Bytes()) == a.To &&
		new(big.Int).SetBytes(l.Data).Cmp(a.Value) == 0
}

// unknownSend is a send whose fate is unknown: the node may have accepted
// the transaction (the connection broke during eth_sendRawTransaction).
type unknownSend struct {
	tx  *types.Transaction
	err error
}

func (e *unknownSend) Error() string { return "sending: " + e.err.Error() }

// send builds, signs and submits the settlement transaction under the
// relayer's nonce lock of n, which every facilitator of the relayer in the
// process shares on its chain (relayerNonces). The reads and the wait for the lock end
// with pre, the send (submit) with ctx; signed is called with each
// transaction signed, just before it is sent (submit signs again, with a
// fresh nonce, after a nonce error): from then on it may reach the node.
// Nothing is signed once f's endpoint was found to reach another chain
// than n's meanwhile (confirmChain, by another settle or the look-after).
func (f *Facilitator) send(ctx, pre context.Context, c *checked, n *nonceManager, signed func(*types.Transaction)) (*types.Transaction, error) {
	q, err := f.quote(pre, c) // read by checkChain's simulation
	if err != nil {
		return nil, err
	}
	ceiling := f.cfg.MaxSettlementGas
	gas, err := f.chain.EstimateGas(pre, q.callMsg(f.relayer, c.token, c.txData, ceiling))
	if err != nil {
		switch kind, reason := classify(err); {
		case kind == answerReverted:
			return nil, &contractError{reason: reason}
		case kind == answerNodeError && isFundsError(reason):
			return nil, fmt.Errorf("%w: %s", ErrRelayerUnfunded, reason)
		case kind != answerNone && outOfGas(reason):
			return nil, fmt.Errorf("%w: %s", errGasCeiling, reason)
		}
		return nil, fmt.Errorf("estimating settlement gas: %w", err)
	}
	if gas > ceiling { // a node that ignored the bound it was given
		return nil, fmt.Errorf("%w: estimated %d gas", errGasCeiling, gas)
	}
	// Never past the ceiling, which is all a settlement may cost the
	// relayer.
	gas = min(withHeadroom(gas), ceiling)

	tx, err := n.submit(pre, ctx, f.chain, func(nonce uint64) (*types.Transaction, error) {
		if f.knownNonces() != n {
			return nil, errOtherChain
		}
		tx, err := types.SignNewTx(f.key, f.signer, q.tx(f.chainID, nonce, gas, c.token, c.txData))
		if err == nil {
			signed(tx)
		}
		return tx, err
	})
	if err != nil {
		if kind, reason := classify(err); kind == answerNodeError && isFundsError(reason) {
			return nil, fmt.Errorf("%w: %s", ErrRelayerUnfunded, reason)
		}
		return nil, fmt.Errorf("submitting the settlement: %w", err)
	}
	return tx, nil
}

func isFundsError(msg string) bool {
	return strings.Contains(msg, "insufficient funds")
}

// waitReceipt polls for a receipt of any of s's transactions (one of them
// at most is mined: they share a nonce) until one arrives, ReceiptTimeout
// passes or ctx ends, and returns it with its transaction.
func (f *Facilitator) waitReceipt(ctx context.Context, s *sentSettlement) (*types.Transaction, *types.Receipt, error) {
	ctx, cancel := context.WithTimeout(ctx, f.cfg.ReceiptTimeout)
	defer cancel()
	t := time.NewTicker(f.cfg.PollInterval)
	defer t.Stop()
	for {
		// Not found yet, or a transport error: keep trying until the deadline.
		for _, tx := range s.all() {
			if r, err := f.receipt(ctx, tx.Hash()); err == nil {
				return tx, r, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("waiting for the settlement receipt: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// resolveTimeout bounds the reads that resolve an unknown outcome; they run
// even when the caller's context has ended.
const resolveTimeout = 10 * time.Second

// resolve decides an unknown outcome of our settlement s from the chain.
// The authorization used: judged by the transaction that used it, ours
// looked at first (usedStatus, the judgement the status readers make), any
// of s's transactions being ours. Unused: whichever of s's transactions is
// mined is judged by its receipt (judgeReceipt: the nonce read may come
// from a node a block behind the one that has the receipt); one still
// pending may be stuck below the base fee, and is replaced at a higher fee
// (replace) and stays unknown; none found, it is not settled only once the
// authorization can no longer execute (neverExecutes), and then its nonce
// goes back to the chain's; while it still can, the latest is sent again
// (rebroadcast) and stays unknown. Anything else stays unknown: "not
// found" on one node proves nothing while the transaction may still land,
// and the gateway keeps such a payment pending and resolves it later.
func (f *Facilitator) resolve(c *checked, s *sentSettlement, cause error) (x402.SettleResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	unknown := func(err error) (x402.SettleResponse, error) {
		return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: err}
	}
	if s.sending.Load() {
		s.resolvedWhileSending.Store(true)
	}
	if err := f.onChainOf(ctx, s); err != nil {
		return unknown(fmt.Errorf("%v; %w", cause, err))
	}
	used, err := f.authorizationState(ctx, c.token, c.auth.From, c.auth.Nonce, nil)
	if err != nil {
		return unknown(fmt.Errorf("%v; then reading authorizationState: %w", cause, err))
	}
	if used {
		resp, _, err := f.resolveUsed(ctx, c, s, cause)
		return resp, err
	}
	// Unused, as far as that node knows. A transaction of s still pending
	// may yet execute; mined, its receipt tells.
	txs := s.all()
	var pending *types.Transaction
	var lookupErr error
	for _, tx := range slices.Backward(txs) {
		_, isPending, err := f.chain.TransactionByHash(ctx, tx.Hash())
		switch {
		case errors.Is(err, ethereum.NotFound): // replaced, lost, or not yet seen by this node
			continue
		case err != nil:
			lookupErr = err
			continue
		case isPending:
			pending = cmp.Or(pending, tx)
			continue
		}
		rcpt, err := f.receipt(ctx, tx.Hash())
		if err != nil {
			return unknown(fmt.Errorf("%v; the transaction %s is mined, but its receipt cannot be read: %w", cause, tx.Hash().Hex(), err))
		}
		return f.judgeOwn(ctx, c, s, tx, rcpt, cause)
	}
	switch {
	case pending != nil:
		return unknown(fmt.Errorf("%v; the transaction %s is still pending: %s", cause, pending.Hash().Hex(), f.replace(ctx, c, s)))
	case lookupErr != nil:
		return unknown(fmt.Errorf("%v; then looking up the transaction: %w", cause, lookupErr))
	}
	tx := txs[len(txs)-1]
	never, err := f.neverExecutes(ctx, c, tx.Nonce())
	switch {
	case err != nil:
		return unknown(fmt.Errorf("%v; the transaction %s is not known to the node, and whether it can still execute is unknown: %w", cause, tx.Hash().Hex(), err))
	case never == nil:
		return unknown(fmt.Errorf("%v; the transaction %s is not known to the node, yet may still execute (the authorization is unused and valid, the relayer's nonce not past it): %s", cause, tx.Hash().Hex(), f.rebroadcast(ctx, s, tx)))
	case never.used:
		resp, _, err := f.resolveUsed(ctx, c, s, cause)
		return resp, err
	case s.sending.Load():
		return unknown(fmt.Errorf("%v; the transaction %s is not known to the node and can no longer execute (%s), but the settle that signed it is still sending it, and may sign the authorization again with the next nonce", cause, tx.Hash().Hex(), never.why))
	}
	// Lost for good: its nonce, when the chain has not used it, is a
	// gap every later transaction of the relayer would wait behind.
	s.nonceManager(f).forget()
	return f.failure(x402.ReasonExactEVMTransactionFailed, c.payer, "the settlement did not execute and no longer can ("+never.why+"); nothing was transferred", ""), nil
}

// rebroadcast sends our transaction tx, which the node does not know though
// it may still execute, once more, and says what became of it. A node may
// acknowledge a transaction and then lose it (evicted from its pool,
// restarted without a journal, a load balancer's other node): the nonce
// manager has moved past tx's nonce, so every later transaction of the
// relayer would wait behind the gap until the process restarts. The same
// signed transaction is idempotent (one hash, one nonce, one authorization):
// sent again, it fills the gap and may settle the payment. When the node
// refuses it (its nonce was taken meanwhile, the relayer cannot pay, its
// fee is too low for the pool), it never fills the gap: the nonce manager
// goes back to the chain's nonce, whose next transaction takes tx's nonce
// (then tx can never execute, and a later resolve says so). A provider's
// rate limit is no such refusal: it says nothing of tx, which may still
// execute, so its nonce stays taken and the next resolve (a retry, follow)
// sends it again; given back, the next settlement would take it, and the
// payment could never settle. Sent again, tx is pending from then on
// (lastSent, whatever the node answered, as recancel counts a cancellation
// sent again): a replacement at a higher fee (replace) waits its wait from
// this send, not from the one the node lost, and the relayer's look-after
// (resolveWatched) does not send it again at once after the settle's own
// resolve did. It is sent under s.mu, as replace sends, so that a resolve
// finding it pending meanwhile reads the new lastSent.
func (f *Facilitator) rebroadcast(ctx context.Context, s *sentSettlement, tx *types.Transaction) string {
	if err := f.onChainOf(ctx, s); err != nil {
		return "not sent again: " + err.Error()
	}
	s.mu.Lock()
	err := f.chain.SendTransaction(ctx, tx)
	s.lastSent = now()
	s.mu.Unlock()
	if err == nil {
		return "it was sent again"
	}
	if limited, reason := rateLimited(err); limited {
		return "sending it again was rate-limited (" + reason + "); it keeps its nonce and is sent again when its outcome is next resolved"
	}
	switch taken, refused, reason := sendAnswer(err); {
	case taken:
		return "it was sent again, and the node has it"
	case refused:
		s.nonceManager(f).forget()
		return "sending it again was refused (" + reason + "); the relayer's next transaction takes its nonce"
	}
	return "sending it again: " + err.Error()
}

// resolveUsed is resolve's answer for an authorization whose nonce is used,
// by a transaction of our settlement s or another: usedStatus's judgement,
// with excused true when the transaction that used it paid payTo, whoever
// sent it (reverted: a revert behind the payment made is not the payer's
// doing). Only one of s's transactions (a replacement at a higher fee is
// s's own) is this settlement's success. Any other that paid is another
// settlement, answered as a joined settle is (settledBy): our relayer's
// (a retry after an unknown outcome, another facilitator or process with
// the same key) answers that success itself; another account's is
// another facilitator's settle of the same authorization (a resource
// server of the same payTo that was handed it too, whose facilitator
// answers it success and serves it) or a relay of the public
// authorization (the payer's own client, anyone watching the mempool).
// The authorization is a bearer instrument and the chain cannot tell
// those apart, so answering success here would let one transfer buy an
// answer from two resource servers; the payer who relays its own
// authorization first is answered as one who handed it elsewhere.
func (f *Facilitator) resolveUsed(ctx context.Context, c *checked, s *sentSettlement, cause error) (resp x402.SettleResponse, excused bool, err error) {
	unknown := func(err error) (x402.SettleResponse, bool, error) {
		return x402.SettleResponse{}, false, &x402.UnknownOutcomeError{Op: "settle", Err: fmt.Errorf("%v; then: %w", cause, err)}
	}
	st, err := f.usedStatus(ctx, c.token, c.auth, s.hashes(), s.start)
	switch {
	case err != nil:
		return unknown(err)
	case st.State != x402.SettlementDone:
		return f.failure(st.Reason, c.payer, "the authorization's nonce was used without paying (cancelled, or spent by another authorization); nothing was transferred to payTo", ""), false, nil
	}
	if s.has(common.HexToHash(st.Transaction)) {
		return f.success(c, st.Transaction), false, nil
	}
	return f.settledBy(c.payer, st.Transaction), true, nil
}

// judgeOwn judges our own mined transaction tx, one of settlement s's, by
// its receipt, as the status
// readers judge any (judgeReceipt): the authorization's nonce log followed
// by its Transfer is a settlement; a receipt without the nonce log is a
// transaction that did not transfer, proven only when it reverted
// (reverted); any other receipt is unknown.
func (f *Facilitator) judgeOwn(ctx context.Context, c *checked, s *sentSettlement, tx *types.Transaction, rcpt *types.Receipt, cause error) (x402.SettleResponse, error) {
	st, found, err := f.judgeReceipt(ctx, tx, rcpt, c.token, c.auth)
	switch {
	case err != nil:
		return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: fmt.Errorf("%v; then: %w", cause, err)}
	case found && st.State == x402.SettlementDone:
		return f.success(c, st.Transaction), nil
	case found:
		return f.failure(st.Reason, c.payer, "the settlement transaction used the authorization's nonce without paying payTo; nothing was transferred to payTo", tx.Hash().Hex()), nil
	case rcpt.Status != types.ReceiptStatusSuccessful:
		return f.reverted(ctx, c, s, tx, rcpt)
	}
	return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: fmt.Errorf("%v; the transaction %s succeeded without the authorization's nonce log", cause, tx.Hash().Hex())}
}

// reverted judges our settlement transaction tx (one of s's), mined and
// reverted. It
// changed nothing, yet the authorization may have been used by another
// transaction (anyone may submit it: the payer's own client, another
// facilitator), which is what made ours revert; so the nonce is read at
// tx's block: used, the transaction that used it decides (resolveUsed:
// when it paid payTo, nonce_already_used naming it, the answer to a
// settle whose payment another settlement made); unused, it is a failure with the token's
// revert string, replayed on the state before tx's block. The relayer paid
// the gas either way, and the payer's failure budget counts it unless the
// authorization paid payTo by another transaction first (resolveUsed's
// excused), whoever sent it: the payer's payment was made, so the revert
// is not something the payer did. Our own relayer's other transaction of
// it is a client's retry of /settle after an unknown outcome that did not
// find the first transaction kept (another process of the key, or one
// past noteSent's bound; the first landed after the retry sent), or a
// replay of the public authorization
// to another facilitator of the key, by anyone; counting either would
// charge an honest payer, or let a third party lock one out. Only reverts
// the payer could have caused count: the nonce cancelled or spent by
// another authorization, the balance moved. The repeated sends one payer
// could still cause (one authorization under many signature encodings of
// a contract wallet) join within a facilitator (Settle keys on the
// digest), so they are bounded by the number of facilitators of the key.
func (f *Facilitator) reverted(ctx context.Context, c *checked, s *sentSettlement, tx *types.Transaction, rcpt *types.Receipt) (resp x402.SettleResponse, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), resolveTimeout)
	defer cancel()
	excused := false
	defer func() { c.failed = !excused }() // recorded as settle ends its flight
	cause := fmt.Errorf("the settlement transaction %s reverted", tx.Hash().Hex())
	used, err := f.authorizationState(ctx, c.token, c.auth.From, c.auth.Nonce, rcpt.BlockNumber)
	if err != nil {
		return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: fmt.Errorf("%v; then reading authorizationState at its block: %w", cause, err)}
	}
	if used {
		resp, excused, err = f.resolveUsed(ctx, c, s, cause)
		return resp, err
	}
	reason := x402.ReasonExactEVMTransactionFailed
	if rcpt.BlockNumber != nil && rcpt.BlockNumber.Sign() > 0 {
		if _, err := f.call(ctx, c.token, c.txData, new(big.Int).Sub(rcpt.BlockNumber, big.NewInt(1))); err != nil {
			var ce *contractError
			if errors.As(err, &ce) {
				reason = revertReason(ce.reason, reason)
			}
		}
	}
	return f.failure(reason, c.payer, "the settlement transaction reverted", tx.Hash().Hex()), nil
}

// finality is why an authorization found unused can no longer execute
// (never), or that it turned out used after all.
type finality struct {
	used bool
	why  string
}

// neverExecutes tells whether our transaction of nonce, which the node
// does not know, can no longer transfer: nil when it may still. Both facts are read
// at one block, the head, so that nodes behind a load balancer cannot
// combine a stale answer with a fresh one: the authorization is unused at
// that block, and either its validBefore is at or before the block's time
// (the token requires block.timestamp < validBefore, and block time never
// goes back, as SentSettlementStatus rules) or the relayer's nonce at that
// block is past nonce (whatever took it was mined by then, and the
// authorization unused after it, so no transaction of that nonce, ours or
// not, transferred, and none ever will). Used at that block: the caller judges it.
func (f *Facilitator) neverExecutes(ctx context.Context, c *checked, nonce uint64) (*finality, error) {
	head, err := f.headBlock(ctx)
	if err != nil {
		return nil, err
	}
	why := ""
	if expiredAt(c.auth, head) {
		why = "the authorization expired unused"
	} else {
		n, err := f.chain.NonceAt(ctx, f.relayer, head.Number)
		if err != nil {
			return nil, fmt.Errorf("reading the relayer's nonce at block %d: %w", head.Number, err)
		}
		if n <= nonce {
			return nil, nil
		}
		why = "the relayer's nonce moved past it, and the authorization is unused"
	}
	used, err := f.authorizationState(ctx, c.token, c.auth.From, c.auth.Nonce, head.Number)
	if err != nil {
		return nil, fmt.Errorf("reading authorizationState at block %d: %w", head.Number, err)
	}
	return &finality{used: used, why: why}, nil
}
