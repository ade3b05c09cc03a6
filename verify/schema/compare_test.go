package schema

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// constUses applies one const (or enum, when enum is true) of value
// through $ref uses times at the root.
func constUses(value string, uses int, enum bool) string {
	kw := `"const": ` + value
	if enum {
		kw = `"enum": [` + value + `]`
	}
	return `{"$defs": {"c": {` + kw + `}}, "allOf": [` +
		strings.TrimSuffix(strings.Repeat(`{"$ref": "#/$defs/c"},`, uses), ",") + `]}`
}

// The validator compares a const or enum value with the instance deeply
// (numbers as big.Rat), after the walk and without interruption, so a
// large value applied many times is charged by its size, not as one step:
// this 580 KB request took seconds of CPU and was accepted.
func TestConstAndEnumWorkIsCharged(t *testing.T) {
	numbers := jsonArray(50_000, strconv.Itoa)
	inst := decode(t, numbers)
	var tc *TooComplexError
	for _, enum := range []bool{false, true} {
		s := mustCompile(t, constUses(numbers, 50, enum))
		if _, err := s.EvaluateWithin(inst, Options{}); !errors.As(err, &tc) || tc.MaxSteps != DefaultMaxSteps {
			t.Errorf("enum %v: a 50,000-number value applied 50 times to itself: %v; want a *TooComplexError", enum, err)
		}
		// Once is within the budget, and passes.
		once := mustCompile(t, constUses(numbers, 1, enum))
		if rep, err := once.EvaluateWithin(inst, Options{}); err != nil || rep.Total != 1 || rep.Passed != 1 {
			t.Errorf("enum %v: the same value once: %+v, %v; want one passing check", enum, rep, err)
		}
	}
}

// A long string costs the validator its length at every comparison:
// under a const applied a hundred thousand times (three nested allOf
// of ten, here 600 KB of request) it took it tens of seconds. Only the
// walk runs here: it must stop at the budget.
func TestLongStringConstIsCharged(t *testing.T) {
	str := strings.Repeat("a", 300_000)
	schema := `{"$defs": {"l0": {"const": ["` + str + `"]}`
	for k := 1; k <= 5; k++ {
		schema += `, "l` + strconv.Itoa(k) + `": {"allOf": [` +
			strings.TrimSuffix(strings.Repeat(`{"$ref": "#/$defs/l`+strconv.Itoa(k-1)+`"},`, 10), ",") + `]}`
	}
	schema += `}, "$ref": "#/$defs/l5"}`
	s := mustCompile(t, schema)
	if _, _, ok := s.count(decode(t, `["`+str[1:]+`b"]`), false, DefaultMaxSteps); ok {
		t.Error("a 300 KB string under a const applied 100,000 times is within the step budget")
	}
}

// Each comparison costs the size of the smaller of the two values when
// both are objects with as many members, arrays of one length or strings
// of one length (otherwise the equality check stops at the top); one step
// for two numbers (each a big.Rat to the validator); and one step per 16
// for anything else (short strings, or values that differ at the top). A
// size counts every value inside, and a string one more per 4 KB. A
// failing application costs fail more (the validator's error for it; an
// item's, at depth 1, as much again).
func TestConstAndEnumSteps(t *testing.T) {
	const fail = failureSteps
	big := jsonArray(10_000, strconv.Itoa)
	long, other := strings.Repeat("a", 8192), strings.Repeat("a", 8191)+"b"
	for _, tc := range []struct {
		schema, inst string
		steps        int
	}{
		// One step for the schema, plus the comparison.
		{`{"const": [1, 2, 3]}`, `[1, 2, 3]`, 1 + 4},
		{`{"const": [1, 2, 3]}`, `[1, 2, 4]`, 1 + 4 + fail},
		{`{"const": {"a": [1, 2], "b": "x"}}`, `{"a": [1, 2], "b": "x"}`, 1 + 5},
		{`{"const": [1, 2, 3]}`, `[1, 2]`, 1 + fail},                          // lengths differ: 1/16
		{`{"const": [1, 2, 3]}`, `"s"`, 1 + fail},                             // types differ: 1/16
		{`{"const": 5}`, `5.0`, 1 + 1},                                        // two numbers
		{`{"const": "USD"}`, `"USD"`, 1},                                      // two strings: 1/16
		{`{"const": ` + big + `}`, `[1]`, 1 + fail},                           // lengths differ, however large
		{`{"const": [` + big + `]}`, `[1]`, 1 + 2 + fail},                     // the smaller size counts
		{`{"const": [1]}`, `[` + big + `]`, 1 + 2 + fail},                     // ... either way round
		{`{"const": "` + long + `"}`, `"` + long + `"`, 1 + 3 + 8},            // compared (1 + 8 KB / 4 KB), applied to (8 KB / 1 KB)
		{`{"const": ["` + long + `"]}`, `["` + other + `"]`, 1 + 4 + fail},    // compared to the end
		{`{"const": ["` + long + `"]}`, `["` + long[1:] + `"]`, 1 + 3 + fail}, // the smaller size, a bound
		{`{"const": "` + long + `"}`, `"` + long[1:] + `"`, 1 + fail},         // lengths differ: 1/16
		{`{"enum": [[1, 2], [1, 3]]}`, `[1, 3]`, 1 + 3 + 3},
		{`{"enum": [1, 2, 3]}`, `3`, 1 + 3},
		{`{"enum": [1, 2, 3]}`, `2`, 1 + 2}, // up to the match
		{`{"enum": ["USD", "EUR"]}`, `"EUR"`, 1},
		{`{"items": {"enum": ["USD", "EUR"]}}`, `["GBP", "GBP", "GBP", "GBP", "GBP", "GBP", "GBP", "GBP"]`, 1 + 8 + 1 + 8*fail + fail},
		{`{"items": {"enum": ["USD", "EUR"]}}`, `["GBP", "GBP", "GBP", "GBP", "GBP", "GBP", "GBP", "GBP", "USD"]`, 1 + 9 + 1 + 8*fail + fail},
	} {
		s := mustCompile(t, tc.schema)
		if got := stepsOf(t, s, decode(t, tc.inst)); got != tc.steps {
			name := tc.schema + " on " + tc.inst
			if len(name) > 120 {
				name = name[:120] + "..."
			}
			t.Errorf("%s: %d steps; want %d", name, got, tc.steps)
		}
	}
}

