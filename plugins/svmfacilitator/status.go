package svmfacilitator

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// polled is what one look at a sent transaction tells.
type polled struct {
	// state: done (landed and succeeded), never (failed on chain, or its
	// blockhash expired while the chain did not know it), or undecided.
	state x402.SettlementState
	// failed is the on-chain error of a transaction that landed and failed.
	failed string
	// validAt is the slot of a bank that held the blockhash valid when this
	// look asked (undecided, unknown signature), 0 otherwise: a read of a
	// peer's send takes it as the floor of its later judgements of expiry
	// (peerPoll).
	validAt uint64
	// unseen: undecided because the chain does not know the signature
	// while its blockhash is valid. A send of this process is then sent
	// again (resendDue), and a payment it holds no send of is settled by a
	// status read (settleUnsent): the transaction can still land, and only
	// a send gets it there.
	unseen bool
	// landed is where a transaction found by a search landed (nil
	// otherwise, or when not told): its age, for attributed.
	landed *landing
}

// poll looks once at signature sig of a transaction built on blockhash,
// which a node at confirmed slot floor accepted (the simulation's slot; 0
// when no record remembers it). An unknown signature is judged unable to
// land only when the blockhash has expired (blockhashExpired) and the chain,
// as a bank at least as new as the one that said so, still does not know
// the signature after that answer (in case it landed in between).
func (f *Facilitator) poll(ctx context.Context, sig, blockhash string, floor uint64) (polled, error) {
	st, _, err := f.rpc.Status(ctx, sig, 0)
	switch {
	case err != nil:
		return polled{}, err
	case st != nil && (st.ConfirmationStatus == "confirmed" || st.ConfirmationStatus == "finalized"):
		if len(st.Err) > 0 && string(st.Err) != "null" {
			return polled{state: x402.SettlementNever, failed: string(st.Err)}, nil
		}
		return polled{state: x402.SettlementDone}, nil
	case st != nil:
		return polled{}, nil // seen, not yet confirmed
	}
	expired, at, err := f.blockhashExpired(ctx, blockhash, floor)
	switch {
	case err != nil:
		return polled{}, err
	case !expired:
		return polled{validAt: at, unseen: true}, nil
	}
	if st, _, err = f.rpc.Status(ctx, sig, at); err != nil || st != nil {
		return polled{}, err
	}
	return polled{state: x402.SettlementNever}, nil
}

// blockhashExpired reports whether no transaction built on blockhash can
// land any more, and the confirmed slot that showed it (when it can still
// land, the slot of the bank that showed it valid): invalid at the
// processed tip and in the confirmed bank (so a transaction that did land
// on it is confirmed, or on a dead fork, and a confirmed lookup sees it),
// each as a bank no older than floor, and than the newest bank of its
// commitment level any reply has shown (RPC.seen: slotFloor), sees it. It
// is the one rule of expiry for every judgement of "never":
//   - the processed tip alone can be a minority fork, or one node of a
//     load-balanced pool ahead of the one that answers the status, and
//     would call a transaction that is about to be confirmed "never
//     landed";
//   - a node answers false for a blockhash it has not seen yet exactly as
//     for an expired one: one a few slots behind the node that accepted
//     the transaction (a pool's other member) would call a seconds-old
//     blockhash expired while the transaction is on its way. Only a bank
//     at least as new as the one that accepted it can tell: floor when a
//     record remembers the simulation's; else, and as well, the newest
//     this process has seen (the status asked just before is one), which
//     is as new as the accepting one once any reply since the acceptance
//     came from a node as new. An older bank's answer is an error (the
//     node's -32016, or a behindError), so the outcome stays undecided.
func (f *Facilitator) blockhashExpired(ctx context.Context, blockhash string, floor uint64) (expired bool, at uint64, err error) {
	for _, level := range []int{processed, confirmed} {
		valid, slot, err := f.rpc.BlockhashValidAt(ctx, blockhash, level, max(floor, f.rpc.seenAt(level)))
		switch {
		case err != nil:
			return false, 0, err
		case valid:
			return false, slot, nil
		}
		at = slot
	}
	return true, at, nil
}

