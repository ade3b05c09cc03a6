package receipt

import (
	"cmp"
	"errors"
	"slices"
	"unicode/utf16"
	"unicode/utf8"
)

// canonReader parses RFC 8259 JSON and writes its RFC 8785 form in the same
// pass: scalars are written as they are read (strings re-escaped the
// canonical way, numbers reprinted as ECMAScript prints the nearest
// double); an object's members are written in input order and only moved
// when they turn out not to be sorted, so already canonical input (what a
// signer is sent) costs one read and one copy. Objects out of order are
// put in order once the whole value is written (order), each byte moved
// once however deep they nest: reordering each object as it closed would
// copy everything below it again at every level, time quadratic in a
// document nested thousands of levels deep.
//
// It refuses, like the reference implementation: duplicate keys (in
// decoded form), invalid UTF-8, lone or mispaired surrogate escapes,
// control characters in strings, numbers outside the RFC 8259 grammar or
// the double range, non-ASCII bytes outside strings, nesting deeper than
// maxAppendDepth, and anything that is not one JSON value.
type canonReader struct {
	s       string // the input, as a string so keys are substrings without copies
	pos     int
	depth   int
	members []member // a stack shared by the objects being read
	// pending lists the objects written with their members out of order,
	// in the order they closed; ordered holds their members, each one's
	// sorted by key.
	pending []pendingObject
	ordered []member
	scratch []byte // the outermost pending object's bytes while order rewrites them
	base    int    // where scratch's bytes sit in the output
}

// pendingObject is an object written with its members in input order,
// which is not their key order: where it sits in the output, {...}
// included, and its members in key order, ordered[from:to].
type pendingObject struct {
	start, end int
	from, to   int
}

// member is one object member already written to the output: its decoded
// key and where its "key":value text sits in the output.
type member struct {
	key        string
	start, end int
}

var (
	errCanonSyntax = errors.New("canonicalizing JSON: invalid JSON syntax")
	errCanonEOF    = errors.New("canonicalizing JSON: the document ends unexpectedly")
)

func (r *canonReader) skipSpace() {
	for r.pos < len(r.s) {
		switch r.s[r.pos] {
		case ' ', '\t', '\n', '\r':
			r.pos++
		default:
			return
		}
	}
}

