package svmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// Settle re-verifies the payment, co-signs the fee payer's slot, sends the
// transaction and polls its signature until it is confirmed.
//
// Guarantees:
//   - One message (the SHA-256 of the signed bytes) is settled at most once,
//     as the x402 reference facilitator does: a second Settle of it while
//     the first runs, or within DuplicateWindow after this process learned
//     it landed (it answered success, a duplicate below, or a
//     SettlementStatus of it), is refused as duplicate_settlement, the
//     latter naming the transaction. The key is the message, not the wire bytes, because the
//     client controls the bytes of the empty fee-payer slot. The reference
//     resource-server middleware verifies, serves, then settles, with no
//     claim of its own: two requests carrying one payment both verify
//     before it lands, and only this refusal keeps the second from being
//     served too.
//   - A Settle this process answered settlement_pending promised its caller
//     the outcome later: a later Settle of the same payment, while the
//     record lives (DuplicateWindow from the pending answer, or as long
//     as its record in Config.Sent can: expired), polls
//     that signature instead of sending anything, and answers success
//     once it landed (duplicate_settlement naming it when the pending
//     Settle had found it on chain, below: the record keeps where the
//     transaction came from), pending while it is undecided, and a
//     failure once it failed or can no longer land.
//   - A payment this process holds no record of (it restarted, the record
//     aged out, or another instance with the same fee payer settled it) is
//     looked up on chain by its transaction's id, the fee payer's
//     deterministic signature, before anything is simulated or sent (a
//     look-up that fails is an *x402.UnknownOutcomeError naming that
//     signature, nothing sent: a send before a restart may have landed,
//     maySent): if the chain has it, it is answered duplicate_settlement
//     naming that transaction once it is confirmed
//     (invalid_exact_svm_transaction_failed if it failed on chain), never
//     success: its sender answers for it, and a second success would have
//     the payment served twice; unless its record in Config.Sent says no
//     Settle answered it success (below).
//     So is a transaction the chain answers AlreadyProcessed to, at
//     simulation or at send (whose record, written just before, is
//     dropped). Such a failure is charged to the failure budget only when
//     this process sent the transaction and has not learned its outcome
//     yet (learned); a replay of a failed payment sends nothing, costs the
//     fee payer nothing and is charged nothing. One still unconfirmed at
//     the deadline is settlement_pending naming it (below), never a
//     definitive refusal for a transfer that may yet land; a retry then
//     polls it as above, and answers duplicate_settlement once it landed,
//     never success.
//   - With Config.Sent, the transaction is recorded there before it is
//     sent (sent.go: remember), and success is answered only by the Settle
//     that marks the record answered (answerSent), in one step that fails
//     once another did: one success per payment across the facilitators
//     sharing the store. A Settle that finds the record (before sending, or
//     once the chain has the transaction: sentBefore) sends nothing: one
//     answered is duplicate_settlement naming the transaction at once; one
//     not answered is confirmed as this Settle's own send (adopt), so that
//     a settlement_pending answered by a facilitator since unloaded (a
//     reload changing its settings) or stopped is followed by success once
//     it landed. This is what tells a replay after a restart from a first
//     settlement when the nodes asked lag the one the transaction landed
//     on (the look-up finds nothing, the simulation passes on older state,
//     and a send with skipPreflight returns the signature), which no
//     look-up can. A store that cannot be written or read has nothing
//     sent, and is an unknown outcome (below): the record it holds may be
//     that of a send which landed. One that cannot mark a landed
//     transaction answered has it answered settlement_pending, never
//     success.
//   - A transaction this process sent has its outcome learned by this
//     process, whatever its caller does: at the caller's deadline, or
//     ConfirmTimeout, the caller is answered pending and the facilitator
//     polls it in the background (resolve) until the outcome is known; a
//     failure on chain is charged to the failure budget once, and the
//     payer's place in flight is held until then.
//   - A refusal (success false) other than duplicate_settlement is
//     returned only when the transfer certainly did not happen: a check
//     failed (the simulation refused the payment), the budget refused a
//     payment of which the store of sends holds no record, the node refused
//     the transaction, it failed on chain, or its blockhash expired (as a
//     bank at least as new as the one that accepted it sees it) while the
//     chain did not know its signature.
//   - When the outcome cannot be established before ConfirmTimeout (or the
//     caller's deadline), whoever sent the transaction, the result is an
//     *x402.UnknownOutcomeError whose Reply says settlement_pending with
//     the transaction's signature.
//   - Every error is an *x402.UnknownOutcomeError naming the transaction,
//     never a plain error saying nothing was sent. Once the payment is
//     well formed and co-signed, its transaction's id is known (the fee
//     payer's ed25519 signature, which is deterministic), and a Settle that
//     cannot reach a verdict on the payment (the look-up, the simulation or
//     the store of sends failing, its caller gone, or the facilitator
//     closed: ErrClosed, its cause) sends nothing, but cannot tell that
//     this very transaction was not sent before a restart and landed: only
//     the record tells, and a node lagging the one it landed on finds
//     nothing (maySent). A plain error would have the gateway tell a
//     charged buyer that nothing was charged, and release the payment; the
//     unknown outcome has it poll the signature (SettlementStatus) instead:
//     settled once it landed, never once its blockhash expired unseen. A
//     status read while its blockhash is valid and the chain does not
//     know it settles it then (SettlementStatus: through settle, this
//     Settle's own path), so a payment never sent costs its buyer the
//     wait for that read (for one the read finds refused, the wait for
//     its blockhash's expiry, then a new payment), never money.
//   - A transaction this process sent that the chain does not know while
//     its blockhash is valid (the node accepted it and dropped it) is sent
//     again, the same bytes, by whichever of a retry, a status read and the
//     resolver looks at it, at most once every resendEvery (pollOwn).
//
// Two Settles of one payment in two processes at the same moment can both
// find nothing on chain, both send, and both report success, unless they
// share Config.Sent: nothing but shared state tells the two sends of one
// transaction apart. The gateway's claim on each payment (in its store)
// keeps its own Settles to one.
func (f *Facilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	fail := func(reason, payer, msg, sig string) x402.SettleResponse {
		return settleRefusal(req, reason, payer, msg, sig)
	}
	tx, err := DecodePayload(p.Payload)
	if err != nil {
		// Nothing to remember: verify refuses it.
		c := f.checkStatic(p, req, false)
		return fail(c.resp.InvalidReason, "", c.resp.InvalidMessage, ""), nil
	}
	// From its claim on, a Settle may write, mark or drop the payment's
	// record in Config.Sent, up to its answer (a send the node refuses
	// after Close began included): Close waits for it.
	f.enter()
	defer f.leave()
	key := tx.MessageHash()
	s, how := f.claim(key)
	switch how {
	case claimBusy:
		return fail(ReasonDuplicateSettlement, "", "this transaction is being settled by another settlement", ""), nil
	case claimSettled:
		return fail(ReasonDuplicateSettlement, s.payer, "this transaction was already settled", s.sig), nil
	case claimRetry:
		// An earlier Settle sent it (or found it on chain, sent by another:
		// the record says so) and answered pending, or saw it fail on
		// chain: the requirements must still be the payment's.
		if c := f.checkStatic(p, req, false); c.resp.InvalidReason != "" {
			f.unclaim(s)
			return fail(c.resp.InvalidReason, c.resp.Payer, c.resp.InvalidMessage, ""), nil
		}
		return f.confirm(ctx, key, s, req.Network)
	}
	return f.settle(ctx, key, s, p, req)
}

