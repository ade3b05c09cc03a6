package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// FuzzEvaluate compiles arbitrary schemas and evaluates arbitrary
// instances. It checks that nothing panics, that a refusal is always a
// *CompileError, that the counting walk and the validator always reach the
// same verdict, that the counts are consistent, and that no failure repeats
// a string from the instance that the schema does not also contain.
func FuzzEvaluate(f *testing.F) {
	f.Add([]byte(invoiceSchema), []byte(invoiceOutput))
	f.Add([]byte(invoiceSchema), []byte(`{"invoice_id": "SECRET-1", "currency": "XXXSECRET", "line_items": [{"qty": 0}], "total": "n"}`))
	f.Add([]byte(`{"anyOf": [{"type": "string", "minLength": 3}, {"items": {"const": 1}}], "not": {"const": "abc"}}`), []byte(`["abcd", 1]`))
	f.Add([]byte(`{"properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"oneOf": [{"minimum": 1}, {"multipleOf": 0.5}]}}, "unevaluatedProperties": false}`), []byte(`{"a": 2, "b": 1}`))
	f.Add([]byte(`{"$schema": "http://json-schema.org/draft-04/schema#", "dependencies": {"a": ["b"]}, "additionalProperties": {"format": "email"}}`), []byte(`{"a": "x@y.z"}`))
	f.Add([]byte(`{"$dynamicAnchor": "n", "contains": {"$dynamicRef": "#n"}, "if": {"required": ["x"]}, "then": {"propertyNames": {"pattern": "^[a-z]+$"}}}`), []byte(`[{"x": 1, "Y": [1, 1]}]`))
	f.Add([]byte(`{"allOf": [{"const": {"a": [1, 2.0, "x"]}}, {"enum": ["x", [1], {"a": [1, 2, "x"]}, 3]}], "items": {"enum": [1e0, -0]}}`), []byte(`{"a": [1.0, 2, "x"]}`))
	// Patterns and format "regex" outputs whose classes the pre-scan
	// bounds (classBound): Unicode tables, case folding, brackets.
	f.Add([]byte(`{"patternProperties": {"^\\p{Lu}\\pL*$": {"format": "regex"}}, "items": {"pattern": "(?i)[a-z\\x{100}-\\x{17f}]|k"}}`), []byte(`[{"Ab": "\\pL{2}(?i:[\\P{Greek}[:alpha:]])"}, "K"]`))
	f.Add([]byte(`{"items": {"format": "regex"}}`), []byte(`["\\Q\\pL\\E\\pL\\pL", "(?i)[\\x{0}-\\x{ffff}]", "[^\\d\\W]"]`))
	// Anchored repeated classes (compiled without the one-pass matcher),
	// wide case-folded ranges (charged by their width), a bad
	// patternProperties key next to other members (named where written).
	f.Add([]byte(`{"type": "object", "patternProperties": {"(?i)^[a-z0-9\\x{a1}-\\x{ffff}]+$": {"pattern": "^[\\p{L}\\p{M}' -]{1,100}$"}, "(": true}, "title": "t"}`), []byte(`{"Zoë": "Zoë d'Arc"}`))
	f.Add([]byte(`{"items": {"pattern": "^x[\\p{L}]{990}$", "format": "regex"}}`), []byte(`["(?i)[\\x{42}-\\x{1e942}]", "x"]`))
	f.Fuzz(func(t *testing.T, schemaJSON, instanceJSON []byte) {
		tree, ok := decodeBytes(schemaJSON)
		if !ok {
			return
		}
		inst, ok := decodeBytes(instanceJSON)
		if !ok {
			return
		}
		s, err := compile(tree, compileOptions{})
		if err != nil {
			var ce *CompileError
			if !errors.As(err, &ce) || len(ce.Fields) == 0 {
				t.Fatalf("compile error %v is not a *CompileError with fields", err)
			}
			return
		}
		walked, _, ok := s.count(inst, false, DefaultMaxSteps)
		rep := s.Evaluate(inst, Options{Undeclared: true})
		if !ok {
			if len(rep.Failures) != 1 || rep.Failures[0].Keyword != "complexity" || rep.Passed != 0 {
				t.Fatalf("an evaluation over budget reported %+v", rep)
			}
			return
		}
		valid := s.sch.Validate(inst) == nil
		if (walked.failed == 0) != valid {
			t.Fatalf("counting walk says %d of %d checks failed, validator says valid = %v", walked.failed, walked.total, valid)
		}
		if rep.Passed < 0 || rep.Passed > rep.Total || (rep.Passed == rep.Total) != valid || (len(rep.Failures) == 0) != valid {
			t.Fatalf("inconsistent report %d/%d with %d failures, valid = %v", rep.Passed, rep.Total, len(rep.Failures), valid)
		}
		for _, str := range strings8(inst, nil) {
			if bytes.Contains(schemaJSON, []byte(str)) {
				continue
			}
			for _, fl := range rep.Failures {
				if strings.Contains(fl.Expected+fl.Found+fl.Message, str) {
					t.Fatalf("failure %+v repeats the submitted string %q", fl, str)
				}
			}
		}
	})
}

func decodeBytes(b []byte) (any, bool) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil || d.More() {
		return nil, false
	}
	return v, true
}

// strings8 lists the strings of at least 8 bytes in a decoded value.
func strings8(v any, out []string) []string {
	switch v := v.(type) {
	case string:
		if len(v) >= 8 {
			out = append(out, v)
		}
	case []any:
		for _, x := range v {
			out = strings8(x, out)
		}
	case map[string]any:
		for _, x := range v {
			out = strings8(x, out)
		}
	}
	return out
}
