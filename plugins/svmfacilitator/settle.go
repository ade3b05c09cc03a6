package svmfacilitator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/x402"
)

// Settle re-verifies the payment, co-signs the fee payer's slot, sends the
// transaction and polls its signature until it is confirmed.
//
// Guarantees:
//   - One message (the SHA-256 of the signed bytes) is sent at most once by
//     this process: a second Settle of it while the first runs is refused
//     as duplicate_settlement. The key is the message, not the wire bytes,
//     because the client controls the bytes of the empty fee-payer slot.
//   - A payment that already landed, and matches the requirements, is
//     answered success naming its transaction, whoever sent it: this
//     process within DuplicateWindow (its record), or, found on chain by
//     its transaction's id (the fee payer's deterministic signature) before
//     anything is simulated or sent, this process before a restart or
//     another with the same fee payer; so is a transaction the chain
//     answers AlreadyProcessed to, at simulation or at send. Its sender may
//     have answered pending, or its reply may have been lost, so a refusal
//     here could leave a payment that moved the buyer's tokens answered
//     success to nobody. The cost is that Settle alone does not refuse a
//     replay of a landed payment: de-duplicating what a payment buys is the
//     caller's claim on it (the gateway claims every payment before it
//     verifies it), and Verify refuses a landed payment as
//     duplicate_settlement.
//   - A refusal (success false) other than duplicate_settlement is
//     returned only when the transfer certainly did not happen: a check
//     failed, the node refused the transaction, it failed on chain, or its
//     blockhash expired (as a bank at least as new as the one that
//     accepted it sees it) while the chain did not know its signature.
//   - When the outcome cannot be established before ConfirmTimeout (or the
//     caller's deadline), whoever sent the transaction, the result is an
//     *x402.UnknownOutcomeError whose Reply says settlement_pending with
//     the transaction's signature; a later Settle of the same payment polls
//     that signature again instead of sending anything.
//   - Any other error means nothing was sent.
//
// Two Settles of one payment in two processes at the same moment can both
// find nothing on chain and both send: the chain takes the transaction
// once, and both report success, as any later Settle of it would.
func (f *Facilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	fail := func(reason, payer, msg, sig string) x402.SettleResponse {
		return x402.SettleResponse{Success: false, ErrorReason: reason, ErrorMessage: msg, Payer: payer, Transaction: sig, Network: req.Network}
	}
	tx, err := DecodePayload(p.Payload)
	if err != nil {
		// Nothing to remember: verify refuses it.
		c := f.checkStatic(p, req, false)
		return fail(c.resp.InvalidReason, "", c.resp.InvalidMessage, ""), nil
	}
	key := tx.MessageHash()
	s, retry := f.claim(key)
	if s == nil {
		return fail(ReasonDuplicateSettlement, "", "this transaction is being settled by another settlement", ""), nil
	}
	if retry {
		// An earlier Settle sent it and could not tell the outcome, or
		// settled it: the requirements must still be the payment's.
		if c := f.checkStatic(p, req, false); c.resp.InvalidReason != "" {
			f.unclaim(s)
			return fail(c.resp.InvalidReason, c.resp.Payer, c.resp.InvalidMessage, ""), nil
		}
		return f.confirm(ctx, key, s, req.Network)
	}

	c := f.checkStatic(p, req, true)
	if c.resp.InvalidReason != "" {
		f.release(key)
		return fail(c.resp.InvalidReason, c.resp.Payer, c.resp.InvalidMessage, ""), nil
	}
	f.cosign(c)
	f.mu.Lock()
	s.sig, s.payer, s.blockhash = base58.Encode(c.signed[1:65]), c.payer, base58.Encode(c.tx.Blockhash[:])
	// What a failure on chain costs, counted once whoever sent it
	// (outcome); the place in flight is reserved only before a send.
	s.exposure, s.slot = c.exposure, c.slot
	f.mu.Unlock()
	// Nothing here remembers this message, but another process with this
	// fee payer may have sent it: the chain knows it by its id.
	st, _, err := f.rpc.Status(ctx, s.sig, 0)
	if err != nil {
		f.release(key)
		return x402.SettleResponse{}, fmt.Errorf("looking the transaction up before settlement: %w", err)
	}
	if st != nil {
		return f.confirm(ctx, key, s, req.Network)
	}
	if f.refuseOverBudget(c); c.resp.InvalidReason != "" {
		f.release(key)
		return fail(c.resp.InvalidReason, c.payer, c.resp.InvalidMessage, ""), nil
	}
	if !c.reused {
		if err := f.checkChain(ctx, c); err != nil {
			f.release(key)
			return x402.SettleResponse{}, fmt.Errorf("verifying before settlement: %w", err)
		}
		if c.landed {
			// Landed since the look-up: sent by another.
			return f.confirm(ctx, key, s, req.Network)
		}
		if c.resp.InvalidReason != "" {
			f.release(key)
			return fail(c.resp.InvalidReason, c.resp.Payer, c.resp.InvalidMessage, ""), nil
		}
	}
	// The payer's place in flight is taken last, atomically with the
	// budget check: concurrent settlements of one payer, all simulated
	// against the same balance, must not all pass a check made before any
	// of them failed.
	if reason, msg := f.budget.reserve(c.exposure); reason != "" {
		f.release(key)
		return fail(reason, c.payer, msg, ""), nil
	}
	f.mu.Lock()
	s.reserved, s.slot = true, c.slot
	f.mu.Unlock()

	if _, err := f.rpc.Send(ctx, c.signed); err != nil {
		var re *RPCError
		switch {
		case errors.As(err, &re) && re.AlreadyProcessed():
			// Not sent: the chain holds it already, sent by another.
			return f.confirm(ctx, key, s, req.Network)
		case errors.As(err, &re) && re.Refused():
			// The node answered and refused: the transaction is not in
			// flight.
			f.outcome(s, false)
			f.release(key)
			return fail(ReasonTransactionFailed, c.payer, "the node refused the transaction: "+truncate(re.Message), ""), nil
		}
		// No answer, or an error that may have come after forwarding: it
		// may have been accepted. The signature is known, so ask the chain
		// rather than guess.
	}
	return f.confirm(ctx, key, s, req.Network)
}

