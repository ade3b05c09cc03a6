package evmfacilitator

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/rpc"

	"github.com/aovhq/aov/x402"
)

// lockOrder: the package's locks are taken in this order, a goroutine
// holding one taking only those below it, so that no two ever wait for
// each other (the look-after, a replacement that finds another chain and a
// settle of the chain ID would otherwise all wait for good):
//
//	sentSettlement.mu       held around a replacement's or a resend's reads and send (replace, recancel, bumpCancel, rebroadcast)
//	Facilitator.identifying held while the genesis is read and a change of chain made (confirmChain, from onChainOf too)
//	chainNonces.mu          the process's nonce sets (chainSet, keptOnAnyChain, releaseChainSet, hold, unhold)
//	nonceSet.mu             one chain's managers
//	nonceManager.lock       the relayer's turn to sign and send (submit)
//	nonceManager.sentMu     what a manager keeps, its users and look-after
//	Facilitator.idMu        which chain f last found (nonces, ident, former)
//
// So nothing under sentMu reads a settlement's lock (resolveWatched reads
// when each was sent after it lets go), and a change of chain found under
// a settlement's lock may leave the chain before (nonceManager.close).
// The other locks (budget, inflightMu, domainMu, the caches') are taken
// alone.

// nonceManager hands out one account's nonces on one chain, one at a time.
// Signing and sending happen under its lock, so concurrent transactions get
// consecutive nonces in the order the node sees them; after a nonce error
// it re-reads the pending nonce from the chain and tries once more, past
// the nonce refused when the refusal shows the node holds it (nonceHeld).
//
// There is one per (chain, account) in the process (chainNonces), shared
// by every facilitator of the account and by the devnet's own sends: two
// caches of one account would hand out the same nonce twice, and the node
// then refuses one transaction or lets it replace the other. It holds no
// chain client: facilitators of one account may reach the chain through
// different RPC endpoints, so each passes its own to submit.
//
// Sharing the lock means one stalled endpoint delays every user of the
// account; sending outside it would not help (a transaction sent after one
// whose nonce is then lost waits in the pool behind the gap). So the delay
// is bounded on both sides: a waiter gives up when its context ends, having
// sent nothing, and a holder's reads and sends end at submitTimeout.
type nonceManager struct {
	// set is the chain's nonce set it is of (nonceSet.of), nil for one
	// made alone (tests).
	set *nonceSet
	// lock is held while full: a channel, not a sync.Mutex, so that the
	// wait for it can end with the waiter's context.
	lock chan struct{}
	addr common.Address
	// stale makes the next holder re-read the nonce (forget). It is not
	// under lock, so that forgetting never waits for a send in progress.
	stale atomic.Bool
	next  uint64 // under lock
	known bool   // under lock

	// sent is each authorization's settlement whose outcome its settle
	// did not learn (noteSent), kept for every facilitator of the
	// account, so that a retry resolves it instead of sending the
	// authorization again.
	sentMu sync.Mutex
	sent   map[usedKey]keptSent
	// sentOrder is the order sent's entries were made in, the oldest
	// first, so that past usedCacheMax the oldest goes (keepLocked): the
	// one whose retry is the least likely to come. It may also hold
	// entries since gone (their seq no longer sent's), skipped then and
	// compacted away once they are as many as usedCacheMax.
	sentOrder []keptAt
	sentSeq   uint64
	// watching is whether watch runs (under sentMu); wake cuts its wait
	// short (a facilitator closed).
	watching bool
	wake     chan struct{}
	// users are the facilitators of the account on this chain not closed,
	// in the order they were opened (under sentMu): the newest takes over
	// the settlements of one that closes (close).
	users []*Facilitator
}

