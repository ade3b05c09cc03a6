package receipt

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/testdata"
)

// decodeTree decodes JSON the way callers of AppendCanonical do: numbers kept
// as json.Number so no precision is lost before canonicalization.
func decodeTree(t testing.TB, raw []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding: %v", err)
	}
	return v
}

// jcsVector is one RFC 8785 test case: an input document with its expected
// canonical form (output/) and, where given, the same as hex (outhex/).
type jcsVector struct {
	name          string
	input, output []byte
	outhex        []byte // nil when the vector has no outhex file
}

func loadJCSVectors(t *testing.T) []jcsVector {
	t.Helper()
	root := testdata.Dir(t, "jcs-testdata")
	var vs []jcsVector
	for _, dir := range []string{root, filepath.Join(root, "gowebpki-extra")} {
		inputs, err := filepath.Glob(filepath.Join(dir, "input", "*.json"))
		if err != nil || len(inputs) == 0 {
			t.Fatalf("no inputs in %s: %v", dir, err)
		}
		for _, in := range inputs {
			name := filepath.Base(in)
			v := jcsVector{name: filepath.Base(dir) + "/" + name}
			if v.input, err = os.ReadFile(in); err != nil {
				t.Fatal(err)
			}
			if v.output, err = os.ReadFile(filepath.Join(dir, "output", name)); err != nil {
				t.Fatal(err)
			}
			hexFile := filepath.Join(dir, "outhex", strings.TrimSuffix(name, ".json")+".txt")
			if h, err := os.ReadFile(hexFile); err == nil {
				b, err := hex.DecodeString(strings.Join(strings.Fields(string(h)), ""))
				if err != nil {
					t.Fatalf("%s: bad hex: %v", hexFile, err)
				}
				v.outhex = b
			}
			vs = append(vs, v)
		}
	}
	return vs
}

func TestCanonicalFormMatchesEveryRFC8785Vector(t *testing.T) {
	vs := loadJCSVectors(t)
	withHex := 0
	for _, v := range vs {
		t.Run(v.name, func(t *testing.T) {
			got, err := Canonicalize(v.input)
			if err != nil {
				t.Fatalf("Canonicalize: %v", err)
			}
			if !bytes.Equal(got, v.output) {
				t.Errorf("Canonicalize:\n got %s\nwant %s", got, v.output)
			}
			tree, err := AppendCanonical(nil, decodeTree(t, v.input))
			if err != nil {
				t.Fatalf("AppendCanonical: %v", err)
			}
			if !bytes.Equal(tree, v.output) {
				t.Errorf("AppendCanonical:\n got %s\nwant %s", tree, v.output)
			}
			if v.outhex != nil {
				withHex++
				if !bytes.Equal(got, v.outhex) || !bytes.Equal(tree, v.outhex) {
					t.Errorf("output differs from outhex bytes %x", v.outhex)
				}
			}
		})
	}
	t.Logf("%d RFC 8785 vectors (%d also checked against outhex), both paths", len(vs), withHex)
}

