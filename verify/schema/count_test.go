package schema

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestCounting pins the counting rules of the package doc, one keyword
// family at a time, on passing and failing instances.
func TestCounting(t *testing.T) {
	const d7 = `"$schema": "http://json-schema.org/draft-07/schema#", `
	const d4 = `"$schema": "http://json-schema.org/draft-04/schema#", `
	cases := []struct {
		desc, schema, instance string
		passed, total          int
		failed                 []string // failure keywords, sorted
	}{
		{"type counts one check", `{"type": "string"}`, `"a"`, 1, 1, nil},
		{"a failed type ends the evaluation at its location", `{"type": "string", "enum": ["x"], "minLength": 2}`, `5`, 0, 1, []string{"type"}},
		{"type-specific assertions count only on their type", `{"minimum": 1, "minLength": 1, "minItems": 1, "required": ["a"]}`, `"abc"`, 1, 1, nil},
		{"required counts one check however many names are missing", `{"required": ["a", "b", "c"]}`, `{}`, 0, 1, []string{"required", "required", "required"}},
		{"enum and const count one check each", `{"enum": [1, 2], "const": 2}`, `2.0`, 2, 2, nil},
		{"a value not equal to const fails const", `{"const": "x"}`, `"y"`, 0, 1, []string{"const"}},
		{"format counts on strings", `{"format": "email"}`, `"a@example.com"`, 1, 1, nil},
		{"format is asserted", `{"format": "email"}`, `"not an address"`, 0, 1, []string{"format"}},
		{"format does not count on a number", `{"format": "email"}`, `5`, 0, 0, nil},
		{"each numeric keyword counts one check", `{"minimum": 0, "maximum": 10, "exclusiveMinimum": 0, "exclusiveMaximum": 10, "multipleOf": 2}`, `4`, 5, 5, nil},
		{"exclusiveMinimum fails at its limit", `{"minimum": 0, "maximum": 10, "exclusiveMinimum": 0, "exclusiveMaximum": 10, "multipleOf": 2}`, `0`, 4, 5, []string{"exclusiveMinimum"}},
		{"decimal multipleOf is exact", `{"multipleOf": 0.01}`, `19.99`, 1, 1, nil},
		{"a number that rounds to the limit as float64 is still below it", `{"exclusiveMaximum": 1}`, `0.99999999999999999999`, 1, 1, nil},
		{"a number that rounds to the limit as float64 is still above it", `{"maximum": 1}`, `1.00000000000000000001`, 0, 1, []string{"maximum"}},
		{"1.0 is an integer", `{"type": "integer"}`, `1.0`, 1, 1, nil},
		{"1.5 is not an integer", `{"type": "integer"}`, `1.5`, 0, 1, []string{"type"}},
		{"each string keyword counts one check", `{"minLength": 1, "maxLength": 3, "pattern": "^a"}`, `"abcd"`, 2, 3, []string{"maxLength"}},
		{"string length counts characters, not bytes", `{"maxLength": 2}`, `"éé"`, 1, 1, nil},
		{"each array keyword counts one check", `{"minItems": 1, "maxItems": 2, "uniqueItems": true}`, `[1, 1.0, 1]`, 1, 3, []string{"maxItems", "uniqueItems"}},
		{"uniqueItems false counts nothing", `{"uniqueItems": false}`, `[1, 1]`, 0, 0, nil},
		{"each object keyword counts one check", `{"minProperties": 1, "maxProperties": 1}`, `{"a": 1, "b": 2}`, 1, 2, []string{"maxProperties"}},
		{"dependentRequired counts one check", `{"dependentRequired": {"a": ["b"]}}`, `{"a": 1}`, 0, 1, []string{"dependentRequired"}},
		{"dependentRequired passes when its trigger is absent", `{"dependentRequired": {"a": ["b"]}}`, `{}`, 1, 1, nil},
		{"properties count the checks of the properties present", `{"properties": {"a": {"type": "integer"}, "b": {"type": "string"}}}`, `{"a": 1}`, 1, 1, nil},
		{"patternProperties and additionalProperties count per property", `{"patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": {"type": "string"}}`, `{"x1": 1, "y": "s", "z": 2}`, 2, 3, []string{"type"}},
		{"additionalProperties false is one failed check per undeclared property", `{"properties": {"a": {}}, "additionalProperties": false}`, `{"a": 1, "b": 2, "c": 3}`, 0, 2, []string{"additionalProperties", "additionalProperties"}},
		{"prefixItems and items count per item", `{"prefixItems": [{"type": "string"}], "items": {"type": "integer"}}`, `["a", 1, 2]`, 3, 3, nil},
		{"items false is one failed check per extra item", `{"prefixItems": [{}], "items": false}`, `[1, 2, 3]`, 0, 2, []string{"items", "items"}},
		{"draft-07 additionalItems false counts each extra item", `{` + d7 + `"items": [{"type": "string"}], "additionalItems": false}`, `["a", 1, 2]`, 1, 3, []string{"additionalItems"}},
		{"contains is one check and the searched items count nothing", `{"contains": {"type": "integer", "minimum": 5}}`, `[1, "a", 7]`, 1, 1, nil},
		{"contains without a match fails", `{"contains": {"type": "integer", "minimum": 5}}`, `[1]`, 0, 1, []string{"contains"}},
		{"minContains and maxContains count one check each", `{"contains": {"const": 1}, "minContains": 2, "maxContains": 2}`, `[1, 1, 1]`, 1, 2, []string{"maxContains"}},
		{"allOf counts every branch", `{"allOf": [{"type": "integer"}, {"minimum": 1}]}`, `0`, 1, 2, []string{"minimum"}},
		{"anyOf with a passing branch counts the passing branches only", `{"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]}`, `3`, 2, 2, nil},
		{"anyOf with no passing branch counts every branch", `{"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]}`, `0`, 1, 3, []string{"minimum", "type"}},
		{"oneOf with one passing branch counts that branch", `{"oneOf": [{"type": "integer"}, {"minimum": 10}]}`, `3`, 1, 1, nil},
		{"oneOf with several passing branches adds one failed check", `{"oneOf": [{"type": "integer"}, {"minimum": 10}]}`, `20`, 2, 3, []string{"oneOf"}},
		{"not is one check whatever it contains", `{"not": {"type": "string", "minLength": 3}}`, `"ab"`, 1, 1, nil},
		{"not fails when its schema matches", `{"not": {"type": "string", "minLength": 3}}`, `"abc"`, 0, 1, []string{"not"}},
		{"if does not count and then does", `{"if": {"type": "integer"}, "then": {"minimum": 1}, "else": {"type": "string"}}`, `0`, 0, 1, []string{"minimum"}},
		{"else counts when if fails", `{"if": {"type": "integer"}, "then": {"minimum": 1}, "else": {"type": "string"}}`, `true`, 0, 1, []string{"type"}},
		{"$ref counts the checks of its target at each use", `{"$defs": {"pos": {"type": "integer", "minimum": 1}}, "properties": {"a": {"$ref": "#/$defs/pos"}, "b": {"$ref": "#/$defs/pos"}}}`, `{"a": 1, "b": 0}`, 3, 4, []string{"minimum"}},
		{"draft-07 $ref ignores its siblings", `{` + d7 + `"definitions": {"i": {"type": "integer"}}, "$ref": "#/definitions/i", "minimum": 10}`, `5`, 1, 1, nil},
		{"the false schema is one failed check", `{"properties": {"a": false}}`, `{"a": 1}`, 0, 1, []string{"false"}},
		{"the true schema counts nothing", `{"properties": {"a": true}}`, `{"a": 1}`, 0, 0, nil},
		{"propertyNames counts its checks for every name", `{"propertyNames": {"maxLength": 3}}`, `{"ab": 1, "abcd": 2}`, 1, 2, []string{"propertyNames"}},
		{"unevaluatedProperties counts the properties nothing else evaluated", `{"properties": {"a": {}}, "unevaluatedProperties": {"type": "integer"}}`, `{"a": "x", "b": 1, "c": "y"}`, 1, 2, []string{"type"}},
		{"dependentSchemas count when their trigger is present", `{"dependentSchemas": {"a": {"required": ["b"]}}}`, `{"a": 1}`, 0, 1, []string{"required"}},
		{"draft-04 dependencies: the array forms are one check, the schema forms count their checks", `{` + d4 + `"dependencies": {"a": ["b"], "c": {"required": ["d"]}}}`, `{"a": 1, "c": 1}`, 0, 2, []string{"dependencies", "required"}},
		{"a self-referencing schema is one failed check", `{"$defs": {"loop": {"$ref": "#/$defs/loop"}}, "$ref": "#/$defs/loop"}`, `1`, 0, 1, []string{"$ref"}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			s := mustCompile(t, tc.schema)
			rep := s.Evaluate(decode(t, tc.instance), Options{})
			var got []string
			for _, f := range rep.Failures {
				got = append(got, f.Keyword)
			}
			slices.Sort(got)
			if rep.Passed != tc.passed || rep.Total != tc.total || !slices.Equal(got, tc.failed) {
				t.Errorf("got %d/%d failures %v; want %d/%d failures %v (%+v)", rep.Passed, rep.Total, got, tc.passed, tc.total, tc.failed, rep.Failures)
			}
			if (len(rep.Failures) == 0) != (rep.Passed == rep.Total) {
				t.Errorf("failures %v disagree with %d/%d", rep.Failures, rep.Passed, rep.Total)
			}
		})
	}
}