// open adds f, a facilitator of the account on this chain, to its users,
// unless it is closed already (or its endpoint reaches another chain
// again), and has it take over the settlements whose facilitator closed,
// or left for another chain, while no other was open (close), so that the
// look-after goes on with them.
func (n *nonceManager) open(f *Facilitator) {
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	if !f.serves(n) {
		return
	}
	n.users = append(n.users, f)
	for _, e := range n.sent {
		if o := e.s.owner.Load(); o != nil && !o.serves(n) && !e.s.done.Load() {
			e.s.owner.Store(f)
		}
	}
	n.startWatchLocked()
}

// close removes f, closed or gone to another chain (confirmChain), from
// its users, and hands the settlements it
// sent or took over to the newest user still open, whose look-after then
// resolves them (watch): its chain is f's, and so are the relayer's nonce
// and the settlements' transactions. Without one they wait for the next
// facilitator opened (open), and the look-after ends meanwhile.
func (n *nonceManager) close(f *Facilitator) {
	n.sentMu.Lock()
	n.users = slices.DeleteFunc(n.users, func(u *Facilitator) bool { return u == f })
	if heir := n.heirLocked(); heir != nil {
		for _, e := range n.sent {
			e.s.owner.CompareAndSwap(f, heir)
		}
	}
	n.sentMu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// heirLocked returns the newest user still open on this chain, nil when
// none is, and drops the others from users; under sentMu.
func (n *nonceManager) heirLocked() *Facilitator {
	n.users = slices.DeleteFunc(n.users, func(u *Facilitator) bool { return !u.serves(n) })
	if len(n.users) == 0 {
		return nil
	}
	return n.users[len(n.users)-1]
}

// keptSent is an entry of nonceManager.sent: the settlement and when it
// was made, as a number in sentOrder.
type keptSent struct {
	s   *sentSettlement
	seq uint64
}

// keptAt is sentOrder's record of entry seq, made for key k.
type keptAt struct {
	k   usedKey
	seq uint64
}

// sentSettlement is a settlement whose outcome may be unknown: its
// transactions, sent after start, of an authorization valid before
// validBefore (Unix seconds). They are the first one sent and each
// replacement of it at a higher fee (replace): all of one nonce and one
// call, so at most one of them is ever mined, and a receipt of any is the
// settlement's.
type sentSettlement struct {
	start       time.Time
	validBefore *big.Int

	mu  sync.Mutex // held by replace while it signs and sends, and by rebroadcast while it sends
	txs []*types.Transaction
	// lastSent is when the latest of txs (or cancel) was last sent, a send
	// again of one the node lost (rebroadcast, recancel) included, under mu.
	lastSent time.Time
	// cancel is the latest cancellation replace sent in place of txs
	// (under mu): a transfer of nothing from the relayer to itself with
	// their nonce, which frees the nonce and is never the settlement.
	cancel *types.Transaction
	// cancelBumps counts the replacements of cancel at a higher fee
	// (bumpCancel, under mu).
	cancelBumps int
	// sends counts the transactions replace sent for it, replacements and
	// cancellations (under mu): follow waits again for the outcome of a
	// round that sent one.
	sends int
	// succeeded is set by the one settle answered success for it
	// (oneSuccess). The settle that sent it and every retry that finds it
	// kept (through any facilitator of the key, at once) may each learn
	// that it paid; one payment is one success per process.
	succeeded atomic.Bool

	// owner is the facilitator that sent it, or took it over when that one
	// closed (nonceManager.close), and c (a copy, which resolve may write
	// to) its checked payment: what watch resolves it with. A settlement
	// without an owner (made by a test) is not watched.
	owner atomic.Pointer[Facilitator]
	c     checked
	// done is set once watch has nothing more to do for it, its outcome
	// learned or its nonce used (resolveWatched): it stops looking after
	// it, and leaves it kept for the retries, which learn the outcome
	// themselves (the first of them that learns it paid is answered
	// success: oneSuccess).
	done atomic.Bool
	// settling is set while the settle that sent it runs: its own receipt
	// wait and resolve look after it until it answers, not watch.
	settling atomic.Bool
	// sending is set from its signing until that settle's send returns.
	// Until then "not known to the node" proves nothing: the send may be
	// refused ("nonce too low") and the authorization signed again with
	// the next nonce, which then pays. So resolve concludes no failure of
	// it, and keeps it kept, while it is set.
	sending atomic.Bool
	// resolvedWhileSending is set by a resolve of it (a retry, through any
	// facilitator of the key) while sending was set: that resolve may have
	// sent the same signed transaction again (rebroadcast), so a refusal
	// of the settle's own send no longer says nothing was sent.
	resolvedWhileSending atomic.Bool
	// kept is the nonce manager that keeps it (keepLocked), that of the
	// chain it was sent on: it is resolved and sent again only through a
	// facilitator whose endpoint still reaches that chain (onChainOf).
	kept atomic.Pointer[nonceManager]
}

func newSentSettlement(tx *types.Transaction, start time.Time, validBefore *big.Int) *sentSettlement {
	return &sentSettlement{start: start, validBefore: validBefore, txs: []*types.Transaction{tx}, lastSent: now()}
}

// sentFor reports whether s is the settlement of c's own authorization:
// what is kept is found by token, payer and nonce (sentOf), which another
// authorization of the nonce shares, and only the EIP-712 digest, signed
// over every field, tells them apart (nonceTaken).
func (s *sentSettlement) sentFor(c *checked) bool { return s.c.digest == c.digest }

// sentAt reports when the latest of its transactions was sent.
func (s *sentSettlement) sentAt() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastSent
}

