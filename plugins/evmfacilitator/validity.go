package evmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/core/types"
	"golang.org/x/sync/singleflight"

	"github.com/aovhq/aov/x402"
)

// span is a run of blocks searched whole without finding a nonce's log:
// the blocks lo to hi, which are exactly those whose time t is from <= t <
// to (a block's time is after its parent's, so one time interval is a run
// of consecutive blocks). to and hi are math.MaxUint64 for "and every
// later block", known once the nonce was read used as of the last block
// searched: a nonce has one log, so none can come after. Times, not
// numbers alone, let another window of the same nonce be matched against
// it without reading a header; numbers let the blocks between two spans be
// searched without looking them up.
type span struct {
	from, to uint64
	lo, hi   uint64
	at       time.Time // when searched (the oldest, once merged)
}

// The bounds of what a validityCache keeps of one nonce: an entry is one
// nonce, whatever the number of windows its payer signs, so distinct
// windows never evict other nonces' entries faster than one search each.
const (
	// maxSpans bounds the spans kept; merging keeps them few (the payer's
	// windows of one nonce overlap or follow one another), and the oldest
	// goes first.
	maxSpans = 4
	// maxCutWindows bounds the windows whose search was cut short kept.
	maxCutWindows = 4
)

// windowTimes is a's validity window as the block times [from, to) its
// transfer can execute at (validAfter < block.timestamp < validBefore),
// bounded to what a block's time can be.
func windowTimes(a x402.AuthorizationValues) (from, to uint64) {
	from, to = math.MaxUint64, math.MaxUint64
	if a.ValidAfter.IsUint64() && a.ValidAfter.Uint64() < math.MaxUint64 {
		from = a.ValidAfter.Uint64() + 1
	}
	if a.ValidBefore.IsUint64() {
		to = a.ValidBefore.Uint64()
	}
	return from, to
}

// findInValidity finds the log that marked a's nonce used within a's
// validity window, the only blocks a's transfer can have executed in,
// leaving out the blocks of done (spans of the nonce searched already),
// with eth_getLogs, logChunkBlocks blocks a call.
//
// The window's blocks not in done are found from done's block numbers and
// at most two header bisections (firstBlockAt), for the window's ends; the
// window reaches at most the head. done splits them into runs, each
// searched in its own calls, the last one partial; when they need more
// than maxLogBlocks/logChunkBlocks calls, both ends are searched, the
// first blocks (half the calls) and the last ones (the rest): a payment
// signed as x402 clients sign it (validAfter shortly before signing,
// validBefore far ahead) is settled near its window's start, one signed
// with validAfter 0 near its end; the blocks between are left out, and
// not finding the log there is errSearchCut, not an answer.
//
// Not finding the log in recent blocks is an answer only once the nonce's
// state agrees (logsCaughtUp): the node that serves eth_getLogs may be
// behind the one that read the nonce used.
//
// It returns the spans it searched whole without finding the log, so
// that they need not be searched again: on errNoNonceLog (the window's
// blocks are all searched: the nonce was spent outside it) and on
// errSearchCut, save the recent blocks of a cut search's first part,
// whose state is not read. A window that reaches the head is searched to
// it, and blocks past the head are returned as searched too, the nonce
// being read used as of the head block: a nonce has one log.
func (f *Facilitator) findInValidity(ctx context.Context, token common.Address, a x402.AuthorizationValues, done []span) (*types.Log, []span, error) {
	head, err := f.headBlock(ctx)
	if err != nil {
		return nil, nil, err
	}
	headN, headT := head.Number.Uint64(), head.Time
	from, to := windowTimes(a)
	reachesHead := to > headT
	if reachesHead {
		to = headT + 1 // no block after the head yet
	}
	headChecked := false // a span of done already runs past the head
	for _, s := range done {
		headChecked = headChecked || s.to == math.MaxUint64 && s.from <= to
	}
	gaps, err := f.gaps(ctx, from, to, done, head)
	if err != nil {
		return nil, nil, err
	}
	l, r, err := f.searchRuns(ctx, token, a, gaps, maxLogBlocks/logChunkBlocks/2)
	if l != nil || err != nil {
		return l, nil, err
	}
	pieces := r.pieces
	for i := range pieces {
		if err := f.spanTimes(ctx, &pieces[i]); err != nil {
			return nil, nil, err
		}
	}
	throughHead := reachesHead && !headChecked
	if err := f.logsCaughtUp(ctx, token, a, r.last, headN, throughHead); err != nil {
		return nil, nil, err
	}
	if r.cut { // the first part's recent blocks, if any, are not proven: not returned
		n := len(pieces) - len(r.last)
		pieces = append(slices.DeleteFunc(pieces[:n], func(s span) bool { return s.hi >= recentFloor(headN) }), pieces[n:]...)
	}
	if throughHead {
		pieces = append(pieces, span{from: headT + 1, to: math.MaxUint64, lo: headN + 1, hi: math.MaxUint64})
	}
	if r.cut {
		return nil, pieces, fmt.Errorf("%w: %d of the window's %d blocks not searched yet were searched", errSearchCut, r.searched, r.total)
	}
	if r.total == 0 {
		return nil, pieces, fmt.Errorf("%w: no block of the authorization's validity window is left to search", errNoNonceLog)
	}
	return nil, pieces, fmt.Errorf("%w: not in the %d blocks of the authorization's validity window", errNoNonceLog, r.total)
}

