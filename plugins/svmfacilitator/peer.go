package svmfacilitator

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/x402"
)

// PeerSettlementStatus is SettlementStatus for a payment the caller knows
// a peer sent: another facilitator holding this fee payer's key (a remote
// one of the gateway's, in the same multi). A payment this facilitator
// sent itself (one it remembers, in memory or as a send whose outcome it
// has not learned) is answered as SettlementStatus answers it. Any other
// is judged by the chain alone, by the signature the peer sent it under
// (the fee payer's over the message, signed again here: ed25519 is
// deterministic, and a record of the send in Config.Sent, whoever wrote
// it, names that same one): landed and succeeded is settled, naming the
// transaction; failed on chain, or expired unknown, never; else
// undecided. It is never settled by another settlement: the record a
// shared store holds of the peer's send is the peer's, marked answered
// when the peer's own reply went out (and was lost), and the gateway that
// asks holds the claim that makes the payment its caller's. Nothing is
// marked, dropped or remembered: the record stays the peer's.
func (f *Facilitator) PeerSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
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
	own := f.memory(key, now()) != nil || f.unlearned[key] != nil
	f.mu.Unlock()
	if own {
		return f.SettlementStatus(ctx, p, req)
	}
	if len(tx.AccountKeys) == 0 || tx.AccountKeys[0] != f.feePayer {
		return out, errors.New("the payment's fee payer is not this facilitator's")
	}
	sig := base58.Encode(ed25519.Sign(f.key, tx.Message))
	o, err := f.poll(ctx, sig, base58.Encode(tx.Blockhash[:]), 0)
	if err != nil {
		return out, err
	}
	out.State = o.state
	if o.state == x402.SettlementDone {
		out.Transaction, out.Payer = sig, payerOf(tx)
	}
	return out, nil
}