// sendCount reports how many transactions replace sent for it.
func (s *sentSettlement) sendCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sends
}

// watched reports whether watch looks after it: it has an owner that is
// not closed and whose endpoint still reaches its chain (serves), and it
// is not done.
func (s *sentSettlement) watched() bool {
	o := s.owner.Load()
	return o != nil && !s.done.Load() && o.serves(s.kept.Load())
}

// over reports whether s may be forgotten at t (Unix seconds): its
// authorization has expired, so no retry finds it (sentOf), and nothing of
// it is pending: done, its outcome learned or its nonce used. One that
// may still be pending holds the relayer's nonce, and is kept, with its
// chain's set, however long its facilitator has been gone, so that the
// next one opened on its chain takes it over (open) and cancels it.
func (s *sentSettlement) over(t *big.Int) bool {
	return s.validBefore.Cmp(t) <= 0 && s.done.Load()
}

// nonceManager returns the nonce manager of the chain s was sent on, or
// f's for one kept nowhere (made by a test).
func (s *sentSettlement) nonceManager(f *Facilitator) *nonceManager {
	if n := s.kept.Load(); n != nil {
		return n
	}
	return f.knownNonces()
}

// all returns the settlement's transactions, the first sent first.
func (s *sentSettlement) all() []*types.Transaction {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.txs)
}

// last returns the latest transaction sent, the one paying the highest fee.
func (s *sentSettlement) last() *types.Transaction {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.txs[len(s.txs)-1]
}

// hashes returns the hashes of all its transactions.
func (s *sentSettlement) hashes() []common.Hash {
	var hs []common.Hash
	for _, tx := range s.all() {
		hs = append(hs, tx.Hash())
	}
	return hs
}

// has reports whether h is one of its transactions.
func (s *sentSettlement) has(h common.Hash) bool { return slices.Contains(s.hashes(), h) }

// noteSent records what became of s, the settlement of the authorization
// k (its token, payer and nonce): kept while its outcome is unknown (err
// an *x402.UnknownOutcomeError) at t, forgotten once known. A /settle
// retried after an unknown outcome (as the client is told to) finds the
// authorization unused while that transaction is pending or lost; sending
// it again would be a second transaction of one authorization, bound to
// revert at the relayer's gas once the first lands, and README promises
// one send per facilitator of the key. An entry also goes once its
// authorization's validBefore passes and nothing of it is pending (over).
// At most usedCacheMax are kept; past that, once those over are gone, the
// oldest is dropped (keepLocked), and a retry of it may send again.
func (n *nonceManager) noteSent(k usedKey, s *sentSettlement, err error, t time.Time) {
	var ue *x402.UnknownOutcomeError
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	if e, ok := n.sent[k]; ok && e.s != s {
		return // signed again with a fresh nonce (keep): that one is kept
	}
	if !errors.As(err, &ue) {
		delete(n.sent, k)
		return
	}
	n.keepLocked(k, s, t)
}