// searched is what searchRuns searched without finding a nonce's log.
type searched struct {
	pieces []span // searched whole, in order
	last   []span // those of the last calls (all of pieces when not cut)
	// total is the blocks of the runs, searched those of pieces.
	total, searched uint64
	cut             bool // runs' blocks were left out
}

// searchRuns finds the log that marked a's nonce used in runs (disjoint,
// in order), the blocks where it may be, with at most
// maxLogBlocks/logChunkBlocks eth_getLogs (searchLogs, each run in its
// own calls, the last one partial): when runs need more calls, only the
// blocks of their first front calls and of their last calls (the rest)
// are searched, and those between left out. The one place a search's
// bound is applied, for findNonceLog and findInValidity alike.
func (f *Facilitator) searchRuns(ctx context.Context, token common.Address, a x402.AuthorizationValues, runs []span, front uint64) (*types.Log, searched, error) {
	var r searched
	var calls uint64
	for _, g := range runs {
		r.total += g.hi - g.lo + 1
		calls += logCalls(g)
	}
	maxCalls := maxLogBlocks / logChunkBlocks
	r.pieces, r.last, r.cut = runs, runs, calls > maxCalls
	if r.cut {
		r.last = lastCalls(runs, maxCalls-front)
		r.pieces = append(firstCalls(runs, front), r.last...)
	}
	for _, p := range r.pieces {
		l, err := f.searchLogs(ctx, token, a, p.lo, p.hi)
		if l != nil || err != nil {
			return l, searched{}, err
		}
		r.searched += p.hi - p.lo + 1
	}
	return nil, r, nil
}

// headBlock reads the head block's header.
func (f *Facilitator) headBlock(ctx context.Context) (*types.Header, error) {
	head, err := f.chain.HeaderByNumber(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("reading the head block: %w", err)
	}
	return head, nil
}

// recentBlocks is how far below the head a block is recent: the nonce's
// state is read as of recent blocks only, which a full node keeps (geth
// keeps 128 blocks' state), and a log index that lags lags by fewer.
const recentBlocks = 64

// recentFloor is the first recent block below head block headN.
func recentFloor(headN uint64) uint64 { return headN - min(headN, recentBlocks) }

