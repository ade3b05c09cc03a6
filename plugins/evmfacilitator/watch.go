package evmfacilitator

import (
	"cmp"
	"context"
	"errors"
	"log"
	"slices"
	"time"

	"github.com/ethereum/go-ethereum"
	"github.com/ethereum/go-ethereum/core/types"
	"github.com/ethereum/go-ethereum/params"

	"github.com/aovhq/aov/x402"
)

// The relayer looks after its own pending settlement transactions. A
// settlement whose outcome its settle did not learn is otherwise resolved
// (its transaction replaced at a higher fee, or cancelled once its
// authorization expired: replace) only by a retry of /settle or by follow;
// no retry finds it kept once its authorization's validBefore passes by
// the chain's time (sentOf), and an ordinary account's settlement
// has no follow. So a transaction stuck below the base fee past validBefore
// kept the relayer's nonce for good, and every later settlement of the
// relayer queued behind it. While any kept settlement of the relayer key
// is watched (sentSettlement.watched), one goroutine per key (nonceManager)
// resolves them in nonce order, every min(ReceiptTimeout, maxBumpWait) of
// their facilitator: the relayer's next to be mined is then replaced, or
// cancelled, within replace's bounds, with no retry needed.

// startWatchLocked starts watch unless it runs; under sentMu.
func (n *nonceManager) startWatchLocked() {
	if n.watching {
		return
	}
	for _, e := range n.sent {
		if e.s.watched() {
			n.watching = true
			go n.watch()
			return
		}
	}
}

// watch resolves the watched settlements (resolveWatched) at each interval
// (watchInterval), and ends once none is left: every outcome known, or
// every facilitator that sent or took over one closed with no other of
// the key on the chain open (nonceManager.close). keep, and a facilitator
// opened that takes them over (nonceManager.open), start it again. A round
// that panics (a chain client's bug) is logged and the next one runs, as
// follow and a settle's server survive one: the goroutine is the
// gateway's own, and its panic would end the whole process.
func (n *nonceManager) watch() {
	for {
		wait, ok := n.watchInterval()
		if !ok {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-n.wake:
			t.Stop()
		}
		n.resolveRound()
	}
}

// resolveRound is one round of watch, a panic in it recovered.
func (n *nonceManager) resolveRound() {
	defer func() {
		if rec := recover(); rec != nil {
			log.Printf("evm facilitator: looking after the relayer's pending settlements panicked: %v", rec)
		}
	}()
	n.resolveWatched()
}

// watchInterval is how long watch waits before its next round, the least
// of min(ReceiptTimeout, maxBumpWait) over the watched settlements'
// facilitators; ok false, and watching cleared, when none is watched.
func (n *nonceManager) watchInterval() (time.Duration, bool) {
	n.sentMu.Lock()
	defer n.sentMu.Unlock()
	wait := time.Duration(-1)
	for _, e := range n.sent {
		if e.s.watched() {
			if w := min(e.s.owner.Load().cfg.ReceiptTimeout, maxBumpWait); wait < 0 || w < wait {
				wait = w
			}
		}
	}
	if wait < 0 {
		n.watching = false
		return 0, false
	}
	return wait, true
}