// askedAbout is the transaction of the payment a status read
// (SettlementStatus, PeerSettlementStatus) is asked about: an error when
// the payment is not on this facilitator's network or its payload is not
// a transaction, so that both reads refuse the same payments alike.
func (f *Facilitator) askedAbout(p x402.PaymentPayload, req x402.PaymentRequirements) (*Transaction, error) {
	if req.Network != f.network {
		return nil, fmt.Errorf("this facilitator settles on %s, not %s", f.network, req.Network)
	}
	tx, err := DecodePayload(p.Payload)
	if err != nil {
		return nil, fmt.Errorf("payment payload: %w", err)
	}
	return tx, nil
}

// SettlementStatus implements x402.SettlementChecker for a payment this
// facilitator sent and could not confirm in time (Settle's unknown
// outcome): it polls the transaction's signature once, and records what it
// learns as a later Settle would. A payment whose record it no longer
// holds (it restarted, or the record aged out DuplicateWindow after
// settling) is judged the same way: ed25519 signing is deterministic, so
// the fee payer's signature over the payment's message, the transaction's
// id, is signed again rather than remembered. A payment whose fee payer is
// not this facilitator's is an error.
//
// While the transaction's blockhash is valid and the chain does not know
// it, the read gets it there rather than wait for its expiry and a new
// payment: a send of this process is sent again, the same bytes
// (pollOwn), and a payment a Settle of this process was asked to send and
// left without a verdict before sending (the look-up, the simulation or
// the store failed, its caller went away, Close: unsent) is settled now
// through Settle's own path (settleUnsent), and answered from it: settled
// once it landed, pending until then (a refusal too: see settleUnsent). A
// read once the blockhash expired sends nothing, and so does a read of a
// payment no Settle of this process was asked for (a restart, a gateway
// that died before settling: its caller may never have decided to).
func (f *Facilitator) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	return f.status(ctx, p, req, true)
}

// status is SettlementStatus; settleUnsent false (a peer's read of its
// own send, PeerSettlementStatus) never settles a payment no Settle of
// this process sent.
func (f *Facilitator) status(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, settleUnsent bool) (x402.SettlementStatus, error) {
	var out x402.SettlementStatus
	tx, err := f.askedAbout(p, req)
	if err != nil {
		return out, err
	}
	// It may mark or drop the send's record: Close waits for it.
	f.enter()
	defer f.leave()
	key := tx.MessageHash()
	f.mu.Lock()
	e := f.memory(key, now())
	var sig, blockhash, failed string
	var inflight, pending, lost bool
	var floor uint64
	if e != nil {
		sig, blockhash, inflight, pending, out.Payer, floor, failed, lost = e.sig, e.blockhash, e.inflight, e.pending, e.payer, e.slot, e.failed, e.lost
	}
	f.mu.Unlock()
	switch {
	case e == nil:
		return f.unrecorded(ctx, tx, p, req, settleUnsent)
	case inflight || sig == "":
		return out, nil // a Settle is working on it
	case failed != "":
		out.State = x402.SettlementNever
		return out, nil
	case !pending:
		st := x402.SettlementStatus{State: x402.SettlementDone, Transaction: sig}
		if lost {
			st = settledElsewhere(sig)
		}
		st.Payer = out.Payer
		return st, nil
	}
	o, err := f.pollOwn(ctx, key, sig, blockhash, floor)
	if err != nil {
		return out, err
	}
	switch {
	case o.state == x402.SettlementDone:
		f.learned(key, false)
		st := f.statusLanded(ctx, e, sig)
		if st.State != x402.SettlementUndecided {
			f.finishLanded(key, st)
		}
		st.Payer = out.Payer
		return st, nil
	case o.state == x402.SettlementNever && o.failed != "":
		f.learned(key, true)
		f.finish(key, o.failed)
	case o.state == x402.SettlementNever:
		// Its blockhash expired: it can no longer land, and its record
		// in Config.Sent goes too, as a /settle or the resolver would
		// drop it.
		f.learned(key, false)
		f.forgetAndRelease(ctx, key, e, sig)
	}
	out.State = o.state
	return out, nil
}