// logsCaughtUp tells whether the eth_getLogs that found no log of a's
// nonce in searched (contiguous but for spans searched before, whose
// state agreed then) can be trusted for its recent blocks: the node that
// serves them may be behind the one that read the nonce used (providers'
// pools), and answer blocks it has not indexed yet as empty. The nonce's
// use lies in blocks lo to hi exactly when it reads unused as of lo-1 and
// used as of hi; so the nonce's state is read at those two blocks of the
// recent part searched (hi the head when throughHead: blocks past it are
// then called searched, which the nonce being used as of the head must
// show). Used at hi and not before lo, the logs are behind: an error, an
// unknown outcome, and nothing is remembered of the blocks; so is a read
// that fails (a node that pruned the state, say). Not used as of the head
// is an error too: it is used as of a later head another node read. Older
// blocks are trusted as searched; a check costs at most two eth_call, and
// none when no recent block was searched and the window ends before the
// head.
func (f *Facilitator) logsCaughtUp(ctx context.Context, token common.Address, a x402.AuthorizationValues, searched []span, headN uint64, throughHead bool) error {
	floor := recentFloor(headN)
	lo, hi, recent := uint64(math.MaxUint64), uint64(0), false
	for _, s := range searched {
		if s.hi < s.lo || s.hi < floor {
			continue // no block, or none recent
		}
		recent = true
		lo, hi = min(lo, max(s.lo, floor)), max(hi, s.hi)
	}
	if throughHead {
		hi = headN
	} else if !recent {
		return nil
	}
	usedAt := func(n uint64) (bool, error) {
		used, err := f.authorizationState(ctx, token, a.From, a.Nonce, new(big.Int).SetUint64(n))
		if err != nil {
			return false, fmt.Errorf("reading authorizationState at block %d: %w", n, err)
		}
		return used, nil
	}
	used, err := usedAt(hi)
	switch {
	case err != nil:
		return err
	case !used && throughHead:
		return fmt.Errorf("the nonce is not used yet as of block %d, the head read", hi)
	case !used || !recent:
		return nil // used after the blocks searched, or none recent searched
	}
	if lo > 0 {
		if used, err = usedAt(lo - 1); err != nil || used {
			return err // used before the recent blocks searched
		}
	}
	return fmt.Errorf("the nonce was used in blocks %d to %d, where the token's logs read have no log of it: the node serving them is behind", lo, hi)
}

// gaps returns the times in [from, to) that no span of done covers, as
// spans with their times and block numbers (to at most head's time plus
// one); a run's ends are read from done's spans where one bounds it, or
// found by firstBlockAt. A run without a block has lo = hi + 1: searched,
// it is searched whole (a window none of whose times a block has is
// answered too); one before block 0 is left out.
func (f *Facilitator) gaps(ctx context.Context, from, to uint64, done []span, head *types.Header) ([]span, error) {
	type run struct {
		span
		loKnown, hiKnown bool
	}
	var runs []run
	cur, next := from, run{}
	for _, s := range done { // sorted by time, disjoint
		if s.to <= cur {
			continue
		}
		if s.from >= to {
			break
		}
		if s.from > cur {
			next.from, next.to, next.hi, next.hiKnown = cur, s.from, s.lo-1, true
			if s.lo > 0 {
				runs = append(runs, next)
			}
		}
		cur, next = s.to, run{span: span{lo: s.hi + 1}, loKnown: true}
		if cur >= to {
			break
		}
	}
	if cur < to {
		next.from, next.to = cur, to
		runs = append(runs, next)
	}
	var out []span
	for _, r := range runs {
		if !r.loKnown {
			lo, err := f.firstBlockAt(ctx, time.Unix(int64(r.from), 0), head)
			if err != nil {
				return nil, err
			}
			r.lo = lo
		}
		if !r.hiKnown {
			first, err := f.firstBlockAt(ctx, time.Unix(int64(r.to), 0), head)
			if err != nil {
				return nil, err
			}
			if first == 0 {
				continue
			}
			r.hi = first - 1
		}
		out = append(out, r.span)
	}
	return out, nil
}

// logCalls is how many eth_getLogs searchLogs makes over s: its blocks
// in calls of logChunkBlocks, the last one partial.
func logCalls(s span) uint64 {
	return (s.hi - s.lo + 1 + logChunkBlocks - 1) / logChunkBlocks
}

