// Package receipt owns everything a signed receipt is made of: the RFC 8785
// (JCS) canonical form of JSON, the SHA-256 hashes over it, the five-key
// signed document, Ed25519 signing and verification, the public keys an agent
// card publishes, and the checks that decide whether a receipt holds.
//
// It is shared by the service that signs (certd), the service that builds
// results (verifierd), the gateway's seller mode and the aov command-line
// tool, so that all of them canonicalize, hash and verify with the same code.
//
// It is not for: validating verification requests (package verify), holding
// private keys on disk (certd's keystore) or fetching agent cards over the
// network (the caller decides where a card comes from and whether to trust it).
package receipt

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
	"unsafe"

	"github.com/aovhq/aov/strictjson"
)

// Names of the signed contexts and algorithms. They are part of every signed
// document and of the agent card, so they never change: a receipt signed
// today must verify against these exact strings years from now.
const (
	// ContextVerify is the context of /verify/schema, /verify/deliverable and
	// the MCP verify_schema tool.
	ContextVerify = "json-schema-verifier/verify-schema-attestation/v1"
	// ContextScore is the context of /score/{agent_id} and the MCP
	// get_verification_record tool.
	ContextScore = "json-schema-verifier/trust-score-attestation/v1"
	// Algorithm is the only signature algorithm receipts use.
	Algorithm = "Ed25519"
	// Canonicalization names RFC 8785 in the response's verify block.
	Canonicalization = "RFC 8785 (JCS)"
	// HashAlgorithm names the hash in the response's verify block.
	HashAlgorithm = "SHA-256"
	// ExtensionURI identifies the attestation extension in the agent card.
	ExtensionURI = "urn:json-schema-verifier:extension:attestation:v1"
	// ExtensionURIPrefix is what a verifier matches, so that a later version
	// of the extension (…:v2) is still found by today's verifiers.
	ExtensionURIPrefix = "urn:json-schema-verifier:extension:attestation:"
)

// maxSafeInteger is 2^53: every integer of at most this magnitude is exact in
// an IEEE-754 double, which is what RFC 8785 numbers are.
const maxSafeInteger = 1 << 53