// unsentFor is how long a status read may settle a payment whose Settle
// ended without a verdict before sending (Facilitator.unsent): longer than
// a blockhash lives (about 60 to 90 s), after which nothing can land and
// the read judges it by the chain alone. maxUnsent bounds that memory; a
// payment past it waits for its blockhash to expire, as one asked of a
// restarted process does.
const (
	unsentFor = 3 * time.Minute
	maxUnsent = 4096
)

// settleRefusal is Settle's answer success false for reason.
func settleRefusal(req x402.PaymentRequirements, reason, payer, msg, sig string) x402.SettleResponse {
	return x402.SettleResponse{Success: false, ErrorReason: reason, ErrorMessage: msg, Payer: payer, Transaction: sig, Network: req.Network}
}

// settle is Settle of key's payment p, claimed new (claimNew: s), from its
// checks to its answer. It is the one path by which a payment is sent: a
// status read that settles a payment no Settle sent (settleUnsent) takes
// it too, with every check, the look-up, the simulation, the budget and
// the record of the send.
func (f *Facilitator) settle(ctx context.Context, key [32]byte, s *settlement, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	fail := func(reason, payer, msg, sig string) x402.SettleResponse {
		return settleRefusal(req, reason, payer, msg, sig)
	}
	c := f.checkStatic(p, req, true)
	if c.resp.InvalidReason != "" {
		f.release(key)
		return fail(c.resp.InvalidReason, c.resp.Payer, c.resp.InvalidMessage, ""), nil
	}
	f.cosign(c)
	f.mu.Lock()
	s.sig, s.payer, s.blockhash, s.slot = base58.Encode(c.signed[1:65]), c.payer, base58.Encode(c.tx.Blockhash[:]), c.slot
	f.mu.Unlock()
	// Nothing here remembers this message, but another process with this
	// fee payer may have sent it: the chain knows it by its id.
	st, _, err := f.rpc.Status(ctx, s.sig, 0)
	if err != nil {
		// Sent before a restart, the transaction may have landed: nothing
		// tells, so the outcome is unknown, never "nothing sent".
		return f.maySent(ctx, key, s, req.Network, fmt.Errorf("looking the transaction up before settlement: %w", err))
	}
	if st != nil {
		return f.sentBefore(ctx, key, s, c.payer, req.Network, nil)
	}
	if f.refuseOverBudget(c); c.resp.InvalidReason != "" {
		return f.overBudget(ctx, key, s, c.payer, req.Network, c.resp.InvalidReason, c.resp.InvalidMessage)
	}
	if !c.reused {
		if err := f.checkChain(ctx, c); err != nil {
			return f.maySent(ctx, key, s, req.Network, fmt.Errorf("verifying before settlement: %w", err))
		}
		if c.landed {
			// Landed since the look-up.
			return f.sentBefore(ctx, key, s, c.payer, req.Network, nil)
		}
		if c.resp.InvalidReason != "" {
			f.release(key)
			return fail(c.resp.InvalidReason, c.resp.Payer, c.resp.InvalidMessage, ""), nil
		}
	}
	if ctx.Err() != nil {
		// The caller went away before the send: nothing is sent for a
		// caller who cannot be answered.
		return f.maySent(ctx, key, s, req.Network, fmt.Errorf("before settlement: %w", ctx.Err()))
	}
	// A closed facilitator sends nothing new (Close): its configuration
	// closes the store handle once Close returned, and the answer to a
	// send begun now could come after that, its record's drop or mark
	// failing. Nothing is written or sent, and the payment is released;
	// its record, which would tell a send before a restart, is not read.
	if !f.open() {
		return f.maySent(ctx, key, s, req.Network, ErrClosed)
	}
	// The payer's place in flight is taken (hold) before the record of the
	// send is written, and kept until the outcome is learned, by this
	// Settle or in the background (resolve): a send the budget refuses
	// leaves no record that a Settle elsewhere could adopt, in the moment
	// before its drop, as a send in flight.
	fresh, reason, msg := f.hold(key, c, s)
	if reason != "" {
		return f.overBudget(ctx, key, s, c.payer, req.Network, reason, msg)
	}
	// The record of the send (Config.Sent) is written before it: no node
	// asked above can tell a replay after a restart from a first
	// settlement (each may lag the one the transaction landed on), and a
	// process stopped mid-send must leave it. Nothing sent, the place
	// taken is given back (learned).
	prior, err := f.remember(ctx, key, s)
	if (err != nil || prior != nil) && fresh {
		f.learned(key, false)
	}
	switch {
	case err != nil:
		return f.maySent(ctx, key, s, req.Network, fmt.Errorf("recording the transaction before settlement: %w", err))
	case prior != nil:
		// Sent before (by this process before a restart or a reload, or
		// by another instance now): nothing is sent again.
		return f.sentBefore(ctx, key, s, c.payer, req.Network, prior)
	}
	// From here on the caller no longer decides: a send cut off halfway
	// may or may not have reached the chain.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.ConfirmTimeout)
	f.sending(key)
	_, err = f.rpc.Send(sctx, c.signed)
	cancel()
	if err != nil {
		var re *RPCError
		switch {
		case errors.As(err, &re) && re.AlreadyProcessed():
			// Not sent: the chain holds it already, sent by another (or by
			// this process earlier, whose hold stays: !fresh). Its record
			// goes: no Settle of this send answers for that transaction,
			// and one left unanswered would have a Settle elsewhere adopt
			// it and answer success.
			if fresh {
				f.learned(key, false)
			}
			f.forgetSent(ctx, s, s.sig, nil)
			return f.confirmElsewhere(ctx, key, s, req.Network)
		case errors.As(err, &re) && re.Refused():
			// The node answered and refused: this send is not in flight
			// (an earlier send of the same transaction may be: !fresh).
			if fresh {
				f.learned(key, false)
			}
			f.forgetAndRelease(ctx, key, s, s.sig)
			return fail(ReasonTransactionFailed, c.payer, "the node refused the transaction: "+truncate(re.Message), ""), nil
		}
		// No answer, or an error that may have come after forwarding: it
		// may have been accepted. The signature is known, so ask the chain
		// rather than guess.
	}
	return f.confirm(ctx, key, s, req.Network)
}

