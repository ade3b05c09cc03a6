package svmfacilitator

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"time"

	"github.com/aovhq/aov/internal/base58"
	"github.com/aovhq/aov/x402"
)

// Finding a payment's transaction on chain from the payment alone.
//
// A Solana transaction is named by its first signature, the fee payer's,
// which only the facilitator makes; when nothing remembers it (a remote
// facilitator's /settle reply was lost whole), the payment itself still
// fixes everything else: the buyer's signature covers the message, and the
// facilitator only fills slot 0. So the transaction is looked for among
// those that touched the transfer's source token account (the buyer's
// account of this mint: far less unrelated traffic than the buyer's wallet,
// the mint, the payee or the fee payer), newest first with
// getSignaturesForAddress, each fetched with getTransaction and taken only
// when its message is the payment's byte for byte and its first signature
// is the fee payer's over that message.
//
// Anyone (the payer first) can put more transactions on that account, so
// the search is bounded: at most searchFetched transactions looked at
// (every signature listed is fetched), and no further back than a lower
// bound of time when the caller knows one (the settlement was asked for no
// earlier; blockTime, less blockTimeSkew). "Not found" counts only when the
// search was complete: the account's history ended, or the bound of time
// was passed, with every candidate fetched. A bound hit first is an
// undecided outcome, never a guess.

// Bounds of one search; tests lower them.
var (
	searchPage    = 100 // signatures per getSignaturesForAddress call
	searchFetched = 64  // transactions fetched per search
)

// blockTimeSkew is how far a block's blockTime (the validators' estimate)
// may trail the wall clock that set the lower bound of time.
const blockTimeSkew = 5 * time.Minute

// findResult is what one search tells.
type findResult struct {
	// sig is the payment's transaction, "" when not found; failed is its
	// on-chain error when it landed and failed; landed, where it landed.
	sig, failed string
	landed      *landing
	// complete: not found, and every transaction that could be it was
	// looked at.
	complete bool
}

// transfer is the payment's transfer: the first TransferChecked of SPL
// Token or Token-2022 (accounts source, mint, destination, authority).
func (tx *Transaction) transfer() (Instruction, bool) {
	if tx.LookupTables == 0 {
		for _, ix := range tx.Instructions {
			if p := tx.Program(ix); (p == TokenProgram || p == Token2022Program) && len(ix.Data) == 10 && ix.Data[0] == 12 && len(ix.Accounts) >= 4 {
				return ix, true
			}
		}
	}
	return Instruction{}, false
}

// paymentSource is the source token account of the payment's transfer.
func paymentSource(tx *Transaction) (PublicKey, error) {
	ix, ok := tx.transfer()
	if !ok {
		return PublicKey{}, errors.New("the payment has no TransferChecked to find it by")
	}
	return tx.Account(ix, 0), nil
}

// PayerOf is the payer of an exact SVM payment, its transfer's authority
// (as Verify and Settle report it), "" when the payload is not one.
func PayerOf(p x402.PaymentPayload) string {
	tx, err := DecodePayload(p.Payload)
	if err != nil {
		return ""
	}
	return tx.Payer()
}

// Payer is PayerOf a decoded transaction: the owner its transfer moves
// funds of, "" when it has no transfer.
func (tx *Transaction) Payer() string {
	ix, ok := tx.transfer()
	if !ok {
		return ""
	}
	return tx.Account(ix, 3).String()
}

// matchLanded reports whether lt, the transaction the node returned for
// signature sig, is the payment tx: the same message bytes, and sig the fee
// payer's signature over them (so it is the transaction's id). failed is
// its on-chain error, "" when it succeeded.
func matchLanded(tx *Transaction, sig string, lt *LandedTransaction) (failed string, ok bool) {
	if lt == nil || lt.Meta == nil || len(lt.Transaction) != 2 || lt.Transaction[1] != "base64" ||
		len(lt.Transaction[0]) > base64.StdEncoding.EncodedLen(MaxTransactionSize) || len(tx.AccountKeys) == 0 {
		return "", false
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(lt.Transaction[0])
	if err != nil {
		return "", false
	}
	got, err := DecodeTransaction(raw)
	if err != nil || !bytes.Equal(got.Message, tx.Message) || base58.Encode(got.Signatures[0]) != sig ||
		!verifySignature(tx.AccountKeys[0], tx.Message, got.Signatures[0]) {
		return "", false
	}
	if e := lt.Meta.Err; len(e) > 0 && string(e) != "null" {
		return string(e), true
	}
	return "", true
}

// find searches the chain once for tx's transaction among those of its
// source token account, no further back than after (zero: no bound of
// time).
func (f *Facilitator) find(ctx context.Context, tx *Transaction, after time.Time, minSlot uint64) (findResult, error) {
	source, err := paymentSource(tx)
	if err != nil {
		return findResult{}, err
	}
	var floor int64 // blockTime below which nothing can be the payment
	if !after.IsZero() {
		floor = after.Add(-blockTimeSkew).Unix()
	}
	before, fetched := "", 0
	lastSlot := ^uint64(0)
	for {
		page, err := f.rpc.SignaturesForAddress(ctx, source.String(), before, searchPage, minSlot)
		if err != nil {
			return findResult{}, err
		}
		for _, e := range page {
			if e.Slot > lastSlot {
				return findResult{}, errors.New("solana rpc getSignaturesForAddress: not newest first")
			}
			lastSlot = e.Slot
			if floor != 0 && e.BlockTime != nil && *e.BlockTime < floor {
				return findResult{complete: true}, nil
			}
			if fetched == searchFetched {
				return findResult{}, nil
			}
			fetched++
			lt, err := f.rpc.Transaction(ctx, e.Signature)
			if err != nil {
				return findResult{}, err
			}
			if lt == nil {
				// Listed but not served (not confirmed yet, or pruned): it
				// might be the payment.
				return findResult{}, nil
			}
			if failed, ok := matchLanded(tx, e.Signature, lt); ok {
				at := lt.BlockTime
				if at == nil {
					at = e.BlockTime
				}
				return findResult{sig: e.Signature, failed: failed, landed: &landing{slot: max(lt.Slot, e.Slot), blockTime: at}}, nil
			}
		}
		if len(page) < searchPage {
			return findResult{complete: true}, nil // the account's whole history
		}
		before = page[len(page)-1].Signature
	}
}

// search judges tx by finding its transaction: done or never (failed) when
// found; never when not found by a complete search made, by a bank at least
// as new, after its blockhash was seen expired (blockhashExpired);
// undecided otherwise. sig is the transaction when found.
func (f *Facilitator) search(ctx context.Context, tx *Transaction, after time.Time) (polled, string, error) {
	var minSlot uint64
	for again := false; ; again = true {
		r, err := f.find(ctx, tx, after, minSlot)
		switch {
		case err != nil:
			return polled{}, "", err
		case r.sig != "" && r.failed != "":
			return polled{state: x402.SettlementNever, failed: r.failed}, r.sig, nil
		case r.sig != "":
			return polled{state: x402.SettlementDone, landed: r.landed}, r.sig, nil
		case !r.complete:
			return polled{}, "", nil
		case again:
			return polled{state: x402.SettlementNever}, "", nil
		}
		// The listing carries no slot: the tip's is the floor of the
		// judgement (blockhashExpired).
		if _, err := f.rpc.Slot(ctx, processed); err != nil {
			return polled{}, "", err
		}
		expired, at, err := f.blockhashExpired(ctx, base58.Encode(tx.Blockhash[:]), 0)
		if err != nil || !expired {
			return polled{}, "", err
		}
		// Once more, after that answer: it may have landed in between.
		minSlot = at
	}
}
