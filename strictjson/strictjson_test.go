package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/jsontree"
)

// stdDecode is the reference reading of a valid document.
func stdDecode(t testing.TB, data []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("encoding/json rejects a document strictjson accepted: %v", err)
	}
	return v
}

func TestDecodeAcceptsWhatEncodingJSONReadsTheSame(t *testing.T) {
	tests := []struct {
		desc string
		in   string
	}{
		{desc: "an object with every value kind", in: `{"s":"x","n":1.5,"i":-3,"t":true,"f":false,"z":null,"a":[1,"2",[3]],"o":{}}`},
		{desc: "surrounding whitespace is allowed", in: " \t\r\n[ 1 , 2 ]\n "},
		{desc: "a bare string is a document", in: `"hello"`},
		{desc: "a bare number is a document", in: `0`},
		{desc: "escapes decode to their characters", in: `"a\"b\\c\/d\b\f\n\r\t\u0041\u00e9\u2713"`},
		{desc: "a surrogate pair decodes to one character", in: `"\ud83d\ude00"`},
		{desc: "literal UTF-8 passes through", in: `{"name":"café ✓ 😀"}`},
		{desc: "the largest safe integers are accepted", in: `[9007199254740991,-9007199254740991]`},
		{desc: "numbers with fractions and exponents are kept as written", in: `[1.0,1e+21,1E-7,-0,0.000001,1e308]`},
		{desc: "an integer written with an exponent is a double, not an integer", in: `1e20`},
		{desc: "long fractions are accepted", in: `0.1000000000000000055511151231257827021181583404541015625`},
		{desc: "a number of 400 characters is accepted", in: `-1.` + strings.Repeat("0", 397)},
		{desc: "zero is zero whatever its exponent", in: `[0e-400,-0.0e100000,0.000e999]`},
		{desc: "the smallest doubles are accepted", in: `[5e-324,-5e-324,3e-324,0.` + strings.Repeat("0", 322) + `5]`},
		{desc: "escaped keys are decoded", in: `{"a\u0062":1,"ab2":2}`},
		{desc: "empty containers", in: `[{},[],""]`},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := Decode([]byte(tc.in), Limits{})
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			want := stdDecode(t, []byte(tc.in))
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Decode = %#v, encoding/json = %#v", got, want)
			}
		})
	}
}

