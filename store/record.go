package store

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"
)

// The history's values, a record (a Verification under its record, agent
// and authenticated keys) and an agent's Counts, are each stored in one of
// two forms, told apart by the first byte:
//
//   - recordBinary (countsBinary): the form this build writes. Every
//     verification writes its record twice and rewrites its agent's counts,
//     and on a small machine the bytes written are what they cost: the
//     memtable arena and Badger's log take fresh pages, and flushes and
//     compactions copy them again. Measured in process, a record 280 bytes
//     shorter made a whole verification request ≈ 15 % cheaper. The binary
//     record is less than half the JSON one: the four hashes and a UUID id
//     are stored as their bytes, not their hex, and no member names.
//   - '{': JSON, as json.Marshal writes the value. Earlier builds wrote
//     every value so, and this one writes the rare value the binary form
//     does not carry (a time that is not UTC).
//
// A binary record, after its tag byte: a flags byte (flagAuthenticated,
// flagTest), VerifiedAt (a time: a varint of Unix seconds and a uvarint of
// nanoseconds), then the thirteen strings in stringFields's order, each as
// a uvarint header h and its bytes: an even h is a string of h/2 bytes
// stored as they are; h = hexString is 64 lowercase hex digits stored as
// their 32 bytes; h = uuidString is a lowercase 8-4-4-4-12 UUID stored as
// its 16 bytes. Binary counts, after their tag byte: Pass, Fail,
// AuthenticatedPass, AuthenticatedFail and Paid as varints, then First and
// Last as times. Nothing may follow either.
const (
	recordBinary = 0x01
	countsBinary = 0x01

	flagAuthenticated = 1 << 0
	flagTest          = 1 << 1

	hexString  = 1
	uuidString = 3
)

// stringFields lists v's string fields in the binary form's order. A
// field added to Verification must be added here (the tests fill every
// field by reflection and fail on one that does not come back).
func stringFields(v *Verification) [13]*string {
	return [13]*string{&v.ID, &v.AgentID, &v.TaskID, &v.Result, &v.OutputHash, &v.SchemaHash,
		&v.RulesHash, &v.RequestHash, &v.KeyVersion, &v.Payment, &v.Payer, &v.Network, &v.Wallet}
}

var (
	errBadRecord = errors.New("malformed binary record")
	errBadCounts = errors.New("malformed binary counts")
)

// encodeRecord is v's stored form: binary when its time is UTC (every
// record the store writes: RecordVerification makes it so), JSON
// otherwise, so that nothing a record holds is lost either way.
func encodeRecord(v *Verification) ([]byte, error) {
	if v.VerifiedAt.Location() != time.UTC {
		return json.Marshal(v)
	}
	fields := stringFields(v)
	n := 1 + 1 + 2*binary.MaxVarintLen64
	for _, s := range fields {
		n += binary.MaxVarintLen64 + len(*s)
	}
	b := make([]byte, 0, n)
	var flags byte
	if v.Authenticated {
		flags |= flagAuthenticated
	}
	if v.Test {
		flags |= flagTest
	}
	b = appendTime(append(b, recordBinary, flags), v.VerifiedAt)
	for _, s := range fields {
		b = appendRecordString(b, *s)
	}
	return b, nil
}

func appendRecordString(b []byte, s string) []byte {
	switch {
	case len(s) == 64 && lowerHex(s):
		return appendHexBytes(append(b, hexString), s)
	case isUUID(s):
		b = append(b, uuidString)
		for _, part := range [...]string{s[0:8], s[9:13], s[14:18], s[19:23], s[24:36]} {
			b = appendHexBytes(b, part)
		}
		return b
	}
	b = binary.AppendUvarint(b, uint64(len(s))<<1)
	return append(b, s...)
}

// appendHexBytes appends the bytes whose lowercase hex s is (lowerHex,
// of even length). It reads the string in place: hex.AppendDecode would
// need s as a []byte, a heap copy for each 64-digit hash on every write.
func appendHexBytes(b []byte, s string) []byte {
	for i := 0; i < len(s); i += 2 {
		b = append(b, nibble(s[i])<<4|nibble(s[i+1]))
	}
	return b
}

func nibble(c byte) byte {
	if c <= '9' {
		return c - '0'
	}
	return c - 'a' + 10
}

