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
	if m == 0 {
		// Zero is 0·10^0 however it is written: "0e-1000000" is a valid
		// request number, and its exponent carried on would make every
		// comparison with it scale by 10^1000000.
		return 0, 0, true
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
// big·10^e once they do not (numbers far apart in magnitude: a term costs
// then as many word operations as the sum has digits, at most about 700
// for request numbers). Its zero value is 0.
type exactSum struct {
	m       int64
	e       int
	big     *big.Int // the digits once they outgrow m; nil until then
	t, u, v big.Int  // scratch for the big case
	set     bool     // e has been set by a nonzero term
}

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
	if m != 0 && !s.addSmall(m, e) {
		s.addBig(m, e)
	}
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

// sign is -1, 0 or +1 as the sum is negative, zero or positive.
func (s *exactSum) sign() int {
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

// pow10s holds 10^k for every k two request numbers' exponents can differ
// by: a last significant digit lies at most 17 digits below the smallest
// double's (5e-324) and at most at the largest's (1e308). Built once, on
// the first sum that needs them.
const exactSpan = 700

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
