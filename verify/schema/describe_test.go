package schema

import (
	"strings"
	"testing"
)

// TestFailureDescriptions pins the Expected/Found wording per keyword. The
// instances carry the marker "S3CRET" wherever a string is submitted; no
// description may contain it.
func TestFailureDescriptions(t *testing.T) {
	cases := []struct {
		desc, schema, instance         string
		keyword, path, expected, found string
	}{
		{"type names both types", `{"properties": {"a": {"type": "integer"}}}`, `{"a": "S3CRET"}`, "type", "$.a", "type integer", "type string"},
		{"enum lists the schema's values", `{"enum": ["USD", "EUR", 3]}`, `"S3CRET"`, "enum", "$", "one of USD, EUR, 3", "a value not in the list"},
		{"const shows the schema's constant", `{"const": {"v": 1}}`, `"S3CRET"`, "const", "$", `the value {"v":1}`, "a different value"},
		{"format names the format", `{"format": "uuid"}`, `"S3CRET"`, "format", "$", "a string in format uuid", "a string that is not a valid uuid"},
		{"pattern shows the pattern", `{"pattern": "^INV-[0-9]{4}$"}`, `"S3CRET"`, "pattern", "$", "a string matching ^INV-[0-9]{4}$", "a string that does not match"},
		{"pattern compiled without its one-pass matcher shows the pattern as written", `{"pattern": "^\\pL{10}$"}`, `"S3CRET"`, "pattern", "$", `a string matching ^\pL{10}$`, "a string that does not match"},
		{"minLength counts characters", `{"minLength": 10}`, `"S3CRET"`, "minLength", "$", "a string of at least 10 characters", "6 characters"},
		{"maxLength counts characters", `{"maxLength": 2}`, `"S3CRET"`, "maxLength", "$", "a string of at most 2 characters", "6 characters"},
		{"minimum says integer for an integer schema", `{"type": "integer", "minimum": 1}`, `0`, "minimum", "$", "integer >= 1", "0"},
		{"minimum says number otherwise", `{"type": "number", "minimum": 0}`, `-2.5`, "minimum", "$", "number >= 0", "-2.5"},
		{"maximum", `{"maximum": 1.5}`, `2`, "maximum", "$", "number <= 1.5", "2"},
		{"exclusiveMinimum", `{"exclusiveMinimum": 0}`, `0`, "exclusiveMinimum", "$", "number > 0", "0"},
		{"exclusiveMaximum", `{"exclusiveMaximum": 0}`, `1`, "exclusiveMaximum", "$", "number < 0", "1"},
		{"multipleOf", `{"multipleOf": 0.5}`, `0.3`, "multipleOf", "$", "a multiple of 0.5", "0.3"},
		{"minItems", `{"minItems": 1}`, `[]`, "minItems", "$", "an array of at least 1 item", "0 items"},
		{"maxItems", `{"maxItems": 1}`, `["S3CRET", "S3CRET"]`, "maxItems", "$", "an array of at most 1 item", "2 items"},
		{"minProperties", `{"minProperties": 2}`, `{"a": "S3CRET"}`, "minProperties", "$", "an object with at least 2 properties", "1 property"},
		{"required names the missing property", `{"properties": {"o": {"required": ["sku"]}}}`, `{"o": {"x": "S3CRET"}}`, "required", "$.o", "property sku", "missing"},
		{"dependentRequired names both properties", `{"dependentRequired": {"a": ["b"]}}`, `{"a": "S3CRET"}`, "dependentRequired", "$", "property b (required when a is present)", "missing"},
		{"additionalProperties points at the property", `{"properties": {}, "additionalProperties": false}`, `{"extra": "S3CRET"}`, "additionalProperties", "$.extra", "no property here (the schema allows only the properties it declares)", "an undeclared property"},
		{"uniqueItems names the equal items", `{"uniqueItems": true}`, `["S3CRET", 1, "S3CRET"]`, "uniqueItems", "$", "unique items", "items 0 and 2 are equal"},
		{"contains", `{"contains": {"type": "integer"}}`, `["S3CRET"]`, "contains", "$", "an array with an item matching the contains schema", "no matching item"},
		{"minContains", `{"contains": {"type": "string"}, "minContains": 2}`, `["S3CRET"]`, "minContains", "$", "at least 2 items matching the contains schema", "1 matching item"},
		{"propertyNames does not repeat the name", `{"propertyNames": {"maxLength": 3}}`, `{"S3CRET": 1}`, "propertyNames", "$", "property names valid against propertyNames", "a property name that is not"},
		{"not", `{"not": {"type": "string"}}`, `"S3CRET"`, "not", "$", "a value that does not match the not schema", "a value that matches it"},
		{"oneOf with two matches", `{"oneOf": [{"type": "string"}, {"minLength": 1}]}`, `"S3CRET"`, "oneOf", "$", "a value matching exactly one oneOf schema", "a value matching schemas 0 and 1"},
		{"a false schema under items", `{"prefixItems": [true], "items": false}`, `[1, "S3CRET"]`, "items", "$[1]", "no value here (the schema at this location is false)", "a value"},
		{"a quoted key in a path", `{"properties": {"a b": {"type": "integer"}}}`, `{"a b": "S3CRET"}`, "type", `$["a b"]`, "type integer", "type string"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			rep := mustCompile(t, tc.schema).Evaluate(decode(t, tc.instance), Options{})
			if len(rep.Failures) != 1 {
				t.Fatalf("got %d failures %+v; want 1", len(rep.Failures), rep.Failures)
			}
			f := rep.Failures[0]
			if f.Keyword != tc.keyword || f.InstancePath != tc.path || f.Expected != tc.expected || f.Found != tc.found {
				t.Errorf("got  %q %q %q %q\nwant %q %q %q %q", f.Keyword, f.InstancePath, f.Expected, f.Found, tc.keyword, tc.path, tc.expected, tc.found)
			}
			if f.Message != "expected "+f.Expected+", found "+f.Found {
				t.Errorf("Message = %q", f.Message)
			}
			if strings.Contains(f.Expected+f.Found+f.Message, "S3CRET") {
				t.Errorf("failure %+v repeats submitted content", f)
			}
		})
	}
}

