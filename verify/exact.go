package verify

import (
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"sync"
)

// Rules add and compare numbers exactly, as decimals. Every number of a
// request means exactly its canonical text, the shortest that reads back
// as its double (number.go refuses the others), so each has one exact
// decimal value: 0.1 is one tenth. Adding the doubles instead would round
// at every step, and an absolute tolerance below the rounding error could
// never hold (8885256.47 + 2962356.65 is 11847613.120000001 in doubles,
// more than 1e-9 off 11847613.12), nor could tolerance 0 hold for
// 0.1 + 0.2 = 0.3, and a sum could overflow to infinity on the way.

// exactOf is the exact decimal value of f's canonical text, m·10^e (a
// canonical text has at most 17 significant digits). f is finite: every
// number of a decoded request is.
func exactOf(f float64) (m int64, e int) {
	var buf [32]byte
	m, e, _ = exactText(string(strconv.AppendFloat(buf[:0], f, 'e', -1, 64)))
	return m, e
}

// exactText is the exact decimal value of a number's text as written,
// m·10^e, read without allocating; ok is false past 18 significant
// digits, which no accepted number has (its value is its canonical
// text's, at most 17 digits: number.go).
func exactText(s string) (m int64, e int, ok bool) {
	i, neg := 0, false
	if i < len(s) && s[i] == '-' {
		neg, i = true, i+1
	}
	sig, zeros, frac := 0, 0, false // zeros: trailing zeros not yet in m
	for ; i < len(s); i++ {
		c := s[i]
		if c == '.' {
			frac = true
			continue
		}
		if c < '0' || c > '9' {
			e += exponent(s[i+1:])
			break
		}
		if frac {
			e--
		}
		if c == '0' {
			if m != 0 {
				zeros++
			}
			continue
		}
		if sig += zeros + 1; sig > 18 {
			return 0, 0, false
		}
		for ; zeros > 0; zeros-- {
			m *= 10
		}
		m = m*10 + int64(c-'0')
	}
	if neg {
		m = -m
	}
	return m, e + zeros, true
}

// exactJSON is the exact decimal value of n, a number of a decoded
// request.
func exactJSON(n json.Number) (int64, int) {
	if m, e, ok := exactText(string(n)); ok {
		return m, e
	}
	return exactOf(number(n)) // not reached for an accepted request
}

// exactSum is an exact decimal sum: m·10^e while its digits fit an int64,
// which keeps the common case (money, counts) to integer additions, and
// big·10^e once they do not. Terms that do not fit the int64 total (numbers
// far apart in magnitude, or very many of them) wait in int64 parts, one
// per exponent, and reach the big total only when a part would overflow
// (once in about 90 terms) or the sum is read: adding stays a few
// nanoseconds a term whatever the numbers, within the work unit each
// value is charged. Its zero value is 0.
type exactSum struct {
	m       int64
	e       int
	big     *big.Int // the digits once they outgrow m; nil until then
	t, u, v big.Int  // scratch for the big case
	set     bool     // e has been set by a nonzero term

	parts  *[exactSpan]int64 // terms waiting, by exponent - exactMinExp
	lo, hi int               // the range of parts that may be nonzero
}

// The exponents a term can have: a request number's last significant
// digit is at most 17 digits below the smallest double's (5e-324) and at
// most at the largest's (1e308).
const (
	exactMinExp = -360
	exactSpan   = 700
)

// add adds f's exact value (that of its canonical text).
func (s *exactSum) add(f float64) {
	m, e := exactOf(f)
	s.addDec(m, e)
}

// addJSON adds n's exact value.
func (s *exactSum) addJSON(n json.Number) {
	m, e := exactJSON(n)
	s.addDec(m, e)
}

// addDec adds m·10^e.
func (s *exactSum) addDec(m int64, e int) {
	if m == 0 || s.addSmall(m, e) {
		return
	}
	i := e - exactMinExp
	if i < 0 || i >= exactSpan { // not reached for request numbers
		s.addBig(m, e)
		return
	}
	if s.parts == nil {
		s.parts, s.lo, s.hi = new([exactSpan]int64), i, i
	}
	s.lo, s.hi = min(s.lo, i), max(s.hi, i)
	if r, ok := add64(s.parts[i], m); ok {
		s.parts[i] = r
		return
	}
	s.addBig(s.parts[i], e)
	s.parts[i] = m
}

