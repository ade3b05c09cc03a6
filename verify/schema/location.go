package schema

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/aovhq/aov/strictjson"
)

// MaxLocationBytes bounds one location as a result shows it ("$.a[0].b").
// A result repeats the location of each finding it describes (errors,
// errors_detail, hints), and a location repeats every member name above
// the value, so unbounded locations let a 30 KB request make a result of
// megabytes (a member name of 30,000 bytes over 60 failing values), more
// than the signer accepts. Member names are shortened as every path a
// client is shown shortens them (strictjson.ShortKey); a location that
// would still pass this bound, an output nested tens of levels deep under
// names that need escaping, ends with "…" where the next step would not
// fit.
const MaxLocationBytes = 1024

// locationCut ends a location that was cut; no step of an uncut location
// ends with it (plain keys are ASCII, quoted keys and indexes end with
// "]"), so a location ending with it takes no more steps.
const locationCut = "…"

// AppendLocationKey appends member k of the value at loc, as PathKey
// renders it, within MaxLocationBytes.
func AppendLocationKey(loc []byte, k string) []byte {
	if plainKey(k) {
		if room(&loc, 1+len(k)) {
			loc = append(append(loc, '.'), k...)
		}
		return loc
	}
	step := PathKey(k)
	if room(&loc, len(step)) {
		loc = append(loc, step...)
	}
	return loc
}

// AppendLocationIndex appends element i of the array at loc, within
// MaxLocationBytes.
func AppendLocationIndex(loc []byte, i int) []byte {
	n := 3 // "[", "]" and a digit
	for j := i; j >= 10; j /= 10 {
		n++
	}
	if room(&loc, n) {
		loc = append(strconv.AppendInt(append(loc, '['), int64(i), 10), ']')
	}
	return loc
}

// LocationKey is the location of member k of the value at loc.
func LocationKey(loc, k string) string {
	b := make([]byte, 0, len(loc)+min(len(k), strictjson.MaxKeyInPath)+8)
	return string(AppendLocationKey(append(b, loc...), k))
}

// room reports whether a step of n bytes may be appended to *loc: not when
// *loc is cut, nor when the step would not leave room for locationCut
// within MaxLocationBytes, and then *loc is cut.
func room(loc *[]byte, n int) bool {
	switch {
	case bytes.HasSuffix(*loc, []byte(locationCut)):
		return false
	case !stepFits(len(*loc), n):
		*loc = append(*loc, locationCut...)
		return false
	}
	return true
}

// stepFits reports whether a step of n bytes after a location of loc bytes
// leaves room for locationCut within MaxLocationBytes.
func stepFits(loc, n int) bool { return loc+n <= MaxLocationBytes-len(locationCut) }

// locator renders the instance locations of an evaluation's failures,
// reusing what a location shares with the one rendered before it: the
// failures of one array's items differ only in their index, so each costs
// its last step, not its whole location (60 KB of locations under names
// JSON escapes allocated 9 KB per failure, 1.1 GB for a 480 KB request).
// The location returned is valid until the next call.
type locator struct {
	toks []string // the tokens of the last location
	ends []int    // ends[i]: the bytes of buf rendering toks[:i]
	vals []any    // vals[i], oks[i]: what locate found after toks[:i]
	oks  []bool
	buf  []byte
}

// locate follows a validator instance location through inst and renders
// it as "$.a[0].b" (within MaxLocationBytes): the value at each step tells
// an index from a member name.
func (l *locator) locate(inst any, loc []string) []byte {
	if len(l.ends) == 0 {
		l.buf, l.ends, l.vals, l.oks = append(l.buf, '$'), append(l.ends, 1), append(l.vals, inst), append(l.oks, true)
	}
	n := 0
	for n < len(loc) && n < len(l.toks) && loc[n] == l.toks[n] {
		n++
	}
	l.toks, l.ends, l.vals, l.oks = l.toks[:n], l.ends[:n+1], l.vals[:n+1], l.oks[:n+1]
	l.buf = l.buf[:l.ends[n]]
	cur, ok := l.vals[n], l.oks[n]
	for _, tok := range loc[n:] {
		l.buf, cur, ok = step(l.buf, cur, ok, tok)
		l.toks, l.ends, l.vals, l.oks = append(l.toks, tok), append(l.ends, len(l.buf)), append(l.vals, cur), append(l.oks, ok)
	}
	return l.buf
}

// step renders token tok of a location after b, and follows it from cur:
// an index into an array, else a member name.
func step(b []byte, cur any, ok bool, tok string) ([]byte, any, bool) {
	switch c := cur.(type) {
	case []any:
		i, err := strconv.Atoi(tok)
		if err == nil && i >= 0 && i < len(c) {
			return AppendLocationIndex(b, i), c[i], ok
		}
		ok = false
	case map[string]any:
		cur, ok = c[tok]
	default:
		ok = false
	}
	return AppendLocationKey(b, tok), cur, ok
}

// plainKey reports whether PathKey writes k as ".k".
func plainKey(k string) bool {
	plain := k != "" && len(k) <= strictjson.MaxKeyInPath
	for i := 0; i < len(k) && plain; i++ {
		c := k[i]
		plain = c == '_' || c == '-' || c == '$' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
	}
	return plain
}

// PathKey renders an object member of a path as ".key", or as ["key"]
// (JSON-quoted) when the key could be misread in a dotted path or is long
// enough to be shortened (strictjson.ShortKey, the one rule for member
// names in every path a client is shown). The instance paths this package
// reports and the rule locations package verify reports must render
// members the same way: a client matches a failure to a rule by comparing
// the two strings, so both use this one function.
func PathKey(k string) string {
	if plainKey(k) {
		return "." + k
	}
	q, _ := json.Marshal(strictjson.ShortKey(k))
	return "[" + string(q) + "]"
}
