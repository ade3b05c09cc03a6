package schema

import (
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Character classes are where a short pattern gets expensive before it
// ever runs: each \pL parses to a table of 659 rune ranges (about 40 ns of
// parsing and 8 to 20 bytes kept apiece), so 30 KB of \pL costs a quarter
// of a second and 60 MB to parse, and syntax.Parse has no limit of its own.
// classBound reads a pattern lexically, without parsing it, and returns an
// upper bound on the rune ranges its parsed character classes hold, so a
// pattern can be refused (ClassesTooLargeError) before syntax.Parse does
// that work. The bound is exact for a class escape or a bracket item on its
// own; it overcounts where the parser merges (items that overlap in one
// bracket count for each) and where (?i) is on: a case-folded range counts
// up to four ranges for each character in it that has a case pair
// (rangeBound), and every alternative of a pattern that turns folding on
// anywhere counts four (the parser collapses single-letter alternatives
// into a class).
//
// classScan returns the bound with the parse cost of the classes
// (parseCost): the same reading, as the limits on ranges and on the work of
// parsing are two facts about one pattern.
func classBound(pat string) int {
	n, _ := classScan(pat)
	return n
}

// The parser's cost, in units of about 10 ns (those of
// DefaultMaxRegexWork), measured on regexp/syntax (TestPatternParseCost):
// a class range costs up to 130 ns to build where a bracket merges tables
// ([\p{Lu}\p{Mn}]; \pL alone 63 ns), a case-folded class escape about 400
// ns a range ((?i)\pL), and a case-folded bracket range about 73 ns for
// each character of it in [minFold, maxFold], which the parser folds one
// by one: (?i)[\x{42}-\x{1e942}] parses to one range in 9 ms.
const (
	costPerRange       = 13
	costPerFoldedRange = 40
	costPerFoldedRune  = 8
)

// classScan is classBound, with cost, the parse work of the pattern's
// classes in those units.
func classScan(pat string) (n, cost int) {
	folds := foldsAnywhere(pat)
	fold := false
	var outer []bool // fold state outside each open group
	alternatives := 1
	for i := 0; i < len(pat); {
		switch c := pat[i]; c {
		case '\\':
			if strings.HasPrefix(pat[i:], `\Q`) {
				// Literal text up to \E: no classes.
				end := strings.Index(pat[i+2:], `\E`)
				if end < 0 {
					i = len(pat)
				} else {
					i += 2 + end + 2
				}
				continue
			}
			item, ok := classEscape(pat[i:])
			if ok {
				r := itemRanges(item, fold)
				n, cost = satAdd(n, r), satAdd(cost, itemCost(r, fold))
				i += len(item)
				continue
			}
			i += escapeLen(pat[i:])
		case '[':
			ranges, c, size := bracketBound(pat[i:], fold)
			n, cost = satAdd(n, ranges), satAdd(cost, c)
			i += size
		case '(':
			alternatives++
			outer = append(outer, fold)
			i++
			if strings.HasPrefix(pat[i:], "?") {
				flags, size, group := parseFlags(pat[i+1:], fold)
				if size > 0 {
					i += 1 + size
					if group {
						fold = flags
					} else {
						// (?i) changes the flags of the group it is in.
						outer = outer[:len(outer)-1]
						fold = flags
						alternatives--
					}
				}
			}
		case ')':
			if len(outer) > 0 {
				fold = outer[len(outer)-1]
				outer = outer[:len(outer)-1]
			}
			i++
		case '|':
			alternatives++
			i++
		default:
			i++
		}
	}
	per := 1
	if folds {
		per = 4
	}
	n = satAdd(n, alternatives*per)
	return n, satAdd(cost, alternatives*per*costPerRange)
}

// itemCost is the parse cost of a class escape or named class of r ranges.
func itemCost(r int, fold bool) int {
	if fold {
		return r * costPerFoldedRange
	}
	return r * costPerRange
}

// foldsAnywhere reports whether a pattern may turn on case folding: a flag
// group whose flags (before any '-') include i.
func foldsAnywhere(pat string) bool {
	for i := 0; ; {
		j := strings.Index(pat[i:], "(?")
		if j < 0 {
			return false
		}
		i += j + 2
		for i < len(pat) && pat[i] != ')' && pat[i] != ':' && pat[i] != '-' {
			if pat[i] == 'i' {
				return true
			}
			if !strings.ContainsRune("msU", rune(pat[i])) {
				break
			}
			i++
		}
	}
}

// parseFlags reads the flags of a group after "(?": size is the bytes up to
// and including the ')' or ':' that ends them (0 when t is not a flag group:
// a named capture), fold the folding they set, and group whether they open
// a group ("(?i:") rather than change the current one ("(?i)").
func parseFlags(t string, fold bool) (newFold bool, size int, group bool) {
	newFold, sign := fold, true
	for i := 0; i < len(t); i++ {
		switch t[i] {
		case 'i':
			newFold = sign
		case 'm', 's', 'U':
		case '-':
			sign = false
		case ')':
			return newFold, i + 1, false
		case ':':
			return newFold, i + 1, true
		default:
			return fold, 0, false
		}
	}
	return fold, 0, false
}

// classEscape returns the class escape at the start of t (\d, \pL,
// \p{Greek}, \P{^Han} and the like), if it is one.
func classEscape(t string) (string, bool) {
	if len(t) < 2 || t[0] != '\\' {
		return "", false
	}
	switch t[1] {
	case 'd', 'D', 's', 'S', 'w', 'W':
		return t[:2], true
	case 'p', 'P':
		if len(t) < 3 {
			return "", false
		}
		if t[2] == '{' {
			end := strings.IndexByte(t, '}')
			if end < 0 {
				return "", false
			}
			return t[:end+1], true
		}
		_, size := utf8.DecodeRuneInString(t[2:])
		return t[:2+size], true
	}
	return "", false
}

// escapeLen is the length of the escape at the start of t, which is not a
// class: \x{10FFFF}, \x41, \123, \n, \. and so on.
func escapeLen(t string) int {
	if len(t) < 2 {
		return len(t)
	}
	switch c := t[1]; {
	case c == 'x' && len(t) > 2 && t[2] == '{':
		if end := strings.IndexByte(t, '}'); end > 0 {
			return end + 1
		}
		return len(t)
	case c == 'x':
		return min(len(t), 4)
	case c >= '0' && c <= '7':
		i := 2
		for i < len(t) && i < 4 && t[i] >= '0' && t[i] <= '7' {
			i++
		}
		return i
	}
	_, size := utf8.DecodeRuneInString(t[1:])
	return 1 + size
}

// escapeRune is the rune an escape in a class stands for, with its length;
// ok is false when it is not one (the pattern does not parse then).
func escapeRune(t string) (r rune, size int, ok bool) {
	size = escapeLen(t)
	if size < 2 {
		return 0, size, false
	}
	body := t[1:size]
	switch c := body[0]; {
	case c == 'x' && len(body) > 1 && body[1] == '{':
		v, err := strconv.ParseUint(strings.TrimSuffix(body[2:], "}"), 16, 32)
		return rune(v), size, err == nil
	case c == 'x':
		v, err := strconv.ParseUint(body[1:], 16, 32)
		return rune(v), size, err == nil
	case c >= '0' && c <= '7':
		v, err := strconv.ParseUint(body, 8, 32)
		return rune(v), size, err == nil
	}
	switch body {
	case "a":
		return '\a', size, true
	case "f":
		return '\f', size, true
	case "n":
		return '\n', size, true
	case "r":
		return '\r', size, true
	case "t":
		return '\t', size, true
	case "v":
		return '\v', size, true
	}
	r, _ = utf8.DecodeRuneInString(body)
	return r, size, true
}

// bracketBound bounds the ranges of the bracket class at the start of t
// ("[a-z\pL[:alpha:]]"), following syntax's parseClass, and returns their
// parse cost and the bytes it spans.
func bracketBound(t string, fold bool) (ranges, cost, size int) {
	i := 1
	n := 0
	if strings.HasPrefix(t[i:], "^") {
		i++
		n = 2 // negating adds a range, and another for \n
	}
	for first := true; i < len(t) && (t[i] != ']' || first); first = false {
		rest := t[i:]
		if strings.HasPrefix(rest, "[:") {
			if end := strings.Index(rest[2:], ":]"); end >= 0 {
				r := itemRanges("["+rest[:2+end+2]+"]", fold)
				n, cost = satAdd(n, r), satAdd(cost, itemCost(r, fold))
				i += 2 + end + 2
				continue
			}
		}
		if item, ok := classEscape(rest); ok {
			r := itemRanges(item, fold)
			n, cost = satAdd(n, r), satAdd(cost, itemCost(r, fold))
			i += len(item)
			continue
		}
		lo, size, ok := classChar(rest)
		if !ok {
			return n, cost, len(t)
		}
		i += size
		hi := lo
		if i+1 < len(t) && t[i] == '-' && t[i+1] != ']' {
			hi, size, ok = classChar(t[i+1:])
			if !ok {
				return n, cost, len(t)
			}
			i += 1 + size
		}
		r, visited := rangeBound(lo, hi, fold)
		n = satAdd(n, r)
		cost = satAdd(cost, satAdd(r*costPerRange, visited*costPerFoldedRune))
	}
	return n, cost, min(i+1, len(t))
}

// classChar reads one character of a bracket class.
func classChar(t string) (r rune, size int, ok bool) {
	if t == "" {
		return 0, 0, false
	}
	if t[0] == '\\' {
		return escapeRune(t)
	}
	r, size = utf8.DecodeRuneInString(t)
	return r, size, true
}

// The characters that may have a case pair lie in [minFold, maxFold]
// (regexp/syntax's own bounds; TestFoldBounds checks them). The parser
// folds a range by visiting each character of it in that span, appending
// the character and the rest of its orbit (at most four characters, as k,
// K and the Kelvin sign), and merging each with the last two ranges.
const (
	minFold = 0x0041
	maxFold = 0x1e943
)

// rangeBound bounds the ranges the parser makes of [lo-hi]. Folded, that
// is the parts outside [minFold, maxFold] (two), the first character's
// range, and for each character c of it that folds: a range for each
// other member of its orbit, and one more when its orbit has three or
// more, since c's own range is then no longer among the last two and c+1
// starts another (foldWeight). A character that does not fold extends
// its neighbour's range, so (?i)[\x{20}-\x{D7FF}] counts the 2,800
// letters in it, not its 55,000 characters.
// visited is the characters the parser folds one by one.
func rangeBound(lo, hi rune, fold bool) (ranges, visited int) {
	if !fold || hi < minFold || lo > maxFold || (lo <= minFold && hi >= maxFold) || hi < lo {
		return 1, 0
	}
	lo, hi = max(lo, minFold), min(hi, maxFold)
	return 3 + foldWeight(lo, hi), int(hi-lo) + 1
}

// foldWeight is the sum over the characters in [lo, hi] of their weight
// in rangeBound: orbit size - 1, plus one for an orbit of three or more.
func foldWeight(lo, hi rune) int {
	t := foldTable()
	below := func(r rune) int { // weight of the folding characters before r
		i, _ := slices.BinarySearch(t.runes, r)
		return int(t.cum[i])
	}
	return below(hi+1) - below(lo)
}

// foldTable lists the characters that fold, in order, with cum[i] the
// weight of the first i of them: some 2,900 characters, computed once.
var foldTable = sync.OnceValue(func() (t struct {
	runes []rune
	cum   []int32
}) {
	t.cum = []int32{0}
	for c := rune(minFold); c <= maxFold; c++ {
		orbit := 1
		for f := unicode.SimpleFold(c); f != c; f = unicode.SimpleFold(f) {
			orbit++
		}
		if orbit == 1 {
			continue
		}
		w := orbit - 1
		if orbit >= 3 {
			w++
		}
		t.runes = append(t.runes, c)
		t.cum = append(t.cum, t.cum[len(t.cum)-1]+int32(w))
	}
	return t
})

// itemRanges caches the ranges of a class item (\pL, [[:alpha:]], \w), on
// its own and case-folded, by parsing it once: the parser's tables are
// the one source of truth. Only items that parse are kept, so the cache
// holds at most the Unicode tables' names in their few spellings.
var itemRanges = func() func(item string, fold bool) int {
	var cache sync.Map // string → int
	return func(item string, fold bool) int {
		key := item
		if fold {
			key = "(?i)" + item
		}
		if n, ok := cache.Load(key); ok {
			return n.(int)
		}
		re, err := syntax.Parse(key, syntax.Perl)
		if err != nil {
			return 0 // the pattern does not parse either
		}
		n := classRanges(re)
		cache.Store(key, n)
		return n
	}
}()

// classRanges counts the rune ranges of the character classes in a parsed
// pattern: what its program keeps, and what parsing it built.
func classRanges(re *syntax.Regexp) int {
	n := 0
	if re.Op == syntax.OpCharClass {
		n = len(re.Rune) / 2
	}
	for _, sub := range re.Sub {
		n = satAdd(n, classRanges(sub))
	}
	return n
}

func satAdd(a, b int) int { return min(a+b, sizeCap) }
