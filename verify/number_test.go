package verify

import (
	"errors"
	"math"
	"math/big"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/quick"
	"time"

	"github.com/aovhq/aov/apierr"
)

func TestInexactNumbersRefused(t *testing.T) {
	v := New(Config{})
	for _, c := range []struct {
		output, field string
	}{
		{`{"n": 9007199254740993.0}`, "submitted_output.n"},
		{`{"n": 9007199254740993e0}`, "submitted_output.n"},
		{`{"n": 1.00000000000000000001}`, "submitted_output.n"},
		{`[1, 0.1000000000000000055511151231257827021181583404541015625]`, "submitted_output[1]"},
		{`{"x": 1}, "rules": [{"type": "gte", "field": "x", "value": 0.30000000000000000001}]`, "rules[0].value"},
	} {
		body := `{"task_id": "t", "expected_schema": {}, "submitted_output": ` + c.output + `}`
		_, err := v.Parse([]byte(body))
		var e *apierr.Error
		if !errors.As(err, &e) || e.Status != 422 || len(e.Fields) != 1 || e.Fields[0].Field != c.field ||
			!strings.Contains(e.Fields[0].Problem, "more precision than a double holds") {
			t.Errorf("%s: %v; want a 422 naming %s", c.output, err, c.field)
		}
	}
	for _, ok := range []string{`1.0`, `1e0`, `10.50`, `0.1`, `9007199254740991`, `-0`, `0.0`, `1E+2`, `1.7976931348623157e308`,
		`5e-324`, `0.30000000000000004`, `123456789012345.6`, `1.0000000000000000000`, `2.2250738585072014e-308`} {
		body := `{"task_id": "t", "expected_schema": {}, "submitted_output": ` + ok + `}`
		if _, err := v.Parse([]byte(body)); err != nil {
			t.Errorf("%s: %v; want it accepted (its text is exactly its double)", ok, err)
		}
	}
	// The schema is checked too: its limits are hashed as doubles.
	body := `{"task_id": "t", "expected_schema": {"maximum": 1.00000000000000000001}, "submitted_output": 1}`
	if _, err := v.Parse([]byte(body)); err == nil || !strings.Contains(err.Error(), "expected_schema.maximum") {
		t.Errorf("an inexact schema limit: %v; want a 422 naming expected_schema.maximum", err)
	}
}

// spellings writes one double many ways: the ways that mean exactly its
// value, and ways that read as the same double but mean another value.
func spellings(f float64) []string {
	short := strconv.FormatFloat(f, 'g', -1, 64)
	e := strconv.FormatFloat(f, 'e', -1, 64)
	mant, exp, _ := strings.Cut(e, "e")
	n, _ := strconv.Atoi(exp)
	out := []string{
		short,
		mant + "e" + strconv.Itoa(n),
		mant + "E+0" + strconv.Itoa(n),
		strconv.FormatFloat(f, 'e', 16, 64),         // 17 digits
		strconv.FormatFloat(f, 'e', 20, 64),         // 21 digits, rounded
		new(big.Float).SetFloat64(f).Text('g', 800), // the exact binary value
	}
	if !strings.Contains(mant, ".") {
		mant += ".0"
	}
	out = append(out,
		mant+"000e"+strconv.Itoa(n),                  // trailing zeros: same value
		mant+"00000000000000000001e"+strconv.Itoa(n), // a little more, same double
		mant+"0000000000000000000e"+strconv.Itoa(n),
	)
	return out
}