// An enum of numbers costs the validator a big.Rat comparison per member
// it tries, about a step's work; one step per 16 members let 300 values
// under a 50,000-number enum cost it half a minute.
func TestNumberEnumIsCharged(t *testing.T) {
	s := mustCompile(t, `{"items": {"enum": `+jsonArray(50_000, func(i int) string { return strconv.Itoa(i) + ".5" })+`}}`)
	inst := decode(t, jsonArray(300, func(int) string { return "-1" }))
	var tc *TooComplexError
	if _, err := s.EvaluateWithin(inst, Options{}); !errors.As(err, &tc) {
		t.Errorf("300 numbers under a 50,000-number enum: %v; want a *TooComplexError", err)
	}
	if rep, err := s.EvaluateWithin([]any{}, Options{}); err != nil || rep.Passed != rep.Total {
		t.Errorf("no values: %+v, %v", rep, err)
	}
}

// Honest schemas are far from the budget: enums of a few strings and
// consts of small objects over a large output.
func TestHonestConstAndEnumWithinBudget(t *testing.T) {
	s := mustCompile(t, `{"type": "array", "items": {"type": "object", "properties": {
		"currency": {"enum": ["USD", "EUR", "GBP", "JPY", "CHF"]},
		"status": {"enum": ["open", "paid", "void"]},
		"rating": {"enum": [1, 2, 3, 4, 5]},
		"meta": {"const": {"version": 2, "source": "agent"}}}}}`)
	inst := decode(t, jsonArray(10_000, func(i int) string {
		return `{"currency": "CHF", "status": "void", "rating": 5, "meta": {"version": 2, "source": "agent"}}`
	}))
	// Per item: its schema and 4 properties (5), the currency and status
	// comparisons (8/16), 5 number comparisons, the const (3).
	if got, want := stepsOf(t, s, inst), 1+10_000*(5+5+3)+10_000*8/16; got != want {
		t.Errorf("10,000 items: %d steps; want %d", got, want)
	}
	if rep, err := s.EvaluateWithin(inst, Options{}); err != nil || rep.Passed != rep.Total {
		t.Errorf("10,000 honest items: %+v, %v; want a pass", rep, err)
	}
}

// The validator copies a string at every schema applied to it (for
// contentEncoding, whether or not the schema has one), so a 300 KB string
// under a hundred thousand applications (five nested allOf of ten) cost
// it about a minute in 222,222 steps. Each application is charged the
// string's length, one step per KB. Only the walk runs here.
func TestLongStringApplicationsAreCharged(t *testing.T) {
	schema := `{"$defs": {"l0": {"type": "string"}`
	for k := 1; k <= 5; k++ {
		schema += `, "l` + strconv.Itoa(k) + `": {"allOf": [` +
			strings.TrimSuffix(strings.Repeat(`{"$ref": "#/$defs/l`+strconv.Itoa(k-1)+`"},`, 10), ",") + `]}`
	}
	schema += `}, "$ref": "#/$defs/l5"}`
	s := mustCompile(t, schema)
	if _, _, ok := s.count(strings.Repeat("a", 300_000), false, DefaultMaxSteps); ok {
		t.Error("a 300 KB string under 222,222 schema applications is within the step budget")
	}
	// Deterministic: one step for the schema, one per KB of the string.
	str := mustCompile(t, `{"type": "string", "maxLength": 20000}`)
	if got, want := stepsOf(t, str, strings.Repeat("é", 5000)), 1+10_000/1024; got != want {
		t.Errorf("a 10,000-byte string: %d steps; want %d", got, want)
	}
	if got, want := stepsOf(t, str, "short"), 1; got != want {
		t.Errorf("a short string: %d steps; want %d", got, want)
	}
}

// A walk whose steps are charged many at a time (each comparison of a
// large const costs its size) still notices its context: the count skips
// past multiples of 1,024 instead of landing on them.
func TestContextCheckedUnderLargeCharges(t *testing.T) {
	numbers := jsonArray(2_000, strconv.Itoa)
	s := mustCompile(t, constUses(numbers, 100, false))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.EvaluateContext(ctx, decode(t, numbers), Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled evaluation of a const of 2,000 numbers applied 100 times: %v; want context.Canceled", err)
	}
}