// addSmall adds m·10^e to the int64 total if the result fits it.
func (s *exactSum) addSmall(m int64, e int) bool {
	switch {
	case s.big != nil:
		return false
	case !s.set:
		s.m, s.e, s.set = m, e, true
		return true
	case e >= s.e:
		if v, ok := mulPow10(m, e-s.e); ok {
			if r, ok := add64(s.m, v); ok {
				s.m = r
				return true
			}
		}
	default:
		if v, ok := mulPow10(s.m, s.e-e); ok {
			if r, ok := add64(v, m); ok {
				s.m, s.e = r, e
				return true
			}
		}
	}
	return false
}

// addBig adds m·10^e to the total, moving it to big.
func (s *exactSum) addBig(m int64, e int) {
	if s.big == nil {
		s.big = new(big.Int).SetInt64(s.m)
		if !s.set {
			s.e, s.set = e, true
		}
	}
	s.t.SetInt64(m)
	if e >= s.e {
		s.u.Mul(&s.t, pow10(e-s.e))
		s.big.Add(s.big, &s.u)
		return
	}
	s.u.Mul(s.big, pow10(s.e-e))
	s.big.Add(&s.u, &s.t)
	s.e = e
}

// settle moves the waiting parts into the total, before it is read.
func (s *exactSum) settle() {
	if s.parts == nil {
		return
	}
	for i := s.lo; i <= s.hi; i++ {
		if m := s.parts[i]; m != 0 {
			if !s.addSmall(m, i+exactMinExp) {
				s.addBig(m, i+exactMinExp)
			}
			s.parts[i] = 0
		}
	}
	s.lo, s.hi = exactSpan, -1
}

// sign is -1, 0 or +1 as the sum is negative, zero or positive.
func (s *exactSum) sign() int {
	s.settle()
	if s.big != nil {
		return s.big.Sign()
	}
	switch {
	case s.m < 0:
		return -1
	case s.m > 0:
		return 1
	}
	return 0
}

// within reports whether |s| ≤ tol, exactly.
func (s *exactSum) within(tol float64) bool {
	m, e := exactOf(tol)
	if s.sign() >= 0 {
		return s.cmp(m, e) <= 0
	}
	return s.cmp(-m, e) >= 0
}

// cmp is -1, 0 or +1 as s is less than, equal to or greater than m·10^e.
func (s *exactSum) cmp(m int64, e int) int {
	s.settle()
	if s.big == nil {
		if e >= s.e {
			if v, ok := mulPow10(m, e-s.e); ok {
				return cmp64(s.m, v)
			}
		} else if v, ok := mulPow10(s.m, s.e-e); ok {
			return cmp64(v, m)
		}
	}
	a := s.big
	if a == nil {
		a = s.u.SetInt64(s.m)
	}
	s.t.SetInt64(m)
	if e >= s.e {
		return a.Cmp(s.v.Mul(&s.t, pow10(e-s.e)))
	}
	return s.v.Mul(a, pow10(s.e-e)).Cmp(&s.t)
}

// float is the double nearest the sum (±Inf past a double's range), for
// the texts that show it.
func (s *exactSum) float() float64 {
	s.settle()
	digits := strconv.FormatInt(s.m, 10)
	if s.big != nil {
		digits = s.big.String()
	}
	f, err := strconv.ParseFloat(digits+"e"+strconv.Itoa(s.e), 64)
	if err != nil && !math.IsInf(f, 0) { // cannot happen: the text is a number
		return math.NaN()
	}
	return f
}

func cmp64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// mulPow10 is m·10^k, if it fits an int64.
func mulPow10(m int64, k int) (int64, bool) {
	if m == 0 {
		return 0, true
	}
	for ; k > 0; k-- {
		if m > math.MaxInt64/10 || m < math.MinInt64/10 {
			return 0, false
		}
		m *= 10
	}
	return m, true
}

// add64 is a+b, if it fits an int64.
func add64(a, b int64) (int64, bool) {
	r := a + b
	if (a > 0 && b > 0 && r < 0) || (a < 0 && b < 0 && r >= 0) {
		return 0, false
	}
	return r, true
}

// pow10s holds 10^k for every k two terms' exponents can differ by (less
// than exactSpan), built once on the first sum that needs them.
var pow10s = sync.OnceValue(func() []*big.Int {
	p := make([]*big.Int, exactSpan)
	p[0] = big.NewInt(1)
	ten := big.NewInt(10)
	for k := 1; k < len(p); k++ {
		p[k] = new(big.Int).Mul(p[k-1], ten)
	}
	return p
})

func pow10(k int) *big.Int {
	if p := pow10s(); k < len(p) {
		return p[k]
	}
	return new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(k)), nil)
}