func TestDecodeRefusesEachInvalidClass(t *testing.T) {
	deep := strings.Repeat("[", 65) + strings.Repeat("]", 65)
	tests := []struct {
		desc    string
		in      string
		lim     Limits
		path    string
		problem string
	}{
		{desc: "an empty document is refused", in: ``, problem: "the document is empty"},
		{desc: "a whitespace-only document is refused", in: " \n", problem: "the document is empty"},
		{desc: "a duplicate key is refused and named", in: `{"a":{"b":1,"b":2}}`, path: "a.b", problem: "this object key appears more than once"},
		{desc: "a duplicate key written with an escape is still a duplicate", in: `{"ab":1,"a\u0062":2}`, path: "ab", problem: "this object key appears more than once"},
		{desc: "invalid UTF-8 in a string value is refused", in: "{\"a\":[\"ok\",\"\xff\"]}", path: "a[1]", problem: "a string is not valid UTF-8"},
		{desc: "invalid UTF-8 in a key is refused", in: "{\"\xc3\x28\":1}", problem: "a string is not valid UTF-8"},
		{desc: "an overlong UTF-8 encoding is refused", in: "\"\xc0\xaf\"", problem: "a string is not valid UTF-8"},
		{desc: "a UTF-8 encoded surrogate is refused", in: "\"\xed\xa0\x80\"", problem: "a string is not valid UTF-8"},
		{desc: "invalid UTF-8 after an escape is refused", in: "\"\\n\xff\"", problem: "a string is not valid UTF-8"},
		{desc: "a lone high surrogate is refused", in: `{"s":"\ud800"}`, path: "s", problem: "a string contains an unpaired UTF-16 surrogate escape"},
		{desc: "a high surrogate followed by a non-surrogate is refused", in: `"\ud800\u0041"`, problem: "a string contains an unpaired UTF-16 surrogate escape"},
		{desc: "a lone low surrogate is refused", in: `"\udc00"`, problem: "a string contains an unpaired UTF-16 surrogate escape"},
		{desc: "an integer above 2^53-1 is refused", in: `{"n":9007199254740992}`, path: "n", problem: "an integer is outside ±(2^53−1) and cannot be represented exactly"},
		{desc: "an integer below -(2^53-1) is refused", in: `[-9007199254740992]`, path: "[0]", problem: "an integer is outside ±(2^53−1) and cannot be represented exactly"},
		{desc: "an integer beyond int64 is refused", in: `123456789012345678901234567890`, problem: "an integer is outside ±(2^53−1) and cannot be represented exactly"},
		{desc: "a number overflowing a double is refused", in: `{"x":[1e400]}`, path: "x[0]", problem: "a number is too large to be represented as a double"},
		{desc: "a negative number overflowing a double is refused", in: `-1.5e309`, problem: "a number is too large to be represented as a double"},
		{desc: "a nonzero number underflowing a double is refused", in: `{"x":[1e-400]}`, path: "x[0]", problem: "a number is too small to be represented as a double: it would read as 0"},
		{desc: "a number below half the smallest double is refused", in: `-2e-324`, problem: "a number is too small to be represented as a double: it would read as 0"},
		{desc: "an underflowing number with a long exponent is refused", in: `1e-100000`, problem: "a number is too small to be represented as a double: it would read as 0"},
		{desc: "an overflowing number with a long exponent is refused", in: `1e100000`, problem: "a number is too large to be represented as a double"},
		{desc: "a number written in more than 400 characters is refused", in: `{"x":1.` + strings.Repeat("0", 399) + `}`, path: "x", problem: "a number is written with more than 400 characters"},
		{desc: "a long integer is refused for its length", in: `[` + strings.Repeat("1", 401) + `]`, path: "[0]", problem: "a number is written with more than 400 characters"},
		// 5 exactly, but strconv.ParseFloat stops reading an exponent past
		// 10000 and reads it as 0: a canonicalizer would hash 0.
		{desc: "a number strconv misreads is refused for its length", in: `{"x":0.` + strings.Repeat("0", 100000) + `5e100001}`, path: "x", problem: "a number is written with more than 400 characters"},
		{desc: "nesting over the default limit is refused", in: deep, path: strings.Repeat("[0]", 64), problem: "nesting is deeper than the limit of 64 levels"},
		{desc: "nesting over a configured limit is refused", in: `{"a":{"b":{}}}`, lim: Limits{MaxDepth: 2}, path: "a.b", problem: "nesting is deeper than the limit of 2 levels"},
		{desc: "trailing data is refused", in: `{} {}`, problem: "there is data after the end of the JSON value"},
		{desc: "a trailing comma is refused", in: `[1,]`, path: "[1]", problem: "invalid JSON syntax (expected a value)"},
		{desc: "a leading zero is refused", in: `[01]`, path: "[0]", problem: "invalid JSON syntax (expected ',' or ']')"},
		{desc: "a bare minus is refused", in: `-`, problem: "the document ends unexpectedly (expected a digit)"},
		{desc: "a fraction without digits is refused", in: `1.`, problem: "the document ends unexpectedly (expected a digit after '.')"},
		{desc: "an exponent without digits is refused", in: `1e+`, problem: "the document ends unexpectedly (expected a digit in the exponent)"},
		{desc: "a single-quoted string is refused", in: `{'a':1}`, problem: "invalid JSON syntax (expected an object key in double quotes)"},
		{desc: "an unknown literal is refused", in: `[tru]`, path: "[0]", problem: "invalid JSON syntax (expected a value)"},
		{desc: "NaN is refused", in: `NaN`, problem: "invalid JSON syntax (expected a value)"},
		{desc: "an unterminated string is refused", in: `"abc`, problem: "the document ends unexpectedly (expected a closing '\"')"},
		{desc: "an unterminated string with an escape is refused", in: `"a\n`, problem: "the document ends unexpectedly (expected a closing '\"')"},
		{desc: "a raw control character in a string is refused", in: "\"a\tb\"", problem: "a string contains an unescaped control character"},
		{desc: "an unknown escape is refused", in: `"\x41"`, problem: "a string contains an invalid escape sequence"},
		{desc: "a short unicode escape is refused", in: `"\u12"`, problem: "a \\u escape is not followed by four hex digits"},
		{desc: "a missing colon is refused", in: `{"a" 1}`, path: "a", problem: "invalid JSON syntax (expected ':' after an object key)"},
		{desc: "an unclosed object is refused", in: `{"a":1`, problem: "the document ends unexpectedly (expected ',' or '}')"},
		{desc: "a byte order mark is refused", in: "\xef\xbb\xbf{}", problem: "the document starts with a byte-order mark"},
		{desc: "a key with dots is quoted in the path", in: `{"a.b":{"c":1,"c":1}}`, path: `["a.b"].c`, problem: "this object key appears more than once"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			v, err := Decode([]byte(tc.in), tc.lim)
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Decode = %#v, %v; want *Error", v, err)
			}
			if e.Problem != tc.problem {
				t.Errorf("problem = %q, want %q", e.Problem, tc.problem)
			}
			if e.Path != tc.path {
				t.Errorf("path = %q, want %q", e.Path, tc.path)
			}
			if e.Fix == "" {
				t.Error("the error has no fix")
			}
			if e.Offset < 0 || e.Offset > int64(len(tc.in)) {
				t.Errorf("offset %d outside the input", e.Offset)
			}
		})
	}
}

