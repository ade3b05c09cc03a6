package schema

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/aovhq/aov/internal/signflip"
)

// compileRefusal compiles schema and returns its one CompileError field,
// with the bytes the compile allocated; it fails the test if the compile
// did not end in a CompileError.
func compileRefusal(t *testing.T, schema string, opts compileOptions) (problem, at string, alloc uint64) {
	t.Helper()
	var err error
	alloc = allocated(func() { _, err = compile(decode(t, schema), opts) })
	var ce *CompileError
	if !errors.As(err, &ce) || len(ce.Fields) == 0 {
		t.Errorf("%.80s: %v; want a CompileError", schema, err)
		return "", "", alloc
	}
	return ce.Fields[0].Problem, ce.Fields[0].Field, alloc
}

// The compiler deduplicates every array its metaschema declares unique,
// before it checks what the array holds: under required or type, an array
// of sign-flipped number arrays costs it what the same array costs under
// enum (300 of 300 numbers under required took 5.7 s). Each is priced as
// enum is, from the same budget: 100 of 100 numbers are about 500,000
// steps, twice MaxEnumSteps, and are refused before the compiler sees
// them, for a few MB of allocation (the compiler's check of them alone
// allocates hundreds).
func TestArraysTheMetaschemasKeepUniqueArePriced(t *testing.T) {
	flips := signflip.Square(100)
	for _, tc := range []struct{ schema, at, keyword string }{
		{`{"$schema":"http://json-schema.org/draft-07/schema#","enum":%s}`, "/enum", "enum"},
		{`{"required":%s}`, "/required", "required"},
		{`{"type":%s}`, "/type", "type"},
		{`{"dependentRequired":{"a":%s}}`, "/dependentRequired/a", "dependentRequired"},
		{`{"dependencies":{"a":%s}}`, "/dependencies/a", "dependencies"},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","dependencies":{"a":%s}}`, "/dependencies/a", "dependencies"},
		{`{"$schema":"http://json-schema.org/draft-04/schema#","properties":{"x":{"required":%s}}}`, "/properties/x/required", "required"},
		{`{"items":{"$schema":"http://json-schema.org/draft-04/schema#","$id":"d4","type":%s}}`, "/items/type", "type"},
	} {
		schema := fmt.Sprintf(tc.schema, flips)
		problem, at, alloc := compileRefusal(t, schema, compileOptions{})
		if at != field+tc.at || problem != fmt.Sprintf("brings the work of checking the schema's %s values for duplicates past %d steps", tc.keyword, MaxEnumSteps) {
			t.Errorf("%.60s: refused at %s: %q; want the duplicate-check budget at %s", tc.schema, at, problem, field+tc.at)
		}
		if alloc > 16<<20 {
			t.Errorf("%.60s: the compile allocated %d MiB", tc.schema, alloc>>20)
		}
	}
	// They share one budget with enum, charged in pointer order: three
	// arrays of about 112,000 steps each pass it at the third.
	one := signflip.Square(60)
	three := `{"$schema":"http://json-schema.org/draft-07/schema#","enum":` + one + `,"required":` + one + `,"type":` + one + `}`
	if _, at, _ := compileRefusal(t, three, compileOptions{}); at != field+"/type" {
		t.Errorf("enum, required and type over the budget together: refused at %q; want %s/type", at, field)
	}
	// Ordinary arrays cost nothing noticeable.
	ordinary := `{"type":["object","null"],"required":["a","b","c"],"dependentRequired":{"a":["b"]},"enum":[1,2,3,{"a":1}]}`
	if _, err := compile(decode(t, ordinary), compileOptions{}); err != nil {
		t.Errorf("an ordinary schema: %v", err)
	}
}