// firstCalls returns the first blocks of gaps that n eth_getLogs search;
// a run cut short ends before its time bound, which spanTimes reads (to
// zero until then).
func firstCalls(gaps []span, n uint64) []span {
	var out []span
	for _, g := range gaps {
		if n == 0 {
			break
		}
		if c := logCalls(g); c > n {
			g.hi, g.to = g.lo+n*logChunkBlocks-1, 0
		}
		n -= logCalls(g)
		out = append(out, g)
	}
	return out
}

// lastCalls returns the last blocks of gaps that n eth_getLogs search, in
// order; a run cut short starts after its time bound, which spanTimes
// reads (from zero until then).
func lastCalls(gaps []span, n uint64) []span {
	var out []span
	for i := len(gaps) - 1; i >= 0 && n > 0; i-- {
		g := gaps[i]
		if c := logCalls(g); c > n {
			g.lo, g.from = g.hi-n*logChunkBlocks+1, 0
		}
		n -= logCalls(g)
		out = append([]span{g}, out...)
	}
	return out
}

// spanTimes reads the time bounds firstCalls or lastCalls left zero: of
// the block after s, or the one before it.
func (f *Facilitator) spanTimes(ctx context.Context, s *span) error {
	read := func(n uint64) (uint64, error) {
		h, err := f.chain.HeaderByNumber(ctx, new(big.Int).SetUint64(n))
		if err != nil {
			return 0, fmt.Errorf("reading block %d: %w", n, err)
		}
		return h.Time, nil
	}
	var err error
	if s.to == 0 {
		s.to, err = read(s.hi + 1)
	}
	if s.from == 0 && err == nil && s.lo > 0 {
		var t uint64
		t, err = read(s.lo - 1)
		s.from = t + 1
	}
	return err
}

// validityCache remembers, for usedStatus's searches of validity windows,
// per token, payer and nonce: the log found (a nonce is used once, and
// the call of its transaction tells which authorization of it executed),
// the spans searched whole
// without finding it, and the windows whose search was cut short, each for
// usedCacheTTL. The payer chooses the window and can sign any number of
// authorizations of a spent nonce: a window wholly within a span is
// answered (the nonce was spent otherwise) without a read, a window
// partly within one has only the rest searched, and a window cut short
// is an unknown outcome again without a search. It runs one search at a
// time per nonce and window (lookup).
type validityCache struct {
	mu     sync.Mutex
	m      map[usedKey]*validityEntry
	flight singleflight.Group // by nonce and window
}

type validityEntry struct {
	use      nonceUse // the log found, when use.log is not nil
	found    time.Time
	searched []span // sorted by time, disjoint
	cut      []cutWindow
}

// cutWindow is a window whose search was cut short, and its error.
type cutWindow struct {
	w   usedWindow
	err error
	at  time.Time
}

// usedWindow is the validity window, validAfter and validBefore as 32-byte
// big-endian numbers, of an authorization: the key of a search of it.
type usedWindow struct{ after, before [32]byte }

// validityOf is a's window as a usedWindow.
func validityOf(a x402.AuthorizationValues) usedWindow {
	var w usedWindow
	a.ValidAfter.FillBytes(w.after[:])
	a.ValidBefore.FillBytes(w.before[:])
	return w
}

// fresh reports whether something remembered at at is still, at t.
func fresh(at, t time.Time) bool {
	return t.Sub(at) < usedCacheTTL && !t.Before(at)
}

// prune drops what e remembers that is no longer fresh at t, and reports
// whether anything is left.
func (e *validityEntry) prune(t time.Time) bool {
	if e.use.log != nil && !fresh(e.found, t) {
		e.use = nonceUse{}
	}
	e.searched = slices.DeleteFunc(e.searched, func(s span) bool { return !fresh(s.at, t) })
	e.cut = slices.DeleteFunc(e.cut, func(c cutWindow) bool { return !fresh(c.at, t) })
	return e.use.log != nil || len(e.searched) > 0 || len(e.cut) > 0
}

