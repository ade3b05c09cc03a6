package schema

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

func TestDialects(t *testing.T) {
	cases := []struct {
		desc, schema string
		valid        string // an instance valid in this dialect
		invalid      string // and one that is not
	}{
		{"no $schema means 2020-12 (prefixItems applies)", `{"prefixItems": [{"type": "string"}]}`, `["a"]`, `[1]`},
		{"2020-12", `{"$schema": "https://json-schema.org/draft/2020-12/schema", "prefixItems": [{"type": "string"}]}`, `["a"]`, `[1]`},
		{"2019-09", `{"$schema": "https://json-schema.org/draft/2019-09/schema", "items": [{"type": "string"}]}`, `["a"]`, `[1]`},
		{"draft-07", `{"$schema": "http://json-schema.org/draft-07/schema#", "if": {"type": "string"}, "then": {"minLength": 2}}`, `"ab"`, `"a"`},
		{"draft-06", `{"$schema": "http://json-schema.org/draft-06/schema#", "const": 3}`, `3`, `4`},
		{"draft-04", `{"$schema": "http://json-schema.org/draft-04/schema#", "maximum": 3, "exclusiveMaximum": true}`, `2`, `3`},
		{"format is asserted in 2020-12", `{"format": "date"}`, `"2026-11-29"`, `"29/11/2026"`},
		{"format is asserted in 2019-09", `{"$schema": "https://json-schema.org/draft/2019-09/schema", "format": "ipv4"}`, `"10.0.0.1"`, `"10.0.0.256"`},
		{"a $ref to a built-in metaschema needs no network", `{"$ref": "https://json-schema.org/draft/2020-12/schema"}`, `{"type": "string"}`, `{"type": 5}`},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			s := mustCompile(t, tc.schema)
			if rep := s.Evaluate(decode(t, tc.valid), Options{}); len(rep.Failures) != 0 {
				t.Errorf("valid instance fails: %+v", rep.Failures)
			}
			if rep := s.Evaluate(decode(t, tc.invalid), Options{}); len(rep.Failures) == 0 {
				t.Errorf("invalid instance passes (%d/%d)", rep.Passed, rep.Total)
			}
		})
	}
}

func TestCompileErrors(t *testing.T) {
	cases := []struct {
		desc, schema string
		field        string
		fixHas       string
	}{
		{"a $ref to an external URL asks to inline it under $defs", `{"properties": {"a": {"$ref": "https://example.com/address.json"}}}`, "expected_schema/properties/a/$ref", "$defs"},
		{"a relative $ref to another document asks to inline it", `{"items": {"$ref": "address.json#/x"}}`, "expected_schema/items/$ref", "$defs"},
		{"a $ref to a missing local definition names the $ref", `{"properties": {"a": {"$ref": "#/$defs/nope"}}}`, "expected_schema/properties/a/$ref", "#/$defs/"},
		{"draft-03 is not supported", `{"$schema": "http://json-schema.org/draft-03/schema#"}`, "expected_schema/$schema", "2020-12"},
		{"the unversioned latest alias is not supported", `{"$schema": "https://json-schema.org/schema"}`, "expected_schema/$schema", "2020-12"},
		{"a custom metaschema is not fetched", `{"$schema": "https://example.com/my-meta.json"}`, "expected_schema/$schema", "2020-12"},
		{"$schema must be a string", `{"$schema": 7}`, "expected_schema/$schema", "2020-12"},
		{"an unknown type name is named", `{"properties": {"a": {"type": "strin"}}}`, "expected_schema/properties/a/type", ""},
		{"a negative minLength is named", `{"minLength": -1}`, "expected_schema/minLength", ""},
		{"a pattern RE2 cannot compile is named", `{"pattern": "(?<=a)b"}`, "expected_schema/pattern", "RE2"},
		{"a schema that is not an object is refused", `[1, 2]`, "expected_schema", "JSON Schema object"},
		{"a $ref to a missing anchor names the $ref", `{"properties": {"a": {"$ref": "#nowhere"}}}`, "expected_schema/properties/a/$ref", "#/$defs/"},
		{"an unsupported dialect in an embedded resource is named", `{"$defs": {"x": {"$id": "x.json", "$schema": "http://json-schema.org/draft-03/schema#"}}, "$ref": "x.json"}`, "expected_schema/$defs/x/$schema", "2020-12"},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := NewCache(2).Compile(decode(t, tc.schema), hashOf(tc.schema))
			var ce *CompileError
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want a *CompileError", err)
			}
			if len(ce.Fields) == 0 || ce.Fields[0].Field != tc.field {
				t.Fatalf("fields %+v; want first field %q", ce.Fields, tc.field)
			}
			if f := ce.Fields[0]; f.Problem == "" || f.Fix == "" || !strings.Contains(f.Fix, tc.fixHas) {
				t.Errorf("field %+v: want a problem and a fix mentioning %q", f, tc.fixHas)
			}
			if a := ce.APIError(); a.Status != 422 || a.Code != "invalid_request" || len(a.Fields) != len(ce.Fields) {
				t.Errorf("APIError() = %+v; want a 422 invalid_request with the same fields", a)
			}
		})
	}
}