// overBudget answers a Settle of key the failure budgets refuse (reason,
// msg), unless the transaction's record in Config.Sent, read now, says it
// was sent (by another instance, or by this process before a restart or a
// reload): that send is answered as any found sent before (sentBefore:
// adopted, or duplicate_settlement), never refused, because the budget
// holds back new sends only, and a refusal tells its caller the transfer
// did not happen while the recorded send may land. The record is read
// after the refusal, so it is found however late before then another
// wrote it, and a Settle within budget pays no read for it. A record that
// cannot be read is an unknown outcome naming the transaction (maySent):
// nothing is sent, but the chain's look-up, through a node that may lag,
// does not tell that nothing was sent before a restart.
func (f *Facilitator) overBudget(ctx context.Context, key [32]byte, s *settlement, payer, network, reason, msg string) (x402.SettleResponse, error) {
	rec, err := f.recorded(ctx, key)
	switch {
	case err != nil:
		return f.maySent(ctx, key, s, network, fmt.Errorf("reading the record of the transaction: %w", err))
	case rec != nil:
		return f.sentBefore(ctx, key, s, payer, network, rec)
	}
	f.release(key)
	return x402.SettleResponse{ErrorReason: reason, ErrorMessage: msg, Payer: payer, Network: network}, nil
}

