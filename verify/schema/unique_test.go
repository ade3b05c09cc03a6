package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// jsonArray builds the text of an array of n items.
func jsonArray(n int, item func(i int) string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(item(i))
	}
	b.WriteByte(']')
	return b.String()
}

// signPatterns is n arrays of sixteen 1s and -1s, all different: the
// validator's hash drops the sign of numbers, so they share one bucket
// and it compares every pair (a quadratic 10 s for 3,000 of them).
func signPatterns(n int) string {
	return jsonArray(n, func(i int) string {
		p := make([]string, 16)
		for k := range p {
			p[k] = "1"
			if i>>k&1 == 1 {
				p[k] = "-1"
			}
		}
		return "[" + strings.Join(p, ",") + "]"
	})
}

// stepsOf runs the counting walk with an unlimited budget and returns the
// steps it charged.
func stepsOf(t *testing.T, s *Schema, inst any) int {
	t.Helper()
	w := walker{s: s, limit: 1 << 40, maxRegexWork: 1 << 60, ctx: context.Background()}
	var u uneval
	w.eval(s.sch, inst, &u, 0)
	if w.stop != nil {
		t.Fatal(w.stop)
	}
	return w.steps
}

func TestUniqueItemsWorkIsCharged(t *testing.T) {
	uniq := mustCompile(t, `{"type": "array", "uniqueItems": true}`)

	// 20,000 distinct one-member objects: every item hashed once, each
	// value one step; nothing quadratic.
	objects := decode(t, jsonArray(20_000, func(i int) string { return `{"a":"` + strconv.Itoa(i) + `"}` }))
	if got, want := stepsOf(t, uniq, objects), 1+20_000*2; got != want {
		t.Errorf("20,000 one-member objects cost %d steps; want %d (one per value)", got, want)
	}
	if rep, err := uniq.EvaluateWithin(objects, Options{}); err != nil || rep.Passed != rep.Total {
		t.Errorf("20,000 distinct objects: %+v, %v; want a pass", rep, err)
	}

	// The same array under uniqueItems applied a hundred times pays a
	// hundred times: the keyword's work is no longer free.
	many := mustCompile(t, `{"allOf": [`+strings.TrimSuffix(strings.Repeat(`{"uniqueItems": true},`, 100), ",")+`]}`)
	var tc *TooComplexError
	if _, err := many.EvaluateWithin(objects, Options{}); !errors.As(err, &tc) {
		t.Errorf("uniqueItems 100 times over 40,000 values: %v; want TooComplexError", err)
	}

	// Items the validator cannot tell apart by hash are charged for the
	// comparisons it would make, before it makes them.
	if _, err := uniq.EvaluateWithin(decode(t, signPatterns(3000)), Options{}); !errors.As(err, &tc) {
		t.Errorf("3,000 arrays colliding in the validator's hash: %v; want TooComplexError", err)
	}
	// A few such collisions cost little (the sign of 1 and -1 is common).
	if rep, err := uniq.EvaluateWithin(decode(t, signPatterns(100)), Options{}); err != nil || rep.Passed != rep.Total {
		t.Errorf("100 arrays colliding in the validator's hash: %+v, %v; want a pass", rep, err)
	}
	// The validator compares every pair of a small array.
	small := decode(t, jsonArray(20, func(i int) string { return `[1,2,3,` + strconv.Itoa(i) + `]` }))
	if got, want := stepsOf(t, uniq, small), 1+20*5+190*5; got != want {
		t.Errorf("20 arrays of 4 numbers cost %d steps; want %d (their values, and 190 comparisons)", got, want)
	}
}

func TestUniqueItemsStopsWithItsContext(t *testing.T) {
	uniq := mustCompile(t, `{"type": "array", "uniqueItems": true}`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	arr := decode(t, jsonArray(1000, strconv.Itoa))
	if _, err := uniq.EvaluateContext(ctx, arr, Options{}); !errors.Is(err, context.Canceled) {
		t.Errorf("uniqueItems over 1,000 items with a cancelled context: %v; want context.Canceled", err)
	}
}

// The walk's verdict on uniqueItems is the validator's, on arrays small
// (compared pairwise) and large (hashed), with every spelling of a value
// the equality of JSON Schema merges: 1, 1.0, 1e0, -0, objects in any key
// order.
func TestUniqueItemsAgreesWithTheValidator(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		n := r.IntN(5)
		if i%3 == 0 {
			n = 21 + r.IntN(40)
		}
		checkUniqueAgrees(t, randomArray(r, n))
	}
}

