// Package strictjson decodes untrusted JSON into plain Go values, refusing
// everything that would make the same bytes mean different things to
// different readers: duplicate object keys (and, on request, keys that
// differ only in letter case), invalid UTF-8, lone UTF-16 surrogates,
// integers that a double cannot hold exactly, numbers that overflow a
// double or that are not zero but read as zero, numbers written with more
// than MaxNumberLen characters, a byte-order mark, and trailing data after
// the value.
//
// It exists because verification results are signed over RFC 8785 canonical
// JSON (SPEC §5): an input that two JSON parsers could read differently
// cannot be canonicalized unambiguously, so it is rejected with a path, a
// problem and a fix instead of being guessed at.
//
// It is not a general-purpose JSON library: it decodes into any only
// (map[string]any, []any, string, json.Number, bool, nil), never into structs,
// and it never echoes the input back in an error.
//
// It is the one reader of untrusted JSON in the project: verification
// requests (verify), x402 payments (x402) and the MCP JSON-RPC envelope the
// gateway prices (caddymodule) all go through it.
package strictjson

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultMaxDepth is the nesting limit used when Limits.MaxDepth is zero.
// Deep nesting costs stack and time in every later walk of the tree; 64 is
// far beyond what any real document of structured agent output needs.
const DefaultMaxDepth = 64

// MaxSafeInteger is 2^53−1, the largest integer every IEEE-754 double (and
// so every RFC 8785 implementation) represents exactly.
const MaxSafeInteger = 1<<53 - 1

// Limits bounds the work a single document may cause.
type Limits struct {
	// MaxDepth is the deepest allowed nesting of arrays and objects; the
	// root container is depth 1. Zero means DefaultMaxDepth.
	MaxDepth int
	// FoldedNames also refuses an object in which two member names are
	// equal under Unicode simple case folding ("name" and "Name", "k" and
	// the Kelvin sign). Turn it on for documents that a case-insensitive
	// reader may also see: encoding/json matches struct fields in any letter
	// case and lets the last duplicate win, so {"to":A,"To":B} would mean B
	// to it and A to an exact reader.
	FoldedNames bool
}

// ProblemFoldedName is the Problem of the Error that refuses, under
// Limits.FoldedNames, an object whose member names are equal under case
// folding: a reader may tell that refusal from the others by it.
const ProblemFoldedName = "this object key appears more than once when letter case is ignored"

// Error reports why a document was refused: where (Path, in the
// "a.b[3]" style, "" for the root), what (Problem), and how to repair it
// (Fix). Offset is the byte offset in the input, for logs. No field ever
// contains input content other than object keys on the path.
type Error struct {
	Path    string
	Problem string
	Fix     string
	Offset  int64
}

// Error reports the path and the problem.
func (e *Error) Error() string {
	if e.Path == "" {
		return "json: " + e.Problem
	}
	return "json at " + e.Path + ": " + e.Problem
}

// Decode parses exactly one JSON value from data. Values are
// map[string]any, []any, string, json.Number, bool and nil. Any refusal is
// an *Error.
func Decode(data []byte, lim Limits) (any, error) { return decode(data, lim, nil) }

// decode is Decode, recording the root object's member values in spans
// when it is not nil (DecodeMembers).
func decode(data []byte, lim Limits, spans map[string][]byte) (any, error) {
	d := decoder{data: data, maxDepth: lim.MaxDepth, folded: lim.FoldedNames, spans: spans}
	return d.run()
}

// run decodes the whole document.
func (d *decoder) run() (any, error) {
	data := d.data
	if d.maxDepth <= 0 {
		d.maxDepth = DefaultMaxDepth
	}
	if len(data) >= 3 && data[0] == 0xEF && data[1] == 0xBB && data[2] == 0xBF {
		// RFC 8259 §8.1: a parser may ignore a BOM, so some readers skip it
		// and others fail; refusing it keeps them from disagreeing.
		return nil, d.fail("the document starts with a byte-order mark", "Send UTF-8 JSON without a byte-order mark (EF BB BF).")
	}
	d.skipSpace()
	if d.pos >= len(d.data) {
		return nil, d.fail("the document is empty", "Send one JSON value, for example an object {...}.")
	}
	v, err := d.value()
	if err != nil {
		return nil, err
	}
	d.skipSpace()
	if d.pos < len(d.data) {
		return nil, d.fail("there is data after the end of the JSON value", "Send exactly one JSON value with nothing after it.")
	}
	return v, nil
}