// Canonicalize returns the RFC 8785 form of raw JSON. It rejects what RFC 8785
// cannot canonicalize unambiguously: duplicate keys, invalid UTF-8, lone
// surrogates, numbers outside the double range (nonzero numbers that read
// as 0 included), numbers longer than strictjson.MaxNumberLen, trailing
// data.
//
// It is the project's one canonicalizer: a single pass that writes the
// canonical bytes as it reads (see canonReader), agreeing byte for byte with
// the reference implementation github.com/gowebpki/jcs on every RFC 8785
// vector and under differential fuzzing (the reference is used by the tests
// only), except that the reference, reading numbers with strconv alone,
// accepts the numbers strictjson.Float64 refuses.
func Canonicalize(raw []byte) ([]byte, error) {
	out, err := AppendCanonicalJSON(make([]byte, 0, len(raw)), raw)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// AppendCanonicalJSON appends the RFC 8785 form of raw JSON to dst, refusing
// what Canonicalize refuses; on error dst is returned unchanged.
func AppendCanonicalJSON(dst, raw []byte) ([]byte, error) {
	n := len(dst)
	r := readerPool.Get().(*canonReader)
	defer r.release()
	// The reader works on a string so that keys are substrings without
	// copies. raw is not modified during the call and no substring
	// outlives it (release clears them), so the bytes are viewed in place.
	r.s = unsafe.String(unsafe.SliceData(raw), len(raw))
	r.skipSpace()
	if r.pos >= len(r.s) {
		return dst, errors.New("canonicalizing JSON: no JSON value")
	}
	out, err := r.value(dst)
	if err == nil {
		if r.skipSpace(); r.pos < len(r.s) {
			err = errors.New("canonicalizing JSON: data after the JSON value")
		}
	}
	if err == nil && len(r.pending) > 0 {
		out, err = r.order(out)
	}
	if err != nil {
		return dst[:n], err
	}
	return out, nil
}

// readerPool recycles readers with their member stacks and scratch space.
var readerPool = sync.Pool{New: func() any { return new(canonReader) }}

// maxPooledScratch keeps one huge document from pinning huge buffers.
const maxPooledScratch = 64 << 10

func (r *canonReader) release() {
	clear(r.members[:cap(r.members)])
	clear(r.ordered[:cap(r.ordered)])
	members, ordered, pending, scratch := r.members[:0], r.ordered[:0], r.pending[:0], r.scratch[:0]
	*r = canonReader{}
	if cap(members) <= maxPooledKeys && cap(ordered) <= maxPooledKeys && cap(pending) <= maxPooledKeys && cap(scratch) <= maxPooledScratch {
		r.members, r.ordered, r.pending, r.scratch = members, ordered, pending, scratch
		readerPool.Put(r)
	}
}

// outPool holds the buffers IsCanonical writes its comparison copy into.
var outPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

// IsCanonical reports whether raw is exactly the RFC 8785 form of itself:
// parsed once, written canonically, compared. A signer uses it to sign the
// bytes it was sent without trusting the sender to have canonicalized them.
func IsCanonical(raw []byte) bool {
	bp := outPool.Get().(*[]byte)
	c, err := AppendCanonicalJSON((*bp)[:0], raw)
	ok := err == nil && string(c) == string(raw)
	if cap(c) <= maxPooledScratch {
		*bp = c[:0]
		outPool.Put(bp)
	}
	return ok
}

// Hash returns the lowercase hex SHA-256 of canonical bytes: the form of every
// hash in a receipt (output_hash, schema_hash, rules_hash, request_hash).
func Hash(canonical []byte) string {
	sum := sha256.Sum256(canonical)
	return hex.EncodeToString(sum[:])
}

// Hashes are the four hashes a verification result carries. Request is empty
// in compact results, which do not carry request_hash.
type Hashes struct {
	Output  string `json:"output_hash"`
	Schema  string `json:"schema_hash"`
	Rules   string `json:"rules_hash"`
	Request string `json:"request_hash,omitempty"`
}

// AppendCanonical appends the RFC 8785 bytes of a decoded JSON value to dst.
// It accepts the trees decoders produce — map[string]any, []any, string,
// json.Number, float64, bool, nil — plus int, int64, json.RawMessage,
// []string, map[string]string and *string (nil is null), so that callers can
// hash a tree they built without a round trip through encoding/json.
//
// It agrees byte for byte with Canonicalize on the decoded form of the same
// document (tested on every RFC 8785 vector and by fuzzing), and it is the
// fast path: no reflection, keys sorted in a pooled slice.
//
// It refuses what cannot be canonicalized unambiguously: strings that are not
// valid UTF-8, NaN and infinities, json.Number text that is not a JSON number
// or that strictjson.Float64 refuses (it overflows a double, or is nonzero
// but reads as 0, or is longer than strictjson.MaxNumberLen), and int/int64
// values beyond ±2^53 (they would be silently rounded). On error dst is returned unchanged.
func AppendCanonical(dst []byte, v any) ([]byte, error) {
	n := len(dst)
	out, err := appendValue(dst, v, 0)
	if err != nil {
		return dst[:n], err
	}
	return out, nil
}

// maxAppendDepth bounds recursion, in trees built by code and in raw JSON
// (decoders have their own, lower limits); it is encoding/json's limit.
const maxAppendDepth = 10000

func appendValue(dst []byte, v any, depth int) ([]byte, error) {
	switch x := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case string:
		return appendString(dst, x)
	case *string:
		if x == nil {
			return append(dst, "null"...), nil
		}
		return appendString(dst, *x)
	case bool:
		if x {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case json.Number:
		return appendNumberText(dst, string(x))
	case float64:
		return appendFloat(dst, x)
	case int:
		return appendInt(dst, int64(x))
	case int64:
		return appendInt(dst, x)
	case map[string]any:
		if depth >= maxAppendDepth {
			return dst, errTooDeep
		}
		return appendObject(dst, x, depth+1)
	case []any:
		if depth >= maxAppendDepth {
			return dst, errTooDeep
		}
		dst = append(dst, '[')
		for i, e := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendValue(dst, e, depth+1); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case []string:
		dst = append(dst, '[')
		for i, e := range x {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendString(dst, e); err != nil {
				return dst, err
			}
		}
		return append(dst, ']'), nil
	case map[string]string:
		m := make(map[string]any, len(x))
		for k, s := range x {
			m[k] = s
		}
		return appendObject(dst, m, depth+1)
	case json.RawMessage:
		return AppendCanonicalJSON(dst, x)
	default:
		return dst, fmt.Errorf("canonicalizing JSON: unsupported Go type %T", v)
	}
}

var errTooDeep = fmt.Errorf("canonicalizing JSON: nesting deeper than %d", maxAppendDepth)

// keyPool recycles the key slices objects are sorted in, so that hashing a
// request allocates little beyond its output.
var keyPool = sync.Pool{New: func() any { s := make([]string, 0, 16); return &s }}

// maxPooledKeys keeps one huge object from pinning a huge slice in the pool.
const maxPooledKeys = 1024

func appendObject(dst []byte, m map[string]any, depth int) ([]byte, error) {
	kp := keyPool.Get().(*[]string)
	keys := (*kp)[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, compareUTF16)
	dst = append(dst, '{')
	var err error
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, ',')
		}
		if dst, err = appendString(dst, k); err != nil {
			break
		}
		dst = append(dst, ':')
		if dst, err = appendValue(dst, m[k], depth); err != nil {
			break
		}
	}
	clear(keys)
	if cap(keys) <= maxPooledKeys {
		*kp = keys[:0]
		keyPool.Put(kp)
	}
	if err != nil {
		return dst, err
	}
	return append(dst, '}'), nil
}