// confirm polls s.sig until it is confirmed, fails, can no longer land, or
// the deadline passes (an unknown outcome, pending). It answers the same
// whoever sent the transaction (this Settle, an earlier one, another
// process): see Settle.
func (f *Facilitator) confirm(ctx context.Context, key [32]byte, s *settlement, network string) (x402.SettleResponse, error) {
	f.mu.Lock()
	sig, payer, blockhash, floor := s.sig, s.payer, s.blockhash, s.slot
	f.mu.Unlock()
	resp := x402.SettleResponse{Transaction: sig, Network: network, Payer: payer}
	ctx, cancel := context.WithTimeout(ctx, f.cfg.ConfirmTimeout)
	defer cancel()
	var lastErr error
	for {
		o, err := f.poll(ctx, sig, blockhash, floor)
		if err != nil {
			lastErr = err
		}
		switch {
		case o.state == x402.SettlementNever && o.failed != "":
			// Failed on chain: the fee is spent, the transfer is not
			// made, and the same message can never land again.
			f.outcome(s, true)
			f.finish(key, o.failed)
			resp.ErrorReason, resp.ErrorMessage = ReasonTransactionFailed, "the transaction failed on chain: "+truncate(o.failed)
			return resp, nil
		case o.state == x402.SettlementNever:
			f.outcome(s, false)
			f.release(key)
			resp.ErrorReason, resp.ErrorMessage, resp.Transaction = ReasonTransactionFailed, "the transaction's blockhash expired before it landed", ""
			return resp, nil
		case o.state == x402.SettlementDone:
			f.outcome(s, false)
			f.finish(key, "")
			resp.Success = true
			return resp, nil
		}
		select {
		case <-ctx.Done():
			f.outcome(s, false)
			f.mu.Lock()
			// Its record lives DuplicateWindow from now: a retry within it
			// polls this signature (claim).
			s.inflight, s.pending, s.at = false, true, now()
			f.mu.Unlock()
			pending := resp
			pending.ErrorReason, pending.ErrorMessage = ReasonSettlementPending, "the transaction was sent; its outcome is not known yet"
			cause := ctx.Err()
			if lastErr != nil {
				cause = fmt.Errorf("%w (last rpc error: %v)", cause, lastErr)
			}
			return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Reply: &pending, Err: cause}
		case <-time.After(f.cfg.PollInterval):
		}
	}
}

// outcome gives back s's place in flight in the budget, if it holds one,
// and records a failure on chain (failed) against s's payer and the
// overall budget, once however many callers learn it. An outcome still
// unknown gives the place back too: a pending settlement is not held
// against its payer for as long as nobody asks about it, and whoever
// learns later that it failed records it.
func (f *Facilitator) outcome(s *settlement, failed bool) {
	f.mu.Lock()
	x, reserved := s.exposure, s.reserved
	s.reserved = false
	if failed {
		s.exposure = exposure{}
	}
	f.mu.Unlock()
	if reserved {
		f.budget.release(x)
	}
	if failed {
		f.budget.fail(x)
	}
}

// claim reserves key for one Settle. It returns nil when the message is
// being settled, and retry true when an earlier Settle sent it and left a
// record (pending: its outcome unknown; settled; or failed on chain): the
// caller polls its signature. A pending record takes that path however old
// it is, until the sweep drops it: the signature it names is the caller's
// own transaction, which the chain may well have landed.
func (f *Facilitator) claim(key [32]byte) (s *settlement, retry bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := now()
	f.sweep(t)
	if e, ok := f.settled[key]; ok && (e.inflight || e.pending || !e.expired(t)) {
		if e.inflight {
			return nil, false
		}
		e.inflight = true
		return e, true
	}
	s = &settlement{inflight: true, at: t}
	f.settled[key] = s
	return s, false
}

// unclaim gives back a record claim took for a retry that went no
// further, as it was.
func (f *Facilitator) unclaim(s *settlement) {
	f.mu.Lock()
	s.inflight = false
	f.mu.Unlock()
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
