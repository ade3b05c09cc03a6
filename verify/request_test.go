package verify

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
)

// body builds a request from the minimal valid one, with fields replaced
// (or added) by extra members; a member "x": DROP removes x.
func body(extra ...string) string {
	fields := map[string]string{
		"task_id":          `"t-1"`,
		"expected_schema":  `{"type":"object"}`,
		"submitted_output": `{"items":[{"id":"a","price":1}],"total":1}`,
	}
	order := []string{"task_id", "expected_schema", "submitted_output"}
	for _, e := range extra {
		k, v, _ := strings.Cut(e, "=")
		if _, ok := fields[k]; !ok {
			order = append(order, k)
		}
		fields[k] = v
	}
	var b strings.Builder
	b.WriteByte('{')
	n := 0
	for _, k := range order {
		if fields[k] == "DROP" {
			continue
		}
		if n > 0 {
			b.WriteByte(',')
		}
		n++
		b.WriteString(strconv.Quote(k) + ":" + fields[k])
	}
	b.WriteByte('}')
	return b.String()
}

type wantField struct{ field, problem string }

func TestParseRefusesEveryInvalidClassWithFieldProblemAndFix(t *testing.T) {
	long := strings.Repeat("é", 201)
	tests := []struct {
		desc string
		body string
		want []wantField // every field problem, in order
	}{
		// the body itself
		{desc: "an empty body is refused", body: ``, want: []wantField{{"body", "the document is empty"}}},
		{desc: "a body that is not an object is refused", body: `[1]`, want: []wantField{{"body", "is an array, not a JSON object"}}},
		{desc: "malformed JSON is refused", body: `{"task_id":`, want: []wantField{{"task_id", "the document ends unexpectedly (expected a value)"}}},
		{desc: "duplicate object keys are refused", body: `{"task_id":"a","task_id":"b"}`, want: []wantField{{"task_id", "this object key appears more than once"}}},
		{desc: "duplicate keys inside the output are refused", body: body(`submitted_output={"a":1,"a":1}`), want: []wantField{{"submitted_output.a", "this object key appears more than once"}}},
		{desc: "invalid UTF-8 is refused", body: body("task_id=\"\xff\""), want: []wantField{{"task_id", "a string is not valid UTF-8"}}},
		{desc: "a lone surrogate is refused", body: body(`submitted_output={"s":"\udc00"}`), want: []wantField{{"submitted_output.s", "a string contains an unpaired UTF-16 surrogate escape"}}},
		{desc: "integers beyond 2^53-1 are refused", body: body(`submitted_output={"n":[9007199254740993]}`), want: []wantField{{"submitted_output.n[0]", "an integer is outside ±(2^53−1) and cannot be represented exactly"}}},
		{desc: "numbers overflowing a double are refused", body: body(`submitted_output=1e400`), want: []wantField{{"submitted_output", "a number is too large to be represented as a double"}}},
		{desc: "nesting over the depth limit is refused", body: body(`submitted_output=` + strings.Repeat("[", 64) + strings.Repeat("]", 64)), want: []wantField{{"submitted_output" + strings.Repeat("[0]", 63), "nesting is deeper than the limit of 64 levels"}}},
		// required fields and top level
		{desc: "all three required fields missing are named together", body: `{}`, want: []wantField{
			{"task_id", "is required"}, {"expected_schema", "is required"}, {"submitted_output", "is required"}}},
		{desc: "an unknown top-level field is refused", body: body(`extra=1`, `Another.Field=2`), want: []wantField{
			{`["Another.Field"]`, "is not a field of a verification request"}, {"extra", "is not a field of a verification request"}}},
		{desc: "an empty task_id is refused", body: body(`task_id=""`), want: []wantField{{"task_id", "must be 1 to 200 characters long"}}},
		{desc: "a task_id over 200 characters is refused", body: body(`task_id="` + long + `"`), want: []wantField{{"task_id", "must be 1 to 200 characters long"}}},
		{desc: "a task_id that is not a string is refused", body: body(`task_id=7`), want: []wantField{{"task_id", "is a number, not a string"}}},
		{desc: "an agent_id over 200 characters is refused", body: body(`agent_id="` + long + `"`), want: []wantField{{"agent_id", "must be 1 to 200 characters long"}}},
		{desc: "an empty agent_id is refused", body: body(`agent_id=""`), want: []wantField{{"agent_id", "must be 1 to 200 characters long"}}},
		{desc: "an agent_id of the wrong type is refused", body: body(`agent_id=true`), want: []wantField{{"agent_id", "is a boolean, not a string or null"}}},
		{desc: "an expected_schema that is not an object is refused", body: body(`expected_schema=true`), want: []wantField{{"expected_schema", "is a boolean, not an object"}}},
		{desc: "a schema that does not compile is refused", body: body(`expected_schema={"type":"nonsense"}`), want: []wantField{{"expected_schema/type", ""}}},
		{desc: "a schema referring outside the request is refused", body: body(`expected_schema={"$ref":"https://example.com/s.json"}`), want: []wantField{{"expected_schema/$ref", "refers to a schema outside the request"}}},
		{desc: "strict_content_check of the wrong type is refused", body: body(`strict_content_check="yes"`), want: []wantField{{"strict_content_check", "is a string, not a boolean"}}},
		{desc: "enforce_rules null is refused", body: body(`enforce_rules=null`), want: []wantField{{"enforce_rules", "is null, not a boolean"}}},
		{desc: "an unknown detail is refused", body: body(`detail="verbose"`), want: []wantField{{"detail", "is not one of the allowed values"}}},
		{desc: "a detail of the wrong type is refused", body: body(`detail=1`), want: []wantField{{"detail", "is a number, not a string"}}},
		// bounds
		{desc: "bounds that are not an object are refused", body: body(`bounds=[]`), want: []wantField{{"bounds", "is an array, not an object"}}},
		{desc: "a bound path that does not parse is refused", body: body(`bounds={"a..b":{"min":0}}`), want: []wantField{{`bounds["a..b"]`, "is not a valid path: it has an empty key (two dots, or a dot at the start)"}}},
		{desc: "a bound without min or max is refused", body: body(`bounds={"total":{"if_present":true}}`), want: []wantField{{"bounds.total", "has neither min nor max"}}},
		{desc: "a bound with null min and max is refused", body: body(`bounds={"total":{"min":null,"max":null}}`), want: []wantField{{"bounds.total", "has neither min nor max"}}},
		{desc: "a bound with min above max is refused", body: body(`bounds={"total":{"min":5,"max":1}}`), want: []wantField{{"bounds.total", "has min greater than max"}}},
		{desc: "a bound limit that is not a number is refused", body: body(`bounds={"total":{"min":"0"}}`), want: []wantField{{"bounds.total.min", "is a string, not a number"}}},
		{desc: "a bound if_present that is not a boolean is refused", body: body(`bounds={"total":{"min":0,"if_present":1}}`), want: []wantField{{"bounds.total.if_present", "is a number, not a boolean"}}},
		{desc: "an unknown bound field is refused", body: body(`bounds={"total":{"min":0,"minimum":1}}`), want: []wantField{{"bounds.total.minimum", "is not a field of a bound"}}},
		{desc: "a bound that is not an object is refused", body: body(`bounds={"total":0}`), want: []wantField{{"bounds.total", "is a number, not an object"}}},
		// rules
		{desc: "rules that are not an array are refused", body: body(`rules={}`), want: []wantField{{"rules", "is an object, not an array"}}},
		{desc: "a rule that is not an object is refused", body: body(`rules=["unique"]`), want: []wantField{{"rules[0]", "is a string, not an object"}}},
		{desc: "an unknown rule type is refused", body: body(`rules=[{"type":"sum","field":"total"}]`), want: []wantField{{"rules[0].type", "is not one of the allowed values"}}},
		{desc: "a rule without a type is refused", body: body(`rules=[{"field":"total"}]`), want: []wantField{{"rules[0].type", "is required"}}},
		{desc: "a rule without a field is refused", body: body(`rules=[{"type":"unique"}]`), want: []wantField{{"rules[0].field", "is required"}}},
		{desc: "a rule field that does not parse is refused", body: body(`rules=[{"type":"unique","field":"items[0].id"}]`), want: []wantField{{"rules[0].field", "is not a valid path: it has a '[' that is not followed by ']'"}}},
		{desc: "an unknown rule field is refused", body: body(`rules=[{"type":"unique","field":"items[].id","strict":true}]`), want: []wantField{{"rules[0].strict", "is not a field of a rule"}}},
		{desc: "a sum_equals with neither equals_field nor equals is refused", body: body(`rules=[{"type":"sum_equals","field":"items[].price"}]`), want: []wantField{{"rules[0]", "has neither 'equals_field' nor 'equals'"}}},
		{desc: "a sum_equals with both equals_field and equals is refused", body: body(`rules=[{"type":"sum_equals","field":"items[].price","equals_field":"total","equals":1}]`), want: []wantField{{"rules[0]", "has both 'equals_field' and 'equals'"}}},
		{desc: "a gte with neither other_field nor value is refused", body: body(`rules=[{"type":"gte","field":"total"}]`), want: []wantField{{"rules[0]", "has neither 'other_field' nor 'value'"}}},
		{desc: "an lte with both other_field and value is refused", body: body(`rules=[{"type":"lte","field":"total","other_field":"total","value":1}]`), want: []wantField{{"rules[0]", "has both 'other_field' and 'value'"}}},
		{desc: "an exists_in with neither in_field nor values is refused", body: body(`rules=[{"type":"exists_in","field":"items[].id"}]`), want: []wantField{{"rules[0]", "has neither 'in_field' nor 'values'"}}},
		{desc: "an exists_in with both in_field and values is refused", body: body(`rules=[{"type":"exists_in","field":"items[].id","in_field":"ids[]","values":["a"]}]`), want: []wantField{{"rules[0]", "has both 'in_field' and 'values'"}}},
		{desc: "an operand another rule type takes is refused", body: body(`rules=[{"type":"unique","field":"items[].id","value":1}]`), want: []wantField{{"rules[0].value", "is not used by a 'unique' rule"}}},
		{desc: "an equals that is not a number is refused", body: body(`rules=[{"type":"sum_equals","field":"items[].price","equals":"1"}]`), want: []wantField{{"rules[0].equals", "is a string, not a number"}}},
		{desc: "an equals_field naming every element is refused", body: body(`rules=[{"type":"sum_equals","field":"items[].price","equals_field":"items[].price"}]`), want: []wantField{{"rules[0].equals_field", "names every element of an array ('[]') where one value is compared"}}},
		{desc: "values that are not an array are refused", body: body(`rules=[{"type":"exists_in","field":"items[].id","values":"a"}]`), want: []wantField{{"rules[0].values", "is a string, not an array"}}},
		{desc: "empty values are refused", body: body(`rules=[{"type":"exists_in","field":"items[].id","values":[]}]`), want: []wantField{{"rules[0].values", "is empty"}}},
		{desc: "a negative tolerance is refused", body: body(`rules=[{"type":"sum_equals","field":"items[].price","equals":1,"tolerance":-1}]`), want: []wantField{{"rules[0].tolerance", "is negative"}}},
		{desc: "a tolerance that is not a number is refused", body: body(`rules=[{"type":"sum_equals","field":"items[].price","equals":1,"tolerance":"0.1"}]`), want: []wantField{{"rules[0].tolerance", "is a string, not a number"}}},
		{desc: "a rule if_present that is not a boolean is refused", body: body(`rules=[{"type":"unique","field":"items[].id","if_present":"no"}]`), want: []wantField{{"rules[0].if_present", "is a string, not a boolean"}}},
		{desc: "problems across fields are all listed in one answer", body: body(`task_id=""`, `detail="x"`, `rules=[{"type":"nope","field":""}]`), want: []wantField{
			{"task_id", "must be 1 to 200 characters long"}, {"detail", "is not one of the allowed values"},
			{"rules[0].type", "is not one of the allowed values"}, {"rules[0].field", "is not a valid path: it is empty"}}},
	}
	v := New(Config{})
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			req, err := v.Parse([]byte(tc.body))
			var ae *apierr.Error
			if !errors.As(err, &ae) {
				t.Fatalf("Parse = %+v, %v; want *apierr.Error", req, err)
			}
			if ae.Status != http.StatusUnprocessableEntity || ae.Code != apierr.CodeInvalidRequest {
				t.Fatalf("status %d code %s, want 422 invalid_request", ae.Status, ae.Code)
			}
			if len(ae.Fields) != len(tc.want) {
				t.Fatalf("fields = %+v, want %d: %+v", ae.Fields, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				f := ae.Fields[i]
				if f.Field != w.field || (w.problem != "" && f.Problem != w.problem) {
					t.Errorf("field %d = %q %q, want %q %q", i, f.Field, f.Problem, w.field, w.problem)
				}
				if f.Fix == "" || f.Problem == "" {
					t.Errorf("field %d has no problem or fix: %+v", i, f)
				}
			}
		})
	}
}