// statusLanded is what a status read that learned s's transaction sig
// landed answers, by the mark of its record in Config.Sent (answerSent):
// the one place a status read decides it, as confirm decides a Settle's
// answer, because the gate serves a payment answered SettlementDone as its
// own. So:
//   - settled by another settlement (settledElsewhere) when the chain had
//     the transaction before a Settle of this facilitator sent it
//     (s.elsewhere): only a send this facilitator made, or adopted from
//     its record, may be its caller's own, as confirm answers the same
//     send duplicate_settlement;
//   - settled (SettlementDone naming sig) only when this facilitator marks
//     the record now, or has no record left to mark (it marked it
//     earlier, it lapsed, or there is no store): an unmarked record would
//     have a Settle elsewhere adopt it and answer success a second time;
//   - store.ErrNoteChanged, another Settle marked it first and answered
//     success: settled by another settlement (settledElsewhere), which
//     the gate neither serves nor holds as pending;
//   - any other error, the store cannot mark it now: undecided, the
//     record left unanswered, and the next read marks it.
func (f *Facilitator) statusLanded(ctx context.Context, s *settlement, sig string) x402.SettlementStatus {
	f.mu.Lock()
	elsewhere := s.elsewhere
	f.mu.Unlock()
	if elsewhere {
		return settledElsewhere(sig)
	}
	switch err := f.answerSent(ctx, s, sig); {
	case err == nil:
		return x402.SettlementStatus{State: x402.SettlementDone, Transaction: sig}
	case errors.Is(err, store.ErrNoteChanged):
		return settledElsewhere(sig)
	default:
		log.Printf("svm facilitator: marking the record of sent transaction %s answered: %v", sig, err)
		return x402.SettlementStatus{State: x402.SettlementUndecided}
	}
}

// settledElsewhere is the status of a payment whose transaction sig landed
// and another settlement answered success for: it can never settle for
// this caller (SettlementNever, with /settle's reason for it,
// duplicate_settlement), so the gate releases its claim and tells the
// buyer that payment is used, as it does a /settle answered
// duplicate_settlement.
func settledElsewhere(sig string) x402.SettlementStatus {
	return x402.SettlementStatus{State: x402.SettlementNever, Transaction: sig, Reason: ReasonDuplicateSettlement}
}

// finishLanded records in memory key's landed transaction as answered with
// st, a decided answer of statusLanded (or of a Settle that answered it
// duplicate_settlement: confirm's mark lost, a send found elsewhere, a
// record found marked): a later status read answers the same from memory,
// and a later Settle duplicate_settlement.
func (f *Facilitator) finishLanded(key [32]byte, st x402.SettlementStatus) {
	f.mu.Lock()
	if e := f.settled[key]; e != nil {
		e.lost = st.State == x402.SettlementNever
	}
	f.mu.Unlock()
	f.finish(key, "")
}

// unrecorded judges a payment the facilitator holds no record of by the
// signature it would have sent it under. One the chain does not know while
// its blockhash is valid is settled now (settleUnsent), when settle allows,
// a Settle of this process was asked for it and sent nothing (unsent), and
// this process holds no send of it (one it holds is sent again: pollOwn).
func (f *Facilitator) unrecorded(ctx context.Context, tx *Transaction, p x402.PaymentPayload, req x402.PaymentRequirements, settle bool) (x402.SettlementStatus, error) {
	var out x402.SettlementStatus
	if len(tx.AccountKeys) == 0 || tx.AccountKeys[0] != f.feePayer {
		return out, errors.New("the payment's fee payer is not this facilitator's")
	}
	sig := base58.Encode(ed25519.Sign(f.key, tx.Message))
	key := tx.MessageHash()
	o, err := f.pollOwn(ctx, key, sig, base58.Encode(tx.Blockhash[:]), 0)
	if err != nil {
		return out, err
	}
	f.mu.Lock()
	held := f.unlearned[key] != nil
	until, asked := f.unsent[key]
	asked = asked && now().Before(until)
	f.mu.Unlock()
	if o.unseen && settle && asked && !held {
		return f.settleUnsent(ctx, key, p, req)
	}
	out.State = o.state
	var adopted *settlement
	if o.state == x402.SettlementDone {
		out, adopted = f.answerRecorded(ctx, key, sig)
	}
	if adopted != nil && out.State == x402.SettlementUndecided {
		// The record adopted could not be marked, or its mark's answer
		// was lost: kept in memory as a pending send with its mark, so the
		// next read marks it with the same one and finds a mark that
		// landed as its own (markedBy), not another's.
		f.mu.Lock()
		if f.memory(key, now()) == nil {
			adopted.sig, adopted.blockhash, adopted.payer, adopted.pending, adopted.at = sig, base58.Encode(tx.Blockhash[:]), tx.Payer(), true, now()
			f.settled[key] = adopted
		}
		f.mu.Unlock()
	}
	if out.State != x402.SettlementUndecided {
		// Charged only when this process sent the transaction and has not
		// learned its outcome yet (its record was swept): one sent by
		// another, or already charged, cost this process nothing now.
		f.learned(key, o.failed != "")
	}
	if (o.state == x402.SettlementDone && out.State != x402.SettlementUndecided) || o.failed != "" {
		// Remembered as Settle would, and a later ask is answered from the
		// record.
		f.mu.Lock()
		if f.memory(key, now()) == nil {
			f.settled[key] = &settlement{sig: sig, blockhash: base58.Encode(tx.Blockhash[:]), payer: tx.Payer(), failed: o.failed, lost: out.State == x402.SettlementNever && o.failed == "", at: now()}
		}
		f.mu.Unlock()
	}
	return out, nil
}

