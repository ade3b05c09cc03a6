package schema

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"math"
	"math/big"
	"slices"
	"strings"
)

// uniqueItems costs work in proportion to the array, not to the one step
// that applies the keyword, and it costs it twice: here and again in the
// validator, which runs after the walk and is not interrupted. Both are
// charged to the step budget before either is done, so that one small
// schema applying uniqueItems many times, or an array built to defeat a
// hash, is refused (TooComplexError) instead of running for seconds:
//
//   - one step per value hashed (every item and everything inside it; a
//     long string one per bytesPerValue of its text, a long number one per
//     digitsPerValue of its digits), which covers this walk's hash and the
//     validator's, whose hash of a number parses it into a big.Rat;
//   - for every comparison of two items the validator will make, the size
//     of the smaller one (its equality check stops at the first difference,
//     but where that is depends on map order, so the charge is the bound).
//
// The validator (jsonschema/v6 util.go duplicates) compares every pair of
// an array of at most 20 items, and otherwise compares each item with the
// earlier items of its hash bucket. Its hash is not the equality it checks:
// it drops the sign of numbers and writes strings and the parts of a
// rational without lengths, so 1 and -1, or ["a\u0004b"] and ["a","b"],
// land in one bucket, and an array of such items costs it quadratic time.
// validatorHash reproduces its buckets so that those comparisons are
// charged here, before the validator makes them.
//
// The walk's own verdict does not depend on either: it keys items by a
// content hash under JSON Schema equality (numbers by value, objects
// whatever their key order) with a per-process random seed, and compares
// only items whose hashes are equal, so its work is linear.

// smallArray is the size up to which the validator compares every pair;
// the walk does the same, so both make exactly the same comparisons.
const smallArray = 20

var hashSeed = maphash.MakeSeed()

// hasDuplicates reports whether arr has two items equal under JSON Schema
// equality. Its answer is meaningless once the walk has stopped (the step
// budget or the context ran out): the caller must check w.stop.
func (w *walker) hasDuplicates(arr []any) bool {
	if len(arr) < 2 {
		return false
	}
	var small [smallArray]int // a small array's sizes, without allocating
	if len(arr) <= smallArray {
		nodes := small[:len(arr)]
		for i, v := range arr {
			nodes[i] = countValues(v)
			if !w.spend(nodes[i]) {
				return false
			}
		}
		for i := 1; i < len(arr); i++ {
			for j := 0; j < i; j++ {
				if !w.spend(compareCost(arr[i], arr[j], nodes[i], nodes[j])) {
					return false
				}
				if equal(arr[i], arr[j]) {
					return true
				}
			}
		}
		return false
	}

	nodes := make([]int, len(arr))
	// own: the walk's buckets, by content hash; theirs: the validator's.
	// Each maps a hash to the last index with it; prev chains the earlier
	// ones.
	own := make(map[uint64]int, len(arr))
	theirs := make(map[uint64]int, len(arr))
	ownPrev := make([]int, len(arr))
	theirPrev := make([]int, len(arr))
	var vh maphash.Hash
	vh.SetSeed(hashSeed)
	for i, v := range arr {
		if i&63 == 0 && w.ctx.Err() != nil {
			w.stop = w.ctx.Err()
			return false
		}
		n := 0
		h := contentHash(v, &n)
		nodes[i] = n
		if !w.spend(n) {
			return false
		}
		vh.Reset()
		validatorHash(&vh, v)
		vk := vh.Sum64()
		theirPrev[i] = -1
		if j, ok := theirs[vk]; ok {
			theirPrev[i] = j
			for ; j >= 0; j = theirPrev[j] {
				if !w.spend(compareCost(v, arr[j], n, nodes[j])) {
					return false
				}
			}
		}
		theirs[vk] = i
		ownPrev[i] = -1
		if j, ok := own[h]; ok {
			ownPrev[i] = j
			for ; j >= 0; j = ownPrev[j] {
				if equal(v, arr[j]) {
					return true
				}
			}
		}
		own[h] = i
	}
	return false
}

// spend charges n steps: the one place the step budget is charged, a
// schema applied (one step) or a comparison's work (many at once). false
// once the budget is spent or the context is done. The context is checked
// each time the count passes a multiple of 1,024, however large the charge
// that passes it: checking only on an exact multiple would let charges of
// many steps at once skip every check.
func (w *walker) spend(n int) bool {
	if w.stop != nil {
		return false
	}
	before := w.steps
	w.steps += n
	if w.steps > w.limit {
		w.stop = &TooComplexError{MaxSteps: w.limit}
		return false
	}
	if before>>10 != w.steps>>10 && w.ctx.Err() != nil {
		w.stop = w.ctx.Err()
		return false
	}
	return true
}

