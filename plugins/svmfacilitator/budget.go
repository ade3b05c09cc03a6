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
	// DefaultMaxFailedLamports is what all failed settlements together may
	// cost the fee payer within FailureWindow (0.005 SOL, about 500 failures
	// of the official client's payment) before payments carrying optional
	// instructions are refused.
	DefaultMaxFailedLamports = 5_000_000
	// DefaultFailureWindow is how long a failure counts.
	DefaultFailureWindow = time.Hour
)

// lamportsPerSignature is Solana's base fee: the fee payer pays it for
// each signature of a transaction, landed or failed.
const lamportsPerSignature = 5000

// exposure is what one settlement puts at risk: the fee the fee payer pays
// if it fails on chain, the identities a failure is charged to, and
// whether it carries optional instructions.
type exposure struct {
	fee uint64
	// ids are the transfer's authority and source token account. The
	// attacker controls both, and a new one of either is cheap alone (a
	// delegate needs one Approve; another token account under the same key
	// one create), so a failure is charged to both and either one over the
	// budget refuses the payment: escaping it takes a new key with a new
	// funded token account.
	ids [2]PublicKey
	// optional: Lighthouse instructions or a second Memo, the parts of a
	// payment that a plain transfer does not need and that can make a
	// transaction that simulated fail when it lands.
	optional bool
}

// feeOf is the fee the fee payer pays for a transaction of signers
// signatures with a compute unit limit of units at price micro-lamports
// per unit, landed or failed: the base fee per signature plus the priority
// fee, charged on the limit asked for, not the units used. It saturates.
func feeOf(signers int, units uint32, price uint64) uint64 {
	hi, lo := bits.Mul64(price, uint64(units))
	if hi >= 1_000_000 {
		return math.MaxUint64
	}
	q, r := bits.Div64(hi, lo, 1_000_000)
	if r > 0 {
		q++
	}
	base := uint64(signers) * lamportsPerSignature
	if q > math.MaxUint64-base {
		return math.MaxUint64
	}
	return q + base
}

// budget records the settlements that failed on chain, per payer identity
// and in lamports overall, and the settlements in flight, and refuses the
// payments that would go past either budget. It lives in the facilitator's
// memory: per process, empty after a restart.
type budget struct {
	perPayer int
	inFlight int
	lamports uint64
	window   time.Duration

	mu sync.Mutex
	// ids holds the identities with a failure in the window or a
	// settlement in flight; nothing else, so it stays as small as the
	// attack that fills it is costly.
	ids map[PublicKey]*identity
	// failed are the failures in the window, oldest first, and spent
	// their fees.
	failed []failure
	spent  uint64
	// optionalInFlight is the fees of the settlements in flight that carry
	// optional instructions: counted against the lamport budget before
	// they are sent, so concurrent ones cannot pass it together.
	optionalInFlight uint64
	sweptAt          time.Time
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
	if x.optional && b.spent+b.optionalInFlight+x.fee > b.lamports {
		return ReasonOptionalInstructionsSuspended, "settlements that failed on chain have used the fee payer's budget for now; a payment may carry no Lighthouse instruction and at most one Memo"
	}
	return "", ""
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
		id := b.ids[k]
		if id == nil {
			id = &identity{}
			b.ids[k] = id
		}
		id.inFlight++
	}
	if x.optional {
		b.optionalInFlight += x.fee
	}
	return "", ""
}

// release ends x's reservation: its outcome is known, or no longer
// awaited (pending outcomes are not held in flight: a later Settle or
// SettlementStatus that learns of a failure records it with fail).
func (b *budget) release(x exposure) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range x.ids {
		if id := b.ids[k]; id != nil && id.inFlight > 0 {
			id.inFlight--
		}
	}
	if x.optional {
		b.optionalInFlight -= min(x.fee, b.optionalInFlight)
	}
}

// fail records that x was sent and failed on chain: the fee payer paid
// its fee.
func (b *budget) fail(x exposure) {
	if x == (exposure{}) {
		return // a record made without settling (unrecorded): nothing to charge
	}
	t := now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, k := range x.ids {
		id := b.ids[k]
		if id == nil {
			id = &identity{}
			b.ids[k] = id
		}
		id.failures = append(id.failures, t)
		if len(id.failures) > b.perPayer {
			id.failures = id.failures[len(id.failures)-b.perPayer:]
		}
	}
	b.failed = append(b.failed, failure{at: t, fee: x.fee})
	if b.spent += x.fee; b.spent < x.fee {
		b.spent = math.MaxUint64 // only with an absurd max_compute_unit_price
	}
}