func TestErrorsNeverEchoValues(t *testing.T) {
	secret := "sk_live_DO_NOT_ECHO"
	inputs := []string{
		`{"k":"` + secret + `\ud800"}`,
		`{"k":"` + secret + `","k":1}`,
		`["` + secret + `" 1]`,
		`{"k":"` + secret + "\x01" + `"}`,
	}
	for _, in := range inputs {
		_, err := Decode([]byte(in), Limits{})
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("Decode(%q) did not fail", in)
		}
		if strings.Contains(e.Error()+e.Fix+e.Problem+e.Path, secret) {
			t.Errorf("error for %q echoes the input: %v", in, e)
		}
	}
}

func TestLongKeysAreCutInPaths(t *testing.T) {
	long := strings.Repeat("é", 100)
	_, err := Decode([]byte(`{"`+long+`":[1e999]}`), Limits{})
	var e *Error
	if !errors.As(err, &e) {
		t.Fatal("an overflowing number was accepted")
	}
	if len(e.Path) > 3*MaxKeyInPath || !strings.HasSuffix(e.Path, `…"][0]`) {
		t.Errorf("path %q is not cut", e.Path)
	}
}

func TestDepthLimitCountsContainers(t *testing.T) {
	ok := strings.Repeat("[", 64) + strings.Repeat("]", 64)
	if _, err := Decode([]byte(ok), Limits{}); err != nil {
		t.Fatalf("64 levels are within the default limit: %v", err)
	}
}