func TestNumberComparisonsAreExact(t *testing.T) {
	cases := []struct {
		desc, schema, instance string
		valid                  bool
	}{
		{"a value equal to minimum passes", `{"minimum": 1}`, `1`, true},
		{"a value equal to minimum written differently passes", `{"minimum": 1}`, `1.000e0`, true},
		{"a value equal to exclusiveMinimum fails", `{"exclusiveMinimum": 0.5}`, `0.5`, false},
		{"a value a hair above a limit with the same float64 fails maximum", `{"maximum": 0.5}`, `0.50000000000000000001`, false},
		{"a limit written as the exact value of float64(0.1) is not 0.1", `{"maximum": 0.1000000000000000055511151231257827021181583404541015625}`, `0.1`, true},
		{"0.1 is below that limit, as exclusiveMaximum", `{"exclusiveMaximum": 0.1000000000000000055511151231257827021181583404541015625}`, `0.1`, true},
		{"a long integer just above a limit fails", `{"maximum": 9007199254740992}`, `9007199254740993`, false},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			s := mustCompile(t, tc.schema)
			inst := decode(t, tc.instance)
			rep := s.Evaluate(inst, Options{})
			walked, _, _ := s.count(inst, false, DefaultMaxSteps)
			if (len(rep.Failures) == 0) != tc.valid || (walked.failed == 0) != tc.valid {
				t.Errorf("validator valid = %v, walk failed %d; want valid = %v", len(rep.Failures) == 0, walked.failed, tc.valid)
			}
		})
	}
}

