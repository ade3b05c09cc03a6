package store

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// Claims is the replay guard: a request atomically claims a set of keys
// (for an x402 payment: the payer+nonce and the payload hash; for
// X-Wallet-Auth: the nonce) until an expiry, all or nothing, and the second
// claimer of any of those keys loses. Once the payment is settled the claim
// is marked settled and can no longer be released, so one authorization is
// never settled twice; a request that failed before anything was charged
// releases its claim so the client may retry with the same authorization.
//
// A Redis implementation runs Claim as one Lua script (EXISTS on every key,
// then SET ... PXAT on all of them), and Settle and Release as
// compare-the-token-then-write scripts, which gives the same atomicity. It
// too keeps a claim's note once, under its first key (claimRecord; in
// plugins/redisstore, a hash field naming the first key on the others).
type Claims interface {
	// Claim claims every key until until. If any key is held and not
	// expired it claims nothing and returns a *ClaimedError.
	Claim(ctx context.Context, keys []string, until time.Time) (Claim, error)
	// Settle marks the claim settled with a note (a transaction hash, an
	// encoded settlement response) and keeps it at least until keepUntil
	// (zero: its current expiry). ErrClaimLost when the claim is no longer
	// this holder's (it expired and someone else claimed a key).
	Settle(ctx context.Context, c Claim, note string, keepUntil time.Time) error
	// Release drops an unsettled claim. Releasing a settled claim fails
	// with ErrClaimSettled and keeps it; a lost one is ErrClaimLost.
	Release(ctx context.Context, c Claim) error
	// Lookup reports the live claim on key, or ErrNotFound.
	Lookup(ctx context.Context, key string) (ClaimState, error)
	// Record writes a settled claim on key with a note until until, in
	// one write, for a fact known only once its payment settled (a
	// wallet's paid access): there is no pending claim for a second
	// write to leave behind when it fails. A live settled claim on key
	// that lasts until then or later is kept as it is (nil error: a
	// retry of the same record changes nothing); one that ends sooner is
	// rewritten with note until until, so a fact paid for again lasts
	// from its latest payment. A live unsettled one is replaced, since
	// its holder could only have been recording the same fact. So key
	// must be one only Record writes (the caller's own prefix), never a
	// key of a claim with several: replacing such a claim's first key
	// would leave its other keys without its note.
	Record(ctx context.Context, key, note string, until time.Time) error
}

// Claim is a held set of keys. Token proves the holder, so a holder whose
// claim expired cannot settle or release the claim of whoever came next.
type Claim struct {
	Keys  []string
	Token string
	Until time.Time
}

// ClaimState is what the store knows of one claimed key.
type ClaimState struct {
	Settled bool
	Note    string
	Until   time.Time
	// Attempt is what the store's clock says of the attempt span the
	// claim was written with (HeldClaims.ClaimHeld).
	Attempt AttemptState
}

// AttemptState is where a claim's attempt span stands by a store's own
// clock.
type AttemptState uint8

const (
	// AttemptUnknown: the store keeps no span for the claim. A store with
	// a Session keeps none (its one process knows its own requests); a
	// shared store has none for a claim written without one (Claim, or a
	// ClaimHeld by a gateway from before it kept them).
	AttemptUnknown AttemptState = iota
	// AttemptRunning: the span has not passed.
	AttemptRunning
	// AttemptOver: the span has passed.
	AttemptOver
)

// ClaimedError reports that a key is already claimed; Key names the first
// such key (in the caller's order) and State its claim, so the gateway can
// tell "in progress" from "already settled".
type ClaimedError struct {
	Key   string
	State ClaimState
}

func (e *ClaimedError) Error() string {
	if e.State.Settled {
		return "store: key already claimed and settled"
	}
	return "store: key already claimed"
}

// Is makes errors.Is(err, ErrClaimed) true.
func (e *ClaimedError) Is(target error) bool { return target == ErrClaimed }