// keep records s, the settlement of authorization k, as of unknown outcome
// at t: its transaction may have reached the node (noteSent).
func (n *nonceManager) keep(k usedKey, s *sentSettlement, t time.Time) {
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	n.keepLocked(k, s, t)
}

// keepLocked is keep under sentMu. A settlement kept in place of another
// of k (sent again with a fresh nonce) takes its place in the order. One
// whose owner is closed (a settle through a facilitator already closed,
// which Close lets run) goes to the newest user open at once, as close
// hands over what it kept: close ran already, and would never hand it
// over. With none open, the next one opened takes it over (open). s is
// this chain's from then on (kept).
func (n *nonceManager) keepLocked(k usedKey, s *sentSettlement, t time.Time) {
	s.kept.CompareAndSwap(nil, n)
	if o := s.owner.Load(); o != nil && !o.serves(n) {
		if heir := n.heirLocked(); heir != nil {
			s.owner.Store(heir)
		}
	}
	if e, ok := n.sent[k]; ok {
		n.sent[k] = keptSent{s: s, seq: e.seq}
		n.startWatchLocked()
		return
	}
	if n.sent == nil {
		n.sent = map[usedKey]keptSent{}
	}
	gone := func(o keptAt) bool { return n.sent[o.k].seq != o.seq }
	if len(n.sent) >= usedCacheMax {
		unix := big.NewInt(t.Unix())
		for k, e := range n.sent {
			if e.s.over(unix) {
				delete(n.sent, k)
			}
		}
		for len(n.sent) >= usedCacheMax {
			o := n.sentOrder[0]
			n.sentOrder = n.sentOrder[1:]
			if !gone(o) {
				delete(n.sent, o.k)
			}
		}
	}
	if len(n.sentOrder) >= 2*usedCacheMax {
		n.sentOrder = slices.DeleteFunc(n.sentOrder, gone)
	}
	n.sentSeq++
	n.sent[k] = keptSent{s: s, seq: n.sentSeq}
	n.sentOrder = append(n.sentOrder, keptAt{k: k, seq: n.sentSeq})
	n.startWatchLocked()
}

// keepsAny reports whether n keeps any settlement (sent).
func (n *nonceManager) keepsAny() bool {
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	return len(n.sent) > 0
}

// sentOf returns the settlement of authorization k whose outcome is
// unknown, if any, and its authorization still valid at t: for a settle,
// the chain's time (checked.keptAt), since a chain whose block time lags
// the wall clock may still include it after validBefore by the wall
// clock. One expired goes once nothing of it is pending (over).
func (n *nonceManager) sentOf(k usedKey, t time.Time) (*sentSettlement, bool) {
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	e, ok := n.sent[k]
	if unix := big.NewInt(t.Unix()); ok && e.s.validBefore.Cmp(unix) <= 0 {
		if e.s.over(unix) {
			delete(n.sent, k)
		}
		return nil, false
	}
	return e.s, ok
}

func newNonceManager(addr common.Address) *nonceManager {
	return &nonceManager{lock: make(chan struct{}, 1), addr: addr, wake: make(chan struct{}, 1)}
}

// submitTimeout bounds how long one submit holds the account: its nonce
// reads and sends, retry included, whatever the caller's deadline (the
// x402_facilitator handler settles on the HTTP request's context, which has
// none). It is the facilitator call timeout x402 clients use, so nobody
// still waits for a settlement that holds the account longer. A send cut
// off by it may have reached the node: it is an *unknownSend, like any
// unanswered send.
const submitTimeout = x402.DefaultFacilitatorTimeout