func TestNumbersPrintAsECMAScriptPrintsDoubles(t *testing.T) {
	f, err := os.Open(filepath.Join(testdata.Dir(t, "jcs-testdata"), "es6numbers_first10000.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	lines, finite := 0, 0
	for sc.Scan() {
		lines++
		hexBits, want, ok := strings.Cut(sc.Text(), ",")
		if !ok {
			t.Fatalf("line %d: no comma", lines)
		}
		bits, err := strconv.ParseUint(hexBits, 16, 64)
		if err != nil {
			t.Fatalf("line %d: %v", lines, err)
		}
		d := math.Float64frombits(bits)
		if math.IsNaN(d) || math.IsInf(d, 0) {
			if _, err := AppendCanonical(nil, d); err == nil {
				t.Errorf("line %d: %s accepted", lines, hexBits)
			}
			continue
		}
		finite++
		got, err := AppendCanonical(nil, d)
		if err != nil || string(got) != want {
			t.Errorf("line %d: float64 %s: got %q (%v), want %q", lines, hexBits, got, err, want)
		}
		// The same number as JSON text, through json.Number and through the
		// raw canonicalizer.
		got, err = AppendCanonical(nil, json.Number(want))
		if err != nil || string(got) != want {
			t.Errorf("line %d: json.Number %q: got %q (%v)", lines, want, got, err)
		}
		// And from another spelling of the same double (Go's shortest 'e'
		// form, e.g. "1.2345e+21"), so the parse is exercised too.
		alt := strconv.FormatFloat(d, 'e', -1, 64)
		got, err = AppendCanonical(nil, json.Number(alt))
		if err != nil || string(got) != want {
			t.Errorf("line %d: json.Number %q: got %q (%v), want %q", lines, alt, got, err, want)
		}
		got, err = Canonicalize([]byte(want))
		if err != nil || string(got) != want {
			t.Errorf("line %d: Canonicalize %q: got %q (%v)", lines, want, got, err)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if lines != 10000 {
		t.Fatalf("read %d lines, want 10000", lines)
	}
	t.Logf("%d number lines, %d finite", lines, finite)
}

func TestAppendCanonical(t *testing.T) {
	s := "x"
	tests := []struct {
		desc string
		in   any
		want string
	}{
		{desc: "10.0 prints as 10", in: json.Number("10.0"), want: "10"},
		{desc: "1e21 prints as 1e+21", in: json.Number("1e21"), want: "1e+21"},
		{desc: "0.000001 prints as 0.000001", in: json.Number("0.000001"), want: "0.000001"},
		{desc: "1e-7 prints as 1e-7", in: json.Number("1e-7"), want: "1e-7"},
		{desc: "minus zero prints as 0", in: json.Number("-0"), want: "0"},
		{desc: "minus zero float prints as 0", in: math.Copysign(0, -1), want: "0"},
		{desc: "an integer beyond 2^53 in JSON text rounds like a double", in: json.Number("12345678901234567890"), want: "12345678901234567000"},
		{desc: "int and int64 print as digits", in: []any{1, int64(-42), int64(1 << 53)}, want: "[1,-42,9007199254740992]"},
		{desc: "keys sort by UTF-16 code units, not code points", in: map[string]any{"\uffff": 1, "\U0001F600": 2, "a": 3, "\u00e9": 4}, want: "{\"a\":3,\"\u00e9\":4,\"\U0001F600\":2,\"\uffff\":1}"},
		{desc: "a key that is a prefix sorts first", in: map[string]any{"ab": 1, "a": 2}, want: `{"a":2,"ab":1}`},
		{desc: "control characters escape as lowercase \\u00xx, the named ones by name", in: "\x00\x1f\b\t\n\f\r\"\\/\x7f", want: "\"\\u0000\\u001f\\b\\t\\n\\f\\r\\\"\\\\/\x7f\""},
		{desc: "non-ASCII stays literal UTF-8", in: "café ✓", want: `"café ✓"`},
		{desc: "a nil *string is null", in: map[string]any{"a": (*string)(nil), "b": &s}, want: `{"a":null,"b":"x"}`},
		{desc: "json.RawMessage is canonicalized, not copied", in: []any{json.RawMessage(`{ "b":1.0, "a":[true ,null] }`)}, want: `[{"a":[true,null],"b":1}]`},
		{desc: "[]string and map[string]string are accepted", in: map[string]any{"l": []string{"b", "a"}, "m": map[string]string{"z": "1", "y": "2"}}, want: `{"l":["b","a"],"m":{"y":"2","z":"1"}}`},
		{desc: "empty containers", in: map[string]any{"a": []any{}, "o": map[string]any{}}, want: `{"a":[],"o":{}}`},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := AppendCanonical([]byte("prefix:"), tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != "prefix:"+tc.want {
				t.Errorf("got %s, want prefix:%s", got, tc.want)
			}
		})
	}
}

func TestAppendCanonicalRefusesWhatIsNotCanonicalizable(t *testing.T) {
	tests := []struct {
		desc string
		in   any
	}{
		{desc: "a string that is not valid UTF-8", in: "\xff"},
		{desc: "a key that is not valid UTF-8", in: map[string]any{"\xc3": 1}},
		{desc: "NaN", in: math.NaN()},
		{desc: "infinity", in: math.Inf(-1)},
		{desc: "a json.Number overflowing a double", in: json.Number("1e400")},
		{desc: "a json.Number underflowing a double", in: json.Number("-1e-400")},
		{desc: "a json.Number over 400 characters", in: json.Number("1." + strings.Repeat("0", 399))},
		{desc: "a json.Number that is not JSON (hex float)", in: json.Number("0x1p4")},
		{desc: "a json.Number that is not JSON (Inf)", in: json.Number("Inf")},
		{desc: "a json.Number that is not JSON (leading plus)", in: json.Number("+1")},
		{desc: "a json.Number that is not JSON (leading zero)", in: json.Number("01")},
		{desc: "a json.Number that is not JSON (bare dot)", in: json.Number("1.")},
		{desc: "an empty json.Number", in: json.Number("")},
		{desc: "an int64 beyond 2^53 that would be rounded", in: int64(1<<53 + 1)},
		{desc: "an unsupported Go type", in: struct{}{}},
		{desc: "an invalid json.RawMessage", in: json.RawMessage(`{"a":1,"a":2}`)},
		{desc: "a bad value nested deep in an array", in: []any{map[string]any{"x": []any{math.NaN()}}}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			got, err := AppendCanonical([]byte("keep"), tc.in)
			if err == nil {
				t.Fatalf("accepted, got %q", got)
			}
			if string(got) != "keep" {
				t.Errorf("dst changed on error: %q", got)
			}
		})
	}
}

// TestAppendStringEscapesAndReplacesInvalidUTF8: the string writer the
// verification result uses escapes as RFC 8785 does and writes an invalid
// byte as U+FFFD (the canonicalizer refuses such strings before writing).
func TestAppendStringEscapesAndReplacesInvalidUTF8(t *testing.T) {
	got := string(AppendString(nil, "a\"b\\c\n\x01é\xff"))
	if want := `"a\"b\\c\n\u0001é` + "\ufffd" + `"`; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestCanonicalizeRefusesAmbiguousJSON(t *testing.T) {
	tests := []struct{ desc, in string }{
		{desc: "duplicate keys", in: `{"a":1,"a":2}`},
		{desc: "invalid UTF-8", in: "\"\xff\""},
		{desc: "a lone surrogate escape", in: `"\ud800"`},
		{desc: "trailing data", in: `{} {}`},
		{desc: "a number beyond the double range", in: `1e400`},
		// Both read as 0 by strconv (5 exactly, and 5e-324 / 10), so a
		// receipt holding one in place of a signed 0 would verify, while
		// a reader of its exact value (math/big, a decimal library, or a
		// JavaScript parser for the first) sees another number.
		{desc: "a number strconv misreads as 0", in: `{"passed":0.` + strings.Repeat("0", 100000) + `5e100001}`},
		{desc: "a nonzero number below the smallest double", in: `[5e-325]`},
		// strconv reads 5; its value is 5e90000.
		{desc: "a number strconv misreads as 5", in: `0.` + strings.Repeat("0", 9999) + `5e100000`},
		{desc: "a number written with more than 400 characters", in: `1.` + strings.Repeat("0", 399)},
		{desc: "nothing at all", in: ``},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			if got, err := Canonicalize([]byte(tc.in)); err == nil {
				t.Fatalf("accepted, got %q", got)
			}
		})
	}
}

func TestHashIsLowercaseHexSHA256OfTheCanonicalBytes(t *testing.T) {
	// SHA-256("abc") from FIPS 180-2.
	if got, want := Hash([]byte("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}

func TestCompareUTF16AgreesWithEncodingToUTF16(t *testing.T) {
	words := []string{"", "a", "ab", "b", "\u00e9", "\u0800", "\ud7ff", "\ue000", "\uffff", "\U00010000", "\U0001F600", "\U0010FFFF", "a\U0001F600", "a\uffff", "\x7f"}
	for _, a := range words {
		for _, b := range words {
			want := compareUnits(a, b)
			got := compareUTF16(a, b)
			if sign(got) != sign(want) {
				t.Errorf("compareUTF16(%q, %q) = %d, want sign of %d", a, b, got, want)
			}
		}
	}
}

func compareUnits(a, b string) int {
	ua, ub := utf16Units(a), utf16Units(b)
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			return int(ua[i]) - int(ub[i])
		}
	}
	return len(ua) - len(ub)
}

func utf16Units(s string) []uint16 {
	var u []uint16
	for _, r := range s {
		if r >= 0x10000 {
			r -= 0x10000
			u = append(u, uint16(0xD800+(r>>10)), uint16(0xDC00+(r&0x3FF)))
			continue
		}
		u = append(u, uint16(r))
	}
	return u
}

func sign(i int) int {
	switch {
	case i < 0:
		return -1
	case i > 0:
		return 1
	}
	return 0
}

// The request_hash test vectors of SPEC §5: the canonical text given there is
// already canonical, and its hash is the published request_hash.
func TestRequestHashVectorsOfTheSpec(t *testing.T) {
	tests := []struct{ desc, canonical, hash string }{
		{
			desc:      "tv-1: defaults filled in, keys sorted",
			canonical: `{"agent_id":null,"bounds":null,"enforce_rules":false,"expected_schema":{"properties":{"ok":{"type":"boolean"}},"required":["ok"],"type":"object"},"rules":null,"strict_content_check":false,"submitted_output":{"ok":true},"task_id":"tv-1"}`,
			hash:      "5366542000b4226c5efb411c15ec8f0aac3c63844343997aa1bcc3c585086f97",
		},
		{
			desc:      "tv-2: rules and bounds with every field",
			canonical: `{"agent_id":"seller-7","bounds":{"items[].price":{"if_present":false,"max":100,"min":0}},"enforce_rules":true,"expected_schema":{"properties":{"items":{"items":{"properties":{"id":{"type":"string"},"price":{"type":"number"}},"required":["id","price"],"type":"object"},"type":"array"},"total":{"type":"number"}},"required":["items","total"],"type":"object"},"rules":[{"equals":null,"equals_field":"total","field":"items[].price","if_present":false,"in_field":null,"other_field":null,"tolerance":0.01,"type":"sum_equals","value":null,"values":null},{"equals":null,"equals_field":null,"field":"items[].id","if_present":false,"in_field":null,"other_field":null,"tolerance":1e-9,"type":"unique","value":null,"values":null}],"strict_content_check":false,"submitted_output":{"items":[{"id":"a","price":10},{"id":"b","price":20.5}],"total":30.5},"task_id":"tv-2"}`,
			hash:      "1aa064d21a2c1487d5d319ded6efec48c18dfee45b93f741266b1f491c2e099f",
		},
		{
			desc:      "tv-3: non-ASCII text and ECMAScript number forms",
			canonical: `{"agent_id":null,"bounds":null,"enforce_rules":false,"expected_schema":{"properties":{"n":{"type":"number"},"name":{"type":"string"}},"type":"object"},"rules":[{"equals":null,"equals_field":null,"field":"n","if_present":true,"in_field":null,"other_field":null,"tolerance":1e-9,"type":"gte","value":0,"values":null}],"strict_content_check":true,"submitted_output":{"n":1,"name":"café ✓","z":[1e+21,0.000001]},"task_id":"tv-3"}`,
			hash:      "037abd3fe4643c14e68d9fd57ca93b460c177c5372f058aa2920a2ef120c0432",
		},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			c, err := Canonicalize([]byte(tc.canonical))
			if err != nil || string(c) != tc.canonical {
				t.Fatalf("canonical text is not a fixed point: %s (%v)", c, err)
			}
			a, err := AppendCanonical(nil, decodeTree(t, []byte(tc.canonical)))
			if err != nil || string(a) != tc.canonical {
				t.Fatalf("AppendCanonical: %s (%v)", a, err)
			}
			if got := Hash(c); got != tc.hash {
				t.Errorf("hash %s, want %s", got, tc.hash)
			}
		})
	}
}