var (
	// ErrClaimed matches every *ClaimedError.
	ErrClaimed = errors.New("store: key already claimed")
	// ErrClaimLost reports that the claim expired and a key now belongs
	// to someone else (or to nobody).
	ErrClaimLost = errors.New("store: claim no longer held")
	// ErrClaimSettled reports a release of a settled claim.
	ErrClaimSettled = errors.New("store: claim is settled")
	// ErrNoteChanged reports a Swap whose claim no longer carries the
	// note it expected: someone else moved it first.
	ErrNoteChanged = errors.New("store: claim note changed")
)

// MaxClaimKeyBytes bounds one claim key; callers hash anything longer.
const MaxClaimKeyBytes = 1024

// claim value: state byte (bit 0: settled; bit 1: ref), 16 token bytes,
// until (Unix ns, int64 big endian), then the note.
//
// A claim's note is written once, under its first key; its other keys'
// records are refs, whose note field names that first key. A note is a
// held record of a paid call (kilobytes: the payment, the offer), written
// with every claim and read back by the compare-and-swap that settles it:
// stored under each key it was encoded, written and copied out once per
// key. The keys are written and read in one transaction, so a ref never
// outlives its note. A record with bit 1 clear carries its own note (every
// record written before refs, and every claim of one key).
type claimRecord struct {
	settled bool
	ref     bool
	token   [16]byte
	until   int64
	note    string // the note, or for a ref the key whose record carries it
}

const (
	claimSettled = 1 << 0
	claimRef     = 1 << 1
	claimHead    = 25 // state, token, until
)

func (c claimRecord) encode() []byte {
	b := make([]byte, 0, claimHead+len(c.note))
	var state byte
	if c.settled {
		state |= claimSettled
	}
	if c.ref {
		state |= claimRef
	}
	b = append(b, state)
	b = append(b, c.token[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(c.until))
	return append(b, c.note...)
}

// decodeClaim reads a claim value; with note false it leaves the note out
// (no copy of it) for a caller that does not read it.
func decodeClaim(b []byte, note bool) (claimRecord, error) {
	var c claimRecord
	if len(b) < claimHead || b[0] > claimSettled|claimRef {
		return c, errors.New("store: corrupt claim record")
	}
	c.settled = b[0]&claimSettled != 0
	c.ref = b[0]&claimRef != 0
	copy(c.token[:], b[1:17])
	c.until = int64(binary.BigEndian.Uint64(b[17:claimHead]))
	if note || c.ref {
		c.note = string(b[claimHead:])
	}
	return c, nil
}

func (c claimRecord) state() ClaimState {
	return ClaimState{Settled: c.settled, Note: c.note, Until: time.Unix(0, c.until).UTC()}
}

// readClaim returns the live claim on key (ok false when absent or expired
// by the store's clock), its note read through a ref.
func readClaim(txn *tx, key []byte, t int64) (claimRecord, bool, error) {
	c, live, err := readClaimRecord(txn, key, t, nil)
	if err != nil || !live || !c.ref {
		return c, live, err
	}
	first, ok, err := readClaimRecord(txn, claimKey(c.note), t, nil)
	if err != nil {
		return c, false, err
	}
	c.ref, c.note = false, ""
	if ok && first.token == c.token {
		c.note = first.note
	}
	return c, true, nil
}

// readClaimRecord returns the record under key as stored (a ref as a ref)
// and whether it is live at t. With note set, the record's own note is
// not copied out: note is called with its bytes, valid during the call.
func readClaimRecord(txn *tx, key []byte, t int64, note func([]byte)) (claimRecord, bool, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return claimRecord{}, false, nil
	}
	if err != nil {
		return claimRecord{}, false, fmt.Errorf("reading claim: %w", err)
	}
	var c claimRecord
	if err := item.Value(func(b []byte) error {
		var err error
		c, err = decodeClaim(b, note == nil)
		if err == nil && note != nil && !c.ref {
			note(b[claimHead:])
		}
		return err
	}); err != nil {
		return c, false, err
	}
	return c, c.until > t, nil
}

