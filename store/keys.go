package store

import (
	"encoding/binary"
	"math"
	"time"
)

// Key layout (layout version 4). Every key starts with a one-byte family
// tag. Variable-length components that are not last are length-prefixed
// (two bytes, big endian) so no value of one component can impersonate
// another: an agent id may contain any character, NUL included.
//
//	0x00 "layout"                          → layout version byte
//	'r' id                                 → Verification (record.go), by verification id
//	't' inv(at) id                         → empty; all verifications, newest first
//	'a' len agent inv(at) id               → Verification (record.go); one agent's, newest first
//	'n' len agent                          → Counts (record.go), exact totals per agent
//	'q' len pool len client day            → allowance state of one client-day (binary, see allowance.go)
//	'c' claimKey                           → claim (binary, see claims.go)
//	'o' len agent                          → owner address of a bound agent id (see owners.go)
//	'u' len agent inv(at) id               → Verification (record.go); one agent's authenticated, newest first (see ownerindex.go)
//	'p' id                                 → payment identifier binding (binary, see idempotency.go)
//	'd' 'm'|'b'|'t' …                      → the facilitator's discovery list (see discovery.go)
//
// inv(at) is math.MaxUint64 minus the verification's Unix time in
// nanoseconds, big endian: Badger iterates keys in ascending byte order, so
// the newest verification comes first without a reverse iterator. day is
// the UTC date as eight ASCII digits (20261129).
//
// The verification record is written twice (by id and under its agent) so
// that a history page is one range read, and a third time when it is
// authenticated (so a score of an owned agent reads only those); all copies
// and the counts change in one transaction.
//
// Version 2 added the 'u' family; a version 1 database gets it built from
// its 'a' records when it is opened (migrateLayout). Version 3 added the
// binary form of a record beside JSON (record.go); the records a version 2
// database holds are read as they are. Version 4 added claim refs (a
// claim's note under its first key alone, claims.go); the claims a version
// 3 database holds, a note under every key, are read as they are. Each bump
// makes an older build refuse the database instead of misreading it.
const (
	tagRecord        = 'r'
	tagTime          = 't'
	tagAgent         = 'a'
	tagCounts        = 'n'
	tagAllowance     = 'q'
	tagClaim         = 'c'
	tagOwner         = 'o' // the owner's address: the bytes the gateway reported, EIP-55 for EVM wallets
	tagAuthenticated = 'u'
	tagPaymentID     = 'p'
	tagDiscovery     = 'd'

	layoutVersion = 4
)

var keyLayoutVersion = []byte("\x00layout")

// maxComponent is the longest variable key component; the two-byte length
// prefix cannot say more, and Badger keys are better kept short anyway.
const maxComponent = math.MaxUint16

func appendComponent(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(s)))
	return append(dst, s...)
}

func invTime(t time.Time) uint64 {
	return math.MaxUint64 - uint64(t.UnixNano())
}

func recordKey(id string) []byte {
	return append([]byte{tagRecord}, id...)
}

func timeKey(at time.Time, id string) []byte {
	k := make([]byte, 0, 1+8+len(id))
	k = append(k, tagTime)
	k = binary.BigEndian.AppendUint64(k, invTime(at))
	return append(k, id...)
}

func agentPrefix(agent string) []byte {
	k := make([]byte, 0, 3+len(agent)+8+36)
	k = append(k, tagAgent)
	return appendComponent(k, agent)
}

func agentKey(agent string, at time.Time, id string) []byte {
	k := agentPrefix(agent)
	k = binary.BigEndian.AppendUint64(k, invTime(at))
	return append(k, id...)
}

func countsKey(agent string) []byte {
	k := make([]byte, 0, 3+len(agent))
	k = append(k, tagCounts)
	return appendComponent(k, agent)
}

func allowanceKey(pool, client, day string) []byte {
	k := make([]byte, 0, 5+len(pool)+len(client)+len(day))
	k = append(k, tagAllowance)
	k = appendComponent(k, pool)
	k = appendComponent(k, client)
	return append(k, day...)
}

func claimKey(key string) []byte {
	return append([]byte{tagClaim}, key...)
}
