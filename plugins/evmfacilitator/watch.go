package evmfacilitator

import (
	"cmp"
	"errors"
	"slices"
	"time"

	"github.com/aovhq/aov/x402"
)

// The relayer looks after its own pending settlement transactions. A
// settlement whose outcome its settle did not learn is otherwise resolved
// (its transaction replaced at a higher fee, or cancelled once its
// authorization expired: replace) only by a retry of /settle or by follow;
// a retry is refused by the wall-clock validBefore check once the
// authorization is about to expire, and an ordinary account's settlement
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
// every facilitator that sent one closed. keep starts it again.
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
		n.resolveWatched()
	}
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
			if w := min(e.s.owner.cfg.ReceiptTimeout, maxBumpWait); wait < 0 || w < wait {
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
// (a settle still waiting for its receipt is left to it), until one's
// outcome stays unknown: that one is the relayer's next pending, which
// resolve replaced or cancelled (replace) or sent again, and those after it
// wait behind it. An outcome learned marks the settlement known; it stays
// kept for the retries, so that the first of them that learns it paid is
// answered success (oneSuccess).
func (n *nonceManager) resolveWatched() {
	n.sentMu.Lock()
	var due []*sentSettlement
	for _, e := range n.sent {
		if !e.s.watched() {
			continue
		}
		if now().Sub(e.s.sentAt()) >= min(e.s.owner.cfg.ReceiptTimeout, maxBumpWait) {
			due = append(due, e.s)
		}
	}
	n.sentMu.Unlock()
	slices.SortFunc(due, func(a, b *sentSettlement) int {
		return cmp.Compare(a.last().Nonce(), b.last().Nonce())
	})
	for _, s := range due {
		c := s.c // resolve may write to its checked payment
		_, err := s.owner.resolve(&c, s, errLookedAfter)
		var ue *x402.UnknownOutcomeError
		if errors.As(err, &ue) {
			return
		}
		s.known.Store(true)
	}
}

// errLookedAfter is the cause watch resolves a settlement with.
var errLookedAfter = errors.New("the relayer looks after its pending settlement transaction")