// The pattern of the case above is compiled behind noOnePass; if it ever
// is not, the case no longer shows that the prefix stays out of the text.
func TestDescribedPatternIsCompiledBehindThePrefix(t *testing.T) {
	m, err := measurePattern(`^\pL{10}$`, DefaultMaxPatternSize)
	if err != nil || m.onePass {
		t.Fatalf("measurePattern = %+v, %v; want a pattern compiled without its one-pass matcher", m, err)
	}
}

// What a failed const or enum expects is written when the schema
// compiles, clipped as before, so describing a failure costs no more than
// pointing at it; a schema the compiled texts miss is described without
// quoting its value rather than by writing the value out.
func TestConstAndEnumTextsAreWrittenAtCompile(t *testing.T) {
	long := `"` + strings.Repeat("é", 40) + `"`
	s := mustCompile(t, `{"properties": {"a": {"$ref": "#/$defs/c"}, "b": {"enum": [`+long+`, [`+long+`]]}}, "$defs": {"c": {"const": [`+long+`]}}}`)
	rep := s.Evaluate(decode(t, `{"a": 1, "b": 1}`), Options{})
	want := []string{`the value ["` + strings.Repeat("é", 29) + `…`, "one of " + strings.Repeat("é", 20) + `…, ["` + strings.Repeat("é", 29) + `…`}
	if len(rep.Failures) != 2 || rep.Failures[0].Expected != want[0] || rep.Failures[1].Expected != want[1] {
		t.Fatalf("failures %+v; want expected %q", rep.Failures, want)
	}
	if len(s.quotes) != 2 {
		t.Errorf("%d schemas with quoted values; want 2", len(s.quotes))
	}
	if q := s.quoted("#/nowhere"); q.constant != "the value the schema gives" || q.enum != "one of the values the schema lists" {
		t.Errorf("an unknown location: %+v", q)
	}
}
