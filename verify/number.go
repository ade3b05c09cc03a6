package verify

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// A receipt hashes every number as the double it reads as (RFC 8785), but
// the schema validator compares numbers exactly as written. A number whose
// text carries more precision than that double (1.00000000000000000001,
// 9007199254740993.0, the full expansion of the double nearest 0.1) would
// be hashed as one value and checked as another: two requests with the
// same hashes could get different verdicts, and each receipt would verify
// against the other's request. So the parser refuses them: a number is
// accepted only when its value is exactly the value of its canonical form.
// strictjson has already refused the numbers no double stands for (beyond
// its range, or nonzero but read as 0) and those written with more than
// strictjson.MaxNumberLen characters, which keeps strconv's reading, the
// hash's, right and the validator's exact arithmetic cheap.

const (
	inexactProblem = "is a number with more precision than a double holds: its receipt would record a different value than the one checked"
	inexactFix     = "Send the number with at most 15 significant digits, or exactly as a double prints it (its shortest form), or send it as a string."
)

// checkNumbers reports every number in v (at path) whose text is not
// exactly its canonical value, each naming where it is, until the problem
// list is full. They come in one order on every run (members by name,
// elements by index), so one request is refused one way: SPEC §3.
func checkNumbers(p *problems, path string, v any) {
	if !inexact(v) {
		return
	}
	var loc []locStep
	reportInexact(p, path, &loc, v)
}

// inexact reports whether v holds an inexact number. Only the answer is
// used, so Go's map order does not matter here, and the common case
// (every number exact) allocates nothing.
func inexact(v any) bool {
	switch x := v.(type) {
	case json.Number:
		return !exactNumber(string(x))
	case map[string]any:
		for _, e := range x {
			switch e.(type) {
			case string, bool, nil: // most members: nothing to look at
				continue
			}
			if inexact(e) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			switch e.(type) {
			case string, bool, nil:
				continue
			}
			if inexact(e) {
				return true
			}
		}
	}
	return false
}

// reportInexact adds a problem for each inexact number in v, whose
// location below path is *loc, walking members in sorted order. It runs
// only once inexact has found one, so the sorting costs nothing in the
// common case; a location is rendered only for a number it names.
func reportInexact(p *problems, path string, loc *[]locStep, v any) {
	switch x := v.(type) {
	case json.Number:
		if !exactNumber(string(x)) {
			p.add(fieldAt(path, *loc), inexactProblem, inexactFix)
		}
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k, e := range x {
			switch e.(type) {
			case string, bool, nil: // nothing to look at
				continue
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if p.more {
				return
			}
			*loc = append(*loc, locStep{key: k, idx: -1})
			reportInexact(p, path, loc, x[k])
			*loc = (*loc)[:len(*loc)-1]
		}
	case []any:
		for i, e := range x {
			if p.more {
				return
			}
			switch e.(type) {
			case string, bool, nil:
				continue
			}
			*loc = append(*loc, locStep{idx: i})
			reportInexact(p, path, loc, e)
			*loc = (*loc)[:len(*loc)-1]
		}
	}
}

// fieldAt renders a location below a request field the way problems name
// fields ("submitted_output.a[2].y").
func fieldAt(path string, loc []locStep) string {
	for _, s := range loc {
		if s.idx >= 0 {
			path += "[" + strconv.Itoa(s.idx) + "]"
		} else {
			path = key(path, s.key)
		}
	}
	return path
}

// exactNumber reports whether the decimal value of a JSON number text is
// the value of the shortest text that reads back as the same double (the
// digits RFC 8785 prints). A number with at most 15 significant digits in
// the normal range always is (a double holds 15 decimal digits exactly),
// if strconv reads its exponent as written; only others are parsed and
// compared.
func exactNumber(s string) bool {
	sig, exp := shape(s)
	if sig == 0 || sig <= 15 && exp > -300 && exp < 300 && exponentRead(s) { // zero, or short
		return true
	}
	neg, digits, exp := decimal(s)
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return false
	}
	cneg, cdigits, cexp := decimal(strconv.FormatFloat(f, 'e', -1, 64))
	if cdigits == "" {
		return false // a nonzero text that reads as zero
	}
	return neg == cneg && digits == cdigits && exp == cexp
}

// exponentRead reports whether strconv.ParseFloat reads the exponent of s
// as written. It stops adding exponent digits once the exponent reaches
// 10000, so "0.<100000 zeros>5e100001", exactly 5 and short by its
// digits, reads as 0: such a text must be compared, not assumed exact.
// (strictjson refuses it first, for its length; this keeps exactNumber
// right on its own.)
func exponentRead(s string) bool {
	i := strings.IndexAny(s, "eE")
	if i < 0 {
		return true
	}
	e := exponent(s[i+1:])
	return e > -10000 && e < 10000
}

// decimal normalizes a JSON number text to its sign, its significant
// digits without leading or trailing zeros, and the decimal exponent of
// the first of them ("120.50" → "1205", 2). Zero has no digits.
func decimal(s string) (neg bool, digits string, exp int) {
	if strings.HasPrefix(s, "-") {
		neg, s = true, s[1:]
	}
	mant, e, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	all := intPart + frac
	lead := len(all) - len(strings.TrimLeft(all, "0"))
	digits = strings.TrimRight(all[lead:], "0")
	if digits == "" {
		return neg, "", 0
	}
	// strictjson has already checked the exponent fits a double's range,
	// or the number is an integer that fits one; a huge exponent text
	// saturates rather than wrapping.
	return neg, digits, exponent(e) + len(intPart) - lead - 1
}

// exponent reads an exponent's text ("", "7", "+07", "-3"), saturating
// far beyond a double's range instead of overflowing.
func exponent(e string) int {
	neg := strings.HasPrefix(e, "-")
	n := 0
	for i := 0; i < len(e); i++ {
		if c := e[i]; c >= '0' && c <= '9' {
			n = min(n*10+int(c-'0'), 1<<20)
		}
	}
	if neg {
		return -n
	}
	return n
}

// shape is decimal without building the digits: how many significant
// digits the text has, and the exponent of the first. It allocates
// nothing, for the common case of short numbers.
func shape(s string) (sig, exp int) {
	i := 0
	if i < len(s) && s[i] == '-' {
		i++
	}
	intDigits, lead, total, trailing := 0, 0, 0, 0
	inFrac, seen := false, false
	for ; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			inFrac = true
			continue
		case c < '0' || c > '9':
			return exponentShape(s[i+1:], total-trailing, intDigits, lead)
		}
		if !inFrac {
			intDigits++
		}
		if !seen {
			if c == '0' {
				lead++
				continue
			}
			seen = true
		}
		total++
		if c == '0' {
			trailing++
		} else {
			trailing = 0
		}
	}
	return exponentShape("", total-trailing, intDigits, lead)
}

func exponentShape(e string, sig, intDigits, lead int) (int, int) {
	if sig == 0 {
		return 0, 0
	}
	return sig, exponent(e) + intDigits - lead - 1
}