// lowerHex reports whether s is lowercase hex digits only (what
// hex.AppendEncode gives back).
func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// isUUID reports whether s is a UUID in lowercase 8-4-4-4-12 form.
func isUUID(s string) bool {
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return false
	}
	return lowerHex(s[0:8]) && lowerHex(s[9:13]) && lowerHex(s[14:18]) && lowerHex(s[19:23]) && lowerHex(s[24:36])
}

// decodeRecord reads a stored record, in either form, into v.
func decodeRecord(b []byte, v *Verification) error {
	*v = Verification{}
	if len(b) == 0 || b[0] != recordBinary {
		return json.Unmarshal(b, v)
	}
	if len(b) < 2 || b[1]&^(flagAuthenticated|flagTest) != 0 {
		return errBadRecord
	}
	v.Authenticated, v.Test = b[1]&flagAuthenticated != 0, b[1]&flagTest != 0
	var ok bool
	if v.VerifiedAt, b, ok = readTime(b[2:]); !ok {
		return errBadRecord
	}
	// The strings are decoded into one buffer and made one string, sliced
	// per field: a page of records costs one allocation per record here.
	var (
		scratch [512]byte
		text    = scratch[:0]
		ends    [13]int
	)
	for i := range ends {
		h, n := binary.Uvarint(b)
		if n <= 0 {
			return errBadRecord
		}
		b = b[n:]
		switch {
		case h == hexString:
			if len(b) < 32 {
				return errBadRecord
			}
			text, b = hex.AppendEncode(text, b[:32]), b[32:]
		case h == uuidString:
			if len(b) < 16 {
				return errBadRecord
			}
			for _, part := range [...][2]int{{0, 4}, {4, 6}, {6, 8}, {8, 10}, {10, 16}} {
				if part[0] > 0 {
					text = append(text, '-')
				}
				text = hex.AppendEncode(text, b[part[0]:part[1]])
			}
			b = b[16:]
		case h&1 == 0 && h/2 <= uint64(len(b)):
			text, b = append(text, b[:h/2]...), b[h/2:]
		default:
			return errBadRecord
		}
		ends[i] = len(text)
	}
	if len(b) != 0 {
		return errBadRecord
	}
	all, start := string(text), 0
	for i, s := range stringFields(v) {
		*s, start = all[start:ends[i]], ends[i]
	}
	return nil
}

// encodeCounts is c's stored form: binary when its times are UTC (as every
// record's is), JSON otherwise.
func encodeCounts(c *Counts) ([]byte, error) {
	if c.First.Location() != time.UTC || c.Last.Location() != time.UTC {
		return json.Marshal(c)
	}
	b := make([]byte, 0, 1+9*binary.MaxVarintLen64)
	b = append(b, countsBinary)
	for _, n := range [...]int64{c.Pass, c.Fail, c.AuthenticatedPass, c.AuthenticatedFail, c.Paid} {
		b = binary.AppendVarint(b, n)
	}
	return appendTime(appendTime(b, c.First), c.Last), nil
}

// decodeCounts reads stored counts, in either form.
func decodeCounts(b []byte) (Counts, error) {
	var c Counts
	if len(b) == 0 || b[0] != countsBinary {
		err := json.Unmarshal(b, &c)
		return c, err
	}
	b = b[1:]
	for _, n := range [...]*int64{&c.Pass, &c.Fail, &c.AuthenticatedPass, &c.AuthenticatedFail, &c.Paid} {
		v, size := binary.Varint(b)
		if size <= 0 {
			return Counts{}, errBadCounts
		}
		*n, b = v, b[size:]
	}
	var ok bool
	if c.First, b, ok = readTime(b); !ok {
		return Counts{}, errBadCounts
	}
	if c.Last, b, ok = readTime(b); !ok || len(b) != 0 {
		return Counts{}, errBadCounts
	}
	return c, nil
}

// appendTime appends a UTC time as a varint of its Unix seconds and a
// uvarint of its nanoseconds: every time.Time in UTC, the zero one
// included, comes back from readTime as it was.
func appendTime(b []byte, t time.Time) []byte {
	b = binary.AppendVarint(b, t.Unix())
	return binary.AppendUvarint(b, uint64(t.Nanosecond()))
}

func readTime(b []byte) (t time.Time, rest []byte, ok bool) {
	sec, n := binary.Varint(b)
	if n <= 0 {
		return t, b, false
	}
	nsec, m := binary.Uvarint(b[n:])
	if m <= 0 || nsec >= 1e9 {
		return t, b, false
	}
	return time.Unix(sec, int64(nsec)).UTC(), b[n+m:], true
}
