package store

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Payment kinds of a recorded verification, as the gateway reported them.
//
// A paid call is recorded before its settlement (the gateway settles only
// after the answer exists), so the gateway forwards it as pending and
// reports the outcome afterwards (SetPayment): paid when the settlement
// succeeded, unpaid when it failed (the answer was then never delivered).
// Pending and unpaid records are kept, for the audit trail, but do not
// count toward an agent's counts, reputation or score (Counted).
const (
	PaymentFree    = "free"
	PaymentPaid    = "paid"
	PaymentPending = "pending" // paid call whose settlement outcome is not known yet
	PaymentUnpaid  = "unpaid"  // settlement failed: the answer was not delivered
	PaymentUnknown = "unknown" // no trusted gateway said how the call was paid
)

// Counted reports whether v counts toward its agent's counts, reputation
// and score: every delivered verification does; a pending or unpaid one
// (not, or not yet, delivered) does not.
func (v Verification) Counted() bool {
	return v.Payment != PaymentPending && v.Payment != PaymentUnpaid
}

// ErrPaymentFinal reports a SetPayment on a record whose payment is no
// longer pending.
var ErrPaymentFinal = errors.New("store: the verification's payment is not pending")

// TestAgentPrefix marks agent ids reserved for examples (SPEC §5): their
// verifications are recorded like any other but flagged, so trust scores
// can leave them out.
const TestAgentPrefix = "test-"

// Page sizes of Verifications.
const (
	DefaultPageSize = 20
	MaxPageSize     = 100
)

var (
	// ErrDuplicate reports a second record with an id already recorded;
	// the first one stands and the counts are unchanged.
	ErrDuplicate = errors.New("store: verification id already recorded")
	// ErrBadCursor reports a paging cursor this store did not hand out.
	ErrBadCursor = errors.New("store: malformed paging cursor")
	// ErrNotFound reports an id with no record.
	ErrNotFound = errors.New("store: not found")
)

// MaxAgentIDBytes bounds an agent id every history and owner store takes:
// the contract's one limit, so that no backend refuses what another keeps.
// It sits under PostgreSQL's btree entry limit (about 2.7 kB, which the
// agent indexes of pghistory would otherwise hit with an id that does not
// compress) and over verifierd's longest agent_id (verify.MaxIDChars
// characters of up to 4 bytes each: 800).
const MaxAgentIDBytes = 1024

// Verification is one entry of the history: what was checked (the hashes,
// never the content), the outcome, and how the call was paid. It is what
// reputation pages list and what trust scores are computed from.
type Verification struct {
	ID          string    `json:"id"`
	VerifiedAt  time.Time `json:"verified_at"`
	AgentID     string    `json:"agent_id,omitempty"` // "" when the request named no agent: not indexed by agent
	TaskID      string    `json:"task_id"`
	Result      string    `json:"result"` // "pass" | "fail"
	OutputHash  string    `json:"output_hash"`
	SchemaHash  string    `json:"schema_hash"`
	RulesHash   string    `json:"rules_hash"`
	RequestHash string    `json:"request_hash"`
	KeyVersion  string    `json:"key_version,omitempty"` // key that signed the receipt

	Payment string `json:"payment"` // PaymentFree | PaymentPaid | PaymentPending | PaymentUnpaid | PaymentUnknown
	Payer   string `json:"payer,omitempty"`
	Network string `json:"network,omitempty"` // CAIP-2
	// Wallet is the address the caller proved control of (X-Wallet-Auth),
	// as the gateway reported it.
	Wallet string `json:"wallet,omitempty"`
	// Authenticated says the agent id was bound to the proven wallet, so
	// the record counts as authenticated history in a score.
	Authenticated bool `json:"authenticated,omitempty"`
	// Test is set by the store for agent ids starting with TestAgentPrefix.
	Test bool `json:"test,omitempty"`
}

// Counts are one agent's exact totals, updated in the same transaction as
// each record, so they never drift from the history.
type Counts struct {
	Pass              int64     `json:"pass"`
	Fail              int64     `json:"fail"`
	AuthenticatedPass int64     `json:"authenticated_pass,omitempty"`
	AuthenticatedFail int64     `json:"authenticated_fail,omitempty"`
	Paid              int64     `json:"paid,omitempty"`
	First             time.Time `json:"first,omitzero"`
	Last              time.Time `json:"last,omitzero"`
}

// Total is the number of recorded verifications.
func (c Counts) Total() int64 { return c.Pass + c.Fail }

// errAgentID refuses an agent id over MaxAgentIDBytes (or an empty one
// where one is required).
var errAgentID = fmt.Errorf("store: agent id must be 1..%d bytes", MaxAgentIDBytes)