func TestEvaluationBudget(t *testing.T) {
	// a0 applies a1 twice, a1 applies a2 twice, ...: 2^30 applications.
	var b strings.Builder
	b.WriteString(`{"$ref": "#/$defs/a0", "$defs": {`)
	for i := range 30 {
		fmt.Fprintf(&b, `"a%d": {"allOf": [{"$ref": "#/$defs/a%d"}, {"$ref": "#/$defs/a%d"}]}, `, i, i+1, i+1)
	}
	b.WriteString(`"a30": {"type": "integer"}}}`)
	s := mustCompile(t, b.String())

	_, err := s.EvaluateWithin(decode(t, `1`), Options{})
	var tc *TooComplexError
	if !errors.As(err, &tc) || tc.MaxSteps != DefaultMaxSteps || len(tc.Fields()) != 1 || tc.Fields()[0].Field != "expected_schema" {
		t.Fatalf("EvaluateWithin on an exponential schema: %v; want a *TooComplexError at the default budget", err)
	}
	rep := s.Evaluate(decode(t, `1`), Options{})
	if rep.Passed != 0 || rep.Total != 1 || len(rep.Failures) != 1 || rep.Failures[0].Keyword != "complexity" {
		t.Errorf("Evaluate over budget = %+v; want one failed complexity check (fail closed)", rep)
	}

	inv := mustCompile(t, invoiceSchema)
	if _, err := inv.EvaluateWithin(decode(t, invoiceOutput), Options{MaxSteps: 5}); !errors.As(err, &tc) || tc.MaxSteps != 5 {
		t.Errorf("the invoice within 5 steps: %v; want a *TooComplexError", err)
	}
	if rep, err := inv.EvaluateWithin(decode(t, invoiceOutput), Options{MaxSteps: 40}); err != nil || rep.Total != 22 {
		t.Errorf("the invoice within 40 steps: %v, %d checks; want 22 checks", err, rep.Total)
	}
}