// compareCost bounds the work of one equality check of a and b (the
// validator's equals, and the walk's equal): nothing past the top level
// when their types or lengths differ, else the size of the smaller one
// (the pairs of values the check can visit before it stops). uniqueItems
// and const and enum all price their comparisons here.
//
// na and nb are the sizes of a and b (valueSize), or 0 when the caller
// has not counted them: then they are counted here, only as far as the
// smaller one goes, so that a small value compared with a large one (an
// enum member with the whole output) costs little to price.
func compareCost(a, b any, na, nb int) int {
	switch a := a.(type) {
	case map[string]any:
		if b, ok := b.(map[string]any); !ok || len(a) != len(b) {
			return 1
		}
	case []any:
		if b, ok := b.([]any); !ok || len(a) != len(b) {
			return 1
		}
	case string:
		if b, ok := b.(string); !ok || len(a) != len(b) {
			return 1
		}
	default:
		if typeOf(a) == tNumber && typeOf(b) == tNumber {
			// The validator parses both into big.Rat.
			return max(valueSize(a), valueSize(b))
		}
		return 1
	}
	if na == 0 || nb == 0 {
		return minSize(a, b)
	}
	return min(na, nb)
}

// bytesPerValue is the length of string text that counts as one more
// value in a size. Comparing or hashing 4 KB of text costs the walk and
// the validator together a fraction of what a step does, so strings of
// ordinary length are one value each, and only long ones weigh more.
const bytesPerValue = 4096

// valueSize is the size of one value without what is inside it: 1, plus
// the length of a string's text in bytesPerValue, or a number's digits in
// digitsPerValue (numberDigits).
func valueSize(v any) int {
	switch x := v.(type) {
	case string:
		return 1 + len(x)/bytesPerValue
	case json.Number:
		return 1 + numberDigits(string(x))/digitsPerValue
	}
	return 1
}

// digitsPerValue is the number of digits of a number that count as one
// more value in a size (numberDigits). The validator parses a number into
// a big.Rat every time it hashes or compares it (jsonschema/v6 writeHash,
// equals), and that costs in proportion to the number's digits, its
// exponent's magnitude included: a pair of ordinary numbers, up to 15
// digits, costs it about what a step stands for, but one of 399 digits 20
// times as much, and 1.234567890123456e-300 (a 300-digit denominator) 6
// times. Sizes counted this way keep those within the step budget's time.
const digitsPerValue = 16

// exponentPerDigit is the magnitude of a number's exponent that weighs as
// one digit of its mantissa: the validator's big.Rat pays for an exponent
// with a power of ten, cheaper digit for digit than a mantissa's digits.
const exponentPerDigit = 4

// numberDigits weighs a JSON number literal by what parsing it into a
// big.Rat costs: the digits of its mantissa plus its exponent's magnitude
// over exponentPerDigit, either sign (saturated, so an exponent cannot
// overflow the count; the request decoder refuses such numbers before).
func numberDigits(s string) int {
	digits, exp, inExp := 0, 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == 'e' || c == 'E':
			inExp = true
		case c < '0' || c > '9':
		case !inExp:
			digits++
		case exp < 1<<20:
			exp = exp*10 + int(c-'0')
		}
	}
	return digits + exp/exponentPerDigit
}

// countValues is the size of v: the valueSize of every value in it,
// itself included.
func countValues(v any) int {
	return countUpTo(v, math.MaxInt)
}

// countUpTo is countValues(v), or limit if that is more: it stops
// counting there.
func countUpTo(v any, limit int) int {
	n := valueSize(v)
	switch v := v.(type) {
	case map[string]any:
		for _, m := range v {
			if n >= limit {
				break
			}
			n += countUpTo(m, limit-n)
		}
	case []any:
		for _, e := range v {
			if n >= limit {
				break
			}
			n += countUpTo(e, limit-n)
		}
	}
	return min(n, limit)
}

// minSize is min(countValues(a), countValues(b)), counted in time
// proportional to it: both are counted up to a limit that doubles until
// one of them falls short of it.
func minSize(a, b any) int {
	for limit := 64; ; limit *= 2 {
		na, nb := countUpTo(a, limit), countUpTo(b, limit)
		if na < limit || nb < limit {
			return min(na, nb)
		}
	}
}

