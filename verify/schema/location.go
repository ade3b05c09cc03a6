package schema

import (
	"encoding/json"
	"strconv"
	"strings"

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
		return appendStep(loc, ".", k)
	}
	return appendStep(loc, PathKey(k), "")
}

// AppendLocationIndex appends element i of the array at loc, within
// MaxLocationBytes.
func AppendLocationIndex(loc []byte, i int) []byte {
	var buf [24]byte
	step := strconv.AppendInt(append(buf[:0], '['), int64(i), 10)
	return appendStep(loc, string(append(step, ']')), "")
}

// LocationKey is the location of member k of the value at loc.
func LocationKey(loc, k string) string {
	b := make([]byte, 0, len(loc)+len(k)+3)
	return string(AppendLocationKey(append(b, loc...), k))
}

// appendStep appends the step a+b to loc, or, when loc plus the step
// would not leave room for locationCut within MaxLocationBytes, cuts loc
// there.
func appendStep(loc []byte, a, b string) []byte {
	switch {
	case strings.HasSuffix(string(loc), locationCut):
		return loc
	case !stepFits(len(loc), len(a)+len(b)):
		return append(loc, locationCut...)
	}
	return append(append(loc, a...), b...)
}

// stepFits reports whether a step of n bytes after a location of loc bytes
// leaves room for locationCut within MaxLocationBytes.
func stepFits(loc, n int) bool { return loc+n <= MaxLocationBytes-len(locationCut) }

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