// claimExpiry is when Badger may drop a claim: an hour after it expires,
// measured on the real clock Badger's TTL reads.
func claimExpiry(until int64) uint64 {
	return uint64(max(until, time.Now().UnixNano())/int64(time.Second)) + 3600
}

// Claims returns the embedded implementation of Claims.
func (db *DB) Claims() Claims { return claims{db} }

type claims struct{ db *DB }

// Claim implements Claims.
func (cl claims) Claim(ctx context.Context, keys []string, until time.Time) (Claim, error) {
	return cl.claim(ctx, keys, until, nil)
}

// ClaimHeld implements HeldClaims. The embedded store has a Session, so it
// keeps no attempt span: its one process knows its requests.
func (cl claims) ClaimHeld(ctx context.Context, keys []string, until time.Time, _ time.Duration, note func(Claim) (string, error)) (Claim, error) {
	return cl.claim(ctx, keys, until, note)
}

// claim is Claim, with the note made by note (nil: none) written on the
// new claim in the same write.
func (cl claims) claim(ctx context.Context, keys []string, until time.Time, note func(Claim) (string, error)) (Claim, error) {
	keys, err := ClaimKeys(keys)
	if err != nil {
		return Claim{}, err
	}
	rec := claimRecord{until: until.UnixNano()}
	if _, err := rand.Read(rec.token[:]); err != nil {
		return Claim{}, fmt.Errorf("making claim token: %w", err)
	}
	c := Claim{Keys: keys, Token: hex.EncodeToString(rec.token[:]), Until: until}
	if note != nil {
		if rec.note, err = note(c); err != nil {
			return Claim{}, err
		}
		if err := CheckHoldNote(rec.note); err != nil {
			return Claim{}, err
		}
	}
	err = cl.db.update(ctx, func(txn *tx) error {
		t := now().UnixNano()
		if rec.until <= t {
			return errors.New("store: claim expiry is not in the future")
		}
		for _, k := range keys {
			c, live, err := readClaim(txn, claimKey(k), t)
			if err != nil {
				return err
			}
			if live {
				return &ClaimedError{Key: k, State: c.state()}
			}
		}
		return putClaims(txn, keys, rec)
	})
	if err != nil {
		return Claim{}, err
	}
	return c, nil
}

// Record implements Claims.
func (cl claims) Record(ctx context.Context, key, note string, until time.Time) error {
	keys, err := ClaimKeys([]string{key})
	if err != nil {
		return err
	}
	rec := claimRecord{settled: true, until: until.UnixNano(), note: note}
	if _, err := rand.Read(rec.token[:]); err != nil {
		return fmt.Errorf("making claim token: %w", err)
	}
	return cl.db.update(ctx, func(txn *tx) error {
		t := now().UnixNano()
		if rec.until <= t {
			return errors.New("store: claim expiry is not in the future")
		}
		c, live, err := readClaimRecord(txn, claimKey(keys[0]), t, func([]byte) {}) // the note is not read
		if err != nil || (live && c.settled && c.until >= rec.until) {
			return err
		}
		return putClaim(txn, keys[0], rec)
	})
}

// held checks that every key of c is still c's (same token, live at t) and
// returns its record: the first key's, without its note, settled if any
// key's is. note, when set, is called with each note the claim's keys
// carry (once for a claim written with refs, once per key for one written
// before), and the bytes are valid during the call only.
func held(txn *tx, c Claim, t int64, note func([]byte)) (claimRecord, error) {
	var token [16]byte
	if n, err := hex.Decode(token[:], []byte(c.Token)); err != nil || n != 16 || len(c.Keys) == 0 {
		return claimRecord{}, ErrClaimLost
	}
	fn := note
	if fn == nil {
		fn = func([]byte) {}
	}
	var first claimRecord
	for i, k := range c.Keys {
		r, live, err := readClaimRecord(txn, claimKey(k), t, fn)
		if err != nil {
			return claimRecord{}, err
		}
		if !live || r.token != token || (r.ref && r.note != c.Keys[0]) {
			return claimRecord{}, ErrClaimLost
		}
		if i == 0 {
			first = r
		}
		first.settled = first.settled || r.settled
	}
	first.note = ""
	return first, nil
}

