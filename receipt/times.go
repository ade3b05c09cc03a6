package receipt

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// statedTimes are the members in which a response states times of its
// own, as checkTimes holds them to the signing instant: verified_at,
// computed_at, and of inputs.window (read only where inputs and window
// are objects) to, from, oldest_evidence_at and newest_evidence_at. Verify
// reads them from the receipt it decoded (timesOf); a signer from the
// canonical response it is about to sign (canonicalTimes), without
// decoding the rest.
type statedTimes struct {
	verifiedAt, computedAt         stated
	windowTo, from, oldest, newest stated
}

// stated is one member's value as checkTimes needs it.
type stated struct {
	kind statedKind
	s    string // the string, when kind is statedString
}

type statedKind uint8

const (
	statedAbsent statedKind = iota
	statedNull
	statedString
	statedOther // a number, boolean, object or array
)

func (v stated) present() bool { return v.kind != statedAbsent }

// timesOf reads the stated times of a decoded response.
func timesOf(doc map[string]any) statedTimes {
	inputs, _ := doc["inputs"].(map[string]any)
	window, _ := inputs["window"].(map[string]any)
	return statedTimes{
		verifiedAt: statedIn(doc, "verified_at"),
		computedAt: statedIn(doc, "computed_at"),
		windowTo:   statedIn(window, "to"),
		from:       statedIn(window, "from"),
		oldest:     statedIn(window, "oldest_evidence_at"),
		newest:     statedIn(window, "newest_evidence_at"),
	}
}

func statedIn(m map[string]any, name string) stated {
	v, present := m[name]
	switch v := v.(type) {
	case nil:
		if !present {
			return stated{}
		}
		return stated{kind: statedNull}
	case string:
		return stated{kind: statedString, s: v}
	default:
		return stated{kind: statedOther}
	}
}

// canonicalTimes reads the stated times of a response in RFC 8785 form by
// walking its members, and inputs' and window's, and reading the value of
// the six it needs: a signer checks them on every signature, and decoding
// the whole response for six members cost more than the rest of a
// signature. In canonical form a member name is written one way, escapes
// only for '"', '\\' and control characters, so "computed_at" is the
// member Verify decodes as computed_at and no other. A response that is
// not a canonical object is refused.
func canonicalTimes(canon []byte) (statedTimes, error) {
	var t statedTimes
	bad := false
	read := func(v []byte) stated {
		s, ok := canonicalStated(v)
		bad = bad || !ok
		return s
	}
	top, ok := canonicalMembers(canon)
	if !ok {
		return t, errNotCanonicalObject
	}
	for top.next() {
		switch string(top.name) {
		case "verified_at":
			t.verifiedAt = read(top.value)
		case "computed_at":
			t.computedAt = read(top.value)
		case "inputs":
			inputs, ok := canonicalMembers(top.value)
			for ok && inputs.next() {
				if string(inputs.name) != "window" {
					continue
				}
				window, ok := canonicalMembers(inputs.value)
				for ok && window.next() {
					switch string(window.name) {
					case "to":
						t.windowTo = read(window.value)
					case "from":
						t.from = read(window.value)
					case "oldest_evidence_at":
						t.oldest = read(window.value)
					case "newest_evidence_at":
						t.newest = read(window.value)
					}
				}
				if window.bad {
					return t, errNotCanonicalObject
				}
			}
			if inputs.bad {
				return t, errNotCanonicalObject
			}
		}
	}
	if top.bad || bad {
		return t, errNotCanonicalObject
	}
	return t, nil
}

var errNotCanonicalObject = errors.New("is not a JSON object in RFC 8785 form")

// canonicalStated reads a canonical JSON value as checkTimes needs it. A
// canonical string escapes only with \", \\, \b, \t, \n, \f, \r and
// \u00xx, which Go's string syntax reads the same way; ok is false for a
// string with any other escape.
func canonicalStated(v []byte) (_ stated, ok bool) {
	switch {
	case string(v) == "null":
		return stated{kind: statedNull}, true
	case v[0] == '"':
		if bytes.IndexByte(v, '\\') < 0 {
			return stated{kind: statedString, s: string(v[1 : len(v)-1])}, true
		}
		if !canonicalEscapes(v[1 : len(v)-1]) {
			return stated{}, false
		}
		s, err := strconv.Unquote(string(v))
		return stated{kind: statedString, s: s}, err == nil
	default:
		return stated{kind: statedOther}, true
	}
}

// canonicalEscapes reports whether every escape in the string content b is
// one RFC 8785 writes.
func canonicalEscapes(b []byte) bool {
	hex := func(c byte) bool { return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' }
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			continue
		}
		if i+1 == len(b) {
			return false
		}
		switch b[i+1] {
		case '"', '\\', 'b', 't', 'n', 'f', 'r':
			i++
		case 'u':
			if i+5 >= len(b) || b[i+2] != '0' || b[i+3] != '0' || !hex(b[i+4]) || !hex(b[i+5]) {
				return false
			}
			i += 5
		default:
			return false
		}
	}
	return true
}

// memberWalk steps through the members of a JSON object in canonical
// form (no whitespace), a member at a time: name is the member's name as
// written, between its quotes, and value its value's bytes. bad reports
// bytes that are not such an object; the walk then stops.
type memberWalk struct {
	b           []byte
	pos         int
	name, value []byte
	bad         bool
}