// The values of const, enum, default and examples are data, but a $ref
// can point into them, and the compiler then compiles the subschemas it
// finds there: 25,000 under const took it 5 s before payment. Every
// object of the schema counts toward MaxSchemas, however it is reached: a
// JSON pointer, a percent-encoded one, the base URI, an $id, a
// $dynamicRef. (Anchors and $ids inside data are not indexed by the
// compiler, so only pointers lead there.)
func TestObjectsInDataCountTowardMaxSchemas(t *testing.T) {
	const limit = 100
	props := func(n int) string {
		var b strings.Builder
		b.WriteString(`{"properties":{`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"p%d":{"type":"string"}`, i)
		}
		b.WriteString(`}}`)
		return b.String()
	}
	hidden := props(2 * limit)
	for _, schema := range []string{
		`{"$ref":"#/const/a","const":{"a":` + hidden + `}}`,
		`{"$ref":"#/default/a","default":{"a":` + hidden + `}}`,
		`{"$ref":"#/examples/0","examples":[` + hidden + `]}`,
		`{"$ref":"#/enum/0","enum":[` + hidden + `]}`,
		`{"$ref":"#/%63onst/a","const":{"a":` + hidden + `}}`,
		`{"$ref":"schema.json#/const/a","const":{"a":` + hidden + `}}`,
		`{"$id":"https://x.invalid/r","$ref":"r#/const/a","const":{"a":` + hidden + `}}`,
		`{"$dynamicRef":"#/const/a","const":{"a":` + hidden + `}}`,
		`{"$ref":"#/x-unknown/a","x-unknown":{"a":` + hidden + `}}`,
	} {
		problem, at, _ := compileRefusal(t, schema, compileOptions{maxSchemas: limit})
		if at != field || !strings.Contains(problem, fmt.Sprintf("more than %d objects", limit)) {
			t.Errorf("%.60s: refused at %s: %q; want the object limit", schema, at, problem)
		}
	}
	// Data within the limit is fine.
	small := `{"$ref":"#/const/a","const":{"a":` + props(limit/2) + `}}`
	if _, err := compile(decode(t, small), compileOptions{maxSchemas: limit}); err != nil {
		t.Errorf("%d objects: %v", limit/2+2, err)
	}
}

// Long numbers cost by their digits: the validator parses both sides of
// every comparison, and every number it hashes, into a big.Rat, which for
// 399 digits costs about what 20 steps do, and for
// 1.234567890123456e-300 (a 300-digit denominator) 6. Ordinary numbers,
// up to 15 digits, keep their one step.
func TestNumbersCostByTheirDigits(t *testing.T) {
	for _, tc := range []struct {
		num  string
		size int
	}{
		{"1", 1}, {"-1", 1}, {"1234.56", 1}, {"0.000001", 1}, {"1e10", 1}, {"1.5e-7", 1},
		{"123456789012345", 1}, {"0.30000000000000004", 2}, {"1e-300", 5}, {"1e300", 5},
		{"1.234567890123456e-300", 6}, {"1.234567890123456E+300", 6},
		{"1." + strings.Repeat("37", 198) + "1", 25},
	} {
		if got := valueSize(decode(t, tc.num)); got != tc.size {
			t.Errorf("%.30s: size %d; want %d", tc.num, got, tc.size)
		}
	}
	long := "1.234567890123456e-300"
	const n = 6
	for _, tc := range []struct {
		schema, inst string
		steps        int
	}{
		{`{"const": 5}`, `5.0`, 1 + 1},
		{`{"const": ` + long + `}`, long, 1 + n},
		{`{"const": ` + long + `}`, `5`, 1 + n + failureSteps},
		{`{"enum": [1, ` + long + `]}`, long, 1 + n + n}, // both parsed, whichever is long
		{`{"const": [` + long + `, 1]}`, `[` + long + `, 1]`, 1 + 1 + n + 1},
		// Every value hashed, and the one comparison of a small array.
		{`{"uniqueItems": true}`, `[1, 2]`, 1 + 2 + 1},
		{`{"uniqueItems": true}`, `[` + long + `, -` + long + `]`, 1 + 2*n + n},
	} {
		s := mustCompile(t, tc.schema)
		if got := stepsOf(t, s, decode(t, tc.inst)); got != tc.steps {
			t.Errorf("%.60s on %.40s: %d steps; want %d", tc.schema, tc.inst, got, tc.steps)
		}
	}
}

// An enum of 110 arrays of 40 long numbers, members that differ only in
// the signs of their last numbers, cost the compiler's duplicate check
// 0.8 s and 446 MiB at one step a number. At their digits' cost (6 steps
// a number, about 1.4 million for the check) it is
// past MaxEnumSteps and refused before the compiler sees it.
func TestEnumOfLongNumbersIsPricedByTheirDigits(t *testing.T) {
	num := "1.234567890123456e-300"
	schema := `{"$schema":"http://json-schema.org/draft-07/schema#","enum":` + signflip.Rows(num, 110, 40) + `}`
	problem, at, alloc := compileRefusal(t, schema, compileOptions{})
	if at != field+"/enum" || !strings.Contains(problem, "for duplicates past") {
		t.Errorf("refused at %s: %q; want the duplicate-check budget at %s/enum", at, problem, field)
	}
	if alloc > 16<<20 {
		t.Errorf("the compile allocated %d MiB", alloc>>20)
	}
}