func TestRepeatedKeysDecodeTheSameOnceInterned(t *testing.T) {
	// Past the first internAfter keys, short keys come from a table; keys
	// with escapes, long keys and non-ASCII keys take the full path.
	var b strings.Builder
	b.WriteByte('[')
	for i := range 3 * internAfter {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"sku":1,"s\u006bu2":2,"` + strings.Repeat("k", maxInternLen+1) + `":3,"é":4,"q` + strconv.Itoa(i%7) + `":5}`)
	}
	b.WriteByte(']')
	data := []byte(b.String())
	v, err := Decode(data, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if want := stdDecode(t, data); !reflect.DeepEqual(v, want) {
		t.Fatal("interned keys decode differently from encoding/json")
	}
	last := strings.LastIndex(b.String(), `"q3":5}`)
	dup := b.String()[:last] + `"q3":5,"q3":6}` + b.String()[last+len(`"q3":5}`):]
	if _, err := Decode([]byte(dup), Limits{}); err == nil {
		t.Fatal("a duplicate interned key was accepted")
	}
}

func FuzzDecode(f *testing.F) {
	seeds := []string{
		`{"task_id":"t","submitted_output":{"a":[1,2.5,-3e2,"x",true,null]}}`,
		`"\ud83d\ude00\u00e9\n"`, `[9007199254740991]`, `1e400`, `{"a":1,"a":2}`,
		"\"\xff\"", `"\ud800"`, `[[[[]]]]`, `{} x`, `0.000001`, `-0`, `{"a\u0062":{"":""}}`,
		`[1e-400,2.4703282292062328e-324,2.4703282292062327e-324,-0e99999]`, `1e100000`, `1e-100000`,
		`0.` + strings.Repeat("0", 9999) + `5e100000`, `[1.` + strings.Repeat("0", 398) + `]`,
		`1` + strings.Repeat("0", 9999) + `e-100000`,
	}
	for _, s := range seeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Decode(data, Limits{MaxDepth: 16})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Problem == "" || e.Fix == "" {
				t.Fatalf("error without problem and fix: %v", err)
			}
			return
		}
		// Whatever strictjson accepts, encoding/json reads identically.
		if want := stdDecode(t, data); !reflect.DeepEqual(v, want) {
			t.Fatalf("Decode = %#v, encoding/json = %#v", v, want)
		}
		for _, n := range jsontree.Numbers(v) {
			checkNumberReadsAlike(t, string(n))
		}
		// FoldedNames refuses exactly the documents with two member names
		// of one object equal under foldName.
		_, ferr := Decode(data, Limits{MaxDepth: 16, FoldedNames: true})
		var e *Error
		if twin := hasFoldedTwin(v); twin != (ferr != nil) || ferr != nil && (!errors.As(ferr, &e) || e.Problem != ProblemFoldedName) {
			t.Fatalf("a folded twin: %v; Decode with FoldedNames: %v", twin, ferr)
		}
	})
}

// hasFoldedTwin reports whether an object in v has two member names whose
// foldName is the same, comparing every pair: the decoder's check written
// the slow, obvious way.
func hasFoldedTwin(v any) bool {
	switch v := v.(type) {
	case map[string]any:
		var names []string
		for k, c := range v {
			for _, n := range names {
				if foldName(n) == foldName(k) {
					return true
				}
			}
			names = append(names, k)
			if hasFoldedTwin(c) {
				return true
			}
		}
	case []any:
		for _, c := range v {
			if hasFoldedTwin(c) {
				return true
			}
		}
	}
	return false
}

// checkNumberReadsAlike is the differential property of the numbers
// strictjson accepts: the double strconv reads (what a canonicalizer
// hashes) is the double nearest the exact value math/big reads (what the
// schema validator compares), zero only for zero, and its shortest text
// (the canonical form) reads back as the same double.
func checkNumberReadsAlike(t *testing.T, s string) {
	t.Helper()
	if len(s) > MaxNumberLen {
		t.Fatalf("a number of %d characters was accepted", len(s))
	}
	f, err := Float64(s)
	if err != nil {
		t.Fatalf("accepted %s, which Float64 refuses: %v", s, err)
	}
	if g, err := strconv.ParseFloat(s, 64); err != nil || g != f {
		t.Fatalf("Float64(%s) = %v; strconv.ParseFloat = %v, %v", s, f, g, err)
	}
	exact, ok := new(big.Rat).SetString(s)
	if !ok {
		t.Fatalf("math/big cannot read %s", s)
	}
	if nearest, _ := exact.Float64(); nearest != f || (f == 0) != (exact.Sign() == 0) {
		t.Fatalf("%s reads as %v; its exact value's nearest double is %v (sign %d)", s, f, nearest, exact.Sign())
	}
	canonical := strconv.FormatFloat(f, 'g', -1, 64)
	if back, err := strconv.ParseFloat(canonical, 64); err != nil || back != f {
		t.Fatalf("%s: canonical form %s reads back as %v, %v", s, canonical, back, err)
	}
}

func BenchmarkDecode(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"invoice_id":"INV-7731","currency":"USD","line_items":[`)
	for i := 0; i < 100; i++ {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`{"sku":"SKU-1","qty":2,"line_total":43.5,"note":"caf\u00e9"}`)
	}
	sb.WriteString(`],"total":4350.0}`)
	data := []byte(sb.String())
	b.Run("strictjson", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			if _, err := Decode(data, Limits{}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.UseNumber()
			var v any
			if err := dec.Decode(&v); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestFoldedNamesRefusesNamesEqualInAnyLetterCase(t *testing.T) {
	fold := Limits{FoldedNames: true}
	tests := []struct {
		desc string
		in   string
		path string // "" when accepted
	}{
		{desc: "names differing only in ASCII case are refused", in: `{"name":"a","Name":"b"}`, path: "Name"},
		{desc: "a folded twin deep inside is refused", in: `{"params":{"x":[{"Method":1,"method":2}]}}`, path: "params.x[0].method"},
		{desc: "the Kelvin sign folds to k", in: `{"k":1,"\u212a":2}`, path: "[\"\u212a\"]"},
		{desc: "a twin after many distinct names is refused", in: `{` + manyKeys(40) + `,"K0":1}`, path: "K0"},
		{desc: "a twin after a nested object is refused", in: `{"a":{"b":1,"c":{"d":2}},"e":3,"A":4}`, path: "A"},
		{desc: "a twin after a wide nested object is refused", in: `{"a":{` + manyKeys(40) + `},"e":3,"A":4}`, path: "A"},
		{desc: "a wide object's twin after its nested objects is refused", in: `{` + manyKeys(20) + `,"x":{"K0":1},"K0":2}`, path: "K0"},
		{desc: "an outer name and an inner name may fold alike", in: `{"a":{"A":1,"x":{"a":2}},"x":{"X":3}}`},
		{desc: "names of sibling objects may fold alike", in: `[{"a":1,"B":2},{"A":3,"b":4},{` + manyKeys(20) + `},{"K0":1}]`},
		{desc: "distinct names pass", in: `{"name":1,"names":2,"_meta":{"a":1,"b":2}}`},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := Decode([]byte(tc.in), fold)
			if tc.path == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) || e.Path != tc.path || e.Problem != "this object key appears more than once when letter case is ignored" {
				t.Fatalf("error %v, want a folded duplicate at %q", err, tc.path)
			}
			// Without the option only exact duplicates are refused.
			if _, err := Decode([]byte(tc.in), Limits{}); err != nil {
				t.Errorf("refused without FoldedNames: %v", err)
			}
		})
	}
}