// txSender is the part of a chain client submit uses.
type txSender interface {
	PendingNonceAt(ctx context.Context, account common.Address) (uint64, error)
	SendTransaction(ctx context.Context, tx *types.Transaction) error
}

// submit signs (sign) and sends a transaction with the account's next nonce
// through chain. A send the node may or may not have taken is an
// *unknownSend: every answer but a proven refusal (sendAnswer); a refusal
// is returned wrapped (classify reads it). wait bounds the wait for the
// account and the nonce read that follows it (a settlement's deadline for
// sending, which must not cut its send short), ctx, with submitTimeout,
// the send; when either ends before the transaction is signed, nothing
// was sent and the error wraps its error. The nonce read is under wait,
// not ctx, so that a caller sends before wait ends or never: a settle
// that joined this one, its deadline ending later than wait, is then
// rightly told that nothing was sent (Settle).
func (n *nonceManager) submit(wait, ctx context.Context, chain txSender, sign func(nonce uint64) (*types.Transaction, error)) (*types.Transaction, error) {
	if err := cmp.Or(wait.Err(), ctx.Err()); err != nil { // select would pick at random when both are ready
		return nil, fmt.Errorf("waiting for the account's earlier transactions: %w", err)
	}
	select {
	case n.lock <- struct{}{}:
	case <-wait.Done():
		return nil, fmt.Errorf("waiting for the account's earlier transactions: %w", wait.Err())
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the account's earlier transactions: %w", ctx.Err())
	}
	defer func() { <-n.lock }()
	ctx, cancel := context.WithTimeout(ctx, submitTimeout)
	defer cancel()
	if n.stale.Swap(false) {
		n.known = false
	}
	// held is the least nonce the node may not hold: past one its refusal
	// showed its pool holds (nonceHeld), so that the retry's read cannot
	// take it again. A node's pending nonce may lag a transaction it has just
	// taken: go-ethereum counts one only once its pool's background loop
	// promotes it, so a read right after an unanswered send may name that
	// send's nonce, and the retry, reading it again, was refused again.
	var held uint64
	for attempt := 0; ; attempt++ {
		if !n.known {
			next, err := chain.PendingNonceAt(wait, n.addr)
			if err != nil {
				return nil, fmt.Errorf("reading the nonce: %w", err)
			}
			n.next, n.known = max(next, held), true
		}
		if err := cmp.Or(wait.Err(), ctx.Err()); err != nil {
			return nil, fmt.Errorf("reading the nonce: %w", err)
		}
		tx, err := sign(n.next)
		if err != nil {
			return nil, fmt.Errorf("signing: %w", err)
		}
		err = chain.SendTransaction(ctx, tx)
		if err == nil {
			n.next++
			return tx, nil
		}
		switch taken, refused, reason := sendAnswer(err); {
		case taken: // our own transaction is in the pool already
			n.next++
			n.known = true
			return tx, nil
		case !refused:
			// The node may have the transaction (an answer that proves no
			// refusal can come after it took it); the nonce may be used.
			// Re-read it next time, and let the caller resolve the outcome.
			n.known = false
			return nil, &unknownSend{tx: tx, err: err}
		case isNonceError(reason) && attempt == 0:
			if nonceHeld(reason) {
				held = tx.Nonce() + 1
			}
			n.known = false
			continue
		}
		n.known = false
		return nil, fmt.Errorf("sending: %w", err)
	}
}

// forget makes the next submit read the nonce from the chain. It does not
// wait for a submit in progress: what that one sends is on the chain the
// caller forgets, and the next one reads the nonce afresh all the same.
func (n *nonceManager) forget() { n.stale.Store(true) }

func isNonceError(msg string) bool {
	msg = strings.ToLower(msg)
	return strings.Contains(msg, "nonce too low") || strings.Contains(msg, "nonce too high") ||
		strings.Contains(msg, "replacement transaction underpriced")
}