func TestUnknownRuleTypeFixListsTheTypes(t *testing.T) {
	_, err := New(Config{}).Parse([]byte(body(`rules=[{"type":"sum","field":"total"}]`)))
	var ae *apierr.Error
	if !errors.As(err, &ae) || len(ae.Fields) != 1 {
		t.Fatalf("err = %v", err)
	}
	if want := "Use one of: 'sum_equals', 'gte', 'lte', 'exists_in' or 'unique'."; ae.Fields[0].Fix != want {
		t.Errorf("fix = %q, want %q", ae.Fields[0].Fix, want)
	}
	if got := ae.NextActions[0].Fields; len(got) != 1 || got[0] != "rules[0].type" {
		t.Errorf("next_actions fields = %v", got)
	}
}

func TestParseAcceptsValidRequests(t *testing.T) {
	tests := []struct {
		desc string
		body string
	}{
		{desc: "a minimal request is valid", body: body()},
		{desc: "any JSON value is a valid output, null included", body: body(`submitted_output=null`)},
		{desc: "agent_id may be null", body: body(`agent_id=null`)},
		{desc: "bounds and rules may be null or empty", body: body(`bounds=null`, `rules=[]`)},
		{desc: "a $.-prefixed path is a path", body: body(`bounds={"$.total":{"max":10}}`)},
		{desc: "null operands are absent operands, as in the normalized request", body: body(`rules=[{"type":"sum_equals","field":"items[].price","equals_field":"total","equals":null,"other_field":null,"value":null,"in_field":null,"values":null,"tolerance":0.01,"if_present":false}]`)},
		{desc: "every rule type with each of its operands is valid", body: body(`rules=[` +
			`{"type":"sum_equals","field":"items[].price","equals_field":"total"},{"type":"sum_equals","field":"items[].price","equals":1},` +
			`{"type":"gte","field":"total","value":0},{"type":"gte","field":"total","other_field":"$.total"},` +
			`{"type":"lte","field":"items[].price","value":10,"tolerance":0},{"type":"lte","field":"total","other_field":"total"},` +
			`{"type":"exists_in","field":"items[].id","values":["a","b"]},{"type":"exists_in","field":"items[].id","in_field":"items[].id"},` +
			`{"type":"unique","field":"items[].id","if_present":true}]`)},
		{desc: "a 200-character task_id is valid", body: body(`task_id="` + strings.Repeat("é", 200) + `"`)},
		{desc: "compact detail is valid", body: body(`detail="compact"`)},
	}
	v := New(Config{})
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			if _, err := v.Parse([]byte(tc.body)); err != nil {
				t.Fatalf("Parse: %v", err)
			}
		})
	}
}

