package svmfacilitator

import (
	"context"
	"fmt"
	"time"

	"github.com/aovhq/aov/x402"
)

// Whose settlement a landed transaction is, by the chain alone.
//
// A read by the chain alone, of a send this facilitator did not make (a
// peer's: PeerSettlementStatus; a remote facilitator's: StatusReader),
// finds the payment's transaction landed but holds nothing that says which
// settlement sent it. A payment already settled and answered at one gate
// can be replayed at another with claims of its own; if the replay passes
// Verify (a node a slot behind simulates it as fine) and its Settle ends
// without a verdict (a look-up that fails, or a duplicate_settlement reply
// lost), the gate holds it and asks the chain, which shows the original's
// transaction landed. Answered settled, the gate would serve the replay:
// one charge, two paid answers. So a landed transaction is the asking
// attempt's only if it landed after that attempt began; one that landed
// earlier was sent by another settlement, and the gate releases its claim
// and answers duplicate_settlement.
//
// Ages are compared, not times, so that an offset between the chain's
// clock and the gateway's cancels: the transaction's age on the chain's
// own clock (the Clock sysvar now, less the blockTime of its block)
// against the attempt's on the gateway's (now less when it began).
//
// "Now" on the chain's clock is the Clock of the bank that answers, and a
// node of a pool behind the tip answers with a clock as far behind: the
// transaction looks younger by the node's lag, and a replay past
// AttemptMargin would be read as its own. So the Clock is read from a
// confirmed bank no older than the one a node names as its confirmed
// tip just before (getSlot), nor than the newest confirmed bank any reply
// has shown (RPC.seen, a floor that lapses after a minute of older answers:
// slotFloor); an older bank's answer is an error, and the outcome stays
// undecided. A lag remains possible only when every node asked, these two
// included, lags alike.

// AttemptMargin is how much older than the attempt a landed transaction
// may be and still be the attempt's own. Block times are whole seconds
// (each of the two readings of the chain's clock is up to a second
// short), a bank's clock is the validators' estimate of the wall time and
// moves with their votes, not smoothly, and the gateway's clock may be
// stepped between the claim and the read: 5 s covers these with room, and
// is far below the seconds a replay takes to be claimed, verified and
// settled after the original was served. It is also what stays open: a
// replay whose attempt began before the original landed, or within
// AttemptMargin after, is still read as its own (the chain cannot tell
// two attempts apart that both began before the landing).
const AttemptMargin = 5 * time.Second

// landing is where a transaction landed: its slot, and its block's time
// (unix seconds on the chain's clock; nil when the node does not tell).
type landing struct {
	slot      uint64
	blockTime *int64
}

// attributed is what a read by the chain alone answers for the payment's
// transaction sig, which landed and succeeded (at landed; nil: asked of
// the node, getTransaction), for an attempt that began at began (the
// gateway's clock; zero when not known):
//   - settled, naming sig, when it is no more than AttemptMargin older
//     than the attempt;
//   - settled by another settlement (settledElsewhere) when it is older;
//   - settled, naming sig, when began is not known (zero): a held record
//     written before records kept their attempt's start, which its gate
//     served by the landing alone; undecided it would be held until its
//     claim lapsed, its buyer charged and never served;
//   - an error when either time cannot be read, or the chain's clock
//     only from a bank behind the tip: the outcome stays undecided, never
//     settled.
func (f *Facilitator) attributed(ctx context.Context, sig string, landed *landing, began time.Time) (x402.SettlementStatus, error) {
	var out x402.SettlementStatus
	if began.IsZero() {
		return x402.SettlementStatus{State: x402.SettlementDone, Transaction: sig}, nil
	}
	if landed == nil {
		lt, err := f.rpc.Transaction(ctx, sig)
		if err != nil {
			return out, err
		}
		if lt == nil {
			return out, fmt.Errorf("solana rpc getTransaction: transaction %s, which landed, is not served", sig)
		}
		landed = &landing{slot: lt.Slot, blockTime: lt.BlockTime}
	}
	if landed.blockTime == nil {
		return out, fmt.Errorf("solana rpc: no block time for transaction %s: whose settlement it is cannot be told", sig)
	}
	if _, err := f.rpc.Slot(ctx, confirmed); err != nil {
		return out, err
	}
	chainNow, _, err := f.rpc.ChainTime(ctx, max(landed.slot, f.rpc.seenAt(confirmed)))
	if err != nil {
		return out, err
	}
	if older(time.Duration(chainNow-*landed.blockTime)*time.Second, now().Sub(began)) {
		return settledElsewhere(sig), nil
	}
	return x402.SettlementStatus{State: x402.SettlementDone, Transaction: sig}, nil
}

// older is the one rule: a transaction of age txAge (on the chain's
// clock) is another settlement's when it is older than the attempt,
// attemptAge (on the gateway's), by more than AttemptMargin.
func older(txAge, attemptAge time.Duration) bool {
	return txAge > attemptAge+AttemptMargin
}