func (v *Verification) validate() error {
	switch {
	case v.ID == "" || len(v.ID) > 200:
		return errors.New("store: verification id must be 1..200 bytes")
	case v.VerifiedAt.IsZero():
		return errors.New("store: verification time is missing")
	case v.Result != "pass" && v.Result != "fail":
		return fmt.Errorf("store: verification result %q is neither pass nor fail", v.Result)
	case len(v.AgentID) > MaxAgentIDBytes:
		return errAgentID
	}
	switch v.Payment {
	case "":
		v.Payment = PaymentUnknown
	case PaymentFree, PaymentPaid, PaymentPending, PaymentUnpaid, PaymentUnknown:
	default:
		return fmt.Errorf("store: payment kind %q is not free, paid, pending, unpaid or unknown", v.Payment)
	}
	return nil
}

// RecordVerification appends v to the history and updates its agent's
// counts, all in one transaction. It sets v.Test from the agent id (callers
// cannot mark or unmark a test agent). A second record with the same id is
// refused with ErrDuplicate and changes nothing.
func (db *DB) RecordVerification(ctx context.Context, v Verification) error {
	if err := v.validate(); err != nil {
		return err
	}
	v.VerifiedAt = v.VerifiedAt.UTC()
	v.Test = strings.HasPrefix(v.AgentID, TestAgentPrefix)
	val, err := encodeRecord(&v)
	if err != nil {
		return fmt.Errorf("encoding verification: %w", err)
	}
	rk := recordKey(v.ID)
	return db.update(ctx, func(txn *tx) error {
		if _, err := txn.Get(rk); err == nil {
			return ErrDuplicate
		} else if !errors.Is(err, badger.ErrKeyNotFound) {
			return fmt.Errorf("checking verification id: %w", err)
		}
		if err := txn.Set(rk, val); err != nil {
			return err
		}
		if err := txn.Set(timeKey(v.VerifiedAt, v.ID), nil); err != nil {
			return err
		}
		return putAgentRecord(txn, v, val)
	})
}

// putAgentRecord writes v (encoded as val) under its agent and counts it in
// the agent's totals (Counts.add: only what counts). It is the one place
// both a new record and a settled one reach an agent's history.
func putAgentRecord(txn *tx, v Verification, val []byte) error {
	if v.AgentID == "" {
		return nil
	}
	if err := txn.Set(agentKey(v.AgentID, v.VerifiedAt, v.ID), val); err != nil {
		return err
	}
	if err := putAuthenticatedRecord(txn, v, val); err != nil {
		return err
	}
	ck := countsKey(v.AgentID)
	c, err := getCounts(txn, ck)
	if err != nil {
		return err
	}
	c.add(v)
	cv, err := encodeCounts(&c)
	if err != nil {
		return fmt.Errorf("encoding counts: %w", err)
	}
	return txn.Set(ck, cv)
}

func (c *Counts) add(v Verification) {
	if !v.Counted() {
		return
	}
	pass := v.Result == "pass"
	if pass {
		c.Pass++
	} else {
		c.Fail++
	}
	if v.Authenticated {
		if pass {
			c.AuthenticatedPass++
		} else {
			c.AuthenticatedFail++
		}
	}
	if v.Payment == PaymentPaid {
		c.Paid++
	}
	if c.First.IsZero() || v.VerifiedAt.Before(c.First) {
		c.First = v.VerifiedAt
	}
	if v.VerifiedAt.After(c.Last) {
		c.Last = v.VerifiedAt
	}
}

// SetPayment records the outcome of a pending verification's settlement:
// payment is PaymentPaid (it now counts for its agent) or PaymentUnpaid (it
// stays out of the counts). A record that is not pending is left as it is
// (ErrPaymentFinal), so a late or repeated report cannot change history;
// an unknown id is ErrNotFound.
func (db *DB) SetPayment(ctx context.Context, id, payment string) error {
	errs, err := db.SetPayments(ctx, []PaymentOutcome{{ID: id, Payment: payment}})
	if err != nil {
		return err
	}
	return errs[0]
}

// PaymentOutcome is one settlement outcome for SetPayments.
type PaymentOutcome struct {
	ID      string
	Payment string // PaymentPaid or PaymentUnpaid
}

