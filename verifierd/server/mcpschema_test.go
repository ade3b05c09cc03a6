package server_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aovhq/aov/verify"
)

// compileInputSchema compiles the MCP tool input schema mcpschema/name.
func compileInputSchema(t *testing.T, name string) *jsonschema.Schema {
	t.Helper()
	raw, err := os.ReadFile("mcpschema/" + name)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource(name, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(name)
	if err != nil {
		t.Fatalf("the input schema %s does not compile: %v", name, err)
	}
	return sch
}

// TestVerifySchemaInputSchema checks the hand-written input schema of the
// MCP tool verify_schema against the service's own parser: for every
// request the two must agree, except where the parser checks what a JSON
// Schema cannot say (the expected_schema compiling, path syntax, a rule's
// operands, min ≤ max), and there the schema may only be the more lenient.
func TestVerifySchemaInputSchema(t *testing.T) {
	sch := compileInputSchema(t, "verify_schema.input.json")
	v := verify.New(verify.Config{})

	const base = `"task_id":"t","expected_schema":{"type":"object"},"submitted_output":{"a":1}`
	for _, c := range []struct {
		desc     string
		body     string
		schemaOK bool
		parseOK  bool
	}{
		{"the SPEC §10 invoice is valid", string(invoice("135.0", "")), true, true},
		{"the minimal request is valid", `{` + base + `}`, true, true},
		{"every optional field with a value is valid", `{` + base + `,"agent_id":"a","strict_content_check":true,"enforce_rules":true,"detail":"compact","bounds":{"a":{"min":0,"max":2,"if_present":true}},"rules":[{"type":"gte","field":"a","value":0,"tolerance":0.5,"if_present":true}]}`, true, true},
		{"null agent_id, bounds and rules are valid", `{` + base + `,"agent_id":null,"bounds":null,"rules":null}`, true, true},
		{"null operands are valid", `{` + base + `,"rules":[{"type":"gte","field":"a","value":0,"other_field":null,"equals":null,"equals_field":null,"in_field":null,"values":null}]}`, true, true},
		{"an exists_in rule with values is valid", `{` + base + `,"rules":[{"type":"exists_in","field":"a","values":[1,2]}]}`, true, true},
		{"a unique rule is valid", `{` + base + `,"rules":[{"type":"unique","field":"a"}]}`, true, true},
		{"submitted_output may be any JSON value", `{"task_id":"t","expected_schema":{},"submitted_output":null}`, true, true},
		{"task_id is required", `{"expected_schema":{},"submitted_output":1}`, false, false},
		{"expected_schema is required", `{"task_id":"t","submitted_output":1}`, false, false},
		{"submitted_output is required", `{"task_id":"t","expected_schema":{}}`, false, false},
		{"an empty task_id is refused", `{"task_id":"","expected_schema":{},"submitted_output":1}`, false, false},
		{"a task_id over 200 characters is refused", `{"task_id":"` + string(bytes.Repeat([]byte("x"), 201)) + `","expected_schema":{},"submitted_output":1}`, false, false},
		{"an empty agent_id is refused", `{` + base + `,"agent_id":""}`, false, false},
		{"a numeric agent_id is refused", `{` + base + `,"agent_id":7}`, false, false},
		{"an expected_schema that is not an object is refused", `{"task_id":"t","expected_schema":true,"submitted_output":1}`, false, false},
		{"an unknown top-level field is refused", `{` + base + `,"extra":1}`, false, false},
		{"a non-boolean strict_content_check is refused", `{` + base + `,"strict_content_check":"yes"}`, false, false},
		{"an unknown detail is refused", `{` + base + `,"detail":"brief"}`, false, false},
		{"bounds that are not an object are refused", `{` + base + `,"bounds":[1]}`, false, false},
		{"an unknown bound member is refused", `{` + base + `,"bounds":{"a":{"min":0,"step":1}}}`, false, false},
		{"a string bound is refused", `{` + base + `,"bounds":{"a":{"min":"0"}}}`, false, false},
		{"rules that are not an array are refused", `{` + base + `,"rules":{}}`, false, false},
		{"an unknown rule type is refused", `{` + base + `,"rules":[{"type":"nope","field":"a"}]}`, false, false},
		{"a rule without field is refused", `{` + base + `,"rules":[{"type":"unique"}]}`, false, false},
		{"an unknown rule member is refused", `{` + base + `,"rules":[{"type":"unique","field":"a","weight":2}]}`, false, false},
		{"a negative tolerance is refused", `{` + base + `,"rules":[{"type":"sum_equals","field":"a","equals":1,"tolerance":-1}]}`, false, false},
		{"empty values are refused", `{` + base + `,"rules":[{"type":"exists_in","field":"a","values":[]}]}`, false, false},
		{"a non-boolean if_present is refused", `{` + base + `,"rules":[{"type":"unique","field":"a","if_present":1}]}`, false, false},
		// What only the parser can see: the schema lets these through.
		{"a schema that does not compile is only the parser's to refuse", `{"task_id":"t","expected_schema":{"type":7},"submitted_output":1}`, true, false},
		{"a path that does not parse is only the parser's to refuse", `{` + base + `,"rules":[{"type":"unique","field":"a..b"}]}`, true, false},
		{"a missing operand is only the parser's to refuse", `{` + base + `,"rules":[{"type":"sum_equals","field":"a"}]}`, true, false},
		{"a bound without limits is only the parser's to refuse", `{` + base + `,"bounds":{"a":{}}}`, true, false},
		{"min above max is only the parser's to refuse", `{` + base + `,"bounds":{"a":{"min":2,"max":1}}}`, true, false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(c.body)))
			if err != nil {
				t.Fatal(err)
			}
			verr := sch.Validate(inst)
			if (verr == nil) != c.schemaOK {
				t.Errorf("input schema says valid=%v, want %v: %v", verr == nil, c.schemaOK, verr)
			}
			_, perr := v.Parse([]byte(c.body))
			if (perr == nil) != c.parseOK {
				t.Errorf("the parser says valid=%v, want %v: %v", perr == nil, c.parseOK, perr)
			}
		})
	}
}

func TestGetVerificationRecordInputSchema(t *testing.T) {
	sch := compileInputSchema(t, "get_verification_record.input.json")
	for _, c := range []struct {
		desc string
		body string
		ok   bool
	}{
		{"an agent id is valid", `{"agent_id":"seller-7"}`, true},
		{"agent_id is required", `{}`, false},
		{"an empty agent id is refused", `{"agent_id":""}`, false},
		{"another member is refused", `{"agent_id":"a","limit":2}`, false},
	} {
		t.Run(c.desc, func(t *testing.T) {
			inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(c.body)))
			if err := sch.Validate(inst); (err == nil) != c.ok {
				t.Fatalf("valid=%v, want %v: %v", err == nil, c.ok, err)
			}
		})
	}
}
