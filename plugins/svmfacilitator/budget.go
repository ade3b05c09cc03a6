package svmfacilitator

import (
	"fmt"
	"math"
	"math/bits"
	"sync"
	"time"
)

// Defaults of the failure budgets (Config).
const (
	// DefaultMaxFailedPerPayer is how many settlements of one payer may
	// fail on chain within FailureWindow before its payments are refused.
	// An honest payer's settlement fails on chain only when it spends the
	// same tokens elsewhere in the second between verify and settle.
	DefaultMaxFailedPerPayer = 3
	// DefaultMaxInFlightPerPayer caps one payer's settlements sent and not
	// yet confirmed: one move of its tokens fails them all at once, so
	// without a cap the failure budget would count only after the damage.
	DefaultMaxInFlightPerPayer = 16
	// DefaultMaxFailedLamports is what failed settlements may cost the fee
	// payer within FailureWindow before payments asking for a priority fee
	// above MaxPriorityFeePastBudget are refused (0.005 SOL: it holds 19
	// failures at the default caps, 260,000 lamports each, or 499 of the
	// official client's payment, 10,001 each).
	DefaultMaxFailedLamports = 5_000_000
	// DefaultMaxPriorityFeePastBudget is the priority fee a payment may ask
	// for once failures have used MaxFailedLamports: one signature's base
	// fee, what a payer pays itself for each move of its tokens that makes
	// settlements fail. Past the budget a failure then costs the fee payer
	// at most 15,000 lamports (two signatures and this), instead of the
	// 260,000 the caps allow. It admits the official client's priority fee
	// (1 micro-lamport × 20,000 units: 1 lamport) and any wallet's up to
	// 100,000 micro-lamports per unit at the 50,000-unit cap.
	DefaultMaxPriorityFeePastBudget = lamportsPerSignature
	// DefaultFailureWindow is how long a failure counts.
	DefaultFailureWindow = time.Hour
)

// lamportsPerSignature is Solana's base fee: the fee payer pays it for
// each signature of a transaction, landed or failed.
const lamportsPerSignature = 5000

// exposure is what one settlement puts at risk: the fee the fee payer pays
// if it fails on chain, the part of it the payment chose (its priority
// fee), and the identities a failure is charged to.
type exposure struct {
	fee      uint64
	priority uint64
	// ids are the transfer's authority and source token account. The
	// attacker controls both, and a new one of either is cheap alone (a
	// delegate needs one Approve; another token account under the same key
	// one create), so a failure is charged to both and either one over the
	// budget refuses the payment: escaping it takes a new key with a new
	// funded token account.
	ids [2]PublicKey
}

// priorityFee is the priority fee of a compute unit limit of units at
// price micro-lamports per unit, in lamports: charged on the limit asked
// for, not the units used, rounded up as the chain rounds it. It
// saturates.
func priorityFee(units uint32, price uint64) uint64 {
	hi, lo := bits.Mul64(price, uint64(units))
	if hi >= 1_000_000 {
		return math.MaxUint64
	}
	q, r := bits.Div64(hi, lo, 1_000_000)
	if r > 0 {
		if q == math.MaxUint64 {
			return q // rounding up would wrap to 0: a free payment
		}
		q++
	}
	return q
}

// feeOf is the fee the fee payer pays for a transaction of signers
// signatures with a priority fee of priority lamports, landed or failed:
// the base fee per signature plus the priority fee. It saturates.
func feeOf(signers int, priority uint64) uint64 {
	return sat(uint64(signers)*lamportsPerSignature, priority)
}

// budget records the settlements that failed on chain, per payer identity
// and in lamports overall, and the settlements in flight, and refuses the
// payments that would go past either budget. It lives in the facilitator's
// memory: per process, empty after a restart.
//
// The overall budget never refuses a payment for what it carries: a plain
// transfer fails as well as any when its payer moves the tokens away, so
// refusing what some wallets add (Phantom's Lighthouse assertions) would
// protect nothing and let a few failures refuse those wallets' payers.
// What a failure costs the fee payer is the fee its payment asked for, so
// that is what the budget limits: past it a payment may ask for a priority
// fee of at most maxPriority, and each further failure costs the fee payer
// its base fee and at most that (by default at most three times the 5,000
// lamports the payer spends on the move that fails it), not the 260,000
// the caps allow.
type budget struct {
	perPayer    int
	inFlight    int
	lamports    uint64
	maxPriority uint64
	window      time.Duration

	mu sync.Mutex
	// ids holds the identities with a failure in the window or a
	// settlement in flight; nothing else, so it stays as small as the
	// attack that fills it is costly.
	ids map[PublicKey]*identity
	// failed are the failures in the window, oldest first, and spent
	// their fees.
	failed []failure
	spent  uint64
	// costlyInFlight is the fees of the settlements in flight whose
	// priority fee is above maxPriority: counted against the lamport
	// budget before they are sent, so concurrent ones cannot pass it
	// together.
	costlyInFlight uint64
	sweptAt        time.Time
}

