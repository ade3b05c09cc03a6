package svmfacilitator

import (
	"testing"
)

// TestFewThrowawayKeysCannotRefuseHonestPayers is a hostile review's
// scenario, on the budget alone (no chain: it counts what the budget
// admits). Failures at the default caps (50,000 units at 5,000,000
// micro-lamports: 260,000 lamports each), from 7 throwaway keys at 3
// failures each with plain transfers, used to fill the lamport budget in 20
// failures, after which every payment carrying a Lighthouse assertion
// (Phantom adds one) was refused, from payers that never failed. Now the
// full budget refuses only a priority fee above the cap past the budget:
// the attacker's own next costly payment is refused, and an honest payer at
// the official client's fees, Lighthouse or not, is not.
func TestFewThrowawayKeysCannotRefuseHonestPayers(t *testing.T) {
	b := &budget{perPayer: DefaultMaxFailedPerPayer, inFlight: DefaultMaxInFlightPerPayer, lamports: DefaultMaxFailedLamports,
		maxPriority: DefaultMaxPriorityFeePastBudget, window: DefaultFailureWindow, ids: map[PublicKey]*identity{}}
	pf := priorityFee(DefaultMaxComputeUnits, DefaultMaxComputeUnitPrice)
	fee := feeOf(2, pf)
	if fee != 260_000 {
		t.Fatalf("a failure at the caps costs %d lamports, want 260,000", fee)
	}
	failures, refused := 0, 0
	for key := byte(1); key <= 7; key++ {
		var auth, src PublicKey
		auth[0], src[0] = key, 100+key
		for range DefaultMaxFailedPerPayer {
			x := exposure{fee: fee, priority: pf, ids: [2]PublicKey{auth, src}}
			if r, _ := b.reserve(x); r != "" {
				if r != ReasonFailureBudgetPriorityFee {
					t.Fatalf("the attacker's payment at the caps was refused with %s", r)
				}
				refused++
				break
			}
			b.release(x)
			b.fail(x)
			failures++
		}
	}
	// 19 × 260,000 fit in 5,000,000; the 20th does not.
	if failures != 19 || refused != 1 || b.spent != 19*fee {
		t.Fatalf("%d failures (%d lamports) and %d refusals, want 19 failures, the 20th refused", failures, b.spent, refused)
	}

	// The 60,000 lamports left hold no failure at the caps, but a costlier
	// payment than the cap past the budget allows could still fit. The
	// attacker goes on with cheap payments (1 lamport of priority fee):
	// they are not refused, and each costs the fee payer 10,001 lamports,
	// twice what the attacker pays for the move of its tokens that fails
	// it.
	for key := byte(8); key <= 9; key++ {
		var auth, src PublicKey
		auth[0], src[0] = key, 100+key
		for range DefaultMaxFailedPerPayer {
			x := exposure{fee: feeOf(2, 1), priority: 1, ids: [2]PublicKey{auth, src}}
			if r, msg := b.reserve(x); r != "" {
				t.Fatalf("a cheap payment was refused: %s %s", r, msg)
			}
			b.release(x)
			b.fail(x)
		}
	}
	if b.spent != 19*fee+6*10_001 {
		t.Fatalf("spent %d", b.spent)
	}

	// An honest payer at the official client's fees (1 micro-lamport ×
	// 20,000 units), whatever its wallet adds after the transfer: the
	// budget never sees the instructions, only the fee.
	var victim, vsrc PublicKey
	victim[0], vsrc[0] = 200, 201
	honest := exposure{fee: feeOf(2, priorityFee(20_000, 1)), priority: priorityFee(20_000, 1), ids: [2]PublicKey{victim, vsrc}}
	if r, msg := b.check(honest); r != "" {
		t.Errorf("after %d failures of 7 attacker keys, an honest payer who never failed is refused: %s %s", failures, r, msg)
	}
	// Nor at the highest priority fee allowed past the budget.
	atCap := exposure{fee: feeOf(2, DefaultMaxPriorityFeePastBudget), priority: DefaultMaxPriorityFeePastBudget, ids: [2]PublicKey{victim, vsrc}}
	if r, msg := b.check(atCap); r != "" {
		t.Errorf("a priority fee of exactly %d lamports is refused: %s %s", DefaultMaxPriorityFeePastBudget, r, msg)
	}
	// One lamport more is refused, with the cap in the message.
	over := exposure{fee: feeOf(2, DefaultMaxPriorityFeePastBudget+1), priority: DefaultMaxPriorityFeePastBudget + 1, ids: [2]PublicKey{victim, vsrc}}
	if r, msg := b.check(over); r != ReasonFailureBudgetPriorityFee || msg != "settlements that failed on chain have used the fee payer's budget for now; a payment may ask for a priority fee (compute unit limit × price) of at most 5000 lamports, this one asks for 5001" {
		t.Errorf("a priority fee over the cap past the budget: %s %q", r, msg)
	}
}

// TestCostlyPaymentsInFlightCountAgainstTheBudget: payments above the
// priority fee cap that are in flight count against the lamport budget
// before any of them fails, so a burst of concurrent ones from many fresh
// keys cannot pass it together; cheap ones in flight do not count.
func TestCostlyPaymentsInFlightCountAgainstTheBudget(t *testing.T) {
	b := &budget{perPayer: DefaultMaxFailedPerPayer, inFlight: DefaultMaxInFlightPerPayer, lamports: DefaultMaxFailedLamports,
		maxPriority: DefaultMaxPriorityFeePastBudget, window: DefaultFailureWindow, ids: map[PublicKey]*identity{}}
	pf := priorityFee(DefaultMaxComputeUnits, DefaultMaxComputeUnitPrice)
	admitted := 0
	for key := range byte(40) {
		var auth, src PublicKey
		auth[0], src[0] = key, 100+key
		if r, _ := b.reserve(exposure{fee: feeOf(2, pf), priority: pf, ids: [2]PublicKey{auth, src}}); r == "" {
			admitted++
		} else if r != ReasonFailureBudgetPriorityFee {
			t.Fatalf("refused with %s", r)
		}
	}
	if admitted != 19 {
		t.Fatalf("%d costly payments admitted in flight at once, want the 19 the budget holds", admitted)
	}
	for key := range byte(40) {
		var auth, src PublicKey
		auth[1], src[1] = key, 100+key
		if r, msg := b.reserve(exposure{fee: feeOf(2, 1), priority: 1, ids: [2]PublicKey{auth, src}}); r != "" {
			t.Fatalf("a cheap payment was refused: %s %s", r, msg)
		}
	}
}