// seg is one step of the path to the value being decoded, kept so errors
// can say where they happened without building strings on the happy path.
type seg struct {
	key   string
	index int // -1 for an object key
}

type decoder struct {
	data     []byte
	pos      int
	depth    int
	maxDepth int
	path     []seg
	buf      []byte            // scratch for strings with escapes
	intern   map[string]string // repeated object keys
	keys     int               // object keys read so far
	folded   bool              // refuse member names equal under case folding
	spans    map[string][]byte // the root object's member values as bytes (DecodeMembers)
	cutPath  []string          // the member DecodeCut locates
	cut      Cut               // where it is, once read
	dataPath []string          // where values are another reader's data (DecodeEnvelope)
	data1    *Error            // the first refusal of that data (keptAsData)
	inKey    bool              // reading a member name of the object at path
	folds    []string          // member names of the objects being read, innermost last (foldSet)
}

func (d *decoder) fail(problem, fix string) *Error {
	return &Error{Path: d.pathString(), Problem: problem, Fix: fix, Offset: int64(d.pos)}
}

func (d *decoder) syntax(what string) *Error {
	if d.pos >= len(d.data) {
		return d.fail("the document ends unexpectedly (expected "+what+")", "Send complete, well-formed JSON.")
	}
	return d.fail("invalid JSON syntax (expected "+what+")", "Send well-formed JSON (RFC 8259).")
}

// pathString renders the current path; used only when failing.
func (d *decoder) pathString() string {
	var b strings.Builder
	for _, s := range d.path {
		if s.index >= 0 {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(s.index))
			b.WriteByte(']')
			continue
		}
		AppendKey(&b, s.key)
	}
	return b.String()
}

// MaxKeyInPath bounds how much of an object key a path repeats: a longer
// key is shortened (ShortKey).
const MaxKeyInPath = 64

// ShortKey is key as a path shows it: whole when it is at most
// MaxKeyInPath bytes, otherwise its first MaxKeyInPath bytes (cut at a character boundary) and "…". A
// path repeats every member name above the value it names, and a name can
// be as long as the document, so every path a client is shown, from a
// refusal of the body or from a verification's findings, shows names this
// way: its size then depends on its depth, not on what was sent.
func ShortKey(key string) string {
	if len(key) <= MaxKeyInPath {
		return key
	}
	cut := MaxKeyInPath
	for cut > 0 && !utf8.RuneStart(key[cut]) {
		cut--
	}
	return key[:cut] + "…"
}

