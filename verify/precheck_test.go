package verify

import (
	"errors"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
)

func TestPrecheckRefusesWhatParseRefusesWithoutEvaluating(t *testing.T) {
	v := New(Config{MaxSchemaSteps: 5})
	tests := []struct {
		desc  string
		body  string
		field string // "" when the request is worth paying for
	}{
		{desc: "a valid request passes", body: `{"task_id":"t","expected_schema":{"type":"object"},"submitted_output":{}}`},
		{desc: "a failing output passes: a fail is a complete answer", body: `{"task_id":"t","expected_schema":{"type":"string"},"submitted_output":1}`},
		{desc: "an output too costly to evaluate is left to the verification service", body: invoiceRequest("129.5")},
		{desc: "malformed JSON is refused", body: `{"task_id":`, field: "task_id"},
		{desc: "a body that is not an object is refused", body: `[1]`, field: "body"},
		{desc: "a missing field is refused", body: `{"task_id":"t","expected_schema":{}}`, field: "submitted_output"},
		{desc: "an unknown field is refused", body: `{"task_id":"t","expected_schema":{},"submitted_output":1,"x":1}`, field: "x"},
		{desc: "a schema that does not compile is refused", body: `{"task_id":"t","expected_schema":{"type":"nope"},"submitted_output":1}`, field: "expected_schema"},
		{desc: "a bad rule is refused", body: `{"task_id":"t","expected_schema":{},"submitted_output":1,"rules":[{"type":"x","field":"a"}]}`, field: "rules[0].type"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			err := v.Precheck([]byte(tc.body))
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var e *apierr.Error
			if !errors.As(err, &e) || e.Status != 422 || len(e.Fields) == 0 || !strings.HasPrefix(e.Fields[0].Field, tc.field) {
				t.Fatalf("error %v, want 422 naming %s", err, tc.field)
			}
			_, perr := v.Parse([]byte(tc.body))
			var pe *apierr.Error
			if !errors.As(perr, &pe) || pe.Fields[0] != e.Fields[0] {
				t.Errorf("Parse refuses with %v, Precheck with %v", perr, err)
			}
		})
	}
	if err := v.Precheck([]byte(strings.Repeat(" ", int(v.cfg.MaxBodyBytes)+1))); apierr.From(err).Status != 413 {
		t.Errorf("an oversize body: %v", err)
	}
}

// FuzzPrecheckAgreesWithParse gives the same bytes to the gateway's check
// and to the verification service's parser: the gate must never refuse a
// request the service would serve, whatever it refuses the service
// refuses too, with the same first problem, and what it passes (402, pay)
// the service refuses only for what Precheck leaves to it, the
// evaluation's own budgets (steps, regular-expression work) or its time.
func FuzzPrecheckAgreesWithParse(f *testing.F) {
	for _, tc := range specVectors {
		f.Add([]byte(tc.request))
	}
	f.Add([]byte(invoiceRequest("135.0")))
	f.Add([]byte(`{"task_id":"t","expected_schema":{"type":"nope"},"submitted_output":1}`))
	f.Add([]byte(`{"task_id":"t","expected_schema":{"$ref":"#/$defs/x","$defs":{"x":{"type":"integer"}}},"submitted_output":1}`))
	f.Add([]byte(`{"task_id":"t","task_id":"u"}`))
	f.Add([]byte("\xef\xbb\xbf{}"))
	f.Add([]byte(body(`strict_content_check=true`, `submitted_output={"a":"TODO","b":["",{"c":"x"}]}`)))
	f.Add([]byte(body(`bounds={"items[].price":{"min":0,"max":1,"if_present":true}}`)))
	f.Add([]byte(body(`rules=[{"type":"exists_in","field":"items[].id","values":["a",1,null]},{"type":"unique","field":"$[]"}]`)))
	f.Add([]byte(`{"task_id":"t","expected_schema":{"minimum":0.4,"multipleOf":1e-300},"submitted_output":[1e-300,5e-324]}`))
	f.Add([]byte(`{"task_id":"t","expected_schema":{"pattern":"^a+$","format":"regex"},"submitted_output":"a("}`))
	f.Add([]byte(`{"task_id":"t","expected_schema":{"uniqueItems":true},"submitted_output":[1,1.0,{"a":1}]}`))
	f.Add([]byte(`{"task_id":"t","expected_schema":{"allOf":[{"format":"json-pointer"},{"format":"uri-template"}]},"submitted_output":"/a/{b}"}`))
	f.Add(refChain(3, 2, false))
	f.Add(refChain(3, 2, true))
	v := New(Config{ListCap: 5, SchemaCacheSize: 8, MaxSchemaSteps: 1 << 12})
	f.Fuzz(func(t *testing.T, data []byte) {
		perr := v.Precheck(data)
		_, err := v.Parse(data)
		if perr == nil {
			if err == nil {
				return
			}
			e := apierr.From(err)
			if e.Code == apierr.CodeVerificationTimeout {
				return
			}
			if e.Status != 422 || len(e.Fields) == 0 {
				t.Fatalf("Precheck passes (402, pay) but Parse fails: %v: %q", err, data)
			}
			for _, fl := range e.Fields {
				if fl.Field != "expected_schema" || !strings.Contains(fl.Problem, "evaluation steps on this output") &&
					!strings.Contains(fl.Problem, "units of regular-expression work") {
					t.Fatalf("Precheck passes (402, pay) but Parse refuses %+v: %q", e.Fields, data)
				}
			}
			return
		}
		if err == nil {
			t.Fatalf("Precheck refuses (%v) what Parse accepts: %q", perr, data)
		}
		pe, e := apierr.From(perr), apierr.From(err)
		if pe.Status != e.Status || (len(pe.Fields) > 0 && (len(e.Fields) == 0 || pe.Fields[0] != e.Fields[0])) {
			t.Fatalf("Precheck %v, Parse %v: %q", perr, err, data)
		}
	})
}
