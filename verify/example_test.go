package verify

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

// invoiceSchema is the schema of SPEC §10.
const invoiceSchema = `{"type":"object","required":["invoice_id","currency","line_items","total"],"properties":{` +
	`"invoice_id":{"type":"string","pattern":"^INV-[0-9]{4}$"},` +
	`"currency":{"enum":["USD","EUR"]},` +
	`"line_items":{"type":"array","minItems":1,"items":{"type":"object","required":["sku","qty","line_total"],"properties":{` +
	`"sku":{"type":"string"},"qty":{"type":"integer","minimum":1},"line_total":{"type":"number","minimum":0}}}},` +
	`"total":{"type":"number"}}}`

// invoiceRequest is the SPEC §10 draft invoice with the given total.
func invoiceRequest(total string) string {
	return `{"task_id":"invoice-7731","agent_id":"seller-7","expected_schema":` + invoiceSchema +
		`,"submitted_output":{"invoice_id":"INV-7731","currency":"USD","line_items":[` +
		`{"sku":"A-1","qty":2,"line_total":87.0},{"sku":"B-2","qty":1,"line_total":42.5}],"total":` + total + `},` +
		`"rules":[{"type":"sum_equals","field":"line_items[].line_total","equals_field":"total"}],"enforce_rules":true}`
}

var verifiedAt = time.Date(2026, 11, 29, 21, 22, 28, 123456789, time.UTC)

func check(t testing.TB, v *Verifier, body string) *Result {
	t.Helper()
	req, err := v.Parse([]byte(body))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return v.Check(req, "6f1c2a4e-8d3b-4c5a-9e7f-0a1b2c3d4e5f", verifiedAt)
}

// resultMap is the result as a reader sees it.
func resultMap(t testing.TB, r *Result) map[string]any {
	t.Helper()
	b, err := r.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("result is not JSON: %v\n%s", err, b)
	}
	return m
}

func TestSpecWorkedExampleFailsOnTheSum(t *testing.T) {
	v := New(Config{VerifierVersion: "test"})
	m := resultMap(t, check(t, v, invoiceRequest("135.0")))

	want := map[string]any{
		"result":  "fail",
		"summary": map[string]any{"result": "fail", "blocking_checks": []any{"consistency:sum_equals"}},
		"errors": []any{
			"enforce_rules: consistency:sum_equals at 'line_items[].line_total': values sum to 129.5, expected total (135.0)",
		},
		"errors_detail": []any{map[string]any{
			"check": "consistency:sum_equals", "path": "$.line_items[].line_total",
			"expected": "a sum equal to total (135.0)", "found": "sum 129.5",
			"message": "enforce_rules: consistency:sum_equals at 'line_items[].line_total': values sum to 129.5, expected total (135.0)",
		}},
		"schema_compliance": map[string]any{"ratio": 1.0, "passed": 22.0, "total": 22.0},
		"integrity_checks":  map[string]any{"ratio": 0.0, "passed": 0.0, "total": 1.0},
		"overall":           map[string]any{"ratio": 0.956522, "passed": 22.0, "total": 23.0},
		"next_actions":      []any{map[string]any{"action": "repair_and_reverify", "using": "hints"}},
		"flags": []any{map[string]any{
			"check": "consistency:sum_equals", "field": "line_items[].line_total", "severity": "error",
			"detail": "values sum to 129.5, expected total (135.0)",
		}},
		"hints": []any{map[string]any{
			"source": "integrity", "check": "consistency:sum_equals", "path": "$.line_items[].line_total",
			"expected": "a sum equal to total (135.0)", "found": "sum 129.5",
		}},
		"errors_total": 1.0, "errors_omitted": 0.0, "errors_detail_total": 1.0, "errors_detail_omitted": 0.0,
		"flags_total": 1.0, "flags_omitted": 0.0, "hints_total": 1.0, "hints_omitted": 0.0,
	}
	for k, w := range want {
		if !reflect.DeepEqual(m[k], w) {
			t.Errorf("%s = %#v, want %#v", k, m[k], w)
		}
	}
}

func TestSpecWorkedExamplePassesWithTheRightTotal(t *testing.T) {
	v := New(Config{VerifierVersion: "test"})
	r := check(t, v, invoiceRequest("129.5"))
	m := resultMap(t, r)
	if r.Result != ResultPass || m["result"] != "pass" {
		t.Fatalf("result = %v, errors %v", m["result"], m["errors"])
	}
	if got := m["summary"]; !reflect.DeepEqual(got, map[string]any{"result": "pass", "blocking_checks": []any{}}) {
		t.Errorf("summary = %#v", got)
	}
	wantNext := []any{map[string]any{"action": "attach_receipt", "for": "seller"}, map[string]any{"action": "proceed_to_payment", "for": "buyer"}}
	if !reflect.DeepEqual(m["next_actions"], wantNext) {
		t.Errorf("next_actions = %#v", m["next_actions"])
	}
	if r.Schema != (Tally{22, 22}) || r.Integrity != (Tally{1, 1}) || r.Overall != (Tally{23, 23}) {
		t.Errorf("tallies = %+v %+v %+v", r.Schema, r.Integrity, r.Overall)
	}
	b, _ := r.MarshalJSON()
	if !strings.Contains(string(b), `"overall":{"ratio":1.0,"passed":23,"total":23}`) {
		t.Errorf("ratio 1 is not written as 1.0: %s", b)
	}
}