// resolveWatched resolves, in the order of their nonces, the watched
// settlements whose latest transaction was sent at least their wait ago
// and whose settle has answered (until then its own receipt wait and
// resolve look after it), until one's
// outcome stays unknown, or its cancellation is pending (bumpCancel),
// while its nonce is not below the relayer's confirmed one: that one is the
// relayer's next pending, which resolve replaced or cancelled (replace) or
// sent again, and those after it wait behind it. A settlement whose outcome
// is learned, or whose nonce the chain has used (nothing of it is pending,
// whatever its outcome; a retry or a status check still learns that), is
// done: it is no longer watched, and stays kept for the retries, so that
// the first of them that learns it paid is answered success (oneSuccess).
// When each was last sent is read after sentMu is let go: a settlement's
// lock comes before sentMu (lockOrder).
func (n *nonceManager) resolveWatched() {
	n.sentMu.Lock()
	var watched []*sentSettlement
	for _, e := range n.sent {
		if e.s.watched() && !e.s.settling.Load() {
			watched = append(watched, e.s)
		}
	}
	n.sentMu.Unlock()
	var due []*sentSettlement
	for _, s := range watched {
		if o := s.owner.Load(); o != nil && now().Sub(s.sentAt()) >= min(o.cfg.ReceiptTimeout, maxBumpWait) {
			due = append(due, s)
		}
	}
	slices.SortFunc(due, func(a, b *sentSettlement) int {
		return cmp.Compare(a.last().Nonce(), b.last().Nonce())
	})
	for _, s := range due {
		owner := s.owner.Load() // or the one that takes it over meanwhile: both reach its chain
		c := s.c                // resolve may write to its checked payment
		_, err := owner.resolve(&c, s, errLookedAfter)
		if !s.watched() {
			// Its owner closed, or its endpoint reaches another chain now
			// (onChainOf): the chain's newest facilitator takes it over.
			continue
		}
		var ue *x402.UnknownOutcomeError
		if errors.As(err, &ue) || owner.bumpCancel(s) {
			if !owner.nonceUsed(s.last().Nonce()) {
				return
			}
		}
		s.done.Store(true)
	}
}

// nonceUsed reports whether the relayer's confirmed nonce is past nonce
// (false when it cannot be read).
func (f *Facilitator) nonceUsed(nonce uint64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	next, err := f.chain.NonceAt(ctx, f.relayer, nil)
	return err == nil && next > nonce
}

// errLookedAfter is the cause watch resolves a settlement with.
var errLookedAfter = errors.New("the relayer looks after its pending settlement transaction")

// bumpCancel looks after the cancellation of s, a settlement whose own
// transactions are gone (resolve found it can no longer execute), and
// reports whether it is still pending: it holds the relayer's nonce as the
// settlement did, and a base fee risen past its fee cap leaves it unmined.
// It is replaced by another cancellation at bumped fees (bumpedFees) under
// replace's bounds: only while it is the relayer's next transaction to be
// mined, once pending for its wait (min(ReceiptTimeout, maxBumpWait)), at
// most maxFeeBumps times and never above maxReplacementFeeCap; a
// replacement the node refuses is not kept. A cancellation that cannot be
// looked up counts as pending (the next round looks again); one the node
// does not know frees nothing more: resolve gave its nonce back.
func (f *Facilitator) bumpCancel(s *sentSettlement) bool {
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cancel
	if old == nil {
		return false
	}
	_, pending, err := f.chain.TransactionByHash(ctx, old.Hash())
	switch {
	case errors.Is(err, ethereum.NotFound):
		return false
	case err != nil:
		return true
	case !pending:
		return false
	case s.cancelBumps >= maxFeeBumps || now().Sub(s.lastSent) < min(f.cfg.ReceiptTimeout, maxBumpWait):
		return true
	}
	head, err := f.headBlock(ctx)
	if err != nil {
		return true
	}
	if next, err := f.chain.NonceAt(ctx, f.relayer, head.Number); err != nil || next != old.Nonce() {
		return err != nil || next < old.Nonce()
	}
	q, err := f.bumpedFees(ctx, old, head)
	if err != nil {
		return true
	}
	tx, err := types.SignNewTx(f.key, f.signer, q.tx(f.chainID, old.Nonce(), params.TxGas, f.relayer, nil))
	if err != nil {
		return true
	}
	if err := f.onChainOf(ctx, s); err != nil {
		return true
	}
	if err := f.chain.SendTransaction(ctx, tx); err != nil {
		if _, refused, _ := sendAnswer(err); refused {
			return true
		}
	}
	s.cancel, s.lastSent = tx, now()
	s.cancelBumps++
	s.sends++
	return true
}
