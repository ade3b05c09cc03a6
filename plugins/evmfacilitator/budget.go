package evmfacilitator

import (
	"fmt"
	"math/big"
	"slices"
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
// sent. The amounts in flight are counted against the payer's balance of
// their token too (committed): the balance and the simulation each
// settlement reads show none of the payer's other settlements until they
// land, so without that a payer funded for one payment could pay many
// calls at once and all but one would revert at the relayer's gas. A
// flight in one token takes nothing from the payer's balance of another,
// so the amounts are per (token, payer); the cap on flights is per payer,
// since one payer's moves revert its settlements in every token. A reverted settlement still costs the relayer its gas, and a payer
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
	flights  []*flight   // its settlements in flight, oldest first
}

// flight is one settlement in flight: the payer's, for value of token. A
// settlement holds it from before it reads the payer's balance until its
// outcome is known (or no longer awaited), so that every settlement that
// reads the balance later counts it, however the reads and sends of
// concurrent settlements interleave.
type flight struct {
	token, payer common.Address
	value        *big.Int
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
		if len(id.flights) == 0 && b.recent(id, t) == 0 {
			delete(b.ids, k)
		}
	}
}

// ahead is the part of id's flights a settlement holding own must count:
// those held before it; all of them for own nil (Verify, which holds
// none). b.mu is held.
func ahead(id *identity, own *flight) []*flight {
	for i, fl := range id.flights {
		if fl == own {
			return id.flights[:i]
		}
	}
	return id.flights
}

// refusal is why payer's payment may not be settled at t; "" when it may.
// own is the settlement's own flight (nil for Verify). Verify and Settle
// ask the same, so a payer at its cap is refused at verify too, before a
// gateway that settles after the call runs it.
//
// contract: the payer's account has code (a contract, or an EOA
// delegating its code under EIP-7702; Facilitator.payerCode), whose
// flights count against its failure budget too: that code runs inside the
// settlement whatever the signature (the token asks its
// isValidSignature) and can make it revert once mined, after every
// simulation passed, at up to MaxSettlementGas each, and a revert counts
// only once its receipt is read. Counted as failures while they fly, such
// a payer's settlements sent and reverted within a window are at most
// MaxFailedPerPayer, whatever their concurrency. An account without code
// runs none in its settlement, so its settlements keep the in-flight cap
// alone. The rule with contract is the stricter: what it lets pass, the
// other does too.
func (b *budget) refusal(payer common.Address, own *flight, contract bool, t time.Time) (reason, msg string) {
	b.prune(t)
	id := b.ids[payer]
	if id == nil {
		return "", ""
	}
	if n := b.recent(id, t); n >= b.perPayer {
		return ReasonPayerFailureBudget, fmt.Sprintf("%d settlements of this payer reverted on chain within %s, each paid for by the relayer; pay again later", n, b.window)
	}
	if n, m := b.recent(id, t), len(ahead(id, own)); contract && n+m >= b.perPayer {
		return ReasonPayerFailureBudget, fmt.Sprintf("this payer is a contract account, each of whose settlements may revert at the relayer's gas: %d reverted on chain within %s and %d are in flight, of at most %d; pay again once they are confirmed", n, b.window, m, b.perPayer)
	}
	if n := len(ahead(id, own)); n >= b.inFlight {
		return ReasonPayerFailureBudget, fmt.Sprintf("%d settlements of this payer are in flight; pay again once they are confirmed", n)
	}
	return "", ""
}

// check is the payment's refusal; own and contract as for refusal.
func (b *budget) check(payer common.Address, own *flight, contract bool) (reason, msg string) {
	t := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refusal(payer, own, contract, t)
}

// committed is what payer's settlements in token in flight ahead of own
// (all of them for own nil) may still take from its balance of token, and
// how many they are: the balance the chain reports does not show them
// until they land. nil when there are none.
func (b *budget) committed(token, payer common.Address, own *flight) (sum *big.Int, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.ids[payer]
	if id == nil {
		return nil, 0
	}
	for _, fl := range ahead(id, own) {
		if fl.token != token {
			continue
		}
		if sum == nil {
			sum = new(big.Int)
		}
		sum.Add(sum, fl.value)
		n++
	}
	return sum, n
}

// hold counts a settlement of value of token by payer in flight, refusing
// nothing (the caller asks check, after the payment's own checks); the
// caller calls release or end when its outcome is known.
func (b *budget) hold(token, payer common.Address, value *big.Int) *flight {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.entry(payer)
	fl := &flight{token: token, payer: payer, value: value}
	id.flights = append(id.flights, fl)
	return fl
}

// entry returns payer's identity, made when it has none. b.mu is held.
func (b *budget) entry(payer common.Address) *identity {
	id := b.ids[payer]
	if id == nil {
		id = &identity{}
		b.ids[payer] = id
	}
	return id
}

// release ends a flight that cost the relayer nothing it must count: the
// outcome is known, or, for a payer without code, no longer awaited (its
// unknown outcome is not held in flight; a payer with code's is, until
// Facilitator.follow learns it).
func (b *budget) release(fl *flight) { b.end(fl, false) }

// end ends a flight, and when failed records that its settlement was sent
// and reverted on chain (or, a contract payer's, may still): the relayer
// paid its gas. Both at once, so that the flight is never counted twice,
// nor not at all, by a concurrent check. fl nil: nothing held.
func (b *budget) end(fl *flight, failed bool) {
	if fl == nil {
		return
	}
	t := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if failed {
		id := b.entry(fl.payer)
		id.failures = append(id.failures, t)
		if len(id.failures) > b.perPayer {
			id.failures = id.failures[len(id.failures)-b.perPayer:]
		}
	}
	if id := b.ids[fl.payer]; id != nil {
		id.flights = slices.DeleteFunc(id.flights, func(x *flight) bool { return x == fl })
		if len(id.flights) == 0 && len(id.failures) == 0 {
			// Held by a payment refused for its balance, say: keyed by
			// payers anyone can make up, it must not wait for prune.
			delete(b.ids, fl.payer)
		}
	}
}