// AppendKey writes one object key as a path step: ".key" (or "key" at the
// start) when the key is a plain name, otherwise a JSON-quoted ["key"] so a
// key containing dots or brackets stays unambiguous. Long keys are cut
// (ShortKey).
func AppendKey(b *strings.Builder, key string) {
	plain := key != "" && len(key) <= MaxKeyInPath
	for i := 0; plain && i < len(key); i++ {
		c := key[i]
		plain = c == '_' || c == '-' || c == '$' || c == '@' ||
			(c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
	}
	if plain {
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(key)
		return
	}
	b.WriteByte('[')
	b.WriteString(strconv.Quote(strings.ToValidUTF8(ShortKey(key), "\uFFFD")))
	b.WriteByte(']')
}

func (d *decoder) skipSpace() {
	for d.pos < len(d.data) {
		switch d.data[d.pos] {
		case ' ', '\t', '\n', '\r':
			d.pos++
		default:
			return
		}
	}
}

func (d *decoder) value() (any, error) {
	if d.pos >= len(d.data) {
		return nil, d.syntax("a value")
	}
	c := d.data[d.pos]
	if (c == '{' || c == '[') && d.depth >= d.maxDepth && d.inData() {
		return nil, d.skipDeepData()
	}
	switch c {
	case '{':
		return d.object()
	case '[':
		return d.array()
	case '"':
		s, err := d.str()
		if err != nil {
			return nil, err
		}
		return s, nil
	case 't':
		return true, d.literal("true")
	case 'f':
		return false, d.literal("false")
	case 'n':
		return nil, d.literal("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return d.number()
		}
		return nil, d.syntax("a value")
	}
}

func (d *decoder) literal(lit string) error {
	if len(d.data)-d.pos < len(lit) || string(d.data[d.pos:d.pos+len(lit)]) != lit {
		return d.syntax("a value")
	}
	d.pos += len(lit)
	return nil
}

func (d *decoder) enter() error {
	d.depth++
	if d.depth > d.maxDepth {
		return d.tooDeep(d.maxDepth)
	}
	return nil
}

// tooDeep is the refusal of nesting past limit levels.
func (d *decoder) tooDeep(limit int) *Error {
	return d.fail("nesting is deeper than the limit of "+strconv.Itoa(limit)+" levels",
		"Flatten the document to at most "+strconv.Itoa(limit)+" levels of nested arrays and objects.")
}

// skipDeepData reads an array or object below DecodeEnvelope's data path
// that would nest past the limit: the data's refusal, worded as Decode of
// the data alone words it (its limit is the document's less the levels
// of the data path above it: the data value itself is its level 1), and
// the value skipped (nil in Value) without recursion, so the envelope
// around it stays readable however deep the data goes.
func (d *decoder) skipDeepData() error {
	d.keptAsData(d.tooDeep(d.maxDepth - len(d.dataPath)))
	return d.skip()
}

// skip reads the array or object at d.pos with every check value makes of
// its scalars (strings, numbers, literals), but neither building it nor
// recursing: a stack of the open brackets' closers, as deep as the value.
// Member names are not checked for duplicates: the value is data already
// refused (skipDeepData).
func (d *decoder) skip() error {
	var open []byte
	for {
		d.skipSpace()
		if d.pos >= len(d.data) {
			return d.syntax("a value")
		}
		switch c := d.data[d.pos]; c {
		case '{', '[':
			closer := byte('}')
			if c == '[' {
				closer = ']'
			}
			d.pos++
			d.skipSpace()
			if d.pos < len(d.data) && d.data[d.pos] == closer {
				d.pos++
				break // an empty one: a value read
			}
			open = append(open, closer)
			if closer == '}' {
				if err := d.skipKey(); err != nil {
					return err
				}
			}
			continue
		default:
			if _, err := d.value(); err != nil {
				return err
			}
		}
		// A value was read: what follows it, up to the next value.
		for {
			if len(open) == 0 {
				return nil
			}
			d.skipSpace()
			closer := open[len(open)-1]
			if d.pos >= len(d.data) || (d.data[d.pos] != ',' && d.data[d.pos] != closer) {
				return d.syntax("',' or '" + string(closer) + "'")
			}
			d.pos++
			if d.data[d.pos-1] == closer {
				open = open[:len(open)-1]
				continue
			}
			if closer == '}' {
				if err := d.skipKey(); err != nil {
					return err
				}
			}
			break
		}
	}
}

// skipKey reads an object key and its colon for skip.
func (d *decoder) skipKey() error {
	d.skipSpace()
	if d.pos >= len(d.data) || d.data[d.pos] != '"' {
		return d.syntax("an object key in double quotes")
	}
	if _, err := d.str(); err != nil {
		return err
	}
	d.skipSpace()
	if d.pos >= len(d.data) || d.data[d.pos] != ':' {
		return d.syntax("':' after an object key")
	}
	d.pos++
	return nil
}

func (d *decoder) object() (any, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	d.pos++ // '{'
	m := make(map[string]any)
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == '}' {
		d.pos++
		d.depth--
		return m, nil
	}
	top := len(d.path)
	// This object's member names, checked when folded is on.
	folds := foldSet{stack: &d.folds, start: len(d.folds)}
	prevComma := -1 // the comma before this member (DecodeCut)
	for {
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != '"' {
			return nil, d.syntax("an object key in double quotes")
		}
		keyStart := d.pos
		d.inKey = true
		k, err := d.key()
		d.inKey = false
		if err != nil {
			return nil, err
		}
		d.path = append(d.path, seg{key: k, index: -1})
		if _, dup := m[k]; dup {
			return nil, d.fail("this object key appears more than once",
				"Send each key at most once per object; readers disagree on which duplicate wins.")
		}
		if d.folded {
			if !folds.add(k) {
				return nil, d.fail(ProblemFoldedName,
					"Send each key once per object, in one letter case; some readers match names in any case.")
			}
		}
		d.skipSpace()
		if d.pos >= len(d.data) || d.data[d.pos] != ':' {
			return nil, d.syntax("':' after an object key")
		}
		d.pos++
		d.skipSpace()
		start := d.pos
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		m[k] = v
		if d.spans != nil && d.depth == 1 {
			d.spans[k] = d.data[start:d.pos]
		}
		valueEnd := d.pos
		d.skipSpace()
		if d.cutPath != nil && d.atCut(top, k) {
			d.markCut(keyStart, valueEnd, prevComma)
		}
		d.path = d.path[:top]
		if d.pos >= len(d.data) {
			return nil, d.syntax("',' or '}'")
		}
		switch d.data[d.pos] {
		case ',':
			prevComma = d.pos
			d.pos++
		case '}':
			d.pos++
			d.depth--
			folds.end()
			return m, nil
		default:
			return nil, d.syntax("',' or '}'")
		}
	}
}

func (d *decoder) array() (any, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	d.pos++ // '['
	a := make([]any, 0, 4)
	d.skipSpace()
	if d.pos < len(d.data) && d.data[d.pos] == ']' {
		d.pos++
		d.depth--
		return a, nil
	}
	d.path = append(d.path, seg{index: 0})
	top := len(d.path) - 1
	for {
		d.path[top].index = len(a)
		d.skipSpace()
		v, err := d.value()
		if err != nil {
			return nil, err
		}
		a = append(a, v)
		d.skipSpace()
		if d.pos >= len(d.data) {
			return nil, d.syntax("',' or ']'")
		}
		switch d.data[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			d.path = d.path[:top]
			d.depth--
			return a, nil
		default:
			return nil, d.syntax("',' or ']'")
		}
	}
}

// str decodes a string starting at the opening quote. The common case, no
// escapes, costs one allocation for the result.
func (d *decoder) str() (string, error) {
	d.pos++ // '"'
	start := d.pos
	data := d.data
	i := start
	for i < len(data) {
		c := data[i]
		if c == '"' {
			d.pos = i + 1
			return string(data[start:i]), nil
		}
		if c == '\\' {
			break
		}
		if c < 0x20 {
			d.pos = i
			return "", d.fail("a string contains an unescaped control character",
				"Escape control characters in strings (for example \\n, \\t or \\u0001).")
		}
		if c < utf8.RuneSelf {
			i++
			continue
		}
		r, size := utf8.DecodeRune(data[i:])
		if r == utf8.RuneError && size == 1 {
			d.pos = i
			return "", d.fail("a string is not valid UTF-8", "Encode all text as UTF-8.")
		}
		i += size
	}
	if i >= len(data) {
		d.pos = i
		return "", d.syntax("a closing '\"'")
	}
	// Slow path: copy what we have and decode escapes.
	buf := append(d.buf[:0], data[start:i]...)
	for i < len(data) {
		c := data[i]
		switch {
		case c == '"':
			d.pos = i + 1
			d.buf = buf
			return string(buf), nil
		case c == '\\':
			if i+1 >= len(data) {
				d.pos = i
				return "", d.syntax("an escape sequence")
			}
			e := data[i+1]
			i += 2
			switch e {
			case '"', '\\', '/':
				buf = append(buf, e)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r, ok := hex4(data, i)
				if !ok {
					d.pos = i
					return "", d.fail("a \\u escape is not followed by four hex digits", "Write \\u escapes as \\u followed by exactly four hex digits.")
				}
				i += 4
				if r >= 0xD800 && r < 0xDC00 {
					lo, ok := rune(0), false
					if i+1 < len(data) && data[i] == '\\' && data[i+1] == 'u' {
						lo, ok = hex4(data, i+2)
					}
					if !ok || lo < 0xDC00 || lo > 0xDFFF {
						if e := d.unpaired(i); !d.keptAsData(e) {
							return "", e
						}
						r = utf8.RuneError
					} else {
						i += 6
						r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
					}
				} else if r >= 0xDC00 && r <= 0xDFFF {
					if e := d.unpaired(i); !d.keptAsData(e) {
						return "", e
					}
					r = utf8.RuneError
				}
				buf = utf8.AppendRune(buf, r)
			default:
				d.pos = i - 1
				return "", d.fail("a string contains an invalid escape sequence",
					"Use only the JSON escapes \\\" \\\\ \\/ \\b \\f \\n \\r \\t and \\uXXXX.")
			}
		case c < 0x20:
			d.pos = i
			return "", d.fail("a string contains an unescaped control character",
				"Escape control characters in strings (for example \\n, \\t or \\u0001).")
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			i++
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				d.pos = i
				return "", d.fail("a string is not valid UTF-8", "Encode all text as UTF-8.")
			}
			buf = append(buf, data[i:i+size]...)
			i += size
		}
	}
	d.pos = i
	d.buf = buf
	return "", d.syntax("a closing '\"'")
}