// sentBefore answers for a transaction sent before this Settle, which
// sends nothing: the chain has it, or rec, its record in Config.Sent, says
// so (nil: read here). A record answered success is duplicate_settlement
// naming the transaction at once, and from memory from then on. One not
// answered (its Settle answered settlement_pending, or never answered:
// its process stopped, or it was unloaded by a reload changing the
// facilitator's settings) is adopted and confirmed as this Settle's own
// send: success once it landed, unless another Settle marked it answered
// first (answerSent), which keeps the payment to one success across every
// facilitator sharing the store. Without a record the transaction is
// another's (confirmElsewhere). A record that cannot be read is an unknown
// outcome naming the transaction (maySent): nothing is sent, but the
// transaction was, and may have landed.
func (f *Facilitator) sentBefore(ctx context.Context, key [32]byte, s *settlement, payer, network string, rec *store.ClaimState) (x402.SettleResponse, error) {
	if rec == nil {
		var err error
		if rec, err = f.recorded(ctx, key); err != nil {
			return f.maySent(ctx, key, s, network, fmt.Errorf("reading the record of the transaction: %w", err))
		}
	}
	switch {
	case rec != nil && rec.Settled:
		// Remembered as another's success, so a status read from memory
		// answers as a fresh one reads the marked record.
		f.finishLanded(key, settledElsewhere(s.sig))
		return x402.SettleResponse{ErrorReason: ReasonDuplicateSettlement, ErrorMessage: "this transaction was already settled", Payer: payer, Transaction: s.sig, Network: network}, nil
	case rec != nil && f.adopt(key, s, rec):
		return f.confirm(ctx, key, s, network)
	}
	return f.confirmElsewhere(ctx, key, s, network)
}

