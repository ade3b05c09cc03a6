package store

import (
	"bytes"
	"encoding/json"
	"math"
	"strconv"
	"time"
)

// The history's values are JSON: a Verification under its record, agent and
// authenticated keys, and an agent's Counts. Every verification writes one
// record and rewrites one Counts, so they are written here by hand rather
// than through encoding/json's reflection, byte for byte as json.Marshal
// writes them (the tests hold them to it over every field), so that records
// written before and after read back the same way, with encoding/json or
// with older code. Anything the hand-written path is not sure to write as
// json.Marshal would (a string that needs escaping, a time outside RFC
// 3339's years) is left to json.Marshal.

// encodeRecord is json.Marshal(v), in one allocation.
func encodeRecord(v *Verification) ([]byte, error) {
	return appendRecord(make([]byte, 0, recordSize(v)), v)
}

// encodeCounts is json.Marshal(c), in one allocation.
func encodeCounts(c *Counts) ([]byte, error) {
	return appendCounts(make([]byte, 0, 160), c)
}

// appendRecord appends v as json.Marshal encodes it.
func appendRecord(b []byte, v *Verification) ([]byte, error) {
	if !plainJSON(v.ID, v.AgentID, v.TaskID, v.Result, v.OutputHash, v.SchemaHash, v.RulesHash,
		v.RequestHash, v.KeyVersion, v.Payment, v.Payer, v.Network, v.Wallet) || !plainTime(v.VerifiedAt) {
		return marshalAppend(b, v)
	}
	b = append(b, `{"id":"`...)
	b = append(b, v.ID...)
	b = append(b, `","verified_at":"`...)
	b = v.VerifiedAt.AppendFormat(b, time.RFC3339Nano)
	b = append(b, '"')
	b = appendOptional(b, `,"agent_id":"`, v.AgentID)
	b = appendMember(b, `,"task_id":"`, v.TaskID)
	b = appendMember(b, `,"result":"`, v.Result)
	b = appendMember(b, `,"output_hash":"`, v.OutputHash)
	b = appendMember(b, `,"schema_hash":"`, v.SchemaHash)
	b = appendMember(b, `,"rules_hash":"`, v.RulesHash)
	b = appendMember(b, `,"request_hash":"`, v.RequestHash)
	b = appendOptional(b, `,"key_version":"`, v.KeyVersion)
	b = appendMember(b, `,"payment":"`, v.Payment)
	b = appendOptional(b, `,"payer":"`, v.Payer)
	b = appendOptional(b, `,"network":"`, v.Network)
	b = appendOptional(b, `,"wallet":"`, v.Wallet)
	if v.Authenticated {
		b = append(b, `,"authenticated":true`...)
	}
	if v.Test {
		b = append(b, `,"test":true`...)
	}
	return append(b, '}'), nil
}

// recordSize is room enough for v's encoding, so that appendRecord
// allocates once: the members' names and fixed parts take about 250 bytes.
func recordSize(v *Verification) int {
	return 320 + len(v.ID) + len(v.AgentID) + len(v.TaskID) + len(v.OutputHash) + len(v.SchemaHash) +
		len(v.RulesHash) + len(v.RequestHash) + len(v.KeyVersion) + len(v.Payer) + len(v.Network) + len(v.Wallet)
}

// appendCounts appends c as json.Marshal encodes it.
func appendCounts(b []byte, c *Counts) ([]byte, error) {
	if !plainTime(c.First) || !plainTime(c.Last) {
		return marshalAppend(b, c)
	}
	b = append(b, `{"pass":`...)
	b = strconv.AppendInt(b, c.Pass, 10)
	b = append(b, `,"fail":`...)
	b = strconv.AppendInt(b, c.Fail, 10)
	b = appendCount(b, `,"authenticated_pass":`, c.AuthenticatedPass)
	b = appendCount(b, `,"authenticated_fail":`, c.AuthenticatedFail)
	b = appendCount(b, `,"paid":`, c.Paid)
	if !c.First.IsZero() {
		b = append(b, `,"first":"`...)
		b = append(c.First.AppendFormat(b, time.RFC3339Nano), '"')
	}
	if !c.Last.IsZero() {
		b = append(b, `,"last":"`...)
		b = append(c.Last.AppendFormat(b, time.RFC3339Nano), '"')
	}
	return append(b, '}'), nil
}

