package schema

import (
	"slices"
	"testing"
)

func TestUndeclaredProperties(t *testing.T) {
	cases := []struct {
		desc, schema, instance string
		want                   []string
	}{
		{"properties no schema declares are listed at every level", invoiceSchema,
			`{"invoice_id": "INV-0001", "currency": "USD", "note": "x", "total": 1,
			  "line_items": [{"sku": "a", "qty": 1, "line_total": 1, "color": "red"}]}`,
			[]string{"$.line_items[0].color", "$.note"}},
		{"a property matched by patternProperties is declared", `{"properties": {"a": {}}, "patternProperties": {"^x-": {}}}`,
			`{"a": 1, "x-trace": 2, "b": 3}`, []string{"$.b"}},
		{"properties declared by another applied schema are declared", `{"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]}`,
			`{"a": 1, "b": 2, "c": 3}`, []string{"$.c"}},
		{"an object schema without properties declares nothing and reports nothing", `{"type": "object"}`,
			`{"x": 1}`, nil},
		{"a failing anyOf branch declares nothing when another passes", `{"anyOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"b": {}}}]}`,
			`{"a": 1, "b": 2}`, []string{"$.a"}},
		{"the condition of if declares nothing", `{"properties": {"a": {}}, "if": {"properties": {"x": {"const": 1}}}}`,
			`{"a": 1, "x": 1}`, []string{"$.x"}},
		{"keys that would misread in a dotted path are quoted", `{"properties": {}}`,
			`{"a.b": 1}`, []string{`$["a.b"]`}},
		{"a $ref target's properties are declared", `{"$defs": {"o": {"properties": {"a": {}}}}, "properties": {"o": {"$ref": "#/$defs/o"}}}`,
			`{"o": {"a": 1, "z": 2}}`, []string{"$.o.z"}},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			rep := mustCompile(t, tc.schema).Evaluate(decode(t, tc.instance), Options{Undeclared: true})
			if !slices.Equal(rep.Undeclared, tc.want) {
				t.Errorf("Undeclared = %q; want %q", rep.Undeclared, tc.want)
			}
		})
	}
	rep := mustCompile(t, `{"properties": {}}`).Evaluate(decode(t, `{"x": 1}`), Options{})
	if rep.Undeclared != nil {
		t.Errorf("without Options.Undeclared, Undeclared = %q; want nil", rep.Undeclared)
	}
}