// maySent answers a Settle that sent nothing itself but cannot tell
// whether its transaction was sent before (cause): the chain has it and its
// record cannot be read, or a step before its send ended with no verdict on
// the payment (the chain or the store of sends could not be asked, the
// caller went away, the facilitator was closed: see Settle). The payer may
// have been charged, so the outcome is unknown (settlement_pending naming
// the transaction), never the plain error that says nothing was sent, on
// which a gate tells its buyer nothing was charged and to pay again. The
// claim is released rather than kept pending: a retry reads the chain and
// the record afresh, so a record another Settle answered is never answered
// success a second time. The payment is noted as asked (unsent), so that
// the caller's status read settles it while its blockhash is valid, unless
// its caller went away (ctx done) or the facilitator is closed: a caller
// of the served /settle hanging up at once would otherwise fill that
// memory with payments no one reads for nothing (they need only pass the
// static checks), and a closed facilitator sends nothing for any read.
func (f *Facilitator) maySent(ctx context.Context, key [32]byte, s *settlement, network string, cause error) (x402.SettleResponse, error) {
	f.mu.Lock()
	sig, payer := s.sig, s.payer
	if ctx.Err() == nil && !f.closed.Load() && len(f.unsent) < maxUnsent {
		f.unsent[key] = now().Add(unsentFor)
	}
	f.mu.Unlock()
	f.release(key)
	return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: cause, Reply: &x402.SettleResponse{
		ErrorReason: ReasonSettlementPending, ErrorMessage: "the transaction may have been sent before; its outcome is not known yet",
		Transaction: sig, Payer: payer, Network: network,
	}}
}

// confirmElsewhere is confirm for a transaction the chain had before this
// Settle sent it: it marks the record (settlement.elsewhere) first, so
// that the answer, and any retry's after a pending one, is
// duplicate_settlement once it landed. This Settle paid no fee for it, so
// its failure is charged only when this process sent it earlier and has
// not learned its outcome (learned): a replay of a failed payment after
// its record aged out is answered failed and charged nothing.
func (f *Facilitator) confirmElsewhere(ctx context.Context, key [32]byte, s *settlement, network string) (x402.SettleResponse, error) {
	f.mu.Lock()
	s.elsewhere = true
	f.mu.Unlock()
	return f.confirm(ctx, key, s, network)
}

// confirm polls s.sig until it is confirmed, fails, can no longer land, or
// the deadline passes (an unknown outcome, pending). When the record says
// the chain had the transaction before a Settle of this process sent it
// (s.elsewhere: another process with this fee payer, or this one before a
// restart or before its record aged out), landed, it is
// duplicate_settlement naming it, since its sender answers for it and a
// second success would have it served twice; the record keeps that origin
// across a pending answer, so a retry answers the same. Its failure on
// chain, its expiry and a deadline are answered as for a transaction this
// Settle sent (see Settle).
//
// The polls are detached from the caller and bounded by ConfirmTimeout: a
// caller that goes away (a payer calling /settle itself and hanging up once
// the transaction is on its way, or a gateway whose own deadline passes
// first: 30 s for a remote facilitator, as long as the default
// ConfirmTimeout) cuts no poll short and is answered pending at once. The
// outcome is then learned in the background (resolve), as after
// ConfirmTimeout, its failure charged, and the payer's place in flight held
// until then. The mark of a landed send's record is not detached
// (answerSent): with its caller gone it is not made, and the answer is
// pending; the next status read or retry marks it.
func (f *Facilitator) confirm(ctx context.Context, key [32]byte, s *settlement, network string) (x402.SettleResponse, error) {
	f.mu.Lock()
	sig, payer, blockhash, floor, elsewhere := s.sig, s.payer, s.blockhash, s.slot, s.elsewhere
	f.mu.Unlock()
	resp := x402.SettleResponse{Transaction: sig, Network: network, Payer: payer}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.cfg.ConfirmTimeout)
	defer cancel()
	var lastErr error
	for {
		o, err := f.pollOwn(pctx, key, sig, blockhash, floor)
		if err != nil {
			lastErr = err
		}
		switch {
		case o.state == x402.SettlementNever && o.failed != "":
			// Failed on chain: the fee is spent, the transfer is not
			// made, and the same message can never land again.
			f.learned(key, true)
			f.finish(key, o.failed)
			resp.ErrorReason, resp.ErrorMessage = ReasonTransactionFailed, "the transaction failed on chain: "+truncate(o.failed)
			return resp, nil
		case o.state == x402.SettlementNever:
			f.learned(key, false)
			f.forgetAndRelease(ctx, key, s, sig)
			resp.ErrorReason, resp.ErrorMessage, resp.Transaction = ReasonTransactionFailed, "the transaction's blockhash expired before it landed", ""
			return resp, nil
		case o.state == x402.SettlementDone:
			f.learned(key, false)
			if elsewhere {
				f.finishLanded(key, settledElsewhere(sig))
				resp.ErrorReason, resp.ErrorMessage = ReasonDuplicateSettlement, "this transaction was already settled, by another settlement"
				return resp, nil
			}
			// Success only once its record is marked answered: of
			// the Settles sharing the record, one marks it.
			err := f.answerSent(ctx, s, sig)
			if errors.Is(err, store.ErrNoteChanged) {
				f.finishLanded(key, settledElsewhere(sig))
				resp.ErrorReason, resp.ErrorMessage = ReasonDuplicateSettlement, "this transaction was already settled, by another settlement"
				return resp, nil
			}
			if err == nil {
				f.finish(key, "")
				resp.Success = true
				return resp, nil
			}
			// The record could not be marked: the caller is answered
			// pending, and its retry marks it.
			return f.pending(key, s, resp, fmt.Errorf("marking the settlement answered: %w", err))
		}
		var cause error
		select {
		case <-ctx.Done():
			cause = ctx.Err()
		case <-pctx.Done():
			cause = pctx.Err()
		case <-time.After(f.cfg.PollInterval):
			continue
		}
		if lastErr != nil {
			cause = fmt.Errorf("%w (last rpc error: %v)", cause, lastErr)
		}
		return f.pending(key, s, resp, cause)
	}
}