// unpaired is the refusal of an unpaired surrogate escape ending at i.
// Below DecodeEnvelope's data path the string keeps U+FFFD in its place
// (keptAsData): the data is refused all the same.
func (d *decoder) unpaired(i int) *Error {
	d.pos = i
	return d.fail("a string contains an unpaired UTF-16 surrogate escape",
		"Escape characters outside the Basic Multilingual Plane as a high and low surrogate pair, or send them as literal UTF-8.")
}

// key decodes an object key, reusing one string per distinct short key so
// an array of a thousand similar objects does not allocate its keys a
// thousand times.
func (d *decoder) key() (string, error) {
	d.keys++
	if d.keys <= internAfter { // small documents: a table costs more than it saves
		return d.str()
	}
	start := d.pos + 1
	for i := start; i < len(d.data) && i-start <= maxInternLen; i++ {
		c := d.data[i]
		if c == '"' {
			b := d.data[start:i]
			if k, ok := d.intern[string(b)]; ok {
				d.pos = i + 1
				return k, nil
			}
			break
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			break
		}
	}
	k, err := d.str()
	if err != nil {
		return "", err
	}
	if len(k) <= maxInternLen && len(d.intern) < maxIntern {
		if d.intern == nil {
			d.intern = make(map[string]string, 16)
		}
		d.intern[k] = k
	}
	return k, nil
}

