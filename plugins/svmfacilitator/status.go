package svmfacilitator

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"

	"github.com/aovhq/aov/internal/base58"
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

// poll looks once at signature sig of a transaction built on blockhash.
// An unknown signature is judged unable to land only when the blockhash has
// expired (blockhashExpired) and the chain still does not know the
// signature after that answer (in case it landed in between).
func (f *Facilitator) poll(ctx context.Context, sig, blockhash string) (polled, error) {
	st, err := f.rpc.Status(ctx, sig)
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
	expired, err := f.blockhashExpired(ctx, blockhash)
	if err != nil || !expired {
		return polled{}, err
	}
	if st, err = f.rpc.Status(ctx, sig); err != nil || st != nil {
		return polled{}, err
	}
	return polled{state: x402.SettlementNever}, nil
}

// blockhashExpired reports whether no transaction built on blockhash can
// land any more: invalid at the processed tip and in the confirmed bank
// (so a transaction that did land on it is confirmed, or on a dead fork,
// and a confirmed lookup sees it). It is the one rule of expiry for every
// judgement of "never": the processed tip alone can be a minority fork, or
// one node of a load-balanced pool ahead of the one that answers the
// status, and would call a transaction that is about to be confirmed
// "never landed".
func (f *Facilitator) blockhashExpired(ctx context.Context, blockhash string) (bool, error) {
	for _, commitment := range []string{"processed", "confirmed"} {
		valid, err := f.rpc.BlockhashValidAt(ctx, blockhash, commitment)
		if err != nil || valid {
			return false, err
		}
	}
	return true, nil
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
	var sig, blockhash string
	var inflight, pending bool
	if e != nil {
		sig, blockhash, inflight, pending, out.Payer = e.sig, e.blockhash, e.inflight, e.pending, e.payer
	}
	f.mu.Unlock()
	switch {
	case e == nil:
		return f.unrecorded(ctx, tx)
	case inflight || sig == "":
		return out, nil // a Settle is working on it
	case !pending:
		out.State, out.Transaction = x402.SettlementDone, sig
		return out, nil
	}
	o, err := f.poll(ctx, sig, blockhash)
	if err != nil {
		return out, err
	}
	switch {
	case o.state == x402.SettlementDone:
		f.finish(key, true)
		out.Transaction = sig
	case o.state == x402.SettlementNever:
		f.outcome(e, o.failed != "")
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
	o, err := f.poll(ctx, sig, base58.Encode(tx.Blockhash[:]))
	if err != nil {
		return out, err
	}
	out.State = o.state
	if o.state == x402.SettlementDone {
		out.Transaction = sig
		// Remembered as settled, as Settle would: a second Settle of it
		// is a duplicate.
		f.mu.Lock()
		if f.settled[tx.MessageHash()] == nil {
			f.settled[tx.MessageHash()] = &settlement{sig: sig, blockhash: base58.Encode(tx.Blockhash[:]), at: now()}
		}
		f.mu.Unlock()
	}
	return out, nil
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
		o, err = r.f.poll(ctx, sig, base58.Encode(tx.Blockhash[:]))
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