// known is what c remembers at t of k's nonce for window w (times from
// to to): answered, with the log found or, when none is, with err the
// window's cut search or nil (not in the window: spent otherwise); or not,
// with the spans searched to leave out.
func (c *validityCache) known(k usedKey, w usedWindow, from, to uint64, t time.Time) (use nonceUse, done []span, answered bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.m[k]
	if e == nil || !e.prune(t) {
		delete(c.m, k)
		return nonceUse{}, nil, false, nil
	}
	if e.use.log != nil {
		return e.use, nil, true, nil
	}
	for _, cw := range e.cut {
		if cw.w == w {
			return nonceUse{}, nil, true, cw.err
		}
	}
	for _, s := range e.searched {
		if from < to && s.from <= from && to <= s.to {
			return nonceUse{}, nil, true, nil
		}
	}
	return nonceUse{}, append([]span(nil), e.searched...), false, nil
}

// lookup returns what c remembers of k's nonce for a's window at t or,
// when that does not answer, runs search with the spans to leave out,
// shared by the lookups of k and a's window that arrive while it runs, and
// remembers what it learned: the use found; the spans it searched whole
// (errNoNonceLog, returned as the zero nonceUse, and errSearchCut); and a
// cut search's window and error, returned again for that window. A search
// that failed (a provider's error, a deadline) says nothing of the nonce:
// it is returned and nothing is remembered.
func (c *validityCache) lookup(k usedKey, a x402.AuthorizationValues, t time.Time, search func(done []span) (nonceUse, []span, error)) (nonceUse, error) {
	w := validityOf(a)
	from, to := windowTimes(a)
	if use, _, ok, err := c.known(k, w, from, to, t); ok {
		return use, err
	}
	fk := k.flightKey() + string(w.after[:]) + string(w.before[:])
	v, err, _ := c.flight.Do(fk, func() (any, error) {
		use, done, ok, err := c.known(k, w, from, to, t)
		if ok {
			return use, err
		}
		use, spans, err := search(done)
		switch {
		case err == nil:
			c.update(k, t, func(e *validityEntry) { e.use, e.found = use, t })
		case errors.Is(err, errNoNonceLog), errors.Is(err, errSearchCut):
			cut := errors.Is(err, errSearchCut)
			c.update(k, t, func(e *validityEntry) {
				e.searched = mergeSpans(e.searched, spans, t)
				if cut {
					e.cut = append(e.cut, cutWindow{w: w, err: err, at: t})
					e.cut = e.cut[max(len(e.cut)-maxCutWindows, 0):]
				}
			})
			if cut {
				return nil, err
			}
			use = nonceUse{}
		default:
			return nil, err
		}
		return use, nil
	})
	if err != nil {
		return nonceUse{}, err
	}
	return v.(nonceUse), nil
}

// update applies change to k's entry, made room for at t (makeRoom) when
// there is none yet.
func (c *validityCache) update(k usedKey, t time.Time, change func(*validityEntry)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[usedKey]*validityEntry{}
	}
	e := c.m[k]
	if e == nil {
		makeRoom(c.m, func(e *validityEntry) bool { return !e.prune(t) })
		e = &validityEntry{}
		c.m[k] = e
	}
	change(e)
}

// mergeSpans adds spans searched at t to have, merging those that touch,
// and keeps the maxSpans most recent.
func mergeSpans(have, spans []span, t time.Time) []span {
	all := append([]span(nil), have...)
	for _, s := range spans {
		s.at = t
		all = append(all, s)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].from < all[j].from })
	var out []span
	for _, s := range all {
		if n := len(out); n > 0 && s.from <= out[n-1].to {
			last := &out[n-1]
			last.to, last.hi = max(last.to, s.to), max(last.hi, s.hi)
			last.lo = min(last.lo, s.lo)
			if s.at.Before(last.at) {
				last.at = s.at
			}
			continue
		}
		out = append(out, s)
	}
	for len(out) > maxSpans {
		oldest := 0
		for i := range out {
			if out[i].at.Before(out[oldest].at) {
				oldest = i
			}
		}
		out = append(out[:oldest], out[oldest+1:]...)
	}
	return out
}
