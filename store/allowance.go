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

// Allowance is a per-client daily counter of free calls that only counts
// calls that end well. A request first reserves a unit; when its answer is
// a success it commits the reservation, otherwise it releases it. Live
// reservations count against the limit, so concurrent requests can never
// be served more than the limit, and a reservation neither committed nor
// released (a crash) lapses after a TTL and gives its unit back.
//
// Every operation is atomic on the one client-day record. A Redis
// implementation keeps that record in one hash (committed count plus a
// pending id → expiry map) and runs each operation as one Lua script:
// drop lapsed pending ids, compare committed+pending with the limit, add,
// remove or move one id.
type Allowance interface {
	// Reserve takes one unit of client's allowance in pool for the UTC day
	// of day. When none is left it returns ErrExhausted (and a Reservation
	// whose Remaining is 0, for the caller's headers).
	Reserve(ctx context.Context, pool, client string, day time.Time, limit int) (Reservation, error)
	// Commit turns the reservation into a used unit. It returns
	// ErrNotReserved, counting nothing, when the reservation was already
	// committed, released or has lapsed.
	Commit(ctx context.Context, r Reservation) error
	// Release gives the unit back. ErrNotReserved as for Commit.
	Release(ctx context.Context, r Reservation) error
	// Remaining reports how many units client can still reserve today,
	// counting live reservations as taken.
	Remaining(ctx context.Context, pool, client string, day time.Time, limit int) (int, error)
}

// Reservation is one reserved unit, to be committed or released.
type Reservation struct {
	Pool   string
	Client string
	Day    string // UTC date, 2006-01-02
	ID     string // opaque, unique
	Limit  int
	// Remaining is what is left for the client today with this unit taken.
	Remaining int
	// Expires is when the unit lapses if neither committed nor released.
	Expires time.Time
}

var (
	// ErrExhausted reports that the day's allowance is used up (or fully
	// reserved by requests in flight).
	ErrExhausted = errors.New("store: allowance exhausted")
	// ErrNotReserved reports a commit or release of a reservation that is
	// no longer pending.
	ErrNotReserved = errors.New("store: reservation is not pending")
)

// allowanceState is the value of one client-day: the committed count and
// the pending reservations. Binary: committed uint32, then per pending
// reservation 16 id bytes and its expiry (Unix ns, int64), all big endian.
type allowanceState struct {
	committed int
	pending   []pendingUnit
}

type pendingUnit struct {
	id      [16]byte
	expires int64
}

const pendingSize = 16 + 8

func decodeAllowance(b []byte) (allowanceState, error) {
	var s allowanceState
	if len(b) < 4 || (len(b)-4)%pendingSize != 0 {
		return s, errors.New("store: corrupt allowance record")
	}
	s.committed = int(binary.BigEndian.Uint32(b))
	b = b[4:]
	s.pending = make([]pendingUnit, 0, len(b)/pendingSize+1)
	for ; len(b) > 0; b = b[pendingSize:] {
		var p pendingUnit
		copy(p.id[:], b)
		p.expires = int64(binary.BigEndian.Uint64(b[16:]))
		s.pending = append(s.pending, p)
	}
	return s, nil
}

func (s allowanceState) encode() []byte {
	b := make([]byte, 4, 4+len(s.pending)*pendingSize)
	binary.BigEndian.PutUint32(b, uint32(s.committed))
	for _, p := range s.pending {
		b = append(b, p.id[:]...)
		b = binary.BigEndian.AppendUint64(b, uint64(p.expires))
	}
	return b
}

// dropLapsed removes pending units whose TTL has passed at t.
func (s *allowanceState) dropLapsed(t int64) {
	live := s.pending[:0]
	for _, p := range s.pending {
		if p.expires > t {
			live = append(live, p)
		}
	}
	s.pending = live
}

func (s *allowanceState) remaining(limit int) int {
	return max(0, limit-s.committed-len(s.pending))
}

// take removes id from the pending units and reports whether it was there
// and still live at t.
func (s *allowanceState) take(id [16]byte, t int64) bool {
	for i, p := range s.pending {
		if p.id == id {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			return p.expires > t
		}
	}
	return false
}

func dayKey(day time.Time) (key, label string, end time.Time) {
	d := day.UTC()
	start := time.Date(d.Year(), d.Month(), d.Day(), 0, 0, 0, 0, time.UTC)
	return start.Format("20060102"), start.Format(time.DateOnly), start.AddDate(0, 0, 1)
}