func (r *canonReader) value(dst []byte) ([]byte, error) {
	if r.pos >= len(r.s) {
		return dst, errCanonEOF
	}
	switch c := r.s[r.pos]; {
	case c == '{':
		return r.object(dst)
	case c == '[':
		return r.array(dst)
	case c == '"':
		r.pos++
		out, _, err := r.str(dst, false)
		return out, err
	case c == 't':
		return r.literal(dst, "true")
	case c == 'f':
		return r.literal(dst, "false")
	case c == 'n':
		return r.literal(dst, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return r.number(dst)
	default:
		return dst, errCanonSyntax
	}
}

func (r *canonReader) literal(dst []byte, lit string) ([]byte, error) {
	if len(r.s)-r.pos < len(lit) || r.s[r.pos:r.pos+len(lit)] != lit {
		return dst, errCanonSyntax
	}
	r.pos += len(lit)
	return append(dst, lit...), r.endOfToken()
}

// endOfToken refuses a literal or number glued to more characters ("truex",
// "1.5.2"): the next byte must be whitespace, structure or the end.
func (r *canonReader) endOfToken() error {
	if r.pos == len(r.s) {
		return nil
	}
	switch r.s[r.pos] {
	case ' ', '\t', '\n', '\r', ',', ']', '}':
		return nil
	}
	return errCanonSyntax
}

func (r *canonReader) number(dst []byte) ([]byte, error) {
	start := r.pos
	for r.pos < len(r.s) {
		c := r.s[r.pos]
		if (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E' {
			r.pos++
			continue
		}
		break
	}
	if err := r.endOfToken(); err != nil {
		return dst, err
	}
	return appendNumberText(dst, r.s[start:r.pos])
}

func (r *canonReader) enter() error {
	if r.depth++; r.depth > maxAppendDepth {
		return errTooDeep
	}
	return nil
}

func (r *canonReader) array(dst []byte) ([]byte, error) {
	if err := r.enter(); err != nil {
		return dst, err
	}
	r.pos++ // '['
	dst = append(dst, '[')
	r.skipSpace()
	if r.pos < len(r.s) && r.s[r.pos] == ']' {
		r.pos++
		r.depth--
		return append(dst, ']'), nil
	}
	for {
		var err error
		r.skipSpace()
		if dst, err = r.value(dst); err != nil {
			return dst, err
		}
		r.skipSpace()
		if r.pos >= len(r.s) {
			return dst, errCanonEOF
		}
		switch r.s[r.pos] {
		case ',':
			r.pos++
			dst = append(dst, ',')
		case ']':
			r.pos++
			r.depth--
			return append(dst, ']'), nil
		default:
			return dst, errCanonSyntax
		}
	}
}

func (r *canonReader) object(dst []byte) ([]byte, error) {
	if err := r.enter(); err != nil {
		return dst, err
	}
	r.pos++ // '{'
	objStart := len(dst)
	dst = append(dst, '{')
	mark := len(r.members)
	r.skipSpace()
	if r.pos < len(r.s) && r.s[r.pos] == '}' {
		r.pos++
		r.depth--
		return append(dst, '}'), nil
	}
	sorted := true
	for {
		r.skipSpace()
		if r.pos >= len(r.s) {
			return dst, errCanonEOF
		}
		if r.s[r.pos] != '"' {
			return dst, errCanonSyntax
		}
		r.pos++
		m := member{start: len(dst)}
		var err error
		if dst, m.key, err = r.str(dst, true); err != nil {
			return dst, err
		}
		r.skipSpace()
		if r.pos >= len(r.s) || r.s[r.pos] != ':' {
			return dst, errCanonSyntax
		}
		r.pos++
		dst = append(dst, ':')
		r.skipSpace()
		if dst, err = r.value(dst); err != nil {
			return dst, err
		}
		m.end = len(dst)
		if n := len(r.members); n > mark && sorted {
			switch c := compareUTF16(r.members[n-1].key, m.key); {
			case c == 0:
				return dst, errDuplicateKey
			case c > 0:
				sorted = false
			}
		}
		r.members = append(r.members, m)
		r.skipSpace()
		if r.pos >= len(r.s) {
			return dst, errCanonEOF
		}
		if r.s[r.pos] == '}' {
			r.pos++
			break
		}
		if r.s[r.pos] != ',' {
			return dst, errCanonSyntax
		}
		r.pos++
		dst = append(dst, ',')
	}
	r.depth--
	dst = append(dst, '}')
	if !sorted {
		ms := r.members[mark:]
		slices.SortFunc(ms, func(a, b member) int { return compareUTF16(a.key, b.key) })
		for i := 1; i < len(ms); i++ {
			if ms[i-1].key == ms[i].key {
				return dst, errDuplicateKey
			}
		}
		from := len(r.ordered)
		r.ordered = append(r.ordered, ms...)
		r.pending = append(r.pending, pendingObject{start: objStart, end: len(dst), from: from, to: len(r.ordered)})
	}
	clear(r.members[mark:])
	r.members = r.members[:mark]
	return dst, nil
}

var (
	errDuplicateKey = errors.New("canonicalizing JSON: duplicate object key")
	errReordered    = errors.New("canonicalizing JSON: reordering changed an object's length")
)

// order puts the members of every pending object of dst in key order, in
// place: an object keeps its length when its members move, so nothing
// around it moves. Each outermost pending object is copied to scratch once
// and written back with the pending objects inside it put in order on the
// way (emitObject), so every byte is copied twice in all, however deep
// pending objects nest.
func (r *canonReader) order(dst []byte) ([]byte, error) {
	slices.SortFunc(r.pending, func(a, b pendingObject) int { return cmp.Compare(a.start, b.start) })
	for i := 0; i < len(r.pending); i = r.after(i) {
		p := r.pending[i]
		r.scratch = append(r.scratch[:0], dst[p.start:p.end]...)
		r.base = p.start
		// Capped at the object's end: a longer rewrite would leave dst,
		// not overwrite what follows, and is caught below.
		if out := r.emitObject(dst[p.start:p.start:p.end], i); len(out) != p.end-p.start {
			return dst, errReordered
		}
	}
	return dst, nil
}

// emitObject appends pending object i, in scratch, with its members in key
// order.
func (r *canonReader) emitObject(out []byte, i int) []byte {
	p := r.pending[i]
	out = append(out, '{')
	for k, m := range r.ordered[p.from:p.to] {
		if k > 0 {
			out = append(out, ',')
		}
		out = r.emitSpan(out, m.start, m.end)
	}
	return append(out, '}')
}

// emitSpan appends the output's bytes start to end, from scratch, with the
// pending objects among them put in order.
func (r *canonReader) emitSpan(out []byte, start, end int) []byte {
	j, _ := slices.BinarySearchFunc(r.pending, start, func(p pendingObject, at int) int { return cmp.Compare(p.start, at) })
	for at := start; ; j = r.after(j) {
		if j == len(r.pending) || r.pending[j].start >= end {
			return append(out, r.scratch[at-r.base:end-r.base]...)
		}
		q := r.pending[j]
		out = append(out, r.scratch[at-r.base:q.start-r.base]...)
		out = r.emitObject(out, j)
		at = q.end
	}
}

// after returns the index of the first pending object after pending object
// i and the pending objects inside it (pending sorted by start).
func (r *canonReader) after(i int) int {
	end := r.pending[i].end
	j, _ := slices.BinarySearchFunc(r.pending[i+1:], end, func(p pendingObject, at int) int { return cmp.Compare(p.start, at) })
	return i + 1 + j
}

// str reads a string whose opening quote is consumed and writes its
// canonical form to dst. For a key it also returns the decoded value, to
// sort by: a substring of the input when it has no escapes, a new string
// otherwise.
func (r *canonReader) str(dst []byte, key bool) ([]byte, string, error) {
	const hexDigits = "0123456789abcdef"
	start := r.pos
	outStart := len(dst)
	dst = append(dst, '"')
	escaped := false
	lit := r.pos // start of the run of bytes copied verbatim
	for {
		if r.pos >= len(r.s) {
			return dst, "", errCanonEOF
		}
		c := r.s[r.pos]
		switch {
		case c == '"':
			dst = append(dst, r.s[lit:r.pos]...)
			dst = append(dst, '"')
			decoded := r.s[start:r.pos]
			r.pos++
			if escaped && key {
				decoded = unquoteCanonical(dst[outStart:])
			}
			return dst, decoded, nil
		case c < 0x20:
			return dst, "", errors.New("canonicalizing JSON: control character in a string")
		case c < utf8.RuneSelf && c != '\\':
			r.pos++
		case c >= utf8.RuneSelf:
			rn, size := utf8.DecodeRuneInString(r.s[r.pos:])
			if rn == utf8.RuneError && size <= 1 {
				return dst, "", errors.New("canonicalizing JSON: string is not valid UTF-8")
			}
			r.pos += size
		default: // a backslash escape
			escaped = true
			dst = append(dst, r.s[lit:r.pos]...)
			rn, err := r.escape()
			if err != nil {
				return dst, "", err
			}
			lit = r.pos
			switch {
			case rn == '"' || rn == '\\':
				dst = append(dst, '\\', byte(rn))
			case rn == '\b':
				dst = append(dst, '\\', 'b')
			case rn == '\t':
				dst = append(dst, '\\', 't')
			case rn == '\n':
				dst = append(dst, '\\', 'n')
			case rn == '\f':
				dst = append(dst, '\\', 'f')
			case rn == '\r':
				dst = append(dst, '\\', 'r')
			case rn < 0x20:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[rn>>4], hexDigits[rn&0xF])
			default:
				dst = utf8.AppendRune(dst, rn)
			}
		}
	}
}

