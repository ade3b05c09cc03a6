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
	if err != nil || !expired {
		return polled{}, err
	}
	if st, _, err = f.rpc.Status(ctx, sig, at); err != nil || st != nil {
		return polled{}, err
	}
	return polled{state: x402.SettlementNever}, nil
}

// blockhashExpired reports whether no transaction built on blockhash can
// land any more, and the confirmed slot that showed it: invalid at the
// processed tip and in the confirmed bank (so a transaction that did land
// on it is confirmed, or on a dead fork, and a confirmed lookup sees it),
// each as a bank no older than floor, and than the newest bank of its
// commitment level any reply has shown (RPC.seen), sees it. It is the one
// rule of expiry for every judgement of "never":
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
		if err != nil || valid {
			return false, 0, err
		}
		at = slot
	}
	return true, at, nil
}

// SettlementStatus implements x402.SettlementChecker for a payment this
// facilitator sent and could not confirm in time (Settle's unknown
// outcome): it polls the transaction's signature once, sending nothing, and
// records what it learns as a later Settle would. A payment whose record it
// no longer holds (it restarted, or the record aged out DuplicateWindow
// after settling) is judged the same way: ed25519 signing is
// deterministic, so the fee payer's signature over the payment's message,
// the transaction's id, is signed again rather than remembered. A payment
// whose fee payer is not this facilitator's is an error.
func (f *Facilitator) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	var out x402.SettlementStatus
	if req.Network != f.network {
		return out, fmt.Errorf("this facilitator settles on %s, not %s", f.network, req.Network)
	}
	tx, err := DecodePayload(p.Payload)
	if err != nil {
		return out, fmt.Errorf("payment payload: %w", err)
	}
	key := tx.MessageHash()
	f.mu.Lock()
	e := f.settled[key]
	var sig, blockhash, failed string
	var inflight, pending bool
	var floor uint64
	if e != nil {
		sig, blockhash, inflight, pending, out.Payer, floor, failed = e.sig, e.blockhash, e.inflight, e.pending, e.payer, e.slot, e.failed
	}
	f.mu.Unlock()
	switch {
	case e == nil:
		return f.unrecorded(ctx, tx)
	case inflight || sig == "":
		return out, nil // a Settle is working on it
	case failed != "":
		out.State = x402.SettlementNever
		return out, nil
	case !pending:
		out.State, out.Transaction = x402.SettlementDone, sig
		return out, nil
	}
	o, err := f.poll(ctx, sig, blockhash, floor)
	if err != nil {
		return out, err
	}
	switch {
	case o.state == x402.SettlementDone:
		// Answered settled, here as by a Settle: its record says so
		// (answerSent), or a Settle elsewhere would find it unanswered
		// and answer success for a payment its caller was told settled.
		// A record another marked first, or one the store cannot mark
		// now, changes nothing of what the chain says.
		f.learned(key, false)
		f.finish(key, "")
		if err := f.answerSent(e, sig); err != nil && !errors.Is(err, store.ErrNoteChanged) {
			log.Printf("svm facilitator: marking the record of sent transaction %s answered: %v", sig, err)
		}
		out.Transaction = sig
	case o.state == x402.SettlementNever && o.failed != "":
		f.learned(key, true)
		f.finish(key, o.failed)
	case o.state == x402.SettlementNever:
		// Its blockhash expired: it can no longer land, and its record
		// in Config.Sent goes too, as a /settle or the resolver would
		// drop it.
		f.learned(key, false)
		f.forgetSent(e, sig)
		f.release(key)
	}
	out.State = o.state
	return out, nil
}

// unrecorded judges a payment the facilitator holds no record of by the
// signature it would have sent it under.
func (f *Facilitator) unrecorded(ctx context.Context, tx *Transaction) (x402.SettlementStatus, error) {
	var out x402.SettlementStatus
	if len(tx.AccountKeys) == 0 || tx.AccountKeys[0] != f.feePayer {
		return out, errors.New("the payment's fee payer is not this facilitator's")
	}
	sig := base58.Encode(ed25519.Sign(f.key, tx.Message))
	o, err := f.poll(ctx, sig, base58.Encode(tx.Blockhash[:]), 0)
	if err != nil {
		return out, err
	}
	out.State = o.state
	key := tx.MessageHash()
	if o.state == x402.SettlementDone {
		out.Transaction = sig
		f.answerRecorded(ctx, key, sig)
	}
	if o.state == x402.SettlementDone || o.failed != "" {
		// Remembered as Settle would, and a later ask is answered from the
		// record.
		f.mu.Lock()
		if _, known := f.settled[key]; !known {
			f.settled[key] = &settlement{sig: sig, blockhash: base58.Encode(tx.Blockhash[:]), payer: payerOf(tx), failed: o.failed, at: now()}
		}
		f.mu.Unlock()
	}
	if o.state != x402.SettlementUndecided {
		// Charged only when this process sent the transaction and has not
		// learned its outcome yet (its record was swept): one sent by
		// another, or already charged, cost this process nothing now.
		f.learned(key, o.failed != "")
	}
	return out, nil
}

// answerRecorded marks key's record in Config.Sent answered, naming sig,
// when a status read with no record in memory (a facilitator of a reload
// that changed the settings, or after a restart) tells its caller the
// transaction landed and the record is unanswered: as SettlementStatus does
// from memory, so that no Settle elsewhere adopts it and answers success
// for a payment its caller was told settled. Store errors are only logged:
// what the chain says stands.
func (f *Facilitator) answerRecorded(ctx context.Context, key [32]byte, sig string) {
	rec, err := f.recorded(ctx, key)
	s := &settlement{}
	if err == nil && (rec == nil || !f.adopt(key, s, rec)) {
		return
	}
	if err == nil {
		err = f.answerSent(s, sig)
	}
	if err != nil && !errors.Is(err, store.ErrNoteChanged) {
		log.Printf("svm facilitator: marking the record of sent transaction %s answered: %v", sig, err)
	}
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
// transaction that landed, and is not needed).
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
	out.State = o.state
	if o.state == x402.SettlementDone {
		out.Transaction = sig
	}
	return out, nil
}

var _ x402.SentSettlementChecker = (*StatusReader)(nil)