// canonicalMembers starts a walk of the object v; ok is false when v is not
// an object (a member whose value is a string, number or array).
func canonicalMembers(v []byte) (w memberWalk, ok bool) {
	if len(v) < 2 || v[0] != '{' || v[len(v)-1] != '}' {
		return memberWalk{}, false
	}
	return memberWalk{b: v, pos: 1}, true
}

// next moves to the next member, reporting whether there is one.
func (w *memberWalk) next() bool {
	b := w.b
	if w.bad || w.pos >= len(b)-1 {
		return false
	}
	if w.pos > 1 {
		if b[w.pos] != ',' {
			w.bad = true
			return false
		}
		w.pos++
	}
	if b[w.pos] != '"' {
		w.bad = true
		return false
	}
	end := stringEnd(b, w.pos)
	if end >= len(b)-1 || b[end+1] != ':' {
		w.bad = true
		return false
	}
	w.name = b[w.pos+1 : end]
	start := end + 2
	n := valueLen(b[start : len(b)-1])
	if n <= 0 {
		w.bad = true
		return false
	}
	w.value = b[start : start+n]
	w.pos = start + n
	return true
}

// valueLen returns the length of the canonical JSON value at the start of
// b, or -1 when it does not end within b.
func valueLen(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	switch b[0] {
	case '"':
		if end := stringEnd(b, 0); end < len(b) {
			return end + 1
		}
		return -1
	case '{', '[':
		return objectEnd(b)
	}
	for i, c := range b {
		if c == ',' || c == '}' || c == ']' {
			return i
		}
	}
	return len(b)
}

// checkTimes holds the times a response states about itself to ts, the
// attestation's timestamp (the instant at): verified_at, computed_at and
// inputs.window.to, wherever they appear, whatever the context, are that
// instant, and a score's evidence dates (inputs.window.from,
// oldest_evidence_at, newest_evidence_at) are not more than slack after
// it. Verify allows MaxSigningSkew: before the score left out verifications
// dated after computed_at, verifierd wrote a verification recorded while
// the score was computed as its newest_evidence_at, a moment after
// computed_at, and those receipts are genuine; a signer's clock is trusted
// no closer than that anyway (the key's service life is widened by it).
// Signers pass 0: what they sign now has no such evidence. The times are
// signed, but chosen by whoever holds the key, and the context is too: a
// check made only under ContextScore let a leaked retired key sign a score
// under ContextVerify (an output_hash member makes that the inferred
// context) and skip it. Under ContextScore computed_at must be there: it
// is the time a score is of.
func checkTimes(t statedTimes, context, ts string, at time.Time, slack time.Duration) error {
	if t.verifiedAt.present() {
		if err := sameInstant(ts, at, "verified_at", t.verifiedAt); err != nil {
			return err
		}
	}
	if !t.computedAt.present() && context == ContextScore {
		return errors.New("receipt has no computed_at, which every trust score carries")
	}
	if t.computedAt.present() {
		if err := sameInstant(ts, at, "computed_at", t.computedAt); err != nil {
			return err
		}
	}
	// inputs.window.to ends the window a score's evidence was read from,
	// which verifierd always writes as computed_at: a reader may take
	// either as the time the score is of.
	if t.windowTo.present() {
		if err := sameInstant(ts, at, "inputs.window.to", t.windowTo); err != nil {
			return err
		}
	}
	for _, e := range []struct {
		name string
		v    stated
	}{{"inputs.window.from", t.from}, {"inputs.window.oldest_evidence_at", t.oldest}, {"inputs.window.newest_evidence_at", t.newest}} {
		if err := notAfter(ts, at, slack, e.name, e.v); err != nil {
			return err
		}
	}
	return nil
}

// notAfter checks that the evidence date name of a score (where its window
// starts, its oldest and newest evidence), whose value is v, is null or
// absent (no evidence) or a time at or before at, the attestation's
// timestamp ts, which computed_at and inputs.window.to name, plus slack. A
// leaked retired key that dates a score inside its service life could
// otherwise claim evidence from after its retirement.
func notAfter(ts string, at time.Time, slack time.Duration, name string, v stated) error {
	if v.kind == statedAbsent || v.kind == statedNull {
		return nil
	}
	t, err := ParseTime(v.s)
	if err != nil {
		return fmt.Errorf("%s %s is not an RFC 3339 time", name, quoteShort(v.s))
	}
	if t.After(at.Add(slack)) {
		if slack > 0 {
			return fmt.Errorf("%s %s is more than %s after attestation.timestamp %s", name, quoteShort(v.s), slack, quoteShort(ts))
		}
		return fmt.Errorf("%s %s is after attestation.timestamp %s", name, quoteShort(v.s), quoteShort(ts))
	}
	return nil
}

// sameInstant checks that the member name of a receipt (verified_at,
// computed_at), whose value is v, is a string naming instant at, the
// attestation's timestamp ts. Both are signed but chosen by whoever holds the
// key, so without this a leaked retired key could sign a receipt dated
// within its service life whose own time says today.
func sameInstant(ts string, at time.Time, name string, v stated) error {
	if v.kind == statedString {
		if v.s == ts {
			return nil
		}
		if t, err := ParseTime(v.s); err == nil && t.Equal(at) {
			return nil
		}
	}
	return fmt.Errorf("attestation.timestamp %s is not the instant of %s %s", quoteShort(ts), name, quoteShort(v.s))
}
