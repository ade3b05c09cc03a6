package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// PaymentIDs keeps the payment identifiers of x402's payment-identifier
// extension: a client-chosen id bound to one payment (its fingerprint, a
// hash of the payment and the request it paid for) and, once that payment
// settled, the answer it bought, so the client's retry gets that answer
// instead of paying again. An id is bound to one fingerprint at a time;
// while the binding lives, another fingerprint cannot take the id.
//
// The binding does not move money: the payment's claim (Claims) does. The
// gateway binds an id while it holds the payment's claim, unbinds it before
// releasing a claim on which nothing was charged, and saves the answer
// after settling, so at most one payment under an id can be charged.
//
// A Redis implementation runs each operation as one Lua script on one key.
type PaymentIDs interface {
	// Bind binds id to fp until until, unless id has a live binding: then
	// it binds nothing and returns that binding with bound false.
	Bind(ctx context.Context, id, fp string, until time.Time) (st PaymentIDState, bound bool, err error)
	// Lookup returns id's live binding, or ErrNotFound.
	Lookup(ctx context.Context, id string) (PaymentIDState, error)
	// Save records answer as the outcome of id's payment fp and keeps it
	// until until: when id is bound to fp (or not bound at all, as after
	// its binding lapsed mid-call). A binding that is already done keeps
	// its first answer (nil error); one to another fingerprint is
	// ErrPaymentIDTaken.
	Save(ctx context.Context, id, fp string, answer []byte, until time.Time) error
	// Unbind drops id's binding if it is bound to fp and not done;
	// otherwise it changes nothing.
	Unbind(ctx context.Context, id, fp string) error
}

// PaymentIDState is one binding of a payment identifier.
type PaymentIDState struct {
	Fingerprint string
	// Done says the payment settled and Answer is what it bought (as the
	// gateway encoded it).
	Done   bool
	Answer []byte
	Until  time.Time
}

// ErrPaymentIDTaken reports a save for a fingerprint the id is not bound
// to.
var ErrPaymentIDTaken = errors.New("store: payment identifier bound to another payment")

// Bounds of one binding; the gateway's own limits are far lower.
const (
	MaxPaymentIDBytes       = 256
	MaxPaymentIDFingerprint = 256
	MaxPaymentIDAnswerBytes = 16 << 20
)

const (
	paymentIDHeader     = 1 + 8 + 2 // state, until, fingerprint length
	paymentIDStateBound = 0
	paymentIDStateDone  = 1
)

// CheckPaymentID checks the arguments every backend refuses alike.
func CheckPaymentID(id, fp string, answer []byte) error {
	switch {
	case id == "" || len(id) > MaxPaymentIDBytes:
		return fmt.Errorf("store: payment identifier must be 1 to %d bytes", MaxPaymentIDBytes)
	case fp == "" || len(fp) > MaxPaymentIDFingerprint:
		return fmt.Errorf("store: payment fingerprint must be 1 to %d bytes", MaxPaymentIDFingerprint)
	case len(answer) > MaxPaymentIDAnswerBytes:
		return fmt.Errorf("store: saved answer over %d bytes", MaxPaymentIDAnswerBytes)
	}
	return nil
}

func paymentIDKey(id string) []byte { return append([]byte{tagPaymentID}, id...) }

// binding value: state byte, until (Unix ns, int64 big endian), the
// fingerprint's length (two bytes) and the fingerprint, then the answer.
type paymentIDRecord struct {
	done   bool
	until  int64
	fp     string
	answer []byte
}

func (p paymentIDRecord) encode() []byte {
	b := make([]byte, 0, paymentIDHeader+len(p.fp)+len(p.answer))
	if p.done {
		b = append(b, paymentIDStateDone)
	} else {
		b = append(b, paymentIDStateBound)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(p.until))
	b = appendComponent(b, p.fp)
	return append(b, p.answer...)
}

func decodePaymentID(b []byte) (paymentIDRecord, error) {
	var p paymentIDRecord
	if len(b) < paymentIDHeader || b[0] > paymentIDStateDone {
		return p, errors.New("store: corrupt payment identifier record")
	}
	p.done = b[0] == paymentIDStateDone
	p.until = int64(binary.BigEndian.Uint64(b[1:9]))
	n := int(binary.BigEndian.Uint16(b[9:11]))
	if len(b) < paymentIDHeader+n {
		return p, errors.New("store: corrupt payment identifier record")
	}
	p.fp = string(b[11 : 11+n])
	p.answer = append([]byte(nil), b[11+n:]...)
	return p, nil
}