type identity struct {
	failures []time.Time // the last perPayer failures, oldest first
	inFlight int
}

type failure struct {
	at  time.Time
	fee uint64
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

// prune drops the failures past the window from the lamport total, and at
// most once per window/8 the identities left with nothing. b.mu is held.
func (b *budget) prune(t time.Time) {
	i := 0
	for i < len(b.failed) && t.Sub(b.failed[i].at) >= b.window {
		b.spent -= min(b.failed[i].fee, b.spent)
		i++
	}
	b.failed = b.failed[i:]
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

// costly reports whether x asks for a priority fee above what the
// budget allows once it is used.
func (b *budget) costly(x exposure) bool { return x.priority > b.maxPriority }

// refusal is why x may not be settled at t, with the reason code; "" when
// it may. Verify and Settle ask the same: a payer at its cap of
// settlements in flight is refused at verify too, before a gateway that
// settles after the call runs it.
func (b *budget) refusal(x exposure, t time.Time) (reason, msg string) {
	b.prune(t)
	for _, k := range x.ids {
		id := b.ids[k]
		if id == nil {
			continue
		}
		if n := b.recent(id, t); n >= b.perPayer {
			return ReasonPayerFailureBudget, fmt.Sprintf("%d settlements of this payer failed on chain within %s, each paid for by the fee payer; pay again later", n, b.window)
		}
		if id.inFlight >= b.inFlight {
			return ReasonPayerFailureBudget, fmt.Sprintf("%d settlements of this payer are in flight; pay again once they are confirmed", id.inFlight)
		}
	}
	if b.costly(x) && sat(sat(b.spent, b.costlyInFlight), x.fee) > b.lamports {
		return ReasonFailureBudgetPriorityFee, fmt.Sprintf("settlements that failed on chain have used the fee payer's budget for now; a payment may ask for a priority fee (compute unit limit × price) of at most %d lamports, this one asks for %d", b.maxPriority, x.priority)
	}
	return "", ""
}

// sat is a+b, saturating.
func sat(a, b uint64) uint64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxUint64
}

// check is refusal without reserving: Verify's answer.
func (b *budget) check(x exposure) (reason, msg string) {
	t := now()
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.refusal(x, t)
}

// reserve counts x in flight unless it is refused; the caller sends it and
// then calls release.
func (b *budget) reserve(x exposure) (reason, msg string) {
	t := now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if reason, msg = b.refusal(x, t); reason != "" {
		return reason, msg
	}
	for _, k := range x.ids {
		id := b.entry(k)
		id.inFlight++
	}
	if b.costly(x) {
		b.costlyInFlight = sat(b.costlyInFlight, x.fee)
	}
	return "", ""
}

// entry returns k's identity, made when it has none. b.mu is held.
func (b *budget) entry(k PublicKey) *identity {
	id := b.ids[k]
	if id == nil {
		id = &identity{}
		b.ids[k] = id
	}
	return id
}

// release ends x's reservation: its outcome is known (Facilitator.learned,
// which holds it until then, however long that takes: a pending settlement
// is still in flight).
func (b *budget) release(x exposure) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range x.ids {
		if id := b.ids[k]; id != nil && id.inFlight > 0 {
			id.inFlight--
		}
	}
	if b.costly(x) {
		b.costlyInFlight -= min(x.fee, b.costlyInFlight)
	}
}

// fail records that x was sent and failed on chain: the fee payer paid
// its fee.
func (b *budget) fail(x exposure) {
	if x == (exposure{}) {
		return // nothing risked: nothing to charge
	}
	t := now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range x.ids {
		id := b.entry(k)
		id.failures = append(id.failures, t)
		if len(id.failures) > b.perPayer {
			id.failures = id.failures[len(id.failures)-b.perPayer:]
		}
	}
	b.failed = append(b.failed, failure{at: t, fee: x.fee})
	b.spent = sat(b.spent, x.fee) // saturates only with an absurd max_compute_unit_price
}