// Interning limits: only once a document has shown many keys, short keys
// only, and a bounded table.
const (
	internAfter  = 64
	maxInternLen = 32
	maxIntern    = 512
)

func hex4(data []byte, i int) (rune, bool) {
	if i+4 > len(data) {
		return 0, false
	}
	var r rune
	for _, c := range data[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	return r, true
}

// MaxNumberLen is the most characters a number may be written with.
//
// Every double, written out without an exponent in its shortest digits,
// fits in 327 characters (-5e-324 is -0. then 323 zeros then 5; no
// 17-digit value needs more), and serializers write far fewer, switching
// to an exponent. Beyond that a text is padding, and padding costs every
// reader after this one: the exact (big.Rat) arithmetic of the schema
// validator is quadratic in a number's digits, so one number of a million
// zeros took seconds. The limit also keeps strconv.ParseFloat right:
// it stops reading an exponent after five digits, which misreads a number
// only when its value is in range though its exponent is not, and that
// takes thousands of leading zeros ("0.<100000 zeros>5e100001" is 5 but
// reads as 0).
const MaxNumberLen = 400

// The errors of Float64.
var (
	ErrNumberTooLong   = errors.New("a number is written with more than " + strconv.Itoa(MaxNumberLen) + " characters")
	ErrNumberOverflow  = errors.New("a number overflows a double")
	ErrNumberUnderflow = errors.New("a nonzero number underflows a double to 0")
)

// Float64 reads a JSON number text (RFC 8259 grammar, already checked)
// as the double nearest its value, and refuses it when that double does
// not stand for the value: written with more than MaxNumberLen characters,
// beyond ±1.7976931348623157e308, or nonzero but nearer 0 than the
// smallest double (strconv.ParseFloat returns 0 without an error). It is
// the reading every RFC 8785 canonicalizer makes, so a number it accepts
// means one value to the hash, the schema validator and the checks. It
// allocates nothing.
func Float64(text string) (float64, error) {
	if len(text) > MaxNumberLen {
		return 0, ErrNumberTooLong
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return 0, ErrNumberOverflow // the only error of a valid JSON number
	}
	if f == 0 {
		for i := 0; i < len(text) && text[i] != 'e' && text[i] != 'E'; i++ {
			if text[i] >= '1' && text[i] <= '9' {
				return 0, ErrNumberUnderflow
			}
		}
	}
	return f, nil
}

// maxExponentDigits bounds the digits of a number's exponent (its leading
// zeros aside). math/big, which the schema validator reads numbers with,
// refuses an exponent beyond int64, and the validator then fails on the
// number it could not read, while strconv reads 0e10000000000000000000 as
// 0. Only a zero can carry such an exponent past Float64's range checks.
const maxExponentDigits = 18

// number scans a JSON number per RFC 8259 and checks it can be represented
// exactly (integers) or at all (doubles).
func (d *decoder) number() (any, error) {
	data := d.data
	start := d.pos
	i := start
	if data[i] == '-' {
		i++
	}
	if i >= len(data) {
		d.pos = i
		return nil, d.syntax("a digit")
	}
	intStart := i
	switch c := data[i]; {
	case c == '0':
		i++
	case c >= '1' && c <= '9':
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
	default:
		d.pos = i
		return nil, d.syntax("a digit")
	}
	intDigits := i - intStart
	integer := true
	if i < len(data) && data[i] == '.' {
		integer = false
		i++
		fs := i
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			i++
		}
		if i == fs {
			d.pos = i
			return nil, d.syntax("a digit after '.'")
		}
	}
	exp := false
	expDigits := 0 // the exponent's digits after its leading zeros
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		integer, exp = false, true
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		es := i
		for i < len(data) && data[i] >= '0' && data[i] <= '9' {
			if expDigits > 0 || data[i] != '0' {
				expDigits++
			}
			i++
		}
		if i == es {
			d.pos = i
			return nil, d.syntax("a digit in the exponent")
		}
	}
	if i-start > MaxNumberLen {
		return d.badNumber(start, i, "a number is written with more than "+strconv.Itoa(MaxNumberLen)+" characters",
			"Write numbers in at most "+strconv.Itoa(MaxNumberLen)+" characters (no double needs more than 24, as in -2.2250738585072014e-308), or send them as strings.")
	}
	text := string(data[start:i])
	if integer {
		// 2^53−1 has 16 digits: anything shorter is safe without parsing.
		if intDigits >= 16 {
			n, err := strconv.ParseInt(text, 10, 64)
			if err != nil || n > MaxSafeInteger || n < -MaxSafeInteger {
				return d.badNumber(start, i, "an integer is outside ±(2^53−1) and cannot be represented exactly",
					"Send integers between -9007199254740991 and 9007199254740991, or send large identifiers and amounts as strings.")
			}
		}
	} else if exp || len(text) > 300 { // shorter, without an exponent: within range
		switch _, err := Float64(text); {
		case err == nil && expDigits > maxExponentDigits:
			return d.badNumber(start, i, "a number's exponent is written with more than "+strconv.Itoa(maxExponentDigits)+" digits",
				"Write zero as 0, and exponents in at most "+strconv.Itoa(maxExponentDigits)+" digits.")
		case err == nil:
		case err == ErrNumberUnderflow:
			return d.badNumber(start, i, "a number is too small to be represented as a double: it would read as 0",
				"Send nonzero numbers no smaller in magnitude than 5e-324, or send them as strings.")
		default:
			return d.badNumber(start, i, "a number is too large to be represented as a double",
				"Send numbers within ±1.7976931348623157e308, or send them as strings.")
		}
	}
	d.pos = i
	return json.Number(text), nil
}