func manyKeys(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":%d`, i, i)
	}
	return b.String()
}

func TestFoldedTwin(t *testing.T) {
	for _, c := range []struct {
		m    map[string]any
		twin string
	}{
		{map[string]any{}, ""},
		{map[string]any{"name": 1}, ""},
		{map[string]any{"name": 1, "names": 2, "Other": 3}, ""},
		{map[string]any{"name": 1, "Name": 2}, "name"},
		{map[string]any{"k": 1, "\u212a": 2}, "\u212a"},
		{map[string]any{"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6, "g": 7, "h": 8, "i": 9, "j": 10,
			"l": 11, "m": 12, "n": 13, "o": 14, "p": 15, "q": 16, "r": 17, "s": 18, "T": 19, "t": 20}, "t"},
	} {
		got, ok := FoldedTwin(c.m)
		if got != c.twin || ok != (c.twin != "") {
			t.Errorf("FoldedTwin(%v) = %q, %v; want %q", c.m, got, ok, c.twin)
		}
		// It agrees with the decoder's FoldedNames.
		b, _ := json.Marshal(c.m)
		_, err := Decode(b, Limits{FoldedNames: true})
		if (err != nil) != ok {
			t.Errorf("%s: FoldedTwin says %v, Decode with FoldedNames says %v", b, ok, err)
		}
	}
}