// Settle implements Claims.
func (cl claims) Settle(ctx context.Context, c Claim, note string, keepUntil time.Time) error {
	return cl.db.update(ctx, func(txn *tx) error {
		r, err := held(txn, c, now().UnixNano(), nil)
		if err != nil {
			return err
		}
		r.settled = true
		r.note = note
		if !keepUntil.IsZero() {
			r.until = max(r.until, keepUntil.UnixNano())
		}
		return putClaims(txn, c.Keys, r)
	})
}

// putClaims writes r under keys, its note under the first key alone and a
// ref to it under the others (claimRecord), each expiring with the claim
// (Badger drops it after claimExpiry).
func putClaims(txn *tx, keys []string, r claimRecord) error {
	if err := putClaim(txn, keys[0], r); err != nil {
		return err
	}
	ref := r
	ref.ref, ref.note = true, keys[0]
	for _, k := range keys[1:] {
		if err := putClaim(txn, k, ref); err != nil {
			return err
		}
	}
	return nil
}

// putClaim writes r under key k, expiring with the claim (Badger drops it
// after claimExpiry).
func putClaim(txn *tx, k string, r claimRecord) error {
	e := badger.NewEntry(claimKey(k), r.encode())
	e.ExpiresAt = claimExpiry(r.until)
	return txn.SetEntry(e)
}

// Release implements Claims.
func (cl claims) Release(ctx context.Context, c Claim) error {
	return cl.db.update(ctx, func(txn *tx) error {
		r, err := held(txn, c, now().UnixNano(), nil)
		if err != nil {
			return err
		}
		if r.settled {
			return ErrClaimSettled
		}
		for _, k := range c.Keys {
			if err := txn.Delete(claimKey(k)); err != nil {
				return err
			}
		}
		return nil
	})
}

// Lookup implements Claims.
func (cl claims) Lookup(ctx context.Context, key string) (ClaimState, error) {
	var st ClaimState
	err := cl.db.view(ctx, func(txn *tx) error {
		c, live, err := readClaim(txn, claimKey(key), now().UnixNano())
		if err != nil {
			return err
		}
		if !live {
			return ErrNotFound
		}
		st = c.state()
		return nil
	})
	return st, err
}

// HeldClaims is implemented by Claims stores that can keep a note with an
// unsettled claim, for settlements whose outcome is unknown: the gateway
// keeps the payment and the answer it held back there until the outcome is
// resolved (the claim is then settled or released). The note lives and
// lapses with its claim, so it is bounded in time by the claim's expiry;
// callers bound its size (MaxHoldNoteBytes).
type HeldClaims interface {
	// ClaimHeld is Claims.Claim with a note on the new claim, in the same
	// write: note is called once, with the claim about to be written (its
	// keys as stored, and its token), and its error is returned with
	// nothing claimed. It is how a payment's record is on disk before its
	// settlement is attempted, so that a gateway that dies mid-attempt
	// leaves what the next one needs to resolve it, at no write more than
	// the claim.
	//
	// span is the attempt span: how long the caller's request may still
	// work on the claim. A store several gateways share (Session "")
	// keeps when it ends by its own clock, and reports where it stands
	// in ClaimState.Attempt: one clock judges every gateway's span, as it
	// does every expiry, so a gateway whose clock runs ahead does not take
	// another's live claim for abandoned. A store with a Session ignores
	// it.
	ClaimHeld(ctx context.Context, keys []string, until time.Time, span time.Duration, note func(Claim) (string, error)) (Claim, error)
	// Session names this opening of the store when no other process can
	// use it at the same time (the embedded store: Badger locks its
	// folder), and is "" for a store several gateways share. A note
	// written in another session was left by a process that is gone: no
	// request is still working on its claim.
	Session() string
	// Hold writes note on c, which must still be c's and unsettled
	// (ErrClaimLost, ErrClaimSettled otherwise).
	Hold(ctx context.Context, c Claim, note string) error
	// Held calls fn with the first key and the state of every live,
	// unsettled claim that carries a note, until fn returns false.
	Held(ctx context.Context, fn func(key string, st ClaimState) bool) error
	// Swap marks c settled with note if its note is still old
	// (ErrNoteChanged otherwise, ErrClaimLost as Settle). It is how a held
	// record moves on (unknown to settled, settled to delivered): of the
	// requests, background passes or gateways moving the same record at
	// once, exactly one succeeds, so a step taken on the strength of the
	// old note (content released) is taken once. Settle, which overwrites
	// whatever note it finds, cannot promise that.
	Swap(ctx context.Context, c Claim, old, note string) error
}