func (p paymentIDRecord) state() PaymentIDState {
	return PaymentIDState{Fingerprint: p.fp, Done: p.done, Answer: p.answer, Until: time.Unix(0, p.until).UTC()}
}

// readPaymentID returns id's live binding (ok false when absent or expired
// by the store's clock).
func readPaymentID(txn *tx, id string, t int64) (paymentIDRecord, bool, error) {
	item, err := txn.Get(paymentIDKey(id))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return paymentIDRecord{}, false, nil
	}
	if err != nil {
		return paymentIDRecord{}, false, fmt.Errorf("reading payment identifier: %w", err)
	}
	var p paymentIDRecord
	if err := item.Value(func(b []byte) error {
		var err error
		p, err = decodePaymentID(b)
		return err
	}); err != nil {
		return p, false, err
	}
	return p, p.until > t, nil
}

func putPaymentID(txn *tx, id string, p paymentIDRecord) error {
	e := badger.NewEntry(paymentIDKey(id), p.encode())
	e.ExpiresAt = claimExpiry(p.until)
	return txn.SetEntry(e)
}

// PaymentIDs returns the embedded implementation of PaymentIDs.
func (db *DB) PaymentIDs() PaymentIDs { return paymentIDs{db} }

type paymentIDs struct{ db *DB }

// Bind implements PaymentIDs.
func (s paymentIDs) Bind(ctx context.Context, id, fp string, until time.Time) (PaymentIDState, bool, error) {
	if err := CheckPaymentID(id, fp, nil); err != nil {
		return PaymentIDState{}, false, err
	}
	var st PaymentIDState
	var bound bool
	err := s.db.update(ctx, func(txn *tx) error {
		t := now().UnixNano()
		if until.UnixNano() <= t {
			return errors.New("store: binding expiry is not in the future")
		}
		p, live, err := readPaymentID(txn, id, t)
		if err != nil {
			return err
		}
		bound = !live
		if live {
			st = p.state()
			return nil
		}
		p = paymentIDRecord{until: until.UnixNano(), fp: fp}
		st = p.state()
		return putPaymentID(txn, id, p)
	})
	if err != nil {
		return PaymentIDState{}, false, err
	}
	return st, bound, nil
}

// Lookup implements PaymentIDs.
func (s paymentIDs) Lookup(ctx context.Context, id string) (PaymentIDState, error) {
	if len(id) > MaxPaymentIDBytes {
		return PaymentIDState{}, ErrNotFound
	}
	var st PaymentIDState
	err := s.db.view(ctx, func(txn *tx) error {
		p, live, err := readPaymentID(txn, id, now().UnixNano())
		if err != nil {
			return err
		}
		if !live {
			return ErrNotFound
		}
		st = p.state()
		return nil
	})
	return st, err
}

// Save implements PaymentIDs.
func (s paymentIDs) Save(ctx context.Context, id, fp string, answer []byte, until time.Time) error {
	if err := CheckPaymentID(id, fp, answer); err != nil {
		return err
	}
	return s.db.update(ctx, func(txn *tx) error {
		t := now().UnixNano()
		p, live, err := readPaymentID(txn, id, t)
		if err != nil {
			return err
		}
		if live && p.fp != fp {
			return ErrPaymentIDTaken
		}
		if live && p.done {
			return nil
		}
		return putPaymentID(txn, id, paymentIDRecord{done: true, until: until.UnixNano(), fp: fp, answer: answer})
	})
}

// Unbind implements PaymentIDs.
func (s paymentIDs) Unbind(ctx context.Context, id, fp string) error {
	if err := CheckPaymentID(id, fp, nil); err != nil {
		return err
	}
	return s.db.update(ctx, func(txn *tx) error {
		p, live, err := readPaymentID(txn, id, now().UnixNano())
		if err != nil || !live || p.done || p.fp != fp {
			return err
		}
		return txn.Delete(paymentIDKey(id))
	})
}

var _ PaymentIDs = paymentIDs{}