// Tags of contentHash, one per JSON type.
const (
	hNull byte = iota
	hBool
	hNumber
	hString
	hArray
	hObject
	hMember
)

// contentHash hashes v so that values equal under JSON Schema equality
// hash equal: numbers by value (1 and 1.0 are one number: equal values
// have one float64 form, and the rare distinct values that share one are
// told apart by equal), objects by the sum of their members' hashes, so
// key order does not matter. n counts the size hashed (countValues).
func contentHash(v any, n *int) uint64 {
	*n += valueSize(v)
	switch x := v.(type) {
	case map[string]any:
		var sum uint64
		for k, m := range x {
			sum += mix(hMember, maphash.String(hashSeed, k), contentHash(m, n))
		}
		return mix(hObject, sum, uint64(len(x)))
	case []any:
		h := mix(hArray, uint64(len(x)), 0)
		for _, e := range x {
			h = mix(hArray, h, contentHash(e, n))
		}
		return h
	case nil:
		return mix(hNull, 0, 0)
	case bool:
		if x {
			return mix(hBool, 1, 0)
		}
		return mix(hBool, 0, 0)
	case string:
		return mix(hString, maphash.String(hashSeed, x), uint64(len(x)))
	}
	if f, ok := toFloat(v); ok {
		if f == 0 {
			f = 0 // -0 is 0
		}
		return mix(hNumber, math.Float64bits(f), 0)
	}
	// Past float64's range: the exact value (ParseFloat fails the same
	// way for every spelling of one value, so equal values get here
	// together).
	if r, ok := toRat(v); ok {
		return mix(hNumber, maphash.String(hashSeed, r.RatString()), 1)
	}
	return mix(hNumber, 0, 2)
}

func mix(tag byte, a, b uint64) uint64 {
	var buf [17]byte
	buf[0] = tag
	binary.LittleEndian.PutUint64(buf[1:], a)
	binary.LittleEndian.PutUint64(buf[9:], b)
	return maphash.Bytes(hashSeed, buf[:])
}

// validatorHash writes v to h exactly as the validator's writeHash
// (jsonschema/v6 util.go) does, so that two items share a bucket here
// exactly when they share one there.
func validatorHash(h *maphash.Hash, v any) {
	switch x := v.(type) {
	case map[string]any:
		h.WriteByte(0)
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			h.WriteByte(4)
			h.WriteString(k)
			validatorHash(h, x[k])
		}
	case []any:
		h.WriteByte(1)
		for _, e := range x {
			validatorHash(h, e)
		}
	case nil:
		h.WriteByte(2)
	case bool:
		h.WriteByte(3)
		if x {
			h.WriteByte(1)
		} else {
			h.WriteByte(0)
		}
	case string:
		h.WriteByte(4)
		h.WriteString(x)
	default:
		h.WriteByte(5)
		var buf [16]byte
		if num, den, ok := smallRat(v); ok {
			h.Write(appendMinimal(buf[:0], num))
			h.Write(appendMinimal(buf[8:8], den))
			return
		}
		if r, ok := new(big.Rat).SetString(fmt.Sprint(v)); ok {
			h.Write(r.Num().Bytes())
			h.Write(r.Denom().Bytes())
		}
	}
}

// smallRat is the validator's big.Rat of a plain decimal json.Number of
// at most 18 digits (no exponent), in lowest terms and without its sign,
// computed without big.Rat; ok is false for any other number.
func smallRat(v any) (num, den uint64, ok bool) {
	n, isNum := v.(json.Number)
	if !isNum {
		return 0, 0, false
	}
	s := strings.TrimPrefix(string(n), "-")
	den = 1
	digits, frac := 0, false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
			if digits++; digits > 18 {
				return 0, 0, false
			}
			num = num*10 + uint64(c-'0')
			if frac {
				den *= 10
			}
		case c == '.' && !frac:
			frac = true
		default:
			return 0, 0, false
		}
	}
	if digits == 0 {
		return 0, 0, false
	}
	if num == 0 {
		return 0, 1, true
	}
	a, b := num, den
	for b != 0 {
		a, b = b, a%b
	}
	return num / a, den / a, true
}

// appendMinimal appends u big-endian without leading zero bytes (none at
// all for 0), as big.Int.Bytes writes it.
func appendMinimal(dst []byte, u uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], u)
	i := 0
	for i < 8 && b[i] == 0 {
		i++
	}
	return append(dst, b[i:]...)
}