// pending answers settlement_pending for s, key's transaction, whose
// outcome its caller cannot be told now (cause): the facilitator learns it
// in the background if it sent it (await), and a retry polls its
// signature (claim).
func (f *Facilitator) pending(key [32]byte, s *settlement, resp x402.SettleResponse, cause error) (x402.SettleResponse, error) {
	f.await(key)
	f.mu.Lock()
	// Its record lives DuplicateWindow from now (or as long as its record
	// in Config.Sent can: expired): a retry within it polls this
	// signature (claim).
	s.inflight, s.pending, s.at = false, true, now()
	f.mu.Unlock()
	pending := resp
	pending.ErrorReason, pending.ErrorMessage = ReasonSettlementPending, "the transaction was sent; its outcome is not known yet"
	return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Reply: &pending, Err: cause}
}

// claimed is what claim found for a message.
type claimed int

const (
	claimNew     claimed = iota // no record: the caller settles it
	claimRetry                  // the caller polls the record's signature
	claimBusy                   // another Settle is working on it
	claimSettled                // settled within DuplicateWindow: refused
)

// claim reserves key for one Settle. It returns a new record (claimNew)
// when none lives (memory); the record itself (claimRetry) when an earlier
// Settle sent the message and answered pending, or saw it fail on chain; nil (claimBusy) while another Settle works
// on it; and a copy of the record (claimSettled), whose sig and payer name
// the settlement, when it was settled within DuplicateWindow.
func (f *Facilitator) claim(key [32]byte) (*settlement, claimed) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := now()
	f.sweep(t)
	if e := f.memory(key, t); e != nil {
		switch {
		case e.inflight:
			return nil, claimBusy
		case !e.pending && e.failed == "":
			done := *e
			return &done, claimSettled
		}
		e.inflight = true
		return e, claimRetry
	}
	s := &settlement{inflight: true, at: t}
	f.settled[key] = s
	return s, claimNew
}

// unclaim gives back a record claim took for a retry that went no
// further, as it was.
func (f *Facilitator) unclaim(s *settlement) {
	f.mu.Lock()
	s.inflight = false
	f.mu.Unlock()
}

// memory returns key's record at t, nil when there is none or it expired
// (expired), which it drops: every read of a record goes through it, so
// that none is acted on past its life whether or not the sweep ran (a
// pending one past it would read its send's record, lapsed since, as its
// own). f.mu is held.
func (f *Facilitator) memory(key [32]byte, t time.Time) *settlement {
	e := f.settled[key]
	if e != nil && e.expired(t) {
		delete(f.settled, key)
		return nil
	}
	return e
}

// release forgets key: nothing was settled, so the payment may be retried.
func (f *Facilitator) release(key [32]byte) {
	f.mu.Lock()
	delete(f.settled, key)
	f.mu.Unlock()
}

// finish records the outcome of key for DuplicateWindow: settled (failed
// ""), or failed on chain with that error; either way a later Settle or
// SettlementStatus answers it from the chain or the record without
// counting a failure again.
func (f *Facilitator) finish(key [32]byte, failed string) {
	f.mu.Lock()
	if e := f.settled[key]; e != nil {
		e.inflight, e.pending, e.failed, e.at = false, false, failed, now()
	}
	f.mu.Unlock()
}