// decodeCounts reads a Counts value. The form appendCounts writes (every
// Counts this store ever wrote) is read directly; anything else goes to
// encoding/json, which then decides, so the result is always what
// json.Unmarshal gives.
func decodeCounts(b []byte) (Counts, error) {
	if c, ok := parseCounts(b); ok {
		return c, nil
	}
	var c Counts
	err := json.Unmarshal(b, &c)
	return c, err
}

// parseCounts reads exactly appendCounts's form: the members in its order,
// integers without signs or leading zeros, times as it formats them. It
// reports false for anything else.
func parseCounts(b []byte) (Counts, bool) {
	var c Counts
	p := countsParser{b: b}
	ok := p.lit(`{"pass":`) && p.int(&c.Pass) && p.lit(`,"fail":`) && p.int(&c.Fail) &&
		(!p.opt(`,"authenticated_pass":`) || p.int(&c.AuthenticatedPass)) &&
		(!p.opt(`,"authenticated_fail":`) || p.int(&c.AuthenticatedFail)) &&
		(!p.opt(`,"paid":`) || p.int(&c.Paid)) &&
		(!p.opt(`,"first":"`) || p.time(&c.First)) &&
		(!p.opt(`,"last":"`) || p.time(&c.Last)) &&
		p.lit(`}`) && len(p.b) == 0
	return c, ok
}

type countsParser struct{ b []byte }

func (p *countsParser) lit(s string) bool {
	if len(p.b) < len(s) || string(p.b[:len(s)]) != s {
		return false
	}
	p.b = p.b[len(s):]
	return true
}

// opt consumes s if the input goes on with it.
func (p *countsParser) opt(s string) bool { return p.lit(s) }

func (p *countsParser) int(dst *int64) bool {
	n := 0
	var v int64
	for ; n < len(p.b) && '0' <= p.b[n] && p.b[n] <= '9'; n++ {
		d := int64(p.b[n] - '0')
		if v > (math.MaxInt64-d)/10 {
			return false
		}
		v = v*10 + d
	}
	if n == 0 || (n > 1 && p.b[0] == '0') {
		return false
	}
	*dst, p.b = v, p.b[n:]
	return true
}

// time reads an RFC 3339 time and its closing quote. A time that does not
// format back to the same text is left to encoding/json.
func (p *countsParser) time(dst *time.Time) bool {
	end := 0
	for end < len(p.b) && p.b[end] != '"' {
		end++
	}
	if end == len(p.b) {
		return false
	}
	s := p.b[:end]
	t, err := time.Parse(time.RFC3339Nano, string(s))
	var again [len(time.RFC3339Nano)]byte
	if err != nil || !plainTime(t) || !bytes.Equal(t.AppendFormat(again[:0], time.RFC3339Nano), s) {
		return false
	}
	*dst, p.b = t, p.b[end+1:]
	return true
}

func appendMember(b []byte, key, s string) []byte {
	b = append(b, key...)
	b = append(b, s...)
	return append(b, '"')
}

// appendOptional is appendMember for an omitempty member.
func appendOptional(b []byte, key, s string) []byte {
	if s == "" {
		return b
	}
	return appendMember(b, key, s)
}

func appendCount(b []byte, key string, n int64) []byte {
	if n == 0 {
		return b
	}
	b = append(b, key...)
	return strconv.AppendInt(b, n, 10)
}

func marshalAppend(b []byte, v any) ([]byte, error) {
	j, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, j...), nil
}

// plainJSON reports whether every string is printable ASCII that
// encoding/json writes as it stands: nothing it escapes (quote,
// backslash, control characters, and <, > and & under its HTML escaping),
// nothing beyond ASCII (whose invalid bytes and U+2028/U+2029 it rewrites).
func plainJSON(ss ...string) bool {
	for _, s := range ss {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return false
			}
		}
	}
	return true
}

// plainTime reports whether t is a UTC instant with a four-digit year, the
// times Time.MarshalJSON writes exactly as AppendFormat(RFC3339Nano) does
// (others it may refuse, or write with an offset).
func plainTime(t time.Time) bool {
	return t.Location() == time.UTC && t.Year() >= 0 && t.Year() <= 9999
}