func TestCompileErrorsNeverEchoTheSchema(t *testing.T) {
	for _, schema := range []string{
		`{"type": "SECRETVALUE"}`,
		`{"$ref": "https://SECRETVALUE.example/x.json"}`,
		`{"$ref": "#/$defs/SECRETVALUE"}`,
		`{"pattern": "(?<=SECRETVALUE)"}`,
		`{"$schema": "https://json-schema.org/SECRETVALUE"}`,
		`{"enum": "SECRETVALUE"}`,
	} {
		_, err := NewCache(1).Compile(decode(t, schema), hashOf(schema))
		var ce *CompileError
		if !errors.As(err, &ce) {
			t.Fatalf("%s: got %v, want a *CompileError", schema, err)
		}
		for _, f := range ce.Fields {
			if strings.Contains(f.Field+f.Problem+f.Fix, "SECRETVALUE") {
				t.Errorf("%s: field %+v echoes the schema", schema, f)
			}
		}
		if strings.Contains(ce.Error(), "SECRETVALUE") {
			t.Errorf("%s: Error() %q echoes the schema", schema, ce.Error())
		}
	}
}

// TestCompileNeverFetches points $ref and $schema at a live local server
// and checks it is never called.
func TestCompileNeverFetches(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"type": "string"}`))
	}))
	defer srv.Close()
	for _, schema := range []string{
		`{"$ref": "` + srv.URL + `/schema.json"}`,
		`{"$schema": "` + srv.URL + `/meta.json"}`,
		`{"$id": "` + srv.URL + `/root.json", "$ref": "other.json"}`,
		`{"$dynamicRef": "` + srv.URL + `/d.json#x"}`,
	} {
		if _, err := NewCache(1).Compile(decode(t, schema), hashOf(schema)); err == nil {
			t.Errorf("%s compiled; want a refusal", schema)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the server was called %d times; compiling must never fetch", n)
	}
}

// A patternProperties key that is not a valid pattern is named where it is
// written. The library records the location of a propertyNames failure
// without copying it, and later members overwrote it: the key of
// {"type": "object", "patternProperties": {"(": true}} was reported at
// expected_schema/type/(.
func TestPatternPropertiesKeyPointer(t *testing.T) {
	long := strings.Repeat("a{1000}", 11)
	for schema, want := range map[string]string{
		`{"type": "object", "patternProperties": {"(": true}}`: "expected_schema/patternProperties/(",
		`{"patternProperties": {"(": true}}`:                   "expected_schema/patternProperties/(",
		// A long key is named shortened, as every path a client is shown
		// shortens member names.
		`{"type": "object", "patternProperties": {"` + long + `": true}}`:                                               "expected_schema/patternProperties/" + long[:64] + "…",
		`{"type": "object", "properties": {"a": {"type": "object", "patternProperties": {"(": true}}}}`:                 "expected_schema/properties/a/patternProperties/(",
		`{"type": "object", "properties": {"a": {"patternProperties": {"x/(": {}}, "minProperties": 1}}, "title": "t"}`: "expected_schema/properties/a/patternProperties/x~1(",
		// A member of the same name at the same depth elsewhere (the
		// library's reported location cannot tell them apart).
		`{"$defs": {"(": {}}, "type": "object", "patternProperties": {"(": true}, "title": "t"}`:                    "expected_schema/patternProperties/(",
		`{"allOf": [{"$defs": {"(": {}}}, {"patternProperties": {"(": true}, "type": "object"}], "type": "object"}`: "expected_schema/allOf/1/patternProperties/(",
	} {
		// The library walks the schema's members in map order: a wrong
		// pick shows only on some compiles.
		var err error
		for range 20 {
			_, err = NewCache(4).Compile(decode(t, schema), hashOf(schema))
			var ce *CompileError
			if !errors.As(err, &ce) || len(ce.Fields) != 1 || ce.Fields[0].Field != want {
				break
			}
		}
		var ce *CompileError
		if !errors.As(err, &ce) || len(ce.Fields) != 1 || ce.Fields[0].Field != want {
			t.Errorf("%.80s: %v; want one field %.60s", schema, err, want)
			continue
		}
		// The field names the key; the problem and fix never repeat it.
		if f := ce.Fields[0]; strings.Contains(f.Problem+f.Fix, "a{1000}a{1000}") || strings.Contains(f.Problem+f.Fix, "x/(") {
			t.Errorf("%+v repeats the pattern", f)
		}
	}
}
