package schema

import (
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// What the validator keeps for failures is charged by the walk before it
// runs: a failing application costs failureSteps more, plus its instance
// depth over failureDepthPerStep (each error holds its own copy of the
// location); a missing required name a step, and 16 names looked up one
// (required names, or members looked up in properties); failures inside
// not and if as much as anywhere, since the validator keeps their errors
// until not or if returns.
func TestFailureSteps(t *testing.T) {
	const fail = failureSteps
	deep := func(depth int) string { // an object depth levels deep, ending in "x"
		return strings.Repeat(`{"a":`, depth) + `"x"` + strings.Repeat(`}`, depth)
	}
	names := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`"n` + strconv.Itoa(i) + `"`)
		}
		return b.String()
	}
	// Every level of deep(10) is two failing applications (a schema and
	// its $ref), each paying its depth.
	nested := `{"$defs":{"n":{"properties":{"a":{"$ref":"#/$defs/n"}},"type":"object"}},"$ref":"#/$defs/n"}`
	nestedSteps := 0
	for vid := 0; vid <= 10; vid++ {
		nestedSteps += 2 * (1 + fail + vid/failureDepthPerStep)
	}
	for _, tc := range []struct {
		schema, inst string
		steps        int
	}{
		{`{"type":"string"}`, `"x"`, 1},
		{`{"type":"string"}`, `1`, 1 + fail},
		{`false`, `1`, 1 + fail},
		// Items fail at depth 1, and the array with them.
		{`{"items":false}`, `[1,2,3]`, 1 + 3*(1+fail) + fail},
		{nested, deep(10), nestedSteps},
		// not and if pay for the failures inside them.
		{`{"not":{"type":"string"}}`, `1`, 2 + fail},
		{`{"if":{"type":"string"},"then":false}`, `1`, 2 + fail},
		{`{"not":{"type":"number"}}`, `1`, 2 + fail},
		{`{"not":{"items":{"type":"string"}}}`, `[1,2,3]`, 2 + 3*(1+fail) + fail},
		// required: a step per missing name, one per 16 looked up.
		{`{"required":[` + names(32) + `]}`, `{}`, 1 + 32 + 2 + fail},
		{`{"required":[` + names(32) + `]}`, `{"n0":0}`, 1 + 31 + 2 + fail},
		{`{"required":["n0"]}`, `{"n0":0}`, 1},
		// Members looked up in properties: one step per 16.
		{`{"properties":{}}`, `{` + strings.ReplaceAll(names(32), `",`, `":0,`) + `:0}`, 1 + 2},
		{`{"dependentRequired":{"a":[` + names(16) + `]}}`, `{"a":0}`, 1 + 16 + 1 + fail},
		{`{"$schema":"http://json-schema.org/draft-07/schema#","dependencies":{"a":[` + names(16) + `]}}`, `{"a":0}`, 1 + 16 + 1 + fail},
	} {
		s := mustCompile(t, tc.schema)
		if got := stepsOf(t, s, decode(t, tc.inst)); got != tc.steps {
			t.Errorf("%.80s on %.60s: %d steps; want %d", tc.schema, tc.inst, got, tc.steps)
		}
	}
}

// A failure the kept list is full for, but that ties with its greatest
// at path and keyword, is described to be compared, since which of
// several tied failures are kept must not depend on the order the
// validator meets them; that builds no text: its Message, which only
// repeats Expected and Found, is written for the kept failures alone.
// (Before: every tie wrote its Message, 515 bytes each for an enum of long
// members, more than the steps a failure is charged stand for.)
func TestTiedFailuresPastTheCapBuildNoText(t *testing.T) {
	member := `"` + strings.Repeat("x", 60) + `"`
	var b strings.Builder
	b.WriteString(`{"$ref": "#/$defs/a6", "$defs": {"a0": {"enum": [` + strings.TrimSuffix(strings.Repeat(member+",", 11), ",") + `]}`)
	for i := 1; i <= 6; i++ {
		r := `{"$ref": "#/$defs/a` + strconv.Itoa(i-1) + `"}`
		b.WriteString(`, "a` + strconv.Itoa(i) + `": {"allOf": [` + r + `, ` + r + `, ` + r + `, ` + r + `]}`)
	}
	b.WriteString(`}}`)
	s := mustCompile(t, b.String())
	inst := decode(t, `1`)
	var verr *jsonschema.ValidationError
	if !errors.As(s.sch.Validate(inst), &verr) {
		t.Fatal("want a validation error")
	}
	fs := failureSet{max: 50, firsts: map[string]string{}}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	collect(verr, inst, s, &fs)
	runtime.ReadMemStats(&after)
	if fs.total != 4096 {
		t.Fatalf("%d failures; want 4096", fs.total)
	}
	if per := (after.TotalAlloc - before.TotalAlloc) / 4096; per > failureBytesPerStep {
		t.Errorf("4,096 tied failures allocated %d bytes each; want at most the %d a step stands for", per, failureBytesPerStep)
	}
	kept, _, _ := fs.sorted()
	if len(kept) != 50 || kept[0].Message != "expected "+kept[0].Expected+", found a value not in the list" {
		t.Errorf("%d kept, the first %+v; want 50 with their messages", len(kept), kept[0])
	}
}
