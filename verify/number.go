package verify

import (
	"encoding/json"
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

const (
	inexactProblem = "is a number with more precision than a double holds: its receipt would record a different value than the one checked"
	inexactFix     = "Send the number with at most 15 significant digits, or exactly as a double prints it (its shortest form), or send it as a string."
)

// checkNumbers reports, for the first number in v (at path) whose text is
// not exactly its canonical value, a problem naming where it is.
func checkNumbers(p *problems, path string, v any) bool {
	switch x := v.(type) {
	case json.Number:
		if !exactNumber(string(x)) {
			p.add(path, inexactProblem, inexactFix)
			return false
		}
	case map[string]any:
		for k, e := range x {
			if _, ok := e.(string); ok { // most members: nothing to look at
				continue
			}
			if !checkNumbers(p, key(path, k), e) {
				return false
			}
		}
	case []any:
		for i, e := range x {
			if _, ok := e.(string); ok {
				continue
			}
			if !checkNumbers(p, path+"["+strconv.Itoa(i)+"]", e) {
				return false
			}
		}
	}
	return true
}

// exactNumber reports whether the decimal value of a JSON number text is
// the value of the shortest text that reads back as the same double (the
// digits RFC 8785 prints). A number with at most 15 significant digits in
// the normal range always is (a double holds 15 decimal digits exactly);
// only longer ones are parsed and compared.
func exactNumber(s string) bool {
	neg, digits, exp := decimal(s)
	if digits == "" { // zero, however written
		return true
	}
	if len(digits) <= 15 && exp > -300 && exp < 300 {
		return true
	}
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
	n, err := strconv.Atoi(strings.TrimPrefix(e, "+"))
	if e != "" && err != nil {
		n = 1 << 20
		if strings.HasPrefix(e, "-") {
			n = -n
		}
	}
	return neg, digits, n + len(intPart) - lead - 1
}
