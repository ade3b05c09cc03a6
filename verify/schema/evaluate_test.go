package schema

import (
	"reflect"
	"strings"
	"testing"
)

func TestInvoiceExampleIs22Checks(t *testing.T) {
	s := mustCompile(t, invoiceSchema)
	rep := s.Evaluate(decode(t, invoiceOutput), Options{})
	if rep.Total != 22 || rep.Passed != 22 || len(rep.Failures) != 0 {
		t.Fatalf("SPEC §10: the invoice schema on the two-item invoice is 22 checks, all passing; got %d/%d, failures %+v", rep.Passed, rep.Total, rep.Failures)
	}
}

func TestInvoiceFailuresAreDescribedWithoutEchoingInput(t *testing.T) {
	s := mustCompile(t, invoiceSchema)
	out := `{"invoice_id": "SECRET-abc", "currency": "GBPSECRET",
	  "line_items": [{"sku": "A-1", "qty": 0, "line_total": 1}, {"qty": 1, "line_total": 2}],
	  "total": 3}`
	rep := s.Evaluate(decode(t, out), Options{})
	want := []Failure{
		{Keyword: "enum", InstancePath: "$.currency", Expected: "one of USD, EUR", Found: "a value not in the list"},
		{Keyword: "pattern", InstancePath: "$.invoice_id", Expected: "a string matching ^INV-[0-9]{4}$", Found: "a string that does not match"},
		{Keyword: "minimum", InstancePath: "$.line_items[0].qty", Expected: "integer >= 1", Found: "0"},
		{Keyword: "required", InstancePath: "$.line_items[1]", Expected: "property sku", Found: "missing"},
	}
	for i := range rep.Failures {
		rep.Failures[i].Message = ""
	}
	if !reflect.DeepEqual(rep.Failures, want) {
		t.Errorf("failures:\n got %+v\nwant %+v", rep.Failures, want)
	}
	// 22 checks minus the sku type check that the missing sku skips.
	if rep.Total != 21 || rep.Passed != 17 {
		t.Errorf("counts: got %d/%d, want 17/21", rep.Passed, rep.Total)
	}
	for _, f := range rep.Failures {
		for _, secret := range []string{"SECRET", "GBP", "abc"} {
			if strings.Contains(f.Expected+f.Found+f.Message, secret) {
				t.Errorf("failure %+v echoes submitted content %q", f, secret)
			}
		}
	}
}

func TestFailuresAreOrderedByPathWithIndexesByNumber(t *testing.T) {
	s := mustCompile(t, `{"items": {"type": "integer"}}`)
	items := make([]string, 12)
	for i := range items {
		items[i] = `"x"`
	}
	rep := s.Evaluate(decode(t, "["+strings.Join(items, ",")+"]"), Options{})
	var got []string
	for _, f := range rep.Failures {
		got = append(got, f.InstancePath)
	}
	want := []string{"$[0]", "$[1]", "$[2]", "$[3]", "$[4]", "$[5]", "$[6]", "$[7]", "$[8]", "$[9]", "$[10]", "$[11]"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("paths %q; want %q", got, want)
	}
	if rep.Passed != 0 || rep.Total != 12 {
		t.Errorf("got %d/%d; want 0/12", rep.Passed, rep.Total)
	}
}

func TestPathLess(t *testing.T) {
	cases := []struct {
		desc, a, b string
		less       bool
	}{
		{"indexes compare by number", "$.a[2]", "$.a[10]", true},
		{"a larger index is later", "$.a[10].b", "$.a[9].b", false},
		{"keys compare bytewise", "$.a", "$.b", true},
		{"a prefix comes first", "$.a", "$.a.b", true},
		{"leading zeros do not change the number", "$.k007", "$.k7x", true},
	}
	for _, tc := range cases {
		if got := pathLess(tc.a, tc.b); got != tc.less {
			t.Errorf("%s: pathLess(%q, %q) = %v", tc.desc, tc.a, tc.b, got)
		}
	}
}