// allowanceExpiry is when Badger may drop a client-day record: a day after
// the day ended, and never sooner than a day from now by the real clock
// (Badger's TTL reads the real clock, not the store's).
func allowanceExpiry(dayEnd time.Time) uint64 {
	return uint64(max(dayEnd.Add(24*time.Hour).Unix(), time.Now().Add(24*time.Hour).Unix()))
}

func readAllowance(txn *badger.Txn, key []byte) (allowanceState, error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return allowanceState{}, nil
	}
	if err != nil {
		return allowanceState{}, fmt.Errorf("reading allowance: %w", err)
	}
	var s allowanceState
	err = item.Value(func(b []byte) error {
		var err error
		s, err = decodeAllowance(b)
		return err
	})
	return s, err
}

func checkAllowanceKey(pool, client string) error {
	if len(pool) > maxComponent || len(client) > maxComponent {
		return errors.New("store: allowance pool or client too long")
	}
	return nil
}

// Allowance returns the embedded implementation of Allowance.
func (db *DB) Allowance() Allowance { return allowance{db} }

type allowance struct{ db *DB }

// Reserve implements Allowance.
func (a allowance) Reserve(ctx context.Context, pool, client string, day time.Time, limit int) (Reservation, error) {
	if err := checkAllowanceKey(pool, client); err != nil {
		return Reservation{}, err
	}
	dk, label, end := dayKey(day)
	key := allowanceKey(pool, client, dk)
	res := Reservation{Pool: pool, Client: client, Day: label, Limit: limit}
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return res, fmt.Errorf("making reservation id: %w", err)
	}
	res.ID = hex.EncodeToString(id[:])
	err := a.db.update(ctx, func(txn *badger.Txn) error {
		s, err := readAllowance(txn, key)
		if err != nil {
			return err
		}
		t := now()
		s.dropLapsed(t.UnixNano())
		if s.remaining(limit) == 0 {
			res.Remaining = 0
			return ErrExhausted
		}
		res.Expires = t.Add(a.db.opts.ReservationTTL)
		s.pending = append(s.pending, pendingUnit{id: id, expires: res.Expires.UnixNano()})
		res.Remaining = s.remaining(limit)
		e := badger.NewEntry(key, s.encode())
		e.ExpiresAt = allowanceExpiry(end)
		return txn.SetEntry(e)
	})
	return res, err
}

// Commit implements Allowance.
func (a allowance) Commit(ctx context.Context, r Reservation) error {
	return a.finish(ctx, r, true)
}

// Release implements Allowance.
func (a allowance) Release(ctx context.Context, r Reservation) error {
	return a.finish(ctx, r, false)
}

func (a allowance) finish(ctx context.Context, r Reservation, commit bool) error {
	var id [16]byte
	if n, err := hex.Decode(id[:], []byte(r.ID)); err != nil || n != 16 {
		return ErrNotReserved
	}
	if err := checkAllowanceKey(r.Pool, r.Client); err != nil {
		return err
	}
	day, err := time.Parse(time.DateOnly, r.Day)
	if err != nil {
		return ErrNotReserved
	}
	dk, _, end := dayKey(day)
	key := allowanceKey(r.Pool, r.Client, dk)
	return a.db.update(ctx, func(txn *badger.Txn) error {
		s, err := readAllowance(txn, key)
		if err != nil {
			return err
		}
		t := now().UnixNano()
		if !s.take(id, t) {
			// Nothing to change: a lapsed unit is dropped by the next
			// Reserve anyway.
			return ErrNotReserved
		}
		s.dropLapsed(t)
		if commit {
			s.committed++
		}
		e := badger.NewEntry(key, s.encode())
		e.ExpiresAt = allowanceExpiry(end)
		return txn.SetEntry(e)
	})
}

// Remaining implements Allowance.
func (a allowance) Remaining(ctx context.Context, pool, client string, day time.Time, limit int) (int, error) {
	if err := checkAllowanceKey(pool, client); err != nil {
		return 0, err
	}
	dk, _, _ := dayKey(day)
	key := allowanceKey(pool, client, dk)
	var rem int
	err := a.db.view(ctx, func(txn *badger.Txn) error {
		s, err := readAllowance(txn, key)
		if err != nil {
			return err
		}
		s.dropLapsed(now().UnixNano())
		rem = s.remaining(limit)
		return nil
	})
	return rem, err
}