// The verdict follows the hash: requests with the same request_hash that
// are accepted get the same result, whatever their numbers' spelling, in
// the output and in the schema.
func TestVerdictFollowsTheHash(t *testing.T) {
	v := New(Config{})
	type answer struct {
		result string
		text   string
	}
	verdict := func(body string) (hash, result string, ok bool) {
		req, err := v.Parse([]byte(body))
		if err != nil {
			var e *apierr.Error
			if !errors.As(err, &e) || e.Status != 422 {
				t.Fatalf("%s: %v", body, err)
			}
			return "", "", false
		}
		return req.Hashes.Request, v.Check(req, "id", verifiedAt).Result, true
	}
	prop := func(bits uint64, scale int8) bool {
		f := math.Float64frombits(bits)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return true
		}
		if scale%3 == 0 { // also plain, human-sized numbers
			f = math.Round(f) / math.Pow(10, float64(scale%7))
			if math.IsNaN(f) || math.IsInf(f, 0) {
				return true
			}
		}
		limit := strconv.FormatFloat(f, 'g', -1, 64)
		seen := map[string]answer{}
		for _, side := range []string{"output", "schema"} {
			for _, s := range spellings(f) {
				var body string
				if side == "output" {
					body = `{"task_id":"t","expected_schema":{"maximum":` + limit + `,"minimum":` + limit + `},"submitted_output":` + s + `}`
				} else {
					body = `{"task_id":"t","expected_schema":{"maximum":` + s + `,"minimum":` + s + `},"submitted_output":` + limit + `}`
				}
				hash, result, ok := verdict(body)
				if !ok {
					continue
				}
				if prev, dup := seen[hash]; dup && prev.result != result {
					t.Logf("same request_hash, different verdicts: %q → %s, %q → %s", prev.text, prev.result, s, result)
					return false
				}
				seen[hash] = answer{result, s}
			}
			// The canonical spelling itself is never refused, and passes
			// against itself.
			body := `{"task_id":"t","expected_schema":{"maximum":` + limit + `,"minimum":` + limit + `},"submitted_output":` + limit + `}`
			if _, result, ok := verdict(body); !ok || result != ResultPass {
				t.Logf("%s against itself: accepted %v, %s", limit, ok, result)
				return false
			}
		}
		return true
	}
	if err := quick.Check(prop, &quick.Config{MaxCount: 300}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []float64{1, 0.1, 9007199254740992, 1e21, 1e-7, 5e-324, math.MaxFloat64, 135, 129.5} {
		if !prop(math.Float64bits(f), 1) {
			t.Errorf("%v: verdicts differ under one hash", f)
		}
	}
}

func TestDecimal(t *testing.T) {
	for _, c := range []struct {
		in     string
		neg    bool
		digits string
		exp    int
	}{
		{"120.50", false, "1205", 2}, {"0.00123", false, "123", -3}, {"1.5e3", false, "15", 3},
		{"-1.5E-07", true, "15", -7}, {"0", false, "", 0}, {"-0.000", true, "", 0}, {"7", false, "7", 0},
		{"1.5e+03", false, "15", 3}, {"100", false, "1", 2}, {"0.0102e-2", false, "102", -4},
		{"1e99999999999999999999", false, "1", 1 << 20}, {"120.50E1", false, "1205", 3},
	} {
		neg, digits, exp := decimal(c.in)
		if neg != c.neg || digits != c.digits || exp != c.exp {
			t.Errorf("decimal(%s) = %v %q %d; want %v %q %d", c.in, neg, digits, exp, c.neg, c.digits, c.exp)
		}
		if sig, exp := shape(c.in); sig != len(c.digits) || exp != c.exp {
			t.Errorf("shape(%s) = %d, %d; want %d, %d", c.in, sig, exp, len(c.digits), c.exp)
		}
	}
}

// FuzzExactNumber compares the number check with math/big: a number text
// is accepted exactly when its value is the value of the shortest text of
// the double strconv reads (whatever its length, and even where strconv
// misreads the exponent), and the allocation-free shape agrees with
// decimal.
func FuzzExactNumber(f *testing.F) {
	for _, s := range []string{"1", "1.0", "1e0", "0.1", "9007199254740993.0", "1.00000000000000000001", "-0", "5e-324",
		"1e-400", "0.1000000000000000055511151231257827021181583404541015625", "123456789012345678", "1.7976931348623157e308",
		"1e-100000", "0e100000", "0." + strings.Repeat("0", 390) + "5e391", "0." + strings.Repeat("0", 100000) + "5e100001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !jsonNumber.MatchString(s) {
			return
		}
		neg, digits, exp := decimal(s)
		if sig, e := shape(s); sig != len(digits) || (sig > 0 && e != exp) {
			t.Fatalf("shape(%s) = %d, %d; decimal = %v %q %d", s, sig, e, neg, digits, exp)
		}
		fl, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return // out of a double's range: strictjson refuses it first
		}
		exact, ok := new(big.Rat).SetString(s)
		if !ok {
			t.Fatalf("big.Rat cannot read %s", s)
		}
		canonical, _ := new(big.Rat).SetString(strconv.FormatFloat(fl, 'g', -1, 64))
		if want := exact.Cmp(canonical) == 0; exactNumber(s) != want {
			t.Fatalf("exactNumber(%s) = %v; its value equals its double's shortest form: %v", s, !want, want)
		}
	})
}