// badNumber refuses the valid JSON number data[start:end] for problem,
// unless it lies below DecodeEnvelope's data path: there the number is
// kept as written and the refusal recorded instead (keptAsData).
func (d *decoder) badNumber(start, end int, problem, fix string) (any, error) {
	d.pos = start
	if e := d.fail(problem, fix); !d.keptAsData(e) {
		return nil, e
	}
	d.pos = end
	return json.Number(d.data[start:end]), nil
}

// keptAsData reports whether the value being decoded lies below
// DecodeEnvelope's data path, where e, a refusal of the value alone (a
// number, an unpaired surrogate, nesting too deep), is the data's to
// answer rather than the document's: then e is recorded, if it is the
// first, and decoding goes on.
func (d *decoder) keptAsData(e *Error) bool {
	if !d.inData() {
		return false
	}
	if d.data1 == nil {
		d.data1 = e
	}
	return true
}

// inData reports whether the value being decoded lies below dataPath, or,
// for a member name, whether its object is the data or lies below it.
func (d *decoder) inData() bool {
	below := len(d.path) > len(d.dataPath) || (d.inKey && len(d.path) == len(d.dataPath))
	if d.dataPath == nil || !below {
		return false
	}
	for i, k := range d.dataPath {
		if s := d.path[i]; s.index >= 0 || s.key != k {
			return false
		}
	}
	return true
}