// settleUnsent settles, for a status read, key's payment p, which the
// chain does not know while its blockhash is valid and of which this
// process holds no send: its Settle ended without a verdict before sending
// (maySent), so the transaction can land only if sent. It takes Settle's
// own path (settle) on a claim of its own, so the payment is checked,
// simulated, held in the budget, recorded in Config.Sent (which finds a
// send before a restart, and sends nothing then) and sent at most once,
// as by a Settle. The answer is the read's:
//   - success: settled, naming the transaction;
//   - duplicate_settlement naming the transaction (it landed, another
//     settlement answers for it): settled by another settlement;
//   - failed on chain (invalid_exact_svm_transaction_failed naming the
//     transaction): never;
//   - anything else, settlement_pending or a refusal (a check, the
//     simulation, the budget, the node refusing the send, its expiry):
//     undecided, and the next read polls the send (its memory) or settles
//     again, until the chain's own word once the blockhash expired. A
//     refusal is no verdict here, as it is for a Settle, because the
//     earlier Settle could not tell that nothing was sent before (a
//     restart, a node lagging), and a refusal of the simulation (a node
//     whose tip is past the blockhash while its confirmed bank still
//     takes it, or one lagging) does not prove that such a send cannot
//     still land: the gate would tell a charged buyer nothing was charged.
//
// A payment another Settle is working on, or has an answer for, is left to
// it: undecided, and the next read answers from its record.
func (f *Facilitator) settleUnsent(ctx context.Context, key [32]byte, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	s, how := f.claim(key)
	if how != claimNew {
		if how == claimRetry {
			f.unclaim(s)
		}
		return x402.SettlementStatus{}, nil
	}
	r, err := f.settle(ctx, key, s, p, req)
	var unknown *x402.UnknownOutcomeError
	switch {
	case errors.As(err, &unknown) && unknown.Reply != nil:
		return x402.SettlementStatus{Payer: unknown.Reply.Payer}, nil
	case err != nil:
		return x402.SettlementStatus{}, err
	case r.Success:
		return x402.SettlementStatus{State: x402.SettlementDone, Transaction: r.Transaction, Payer: r.Payer}, nil
	case r.ErrorReason == ReasonDuplicateSettlement && r.Transaction != "":
		st := settledElsewhere(r.Transaction)
		st.Payer = r.Payer
		return st, nil
	case r.ErrorReason == ReasonTransactionFailed && r.Transaction != "":
		return x402.SettlementStatus{State: x402.SettlementNever, Payer: r.Payer}, nil
	}
	log.Printf("svm facilitator: settling a held payment on reading its status: %s: %s (undecided until its blockhash expires)", r.ErrorReason, r.ErrorMessage)
	return x402.SettlementStatus{Payer: r.Payer}, nil
}