// Exponents up to six digits: strconv.ParseFloat misreads some of those.
var jsonNumber = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]{1,6})?$`)

// A number that is not zero but that a double reads as zero is refused
// where the request is parsed, wherever it is: the receipt would hash 0
// and the bounds and rules would see 0, while the schema validator compares
// its exact value. "0.<100000 zeros>5e100001" is exactly 5, but
// strconv.ParseFloat stops reading an exponent past 10000 and reads 0: it
// used to pass "minimum": 0.4 under the hashes of {"x":0}.
func TestNumbersThatReadAsZeroRefused(t *testing.T) {
	saturated := "0." + strings.Repeat("0", 100000) + "5e100001"
	if exactNumber(saturated) {
		t.Errorf("exactNumber calls a text strconv reads as 0 exact")
	}
	v := New(Config{})
	schema := `{"type":"object","required":["x"],"properties":{"x":{"type":"number","minimum":0.4}}}`
	for _, c := range []struct{ body, field, problem string }{
		{`{"task_id":"t","expected_schema":` + schema + `,"submitted_output":{"x":` + saturated + `}}`,
			"submitted_output.x", "a number is written with more than 400 characters"},
		{`{"task_id":"t","expected_schema":` + schema + `,"submitted_output":{"x":[1,1e-400]}}`,
			"submitted_output.x[1]", "a number is too small to be represented as a double: it would read as 0"},
		{`{"task_id":"t","expected_schema":{"minimum":-2e-324},"submitted_output":0}`,
			"expected_schema.minimum", "a number is too small to be represented as a double: it would read as 0"},
		{`{"task_id":"t","expected_schema":{},"submitted_output":{"x":1},"rules":[{"type":"gte","field":"x","value":1e-99999}]}`,
			"rules[0].value", "a number is too small to be represented as a double: it would read as 0"},
		{`{"task_id":"t","expected_schema":{},"submitted_output":{"x":1},"bounds":{"x":{"max":-1e-400}}}`,
			"bounds.x.max", "a number is too small to be represented as a double: it would read as 0"},
	} {
		_, err := v.Parse([]byte(c.body))
		var e *apierr.Error
		if !errors.As(err, &e) || e.Status != 422 || e.Code != "invalid_request" || len(e.Fields) != 1 ||
			e.Fields[0].Field != c.field || e.Fields[0].Problem != c.problem || e.Fields[0].Fix == "" {
			t.Errorf("%.80s…: %v; want a 422 naming %s: %s", c.body, err, c.field, c.problem)
		}
	}
	// Zero stays zero however it is written, and the smallest double is a
	// number like any other.
	for _, ok := range []string{`0e-400`, `-0.0e99999`, `5e-324`, `-5e-324`} {
		body := `{"task_id":"t","expected_schema":{},"submitted_output":` + ok + `}`
		if _, err := v.Parse([]byte(body)); err != nil {
			t.Errorf("%s: %v; want it accepted", ok, err)
		}
	}
}

// A number's text is capped (strictjson.MaxNumberLen) in the output, the
// schema, the rules and the bounds alike: the validator's exact arithmetic
// is quadratic in a number's digits, and "1.000…0" with a million zeros
// (one significant digit, so exact) took seconds, past a timeout that
// cannot interrupt the validator.
func TestLongNumbersRefused(t *testing.T) {
	v := New(Config{})
	long := "1." + strings.Repeat("0", 1_000_000)
	problem := "a number is written with more than 400 characters"
	for _, c := range []struct{ body, field string }{
		{`{"task_id":"t","expected_schema":{"properties":{"x":{"minimum":0,"multipleOf":0.5}}},"submitted_output":{"x":` + long + `}}`, "submitted_output.x"},
		{`{"task_id":"t","expected_schema":{"properties":{"x":{"multipleOf":` + long + `}}},"submitted_output":{"x":1}}`, "expected_schema.properties.x.multipleOf"},
		{`{"task_id":"t","expected_schema":{},"submitted_output":{"x":1},"rules":[{"type":"lte","field":"x","value":` + long + `}]}`, "rules[0].value"},
		{`{"task_id":"t","expected_schema":{},"submitted_output":{"x":1},"bounds":{"x":{"min":` + long + `}}}`, "bounds.x.min"},
		{`{"task_id":"t","expected_schema":{},"submitted_output":[-1.` + strings.Repeat("5", 398) + `]}`, "submitted_output[0]"},
	} {
		_, err := v.Parse([]byte(c.body))
		var e *apierr.Error
		if !errors.As(err, &e) || e.Status != 422 || len(e.Fields) != 1 || e.Fields[0].Field != c.field ||
			e.Fields[0].Problem != problem || !strings.Contains(e.Fields[0].Fix, "400") {
			t.Errorf("%.80s…: %v; want a 422 naming %s", c.body, err, c.field)
		}
	}
	// 400 characters are accepted, and the number means what it says.
	at := "-1." + strings.Repeat("0", 397)
	req, err := v.Parse([]byte(`{"task_id":"t","expected_schema":{"maximum":-1,"minimum":-1},"submitted_output":` + at + `}`))
	if err != nil {
		t.Fatalf("a number of 400 characters: %v", err)
	}
	if r := v.Check(req, "id", verifiedAt); r.Result != ResultPass {
		t.Errorf("%d-character -1 against maximum and minimum -1: %s", len(at), r.Result)
	}
}

// Every over-precise number of a request is named, in one order on every
// run: members in sorted order, elements in theirs, the request's fields
// in their listed order. (Before: only the first one met in Go's map order
// was named, so the same body got different 422s run to run.)
func TestEveryInexactNumberNamedInOneOrder(t *testing.T) {
	v := New(Config{})
	const x = "1.00000000000000000001"
	b := []byte(`{"task_id": "t", "expected_schema": {"maximum": ` + x + `}, "submitted_output": {"c": ` + x +
		`, "a": [1, ` + x + `, {"z": ` + x + `, "y": ` + x + `}], "b": ` + x + `}, "bounds": {"b": {"min": ` + x + `}}}`)
	want := []string{"expected_schema.maximum", "submitted_output.a[1]", "submitted_output.a[2].y",
		"submitted_output.a[2].z", "submitted_output.b", "submitted_output.c", "bounds.b.min"}
	for i := 0; i < 100; i++ {
		_, err := v.Parse(b)
		var e *apierr.Error
		if !errors.As(err, &e) {
			t.Fatalf("Parse: %v, want an *apierr.Error", err)
		}
		var got []string
		for _, f := range e.Fields {
			got = append(got, f.Field)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("run %d: fields %v, want %v", i, got, want)
		}
	}
}

// Past maxProblems inexact numbers the list stops, as every problem list
// does, with one last field saying there are more.
func TestInexactNumbersListBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"task_id": "t", "expected_schema": {}, "submitted_output": [`)
	for i := 0; i < maxProblems+50; i++ {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString("1.00000000000000000001")
	}
	b.WriteString("]}")
	_, err := New(Config{}).Parse([]byte(b.String()))
	var e *apierr.Error
	if !errors.As(err, &e) || len(e.Fields) != maxProblems+1 || e.Fields[maxProblems].Field != "request" ||
		e.Fields[maxProblems-1].Field != "submitted_output["+strconv.Itoa(maxProblems-1)+"]" {
		t.Fatalf("Parse: %v; want %d inexact numbers named in order, then a 'request' field", err, maxProblems)
	}
}

