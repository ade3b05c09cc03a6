package verify

import (
	"math"
	"math/big"
	"strconv"
	"testing"
	"testing/quick"
)

// Sums and tolerances are exact decimal arithmetic on the numbers as
// written. (Before: they were doubles, so an invoice whose amounts add up
// exactly failed the default tolerance, tolerance 0 failed 0.1 + 0.2 = 0.3,
// and 1e308 + 1e308 - 1e308 summed to infinity.)
func TestSumEqualsIsExact(t *testing.T) {
	v := New(Config{})
	for _, c := range []struct {
		output, rule, result, found string
	}{
		{`{"line_items":[{"line_total":8885256.47},{"line_total":2962356.65}],"total":11847613.12}`,
			`{"type":"sum_equals","field":"line_items[].line_total","equals_field":"total"}`, "pass", ""},
		{`{"l":[0.1,0.2],"t":0.3}`, `{"type":"sum_equals","field":"l[]","equals_field":"t","tolerance":0}`, "pass", ""},
		{`{"l":[1e308,1e308,-1e308],"t":1e308}`, `{"type":"sum_equals","field":"l[]","equals_field":"t"}`, "pass", ""},
		{`{"l":[5e-324,1e308,-1e308],"t":0}`, `{"type":"sum_equals","field":"l[]","equals":5e-324,"tolerance":0}`, "pass", ""},
		// Off by exactly the tolerance passes; a hair more fails, and the
		// found text shows the sum as the double nearest it.
		{`{"l":[0.1,0.2],"t":0.31}`, `{"type":"sum_equals","field":"l[]","equals_field":"t","tolerance":0.01}`, "pass", ""},
		{`{"l":[0.1,0.2],"t":0.3100000001}`, `{"type":"sum_equals","field":"l[]","equals_field":"t","tolerance":0.01}`, "fail", "sum 0.3"},
		{`{"l":[1e308,1e308],"t":0}`, `{"type":"sum_equals","field":"l[]","equals_field":"t"}`, "fail", "sum inf"},
		{`{"l":[0.1,0.2,0.3],"t":0}`, `{"type":"sum_equals","field":"l[]","equals_field":"t"}`, "fail", "sum 0.6"},
	} {
		r := check(t, v, body(`submitted_output=`+c.output, `rules=[`+c.rule+`]`, `enforce_rules=true`))
		if r.Result != c.result {
			t.Errorf("%s %s: result %s (%q), want %s", c.output, c.rule, r.Result, r.Errors, c.result)
			continue
		}
		if c.found != "" && (len(r.ErrorsDetail) != 1 || r.ErrorsDetail[0].Found != c.found) {
			t.Errorf("%s %s: %+v, want found %q", c.output, c.rule, r.ErrorsDetail, c.found)
		}
	}
}

// gte and lte measure their slack exactly too: a value exactly tolerance
// below (above) the limit passes, one a hair further fails. (Before: 5.22
// failed gte 6.11 with tolerance 0.89, 6.11 - 0.89 being 5.220000000000001
// in doubles.)
func TestCompareToleranceIsExact(t *testing.T) {
	v := New(Config{})
	for _, c := range []struct {
		output, rule, result string
	}{
		{`{"n":5.22}`, `{"type":"gte","field":"n","value":6.11,"tolerance":0.89}`, "pass"},
		{`{"n":5.21}`, `{"type":"gte","field":"n","value":6.11,"tolerance":0.89}`, "fail"},
		{`{"n":4.86}`, `{"type":"lte","field":"n","value":4.39,"tolerance":0.47}`, "pass"},
		{`{"n":4.87}`, `{"type":"lte","field":"n","value":4.39,"tolerance":0.47}`, "fail"},
		{`{"n":0.2}`, `{"type":"gte","field":"n","value":0.3,"tolerance":0.1}`, "pass"},
		{`{"n":0.19999999999999998}`, `{"type":"gte","field":"n","value":0.3,"tolerance":0.1}`, "fail"},
		{`{"n":0.4}`, `{"type":"lte","field":"n","value":0.3,"tolerance":0.1}`, "pass"},
		{`{"n":0.4000000000000001}`, `{"type":"lte","field":"n","value":0.3,"tolerance":0.1}`, "fail"},
		{`{"n":1e308}`, `{"type":"lte","field":"n","value":-1e308,"tolerance":1.7976931348623157e308}`, "fail"},
		{`{"n":-1e308}`, `{"type":"gte","field":"n","value":1e308,"tolerance":1e308}`, "fail"},
	} {
		r := check(t, v, body(`submitted_output=`+c.output, `rules=[`+c.rule+`]`, `enforce_rules=true`))
		if r.Result != c.result {
			t.Errorf("%s %s: result %s (%q), want %s", c.output, c.rule, r.Result, r.Errors, c.result)
		}
	}
}

// exactSum agrees with math/big's rationals on the canonical texts of
// random doubles, of any magnitudes, and rounds to the same double.
func TestExactSumMatchesRationals(t *testing.T) {
	rat := func(f float64) *big.Rat {
		r, _ := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
		return r
	}
	prop := func(xs []float64, scale []int8) bool {
		var s exactSum
		want := new(big.Rat)
		for i, x := range xs {
			if i < len(scale) {
				x = math.Ldexp(x, int(scale[i])*8)
			}
			if math.IsInf(x, 0) || math.IsNaN(x) {
				continue
			}
			s.add(x)
			want.Add(want, rat(x))
		}
		wf, _ := want.Float64()
		got := s.float()
		return s.sign() == want.Sign() && (got == wf || math.IsInf(got, 0) && math.Abs(wf) == math.MaxFloat64)
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 2000}); err != nil {
		t.Error(err)
	}
}

// Every spelling of a double that number.go accepts reads, as written, as
// the exact value of its canonical text.
func TestExactTextOfEverySpelling(t *testing.T) {
	prop := func(f float64) bool {
		if math.IsInf(f, 0) || math.IsNaN(f) {
			return true
		}
		m, e := exactOf(f)
		for _, s := range spellings(f) {
			if !exactNumber(s) {
				continue
			}
			if gm, ge, ok := exactText(s); !ok || gm != m || ge != e {
				t.Logf("%s: %d·10^%d (%v), want %d·10^%d", s, gm, ge, ok, m, e)
				return false
			}
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 2000}); err != nil {
		t.Error(err)
	}
	for s, want := range map[string][2]int64{"120.50": {1205, -1}, "0.001": {1, -3}, "-1E+2": {-1, 2},
		"1.0000000000000000000": {1, 0}, "0.0": {0, 0}, "5e-324": {5, -324},
		// Zero is 0·10^0 however written. (Before: 0e-1000000 kept its
		// exponent, and gte/lte with a tolerance computed 10^1000000 in
		// math/big for every such value, 50 ms each, uncharged.)
		"0e-1000000": {0, 0}, "-0.000E+999999": {0, 0}, "-0": {0, 0}} {
		if m, e, ok := exactText(s); !ok || m != want[0] || int64(e) != want[1] {
			t.Errorf("exactText(%s) = %d·10^%d, %v; want %d·10^%d", s, m, e, ok, want[0], want[1])
		}
	}
}