// nonceHeld reports whether a nonce error proves the node's pool holds a
// transaction of the account with the nonce refused ("replacement
// transaction underpriced"), which its pending nonce may not count yet.
// "Nonce too low" is left to the read: the node's chain is past the nonce,
// and so is its pending nonce, unless the answer came from another node
// than the read (a load balancer's), when the read is the better guess.
func nonceHeld(msg string) bool {
	return strings.Contains(strings.ToLower(msg), "replacement transaction underpriced")
}

// sendRefusals are the answers to eth_sendRawTransaction that prove the
// node did not take the transaction: the transaction pool's validation
// errors (geth's core/txpool and core errors, which Erigon, Reth, Besu and
// Nethermind word alike or in these words), all answered before the
// transaction is added. Matched lower-cased, anywhere in the message.
var sendRefusals = []string{
	"nonce too low",
	"nonce too high",
	"transaction underpriced", // "replacement transaction underpriced" too
	"insufficient funds",
	"intrinsic gas too low",
	"exceeds block gas limit",
	"less than block base fee",
	"exceeds the configured cap", // tx fee cap
	"txpool is full",
	"oversized data",
	"transaction type not supported",
	"invalid sender",
}

// sendAnswer reads the node's answer to a send (classify's reading of it):
// taken when the node already has the transaction ("already known", ours
// in the pool); refused only when the answer proves the node did not take
// it: a transaction-pool refusal (sendRefusals) or a rate limit answered
// before the method runs (HTTP 429, JSON-RPC -32005 "limit exceeded").
// Anything else, a JSON-RPC error included, may have been answered after
// the node took the transaction (geth's -32002 "request timed out" when
// its HTTP timeout fires while the method runs; a load balancer's -32603
// after forwarding): neither, and the caller resolves it from the chain.
func sendAnswer(err error) (taken, refused bool, reason string) {
	if limited, reason := rateLimited(err); limited {
		return false, true, reason
	}
	kind, reason := classify(err)
	if kind != answerNodeError {
		return false, false, reason
	}
	lower := strings.ToLower(reason)
	if strings.Contains(lower, "already known") || strings.Contains(lower, "known transaction") {
		return true, false, reason
	}
	for _, r := range sendRefusals {
		if strings.Contains(lower, r) {
			return false, true, reason
		}
	}
	return false, false, reason
}

// rateLimited reports whether err is a provider's rate limit, answered
// before the method runs (HTTP 429, JSON-RPC -32005 "limit exceeded"): the
// node did not take the transaction, and it says nothing about whether the
// node would (rebroadcast tries again later); reason is the answer.
func rateLimited(err error) (limited bool, reason string) {
	var he rpc.HTTPError
	if errors.As(err, &he) && he.StatusCode == http.StatusTooManyRequests {
		return true, he.Error()
	}
	var re rpc.Error
	if errors.As(err, &re) && re.ErrorCode() == -32005 {
		return true, re.Error()
	}
	return false, ""
}

// nonceSet is one chain's nonce managers, one per account.
type nonceSet struct {
	id chainIdentity
	mu sync.Mutex
	m  map[common.Address]*nonceManager

	// Under chainNonces.mu. devnet is set once a devnet of the process
	// runs the chain: its set stays. holds counts the users of the set
	// that none of its managers counts yet (hold): a settle running, a
	// facilitator not yet among a manager's users. dropped is set once a
	// facilitator forgot the chain (releaseChainSet), retrying while a
	// later try to release it waits (releaseRetry), and released once it
	// left chainNonces.
	devnet   bool
	holds    int
	dropped  bool
	retrying bool
	released bool
}

func (s *nonceSet) of(addr common.Address) *nonceManager {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[common.Address]*nonceManager{}
	}
	n := s.m[addr]
	if n == nil {
		n = newNonceManager(addr)
		n.set = s
		s.m[addr] = n
	}
	return n
}