// A zero whose exponent math/big cannot read (beyond int64) is refused
// when the request is read, like any number the validator could not read
// as the hash does, in the output, in the schema and in a rule's value.
// (Before: strconv read it as 0 and the request was accepted; the schema
// validator, reading it with math/big, dereferenced the nil it got, and
// verifierd's answer was a dropped connection.)
func TestZeroWithAnUnreadableExponentRefused(t *testing.T) {
	v := New(Config{})
	for _, c := range []struct{ body, field string }{
		{`{"task_id": "t", "expected_schema": {"maximum": -1}, "submitted_output": 0E10000000000000000000}`, "submitted_output"},
		{`{"task_id": "t", "expected_schema": {"properties": {"n": {"maximum": -1}}}, "submitted_output": {"n": 0E10000000000000000000}}`, "submitted_output.n"},
		{`{"task_id": "t", "expected_schema": {"maximum": -1}, "submitted_output": [0.0e-99999999999999999999]}`, "submitted_output[0]"},
		{`{"task_id": "t", "expected_schema": {"minimum": 0e9223372036854775808}, "submitted_output": 1}`, "expected_schema.minimum"},
		{`{"task_id": "t", "expected_schema": {}, "submitted_output": {"x": 1}, "rules": [{"type": "gte", "field": "x", "value": -0e10000000000000000000}]}`, "rules[0].value"},
	} {
		_, err := v.Parse([]byte(c.body))
		var e *apierr.Error
		if !errors.As(err, &e) || e.Status/100 != 4 || !strings.Contains(err.Error(), c.field) || !strings.Contains(err.Error(), "exponent") {
			t.Errorf("%s: %v; want a refusal naming %s and its exponent", c.body, err, c.field)
		}
	}
	// An exponent of 18 digits, or more written with leading zeros, is read.
	for _, ok := range []string{`0e999999999999999999`, `1e-000000000000000000000000001`, `0E+000000000000000000000000000`} {
		body := `{"task_id": "t", "expected_schema": {"maximum": 1}, "submitted_output": ` + ok + `}`
		req, err := v.Parse([]byte(body))
		if err != nil {
			t.Fatalf("%s: %v; want it accepted", ok, err)
		}
		if r := v.Check(req, "v", time.Now()); r.Result != "pass" {
			t.Errorf("%s: %s; want pass", ok, r.Result)
		}
	}
}