// escape decodes the escape at r.pos (a backslash), joining a surrogate
// pair and refusing a lone or mispaired surrogate.
func (r *canonReader) escape() (rune, error) {
	if r.pos+1 >= len(r.s) {
		return 0, errCanonEOF
	}
	c := r.s[r.pos+1]
	r.pos += 2
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 't':
		return '\t', nil
	case 'n':
		return '\n', nil
	case 'f':
		return '\f', nil
	case 'r':
		return '\r', nil
	case 'u':
	default:
		return 0, errors.New("canonicalizing JSON: unknown escape in a string")
	}
	u, ok := r.hex4()
	if !ok {
		return 0, errors.New("canonicalizing JSON: \\u escape without four hex digits")
	}
	if !utf16.IsSurrogate(u) {
		return u, nil
	}
	if u >= 0xDC00 || r.pos+1 >= len(r.s) || r.s[r.pos] != '\\' || r.s[r.pos+1] != 'u' {
		return 0, errLoneSurrogate
	}
	r.pos += 2
	lo, ok := r.hex4()
	if !ok || lo < 0xDC00 || lo > 0xDFFF {
		return 0, errLoneSurrogate
	}
	return utf16.DecodeRune(u, lo), nil
}

var errLoneSurrogate = errors.New("canonicalizing JSON: lone UTF-16 surrogate in a string")

func (r *canonReader) hex4() (rune, bool) {
	if len(r.s)-r.pos < 4 {
		return 0, false
	}
	var v rune
	for _, c := range []byte(r.s[r.pos : r.pos+4]) {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			v = v<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			v = v<<4 | rune(c-'A'+10)
		default:
			return 0, false
		}
	}
	r.pos += 4
	return v, true
}

// unquoteCanonical decodes a string this reader just wrote in canonical form
// (quotes included), for sorting a key that had escapes. Canonical strings
// escape only '"', '\\' and control characters, so this is short.
func unquoteCanonical(q []byte) string {
	q = q[1 : len(q)-1]
	out := make([]byte, 0, len(q))
	for i := 0; i < len(q); i++ {
		if q[i] != '\\' {
			out = append(out, q[i])
			continue
		}
		i++
		switch q[i] {
		case 'b':
			out = append(out, '\b')
		case 't':
			out = append(out, '\t')
		case 'n':
			out = append(out, '\n')
		case 'f':
			out = append(out, '\f')
		case 'r':
			out = append(out, '\r')
		case 'u': // \u00xx
			out = append(out, unhex(q[i+3])<<4|unhex(q[i+4]))
			i += 4
		default: // '"' or '\\'
			out = append(out, q[i])
		}
	}
	return string(out)
}

func unhex(c byte) byte {
	if c >= 'a' {
		return c - 'a' + 10
	}
	return c - '0'
}