// hold counts one more user of s (holds), so that releaseChainSet leaves
// it to the process until that user lets go (unhold): a settle, which may
// keep a settlement in it until it answers, whatever became of its
// facilitator (Close lets it run), and then its follow, which keeps it
// there until it learns its outcome (one hold, handed over), and a facilitator that reached the
// chain, until it is among a manager's users (confirmChain). It reports
// false when s was released already: it is no chain's any more, and
// whatever were kept in it nobody would find. A manager of no set, or of
// one outside chainNonces (a test's), is any chain's.
func (s *nonceSet) hold() bool {
	if s == nil {
		return true
	}
	chainNonces.mu.Lock()
	defer chainNonces.mu.Unlock()
	if s.released {
		return false
	}
	s.holds++
	return true
}

// unhold lets go of a hold, and releases s when it was dropped and
// nothing else uses it (releaseLocked).
func (s *nonceSet) unhold() {
	if s == nil {
		return
	}
	chainNonces.mu.Lock()
	defer chainNonces.mu.Unlock()
	s.holds--
	if s.holds == 0 && s.dropped {
		s.releaseLocked()
	}
}

// hold holds n's chain's set (nonceSet.hold).
func (n *nonceManager) hold() bool { return n.set.hold() }

// unhold lets go of n's chain's set (nonceSet.unhold).
func (n *nonceManager) unhold() { n.set.unhold() }

// newChain makes s a new chain's (a devnet started again): each account's
// nonce is read afresh, and the settlements it kept are dropped, since
// they were sent to the chain before, and resolved on this one they would
// be sent again to it (rebroadcast) or replaced, by the look-after too.
func (s *nonceSet) newChain() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.m {
		n.forget()
		n.sentMu.Lock()
		n.sent, n.sentOrder = nil, nil
		n.sentMu.Unlock()
	}
}

// chainIdentity tells chains apart: its chain ID and the hash of its
// genesis block. The chain ID alone does not: every devnet is chain 1337,
// and so may be a private network beside another; their genesis blocks
// differ (a devnet's carries random extra data). A fork of a chain that
// keeps its chain ID (a private fork of a public chain) keeps its genesis
// too, and still counts as that chain: give it a relayer key of its own.
type chainIdentity struct {
	id      string // the chain ID, in decimal
	genesis common.Hash
}

// identifyTimeout bounds a read of a chain's genesis block (confirmChain).
const identifyTimeout = 10 * time.Second

// chainNonces is the process's nonceSet of each chain, by its identity.
// Entries stay while a facilitator remembers their chain: a manager is a
// few words, one per account a configuration names, and keeping it costs
// nothing; dropping it when its last facilitator goes would need every
// user of New to release what it made. A facilitator bounds the chains it
// remembers (maxChainsPerKey), and one it forgets goes from here once
// nothing in it is in use (releaseChainSet), then or later. A nonce cached
// across a reload that the account's other users (another process) made
// stale is corrected by the nonce-error re-read.
//
// The key is the chain's identity, not the RPC endpoint: facilitators of
// one chain through different endpoints (a failover node, another
// provider) must share the sequence and the settlements kept, and
// facilitators of two chains with one chain ID must not (the nonce cached
// from one would be used on the other, and a settlement kept of one
// resolved, sent again, on the other).
var chainNonces struct {
	mu sync.Mutex
	m  map[chainIdentity]*nonceSet
}

// chainSet returns the nonceSet of chain id, and whether it was made now,
// held (nonceSet.hold) for the caller, who lets go of it (unhold).
func chainSet(id chainIdentity) (s *nonceSet, made bool) {
	chainNonces.mu.Lock()
	defer chainNonces.mu.Unlock()
	s = chainNonces.m[id]
	if s == nil {
		if chainNonces.m == nil {
			chainNonces.m = map[chainIdentity]*nonceSet{}
		}
		s, made = &nonceSet{id: id}, true
		chainNonces.m[id] = s
	}
	s.holds++
	return s, made
}