// FuzzUniqueItems builds arrays from the fuzzer's bytes and checks the
// walk's uniqueItems verdict against the validator's.
func FuzzUniqueItems(f *testing.F) {
	f.Add(uint64(1), uint8(3))
	f.Add(uint64(7), uint8(30))
	f.Add(uint64(42), uint8(60))
	f.Fuzz(func(t *testing.T, seed uint64, n uint8) {
		checkUniqueAgrees(t, randomArray(rand.New(rand.NewPCG(seed, 0)), int(n)))
	})
}

func checkUniqueAgrees(t *testing.T, text string) {
	t.Helper()
	for _, schema := range []string{`{"uniqueItems": true}`, `{"$schema": "http://json-schema.org/draft-07/schema#", "uniqueItems": true}`} {
		s := mustCompile(t, schema)
		inst := decode(t, text)
		walked, _, ok := s.count(inst, false, DefaultMaxSteps)
		if !ok {
			t.Fatalf("%s: over the step budget", text)
		}
		valid := s.sch.Validate(inst) == nil
		if (walked.failed == 0) != valid {
			t.Fatalf("%s: the walk says %d of %d failed, the validator says valid = %v", text, walked.failed, walked.total, valid)
		}
	}
}

// spellings are values with several spellings that JSON Schema equality
// merges, and values the validator's hash merges though they differ.
var spellings = [][]string{
	{`1`, `1.0`, `1e0`, `10e-1`, `0.1e1`},
	{`-1`, `-1.00`},
	{`0`, `-0`, `0.0`, `0e5`},
	{`0.5`, `5e-1`, `0.50`},
	{`-0.5`},
	{`257`}, {`256`}, {`1.00390625`}, {`0.00390625`},
	{`12345678901234567890`, `1.234567890123456789e19`},
	{`"a"`}, {`"a\u0004b"`}, {`"b"`}, {`""`},
	{`null`}, {`true`}, {`false`},
	{`{}`}, {`[]`},
}

// randomArray is the text of an array of n values drawn from spellings,
// nested in arrays and objects, with duplicates likely.
func randomArray(r *rand.Rand, n int) string {
	return jsonArray(n, func(int) string { return randomValue(r, 2) })
}

func randomValue(r *rand.Rand, depth int) string {
	switch k := r.IntN(10); {
	case depth > 0 && k == 0:
		return "[" + strings.Join(randomValues(r, depth-1), ",") + "]"
	case depth > 0 && k == 1:
		vals := randomValues(r, depth-1)
		keys := []string{`"a"`, `"b"`, `"a\u0004"`, `""`}
		r.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
		members := make([]string, len(vals))
		for i, v := range vals {
			members[i] = keys[i%len(keys)] + ":" + v
		}
		return "{" + strings.Join(members[:min(len(members), len(keys))], ",") + "}"
	default:
		set := spellings[r.IntN(len(spellings))]
		return set[r.IntN(len(set))]
	}
}

func randomValues(r *rand.Rand, depth int) []string {
	out := make([]string, r.IntN(3))
	for i := range out {
		out[i] = randomValue(r, depth)
	}
	return out
}

// smallRat must give the validator's big.Rat parts exactly.
func TestSmallRatIsTheValidatorsRational(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	cases := []string{"0", "-0", "0.0", "1", "-1", "10", "0.5", "12.5", "100.25", "999999999999999999", "0.00000000000000001", "-123.4560"}
	for range 2000 {
		s := strconv.FormatUint(r.Uint64N(1_000_000_000_000), 10)
		if p := r.IntN(len(s) + 1); p < len(s) {
			s = s[:p] + "." + s[p:]
			if p == 0 {
				s = "0" + s
			}
		}
		if r.IntN(2) == 0 {
			s = "-" + s
		}
		cases = append(cases, s)
	}
	for _, s := range cases {
		num, den, ok := smallRat(json.Number(s))
		if !ok {
			t.Fatalf("smallRat(%s) not ok", s)
		}
		rat, _ := new(big.Rat).SetString(fmt.Sprint(json.Number(s)))
		if got, want := string(appendMinimal(nil, num))+"/"+string(appendMinimal(nil, den)),
			string(rat.Num().Bytes())+"/"+string(rat.Denom().Bytes()); got != want {
			t.Errorf("smallRat(%s) = %d/%d; the validator's rational is %v", s, num, den, rat)
		}
	}
	for _, s := range []string{"1e5", "1234567890123456789", "1E0"} {
		if _, _, ok := smallRat(json.Number(s)); ok {
			t.Errorf("smallRat(%s) is ok; want the big.Rat fallback", s)
		}
	}
}
