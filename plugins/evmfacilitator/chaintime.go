package evmfacilitator

import (
	"context"
	"time"
)

// checkTime is the instant a payment's validity window is judged against:
// the later of the wall clock and the chain head's timestamp. The token
// checks validAfter and validBefore against block time, and a chain may run
// ahead of the wall clock (the devnet seals each block at least a second
// after its parent, so a burst of blocks pushes it up to MaxClockLead
// ahead). Judging by the wall clock alone would accept a payment that then
// reverts on chain for time; judging by the later clock, what Verify accepts
// can still settle. When the head cannot be read the wall clock stands: the
// on-chain simulation still refuses what the chain would.
//
// chain is the instant the chain itself is at: the head's timestamp, or
// the wall clock when the head cannot be read. A settlement already sent
// is judged by it, not by t (checked.keptAt): a chain whose block time
// lags the wall clock may still include it after validBefore by the wall
// clock.
func (f *Facilitator) checkTime(ctx context.Context) (t, chain time.Time) {
	t = now()
	chain = t
	if h, err := f.chain.HeaderByNumber(ctx, nil); err == nil && h != nil {
		chain = time.Unix(int64(h.Time), 0)
		if chain.After(t) {
			t = chain
		}
	}
	return t, chain
}