// compareUTF16 orders strings by their UTF-16 code units, as RFC 8785 §3.2.3
// requires. UTF-8 byte order is code point order, which differs from UTF-16
// order only between a supplementary character (a surrogate pair, first unit
// 0xD800–0xDBFF) and a character in U+E000–U+FFFF: UTF-16 puts the
// supplementary one first. So compare bytes up to the first difference and
// only decode the two runes there.
func compareUTF16(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b)
	}
	if a[i] < utf8.RuneSelf && b[i] < utf8.RuneSelf {
		return int(a[i]) - int(b[i])
	}
	for i > 0 && !utf8.RuneStart(a[i]) {
		i--
	}
	ra, _ := utf8.DecodeRuneInString(a[i:])
	rb, _ := utf8.DecodeRuneInString(b[i:])
	return compareRunesUTF16(ra, rb)
}

// compareRunesUTF16 orders two different runes by their UTF-16 code units.
// Runes on the same side of U+10000 order by code point; a supplementary
// rune (first unit 0xD800–0xDBFF) sorts after U+0000–U+D7FF and before
// U+E000–U+FFFF. Valid UTF-8 never holds U+D800–U+DFFF itself.
func compareRunesUTF16(a, b rune) int {
	aSup, bSup := a >= 0x10000, b >= 0x10000
	switch {
	case aSup == bSup:
		return int(a) - int(b)
	case aSup && b < 0xD800, bSup && a >= 0xE000:
		return 1
	default:
		return -1
	}
}

// appendString writes s as an RFC 8785 string, refusing invalid UTF-8
// (which has no canonical form) instead of replacing it.
func appendString(dst []byte, s string) ([]byte, error) {
	if !utf8.ValidString(s) {
		return dst, errors.New("canonicalizing JSON: string is not valid UTF-8")
	}
	return AppendString(dst, s), nil
}