func TestParseLimits(t *testing.T) {
	tests := []struct {
		desc   string
		cfg    Config
		body   string
		status int
		field  string
	}{
		{desc: "a body over MaxBodyBytes is 413", cfg: Config{MaxBodyBytes: 64}, body: body(`task_id="` + strings.Repeat("x", 64) + `"`), status: 413},
		{desc: "more rules than MaxRules are refused", cfg: Config{MaxRules: 1}, body: body(`rules=[{"type":"unique","field":"a[]"},{"type":"unique","field":"b[]"}]`), status: 422, field: "rules"},
		{desc: "more bounds than MaxBounds are refused", cfg: Config{MaxBounds: 1}, body: body(`bounds={"a":{"min":1},"b":{"min":1}}`), status: 422, field: "bounds"},
		{desc: "a schema needing more evaluation steps than MaxSchemaSteps is refused", cfg: Config{MaxSchemaSteps: 5}, body: invoiceRequest("129.5"), status: 422, field: "expected_schema"},
		{desc: "nesting over MaxDepth is refused", cfg: Config{MaxDepth: 3}, body: body(`submitted_output={"a":{"b":{}}}`), status: 422, field: "submitted_output.a.b"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := New(tc.cfg).Parse([]byte(tc.body))
			var ae *apierr.Error
			if !errors.As(err, &ae) {
				t.Fatalf("err = %v", err)
			}
			if ae.Status != tc.status {
				t.Fatalf("status = %d, want %d", ae.Status, tc.status)
			}
			if tc.status == 413 {
				if ae.Code != apierr.CodePayloadTooLarge || !strings.Contains(ae.Message, "64 bytes") {
					t.Errorf("413 does not name the limit: %+v", ae)
				}
				return
			}
			if len(ae.Fields) != 1 || ae.Fields[0].Field != tc.field {
				t.Errorf("fields = %+v, want %s", ae.Fields, tc.field)
			}
		})
	}
}