// MaxHoldNoteBytes bounds one Hold note.
const MaxHoldNoteBytes = 4 << 20

// CheckHoldNote refuses a note over MaxHoldNoteBytes: the one check every
// HeldClaims implementation makes before it writes one.
func CheckHoldNote(note string) error {
	if len(note) > MaxHoldNoteBytes {
		return fmt.Errorf("store: hold note over %d bytes", MaxHoldNoteBytes)
	}
	return nil
}

// Session implements HeldClaims: the open database's, made at Open.
func (cl claims) Session() string { return cl.db.life.session }

// Hold implements HeldClaims.
func (cl claims) Hold(ctx context.Context, c Claim, note string) error {
	if err := CheckHoldNote(note); err != nil {
		return err
	}
	return cl.db.update(ctx, func(txn *tx) error {
		r, err := held(txn, c, now().UnixNano(), nil)
		if err != nil {
			return err
		}
		if r.settled {
			return ErrClaimSettled
		}
		r.note = note
		return putClaims(txn, c.Keys, r)
	})
}

// Swap implements HeldClaims.
func (cl claims) Swap(ctx context.Context, c Claim, old, note string) error {
	if err := CheckHoldNote(note); err != nil {
		return err
	}
	return cl.db.update(ctx, func(txn *tx) error {
		same := true
		r, err := held(txn, c, now().UnixNano(), func(n []byte) {
			same = same && string(n) == old // compared in place, not copied
		})
		if err != nil {
			return err
		}
		if !same {
			return ErrNoteChanged
		}
		r.settled, r.note = true, note
		return putClaims(txn, c.Keys, r)
	})
}

// Held implements HeldClaims. A claim is stored under each of its keys;
// each claim is reported once (by the first key met), told apart by its
// token.
func (cl claims) Held(ctx context.Context, fn func(key string, st ClaimState) bool) error {
	return cl.db.view(ctx, func(txn *tx) error {
		t := now().UnixNano()
		seen := map[[16]byte]bool{}
		opts := badger.DefaultIteratorOptions
		opts.Prefix = claimKey("")
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			var c claimRecord
			skip := true
			if err := it.Item().Value(func(b []byte) error {
				var err error
				if c, err = decodeClaim(b, false); err != nil {
					return err
				}
				// A ref's claim is met under its first key, which
				// carries the note; only a listed claim's is copied.
				skip = c.ref || c.settled || len(b) == claimHead || c.until <= t || seen[c.token]
				if !skip {
					c.note = string(b[claimHead:])
				}
				return nil
			}); err != nil {
				return err
			}
			if skip {
				continue
			}
			seen[c.token] = true
			if !fn(string(it.Item().Key()[len(opts.Prefix):]), c.state()) {
				return nil
			}
		}
		return nil
	})
}