// AppendString writes s as an RFC 8785 string: literal UTF-8, with only '"',
// '\\' and the control characters escaped (\b \t \n \f \r by name, the rest
// as lowercase \u00xx). Writers that build canonical JSON by hand (the
// verification result) use it so their strings are byte-identical to what
// the canonicalizer produces. An invalid UTF-8 byte is written as U+FFFD,
// as encoding/json does; the canonicalizer itself refuses such strings
// before calling it.
func AppendString(dst []byte, s string) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if i+8 <= len(s) && plain8(s[i:i+8]) {
			i += 8 // eight bytes written as they are
			continue
		}
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(dst, s[start:i]...)
				dst = append(dst, "\ufffd"...)
				i++
				start = i
				continue
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[start:i]...)
		switch c {
		case '"', '\\':
			dst = append(dst, '\\', c)
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		i++
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// plain8 reports whether none of the 8 bytes of b needs a look: no control
// character, '"', '\\' or non-ASCII byte. It tests the eight at once (the
// usual word-at-a-time tests for a zero byte and a byte below n); a false
// "no" only sends the block down the byte-by-byte path, and a "yes" is
// never wrong.
func plain8(b string) bool {
	const lsb, msb = 0x0101010101010101, 0x8080808080808080
	x := uint64(b[0]) | uint64(b[1])<<8 | uint64(b[2])<<16 | uint64(b[3])<<24 |
		uint64(b[4])<<32 | uint64(b[5])<<40 | uint64(b[6])<<48 | uint64(b[7])<<56
	q := x ^ (lsb * '"')
	bs := x ^ (lsb * '\\')
	special := (x - lsb*0x20) | (q-lsb)&^q | (bs-lsb)&^bs | x
	return special&msb == 0
}

// appendNumberText canonicalizes a JSON number literal: parsed to the nearest
// double (as every RFC 8785 implementation does) and printed the ECMAScript
// way.
func appendNumberText(dst []byte, s string) ([]byte, error) {
	if !isJSONNumber(s) {
		return dst, errors.New("canonicalizing JSON: json.Number is not a JSON number")
	}
	// Small integers (the common case in requests: counts, quantities) are
	// already canonical; skip the float round trip.
	if len(s) <= 15 && isPlainInteger(s) {
		if s == "-0" {
			return append(dst, '0'), nil
		}
		return append(dst, s...), nil
	}
	// strictjson.Float64, not strconv.ParseFloat alone: a nonzero number
	// below the smallest double, or one whose exponent strconv misreads,
	// would canonicalize to the bytes of another number (0, or 5 for
	// "0.<9999 zeros>5e100000"), so a receipt rewritten that way would
	// still verify while its text means another value to other readers.
	f, err := strictjson.Float64(s)
	if err != nil {
		return dst, fmt.Errorf("canonicalizing JSON: %w", err)
	}
	return appendFloat(dst, f)
}

// isPlainInteger reports whether s (already a valid JSON number) has no
// fraction and no exponent.
func isPlainInteger(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '.' || c == 'e' || c == 'E' {
			return false
		}
	}
	return true
}

// isJSONNumber reports whether s matches the RFC 8259 number grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
// strconv.ParseFloat alone accepts far more ("Inf", "0x1p4", "+1", "1_0").
func isJSONNumber(s string) bool {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && s[i] >= '1' && s[i] <= '9':
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		d := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		d := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		if i == d {
			return false
		}
	}
	return i == len(s)
}

func appendFloat(dst []byte, f float64) ([]byte, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return dst, errors.New("canonicalizing JSON: NaN and infinities are not JSON numbers")
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		// Integral and well inside the range ECMAScript prints as plain
		// digits: strconv gives the same digits without a string copy.
		return strconv.AppendInt(dst, int64(f), 10), nil
	}
	return appendES6Number(dst, f), nil
}

// AppendNumber appends a finite double in its RFC 8785 form, as
// ECMAScript's Number.prototype.toString prints it. Writers that produce
// canonical JSON directly (a verification result's signed form) use it for
// their numbers; f must not be NaN or an infinity, which JSON cannot hold.
func AppendNumber(dst []byte, f float64) []byte {
	return appendES6Number(dst, f)
}

// appendES6Number prints a finite double as ECMAScript's Number.prototype
// .toString does (RFC 8785 §3.2.2.3): the shortest digits that round-trip,
// plain notation from 1e-6 up to 1e21, exponent notation outside it with no
// leading zero in the exponent, and no negative zero.
func appendES6Number(dst []byte, f float64) []byte {
	if f == 0 {
		return append(dst, '0')
	}
	if f < 0 {
		dst = append(dst, '-')
		f = -f
	}
	if f >= 1e-6 && f < 1e21 {
		return strconv.AppendFloat(dst, f, 'f', -1, 64)
	}
	start := len(dst)
	dst = strconv.AppendFloat(dst, f, 'e', -1, 64)
	// Go writes at least two exponent digits ("1e+09"); ECMAScript none
	// leading ("1e+9").
	if e := bytes.IndexByte(dst[start:], 'e'); e >= 0 && len(dst)-(start+e) == 4 && dst[start+e+2] == '0' {
		i := start + e + 2
		dst = append(dst[:i], dst[i+1:]...)
	}
	return dst
}

func appendInt(dst []byte, i int64) ([]byte, error) {
	if i > maxSafeInteger || i < -maxSafeInteger {
		return dst, errors.New("canonicalizing JSON: integer beyond ±2^53 cannot be represented exactly")
	}
	return strconv.AppendInt(dst, i, 10), nil
}