// foldSet holds the member names of one object, to find two equal under
// case folding. Up to foldScan names sit on a stack shared by the objects
// being read (decoder.folds), and a new name is compared with each by
// strings.EqualFold, the relation foldName maps names to: the small objects
// payments are made of cost no allocation. A wider object moves its names
// to a set of folded names, so it costs no quadratic scan.
type foldSet struct {
	stack *[]string // the names of the objects being read, innermost last
	start int       // where this object's names begin on it
	set   map[string]struct{}
}

const foldScan = 16

// add adds name and reports whether no name before it folds to the same.
func (s *foldSet) add(name string) bool {
	if s.set != nil {
		f := foldName(name)
		if _, dup := s.set[f]; dup {
			return false
		}
		s.set[f] = struct{}{}
		return true
	}
	names := (*s.stack)[s.start:]
	for _, n := range names {
		if strings.EqualFold(n, name) {
			return false
		}
	}
	if len(names) < foldScan {
		*s.stack = append(*s.stack, name)
		return true
	}
	s.set = make(map[string]struct{}, 2*foldScan)
	for _, n := range names {
		s.set[foldName(n)] = struct{}{}
	}
	s.set[foldName(name)] = struct{}{}
	s.end()
	return true
}

// end takes the object's names off the stack, once it is read.
func (s *foldSet) end() { *s.stack = (*s.stack)[:s.start] }

// foldName maps s to a representative of its case-folding class: every rune
// becomes the smallest rune of its simple-folding orbit, with ASCII letters
// in lower case. "K", "k" and the Kelvin sign all become "k", the relation
// encoding/json uses to match names.
func foldName(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		return lowerASCII(s)
	}
	b := make([]rune, 0, len(s))
	for _, r := range s {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			if f < m {
				m = f
			}
		}
		if 'A' <= m && m <= 'Z' { // agree with the ASCII fast path
			m += 'a' - 'A'
		}
		b = append(b, m)
	}
	return string(b)
}

func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if 'A' <= b[j] && b[j] <= 'Z' {
					b[j] += 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}