// answerRecorded is what a status read with no record in memory (a
// facilitator of a reload that changed the settings, or after a restart)
// answers for key's transaction sig, which landed: as SettlementStatus
// from memory (statusLanded), by the mark of its record in Config.Sent.
// No record is settled by another settlement (it lapsed, and only its
// sender, which remembers the send, answers it as its own: markedBy), or,
// with no store, settled, as the chain says. A record already answered is settled by another
// settlement: this facilitator holds no memory of marking it, and the
// Settle that did answered success. One that cannot be read is undecided.
// adopted is the record in memory of an unanswered record adopted here
// (adopt), with the mark it tried, nil otherwise.
func (f *Facilitator) answerRecorded(ctx context.Context, key [32]byte, sig string) (st x402.SettlementStatus, adopted *settlement) {
	rec, err := f.recorded(ctx, key)
	if err != nil {
		log.Printf("svm facilitator: reading the record of sent transaction %s: %v", sig, err)
		return x402.SettlementStatus{State: x402.SettlementUndecided}, nil
	}
	s := &settlement{}
	switch {
	case rec == nil && f.sentIn() != nil:
		// It lapsed: only its sender answers it as its own (markedBy), and
		// a facilitator with no memory of the send cannot tell it sent it.
		return settledElsewhere(sig), nil
	case rec == nil || (!rec.Settled && !f.adopt(key, s, rec)):
		// No store, or a record written before records named their
		// token: the chain says it landed.
		return x402.SettlementStatus{State: x402.SettlementDone, Transaction: sig}, nil
	case rec.Settled:
		return settledElsewhere(sig), nil
	}
	return f.statusLanded(ctx, s, sig), s
}

var _ x402.SettlementChecker = (*Facilitator)(nil)

// StatusReader tells whether a Solana payment's transaction landed, from a
// chain endpoint alone: it holds no key and sends nothing. A gateway whose
// facilitator is remote uses it when that facilitator reported the outcome
// unknown, by the signature it named (judged by poll, as in Settle) or,
// when it named none, by searching the chain for the payment (search).
type StatusReader struct{ f *Facilitator }

// NewStatusReader reads network (a solana CAIP-2 id) through rpc.
func NewStatusReader(rpc *RPC, network string) (*StatusReader, error) {
	if rpc == nil || rpc.URL == "" {
		return nil, errors.New("svm status reader: no rpc endpoint")
	}
	if !x402.IsSolana(network) {
		return nil, fmt.Errorf("svm status reader: %q is not a Solana network", network)
	}
	return &StatusReader{f: &Facilitator{rpc: rpc, network: network}}, nil
}

// SentSettlementStatus implements x402.SentSettlementChecker: by the named
// signature when it is the fee payer's signature over the payment's own
// message (so it names this transaction and no other), else, as when none
// was named, by searching the chain for the payment no further back than
// sent.After (search: a facilitator's word alone could name any
// transaction that landed, and is not needed). A transaction that landed
// is the attempt's only when it landed after the attempt began, sent.After
// (attributed): one older is settled by another settlement.
func (r *StatusReader) SentSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error) {
	var out x402.SettlementStatus
	if req.Network != r.f.network {
		return out, fmt.Errorf("this reader reads %s, not %s", r.f.network, req.Network)
	}
	tx, err := DecodePayload(p.Payload)
	if err != nil {
		return out, fmt.Errorf("payment payload: %w", err)
	}
	// The fee payer must be the offer's (the facilitator's, from
	// /supported): a payer who is also the fee payer could sign and send
	// the transaction alone.
	if fp, _ := req.Extra["feePayer"].(string); len(tx.AccountKeys) == 0 || tx.AccountKeys[0].String() != fp {
		return out, errors.New("the payment's fee payer is not the offer's extra.feePayer")
	}
	var o polled
	sig := sent.Transaction
	if raw, derr := base58.Decode(sig); derr == nil && len(raw) == 64 && verifySignature(tx.AccountKeys[0], tx.Message, raw) {
		o, err = r.f.poll(ctx, sig, base58.Encode(tx.Blockhash[:]), 0)
	} else {
		o, sig, err = r.f.search(ctx, tx, sent.After)
	}
	if err != nil {
		return out, err
	}
	if o.state == x402.SettlementDone {
		return r.f.attributed(ctx, sig, o.landed, sent.After)
	}
	out.State = o.state
	return out, nil
}

var _ x402.SentSettlementChecker = (*StatusReader)(nil)