// SetPayments records outcomes as SetPayment records each, one after
// another, in one transaction: a gateway's batch of reports costs one
// commit (one synced write), not one per outcome. errs[i] is outcome i's
// own refusal (ErrNotFound, ErrPaymentFinal, or a payment that is neither
// paid nor unpaid), which leaves the others to be recorded; err is a
// failure of the transaction, which records none of them.
func (db *DB) SetPayments(ctx context.Context, outs []PaymentOutcome) (errs []error, err error) {
	errs = make([]error, len(outs))
	err = db.update(ctx, func(txn *tx) error {
		for i, o := range outs {
			errs[i] = setPayment(txn, o)
			if errs[i] != nil && !OutcomeRefused(errs[i]) {
				return errs[i]
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return errs, nil
}

// ErrBadOutcome refuses an outcome other than paid or unpaid.
var ErrBadOutcome = errors.New("store: a settlement outcome is paid or unpaid")

// Check refuses (ErrBadOutcome) a payment other than paid or unpaid: the
// one test of an outcome, for every history backend and for verifierd's
// reading of a report.
func (o PaymentOutcome) Check() error {
	if o.Payment != PaymentPaid && o.Payment != PaymentUnpaid {
		return fmt.Errorf("%w, not %q", ErrBadOutcome, o.Payment)
	}
	return nil
}

// OutcomeRefused reports whether err, from a history backend's
// SetPayments, refuses one outcome of a batch (nothing of it was written)
// rather than failing the batch's transaction.
func OutcomeRefused(err error) bool {
	return errors.Is(err, ErrNotFound) || errors.Is(err, ErrPaymentFinal) || errors.Is(err, ErrBadOutcome)
}

// setPayment records o in txn, or refuses it having written nothing.
func setPayment(txn *tx, o PaymentOutcome) error {
	if err := o.Check(); err != nil {
		return err
	}
	rk := recordKey(o.ID)
	item, err := txn.Get(rk)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return ErrNotFound
	}
	if err != nil {
		return err
	}
	var v Verification
	if err := item.Value(func(b []byte) error { return decodeRecord(b, &v) }); err != nil {
		return fmt.Errorf("decoding verification: %w", err)
	}
	if v.Payment != PaymentPending {
		return ErrPaymentFinal
	}
	v.Payment = o.Payment
	val, err := encodeRecord(&v)
	if err != nil {
		return fmt.Errorf("encoding verification: %w", err)
	}
	if err := txn.Set(rk, val); err != nil {
		return err
	}
	return putAgentRecord(txn, v, val)
}

func getCounts(txn *tx, key []byte) (Counts, error) {
	var c Counts
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return c, nil
	}
	if err != nil {
		return c, fmt.Errorf("reading counts: %w", err)
	}
	err = item.Value(func(b []byte) (err error) { c, err = decodeCounts(b); return err })
	if err != nil {
		return c, fmt.Errorf("decoding counts: %w", err)
	}
	return c, nil
}

// AgentCounts returns agentID's totals (zero for an agent never seen).
func (db *DB) AgentCounts(ctx context.Context, agentID string) (Counts, error) {
	var c Counts
	err := db.view(ctx, func(txn *tx) error {
		var err error
		c, err = getCounts(txn, countsKey(agentID))
		return err
	})
	return c, err
}

// Verification returns the record with the given id, or ErrNotFound.
func (db *DB) Verification(ctx context.Context, id string) (Verification, error) {
	var v Verification
	err := db.view(ctx, func(txn *tx) error {
		item, err := txn.Get(recordKey(id))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return ErrNotFound
		}
		if err != nil {
			return err
		}
		return item.Value(func(b []byte) error { return decodeRecord(b, &v) })
	})
	return v, err
}

// Verifications pages through the history newest first: agentID's records,
// or every record when agentID is "". cursor is "" for the first page, then
// the cursor the previous page returned; the returned cursor is "" after the
// last page. limit is clamped to 1..MaxPageSize (0 means DefaultPageSize).
// A cursor stays valid while records are added: a page never repeats or
// skips a record older than its cursor.
func (db *DB) Verifications(ctx context.Context, agentID, cursor string, limit int) ([]Verification, string, error) {
	if limit <= 0 {
		limit = DefaultPageSize
	}
	limit = min(limit, MaxPageSize)
	after, err := parseCursor(cursor)
	if err != nil {
		return nil, "", err
	}
	if len(agentID) > MaxAgentIDBytes {
		return nil, "", nil
	}
	var prefix []byte
	byAgent := agentID != ""
	if byAgent {
		prefix = agentPrefix(agentID)
	} else {
		prefix = []byte{tagTime}
	}
	out := make([]Verification, 0, min(limit, 16))
	var next string
	var lastSuffix []byte
	err = db.view(ctx, func(txn *tx) error {
		it := txn.NewIterator(badger.IteratorOptions{
			Prefix:         prefix,
			PrefetchValues: byAgent,
			PrefetchSize:   limit + 1,
		})
		defer it.Close()
		seek := append(bytes.Clone(prefix), after...)
		for it.Seek(seek); it.ValidForPrefix(prefix); it.Next() {
			key := it.Item().Key()
			suffix := key[len(prefix):]
			if after != nil && bytes.Equal(suffix, after) {
				continue
			}
			if len(out) == limit {
				next = base64.RawURLEncoding.EncodeToString(lastSuffix)
				return nil
			}
			var v Verification
			if byAgent {
				if err := it.Item().Value(func(b []byte) error { return decodeRecord(b, &v) }); err != nil {
					return fmt.Errorf("decoding verification: %w", err)
				}
			} else {
				item, err := txn.Get(recordKey(string(suffix[8:])))
				if err != nil {
					return fmt.Errorf("reading verification: %w", err)
				}
				if err := item.Value(func(b []byte) error { return decodeRecord(b, &v) }); err != nil {
					return fmt.Errorf("decoding verification: %w", err)
				}
			}
			out = append(out, v)
			lastSuffix = append(lastSuffix[:0], suffix...)
		}
		return nil
	})
	if err != nil {
		return nil, "", err
	}
	return out, next, nil
}