// keptOnAnyChain returns the settlement of authorization k that account
// addr's manager on any chain of chain ID id in the process but except's
// keeps, if any (sentOf): where the chain's identity cannot be read
// (confirmChain), or is another than the one it was kept on, a settlement
// kept on any chain of its ID makes a retry's outcome unknown.
func keptOnAnyChain(id *big.Int, addr common.Address, k usedKey, t time.Time, except *nonceManager) (*sentSettlement, bool) {
	chainNonces.mu.Lock()
	var ms []*nonceManager
	for ci, s := range chainNonces.m {
		if ci.id != id.String() {
			continue
		}
		s.mu.Lock()
		if n := s.m[addr]; n != nil && n != except {
			ms = append(ms, n)
		}
		s.mu.Unlock()
	}
	chainNonces.mu.Unlock()
	for _, n := range ms {
		if s, ok := n.sentOf(k, t); ok {
			return s, true
		}
	}
	return nil, false
}

// releaseChainSet removes s, a chain's nonce set a facilitator forgot
// (rememberFormer), from chainNonces once nothing in it is in use
// (releaseLocked), so that an endpoint whose genesis answer varies leaves
// the process a bounded number of sets, each of which every settle of the
// chain ID scans (keptOnAnyChain); one that reaches the chain again makes
// a new set, whose nonce is read from the chain.
func releaseChainSet(s *nonceSet) {
	chainNonces.mu.Lock()
	defer chainNonces.mu.Unlock()
	if chainNonces.m[s.id] == s {
		s.dropped = true
		s.releaseLocked()
	}
}

// releaseRetry is how long after a dropped set was found in use it is
// judged again (releaseLocked); read under chainNonces.mu, where tests
// shorten it.
var releaseRetry = time.Minute

// releaseLocked removes s, dropped, from chainNonces unless it is in use:
// held (hold), a manager with a facilitator open on it (heirLocked), or a
// settlement kept whose authorization is still valid or that may still be
// pending (one over goes, as sentOf drops it). One whose facilitator was
// unloaded while none other of the key was open on its chain is watched
// by nobody, yet its transaction may be stuck below the base fee, holding
// the relayer's nonce: released with the set, the next facilitator opened
// on the chain would make a fresh set, take nothing over, and every later
// settlement of the key there would queue behind it. A devnet's set stays (its
// own sends use it). The last hold's unhold judges it again; kept
// settlements and facilitators end without a word, so a set in use for
// them is judged again releaseRetry later, until it goes. Under
// chainNonces.mu.
func (s *nonceSet) releaseLocked() {
	if chainNonces.m[s.id] != s || s.devnet || s.holds > 0 {
		return
	}
	t := big.NewInt(now().Unix())
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, n := range s.m {
		n.sentMu.Lock()
		for k, e := range n.sent {
			if e.s.over(t) {
				delete(n.sent, k)
			}
		}
		inUse := n.heirLocked() != nil || len(n.sent) > 0
		n.sentMu.Unlock()
		if inUse {
			if !s.retrying {
				s.retrying = true
				time.AfterFunc(releaseRetry, func() {
					chainNonces.mu.Lock()
					defer chainNonces.mu.Unlock()
					s.retrying = false
					s.releaseLocked()
				})
			}
			return
		}
	}
	delete(chainNonces.m, s.id)
	s.released = true
}

// devnetNonces returns the nonceSet of a starting devnet, chain id. A
// devnet started afresh is a chain of its own (its genesis is new); one
// resumed from a data_dir a devnet of this process used before is that
// chain again, whose set is forgotten (newChain): the chain may be behind
// what it remembers.
func devnetNonces(id chainIdentity) *nonceSet {
	s, made := chainSet(id)
	chainNonces.mu.Lock()
	s.devnet = true
	chainNonces.mu.Unlock()
	s.unhold()
	if !made {
		s.newChain()
	}
	return s
}
