package svmfacilitator

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// PeerSettlementStatus is SettlementStatus for a payment the caller knows
// a peer sent: another facilitator holding this fee payer's key (a remote
// one of the gateway's, in the same multi). A payment this facilitator
// sent itself (one it remembers, in memory or as a send whose outcome it
// has not learned), or was asked to send by a Settle that sent nothing
// (unsent: the gateway asked this member, not the peer), is answered as
// SettlementStatus answers it (sent again while the chain does not know
// it, settled when a Settle of it sent nothing), except that a payment of
// which it then holds neither is never settled here: it is the peer's to
// send. Any other
// is judged by the chain alone, by the signature the peer sent it under
// (the fee payer's over the message, signed again here: ed25519 is
// deterministic, and a record of the send in Config.Sent, whoever wrote
// it, names that same one): landed and succeeded is the asking attempt's,
// which began at began (x402.SentSettlement.After), when it landed after
// that attempt began (attributed): settled, naming the transaction; one
// that landed earlier is settled by another settlement (a replay of a
// payment already settled and answered, held at a gate with claims of its
// own). Failed on chain, or expired unknown (peerPoll), is never; else
// undecided. The record a shared store holds of the peer's send is never
// read as another's: it is the peer's, marked answered when the peer's own
// reply went out (and was lost), and the gateway that asks holds the claim
// that makes the payment its caller's. Nothing is dropped or remembered; a
// record still unanswered is marked answered as the read answers settled
// (markAnswered).
func (f *Facilitator) PeerSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, began time.Time) (x402.SettlementStatus, error) {
	var out x402.SettlementStatus
	tx, err := f.askedAbout(p, req)
	if err != nil {
		return out, err
	}
	key := tx.MessageHash()
	f.mu.Lock()
	until, asked := f.unsent[key]
	asked = asked && now().Before(until)
	own := f.memory(key, now()) != nil || f.unlearned[key] != nil || asked
	f.mu.Unlock()
	if own {
		// Settled here only when a Settle of this process was asked for
		// it and sent nothing (unsent): else, should its memory go
		// meanwhile, a payment this process holds no send of is the
		// peer's.
		return f.status(ctx, p, req, asked)
	}
	if len(tx.AccountKeys) == 0 || tx.AccountKeys[0] != f.feePayer {
		return out, errors.New("the payment's fee payer is not this facilitator's")
	}
	sig := base58.Encode(ed25519.Sign(f.key, tx.Message))
	o, err := f.peerPoll(ctx, sig, base58.Encode(tx.Blockhash[:]))
	if err != nil {
		return out, err
	}
	if o.state == x402.SettlementDone {
		if out, err = f.attributed(ctx, sig, nil, began); err != nil {
			return out, err
		}
		if out.State == x402.SettlementDone {
			if err := f.markAnswered(ctx, key, sig); err != nil {
				return x402.SettlementStatus{}, err
			}
		}
		out.Payer = tx.Payer()
		return out, nil
	}
	out.State = o.state
	return out, nil
}

// markAnswered marks key's record in Config.Sent answered, naming sig,
// when it is still unanswered, for a peer read about to answer settled:
// the gate serves the payment on that answer, and a record left
// unanswered would be adopted by a later Settle of the same payment (a
// replay, here or on any instance sharing the store) and answered success
// a second time. It is this facilitator's own send made before a restart
// (in a multi with a remote member every send not remembered is read as a
// peer's) or a peer's whose reply has not gone out. No record, one already
// answered (the peer's reply went out, and was lost), or one another
// marked meanwhile (store.ErrNoteChanged) leaves the answer settled, as a
// peer read answers them; any other error, the outcome undecided, and the
// next read marks it.
func (f *Facilitator) markAnswered(ctx context.Context, key [32]byte, sig string) error {
	f.enter() // Close waits for the mark
	defer f.leave()
	rec, err := f.recorded(ctx, key)
	if err != nil {
		return fmt.Errorf("reading the record of sent transaction %s: %w", sig, err)
	}
	s := &settlement{}
	if rec == nil || !f.adopt(key, s, rec) {
		return nil
	}
	if err := f.answerSent(ctx, s, sig); err != nil && !errors.Is(err, store.ErrNoteChanged) {
		return fmt.Errorf("marking the record of sent transaction %s answered: %w", sig, err)
	}
	return nil
}

// peerPoll is poll for a peer's send, which this process neither simulated
// nor sent: no record here tells the slot of the bank that accepted it,
// and the newest slot this process has seen can be older (the peer reads
// another node, or pool), at which this node answers a blockhash it has
// not seen yet invalid as it does an expired one. So the floor of the
// judgement of expiry is a slot at which this node held the blockhash
// valid (peerValid), a bank that had seen it: one no older that holds it
// invalid is past it. Without one (the first read, or every read came
// after the blockhash had gone) expiry is undecided, never "never": the
// transaction could still be on its way.
func (f *Facilitator) peerPoll(ctx context.Context, sig, blockhash string) (polled, error) {
	floor := f.peerValidAt(blockhash)
	o, err := f.poll(ctx, sig, blockhash, floor)
	switch {
	case err != nil:
		return polled{}, err
	case o.validAt > 0:
		f.peerSawValid(blockhash, o.validAt)
	case o.state == x402.SettlementNever && o.failed == "" && floor == 0:
		return polled{}, nil
	}
	return o, nil
}

// peerSight is a slot at which this facilitator's node held a blockhash
// valid, and when a peer read saw it.
type peerSight struct {
	slot uint64
	at   time.Time
}

// peerValidAt is the newest slot at which a peer read saw blockhash
// valid, 0 for none.
func (f *Facilitator) peerValidAt(blockhash string) uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.peerValid[blockhash].slot
}

// peerSawValid remembers that this node held blockhash valid at slot. A
// blockhash lasts 150 slots: its sight is forgotten SentRecordHold after
// it was seen, as a record of a send is, long after it can matter.
func (f *Facilitator) peerSawValid(blockhash string, slot uint64) {
	t := now()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.peerValid == nil {
		f.peerValid = map[string]peerSight{}
	}
	for b, s := range f.peerValid {
		if t.Sub(s.at) > SentRecordHold {
			delete(f.peerValid, b)
		}
	}
	if slot > f.peerValid[blockhash].slot {
		f.peerValid[blockhash] = peerSight{slot: slot, at: t}
	}
}
