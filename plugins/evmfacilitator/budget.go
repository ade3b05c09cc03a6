package evmfacilitator

import (
	"fmt"
	"sync"
	"time"

	"github.com/ethereum/go-ethereum/common"
)

// Defaults of the failure budget (Config), the Solana facilitator's.
const (
	// DefaultMaxFailedPerPayer is how many settlements of one payer may
	// revert on chain within FailureWindow before its payments are
	// refused. An honest payer's settlement reverts only when it spends
	// the same tokens, or the authorization's nonce, in the seconds between
	// verify and inclusion.
	DefaultMaxFailedPerPayer = 3
	// DefaultMaxInFlightPerPayer caps one payer's settlements sent and not
	// yet resolved: one move of its tokens reverts them all at once, so
	// without a cap the failure budget would count only after the damage.
	DefaultMaxInFlightPerPayer = 16
	// DefaultFailureWindow is how long a reverted settlement counts.
	DefaultFailureWindow = time.Hour
)

// ReasonPayerFailureBudget is this facilitator's own reason code (the
// reference has none): the payer's recent settlements reverted on chain,
// each at the relayer's gas, or too many of its settlements are in flight.
const ReasonPayerFailureBudget = "invalid_exact_evm_payer_failure_budget_exhausted"

// budget records, per payer (authorization.from), the settlements that
// were sent and reverted on chain, and the settlements in flight, and
// refuses the payments that would go past either cap, before anything is
// sent. A reverted settlement still costs the relayer its gas, and a payer
// can make its own revert at will (it moves its balance away, or spends
// the authorization's nonce with cancelAuthorization or another
// authorization, between the facilitator's gas estimate and inclusion), so
// without it the relayer would pay for reverts without end. It has the
// shape of the Solana facilitator's per-payer budget; the Solana one also
// budgets the priority fees payments choose, which have no counterpart
// here (the relayer sets the gas price). It lives in the facilitator's
// memory: per process, empty after a restart.
type budget struct {
	perPayer int
	inFlight int
	window   time.Duration
	now      func() time.Time // the wall clock; tests move it

	mu sync.Mutex
	// ids holds the payers with a failure in the window or a settlement
	// in flight; nothing else, so it stays as small as the attack that
	// fills it is costly (each entry cost its payer a transaction).
	ids     map[common.Address]*identity
	sweptAt time.Time
}

type identity struct {
	failures []time.Time // the last perPayer failures, oldest first
	inFlight int
}

func newBudget(cfg Config) *budget {
	return &budget{perPayer: cfg.MaxFailedPerPayer, inFlight: cfg.MaxInFlightPerPayer, window: cfg.FailureWindow,
		now: func() time.Time { return now() }, ids: map[common.Address]*identity{}}
}

// recent counts the failures of id within the window at t.
func (b *budget) recent(id *identity, t time.Time) int {
	n := 0
	for _, at := range id.failures {
		if t.Sub(at) < b.window {
			n++
		}
	}
	return n
}

// prune drops, at most once per window/8, the payers left with nothing.
// b.mu is held.
func (b *budget) prune(t time.Time) {
	if d := t.Sub(b.sweptAt); d >= 0 && d < b.window/8 {
		return
	}
	b.sweptAt = t
	for k, id := range b.ids {
		if id.inFlight == 0 && b.recent(id, t) == 0 {
			delete(b.ids, k)
		}
	}
}

// refusal is why payer's payment may not be settled at t; "" when it may.
// Verify and Settle ask the same, so a payer at its cap is refused at
// verify too, before a gateway that settles after the call runs it.
func (b *budget) refusal(payer common.Address, t time.Time) (reason, msg string) {
	b.prune(t)
	id := b.ids[payer]
	if id == nil {
		return "", ""
	}
	if n := b.recent(id, t); n >= b.perPayer {
		return ReasonPayerFailureBudget, fmt.Sprintf("%d settlements of this payer reverted on chain within %s, each paid for by the relayer; pay again later", n, b.window)
	}
	if id.inFlight >= b.inFlight {
		return ReasonPayerFailureBudget, fmt.Sprintf("%d settlements of this payer are in flight; pay again once they are confirmed", id.inFlight)
	}
	return "", ""
}

// check is refusal without reserving: Verify's answer.
func (b *budget) check(payer common.Address) (reason, msg string) {
	t := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refusal(payer, t)
}

// reserve counts payer's settlement in flight unless it is refused; the
// caller sends it and then calls release.
func (b *budget) reserve(payer common.Address) (reason, msg string) {
	t := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if reason, msg = b.refusal(payer, t); reason != "" {
		return reason, msg
	}
	id := b.ids[payer]
	if id == nil {
		id = &identity{}
		b.ids[payer] = id
	}
	id.inFlight++
	return "", ""
}

// release ends a reservation: the outcome is known, or no longer awaited
// (an unknown outcome is not held in flight).
func (b *budget) release(payer common.Address) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if id := b.ids[payer]; id != nil && id.inFlight > 0 {
		id.inFlight--
	}
}

// fail records that a settlement of payer was sent and reverted on chain:
// the relayer paid its gas.
func (b *budget) fail(payer common.Address) {
	t := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.ids[payer]
	if id == nil {
		id = &identity{}
		b.ids[payer] = id
	}
	id.failures = append(id.failures, t)
	if len(id.failures) > b.perPayer {
		id.failures = id.failures[len(id.failures)-b.perPayer:]
	}
}