func TestProblemListIsCapped(t *testing.T) {
	var rules []string
	for range 100 {
		rules = append(rules, `{"type":"x","field":"..","y":1}`)
	}
	_, err := New(Config{}).Parse([]byte(body(`rules=[` + strings.Join(rules, ",") + `]`)))
	var ae *apierr.Error
	if !errors.As(err, &ae) {
		t.Fatal(err)
	}
	if len(ae.Fields) != maxProblems+1 || ae.Fields[maxProblems].Field != "request" {
		t.Fatalf("%d fields, last %+v", len(ae.Fields), ae.Fields[len(ae.Fields)-1])
	}
}

func TestRefusalsNeverEchoSubmittedValues(t *testing.T) {
	const secret = "sk_live_SECRET_VALUE"
	bodies := []string{
		body(`task_id=["` + secret + `"]`),
		body(`detail="` + secret + `"`),
		body(`rules=[{"type":"` + secret + `","field":"` + secret + `[0]"}]`),
		body(`submitted_output={"k":"` + secret + `\ud800"}`),
		body(`expected_schema={"type":"` + secret + `"}`),
		body(`expected_schema={"$ref":"https://` + secret + `.example/s.json"}`),
		body(`bounds={"total":{"min":"` + secret + `"}}`),
	}
	v := New(Config{})
	for _, b := range bodies {
		_, err := v.Parse([]byte(b))
		var ae *apierr.Error
		if !errors.As(err, &ae) {
			t.Fatalf("Parse(%s) accepted", b)
		}
		text := ae.Message
		for _, f := range ae.Fields {
			text += f.Field + f.Problem + f.Fix
		}
		if strings.Contains(text, secret) {
			t.Errorf("refusal of %s echoes the input: %s", b, text)
		}
	}
}
