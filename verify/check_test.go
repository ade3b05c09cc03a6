package verify

import (
	"encoding/json"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// integrityCase checks one output against bounds/rules/strict settings with
// the accept-anything schema {}, so only integrity checks count.
type integrityCase struct {
	desc      string
	output    string
	extra     []string // request members, "name=json"
	result    string
	blocking  []string
	errors    []string
	details   []ErrorDetail
	flags     []Flag
	integrity Tally
}

func runIntegrity(t *testing.T, tests []integrityCase) {
	t.Helper()
	v := New(Config{})
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			extra := append([]string{`expected_schema={}`, `submitted_output=` + tc.output}, tc.extra...)
			r := check(t, v, body(extra...))
			if r.Result != tc.result {
				t.Errorf("result = %s, want %s (errors %q, flags %+v)", r.Result, tc.result, r.Errors, r.Flags)
			}
			if !reflect.DeepEqual(r.BlockingChecks, tc.blocking) {
				t.Errorf("blocking_checks = %q, want %q", r.BlockingChecks, tc.blocking)
			}
			if !reflect.DeepEqual(r.Errors, tc.errors) {
				t.Errorf("errors =\n%q\nwant\n%q", r.Errors, tc.errors)
			}
			// Each errors_detail entry's message is its errors entry.
			for i, d := range r.ErrorsDetail {
				if i < len(r.Errors) && d.Message != r.Errors[i] {
					t.Errorf("errors_detail[%d].message = %q; want the errors entry %q", i, d.Message, r.Errors[i])
				}
			}
			if tc.details != nil {
				for i := range tc.details {
					if i < len(r.Errors) {
						tc.details[i].Message = r.Errors[i]
					}
				}
				if !reflect.DeepEqual(r.ErrorsDetail, tc.details) {
					t.Errorf("errors_detail =\n%+v\nwant\n%+v", r.ErrorsDetail, tc.details)
				}
			}
			// Every rule violation is a flag: the warnings the case lists,
			// and one error flag per enforced rule error, under the rule's
			// field as written and without the check name.
			want := tc.flags
			for _, e := range r.Errors {
				rest, ok := strings.CutPrefix(e, enforceRulesErrorPrefix)
				if !ok {
					continue
				}
				check, rest, _ := strings.Cut(rest, " at '")
				_, detail, _ := strings.Cut(rest, "': ")
				want = append(want, Flag{Check: check, Field: ruleField(t, tc.extra, check), Severity: "error", Detail: detail})
			}
			if !reflect.DeepEqual(r.Flags, want) && (len(r.Flags) > 0 || len(want) > 0) {
				t.Errorf("flags =\n%+v\nwant\n%+v", r.Flags, want)
			}
			if r.Integrity != tc.integrity {
				t.Errorf("integrity = %+v, want %+v", r.Integrity, tc.integrity)
			}
			if r.HintsTotal != r.ErrorsTotal+r.FlagsTotal-errorFlags(r) {
				t.Errorf("%d hints for %d errors and %d flags", r.HintsTotal, r.ErrorsTotal, r.FlagsTotal)
			}
			for _, h := range r.Hints {
				if h.Source != sourceIntegrity {
					t.Errorf("hint source = %s", h.Source)
				}
			}
		})
	}
}

const enforce = `enforce_rules=true`

// ruleField is the field, as written, of the rule of type check in a
// case's request members.
func ruleField(t *testing.T, extra []string, check string) string {
	t.Helper()
	for _, e := range extra {
		raw, ok := strings.CutPrefix(e, "rules=")
		if !ok {
			continue
		}
		var rules []map[string]any
		if err := json.Unmarshal([]byte(raw), &rules); err != nil {
			t.Fatal(err)
		}
		for _, r := range rules {
			if checkConsistencyPrefix+r["type"].(string) == check {
				return r["field"].(string)
			}
		}
	}
	t.Fatalf("no rule for %s in %q", check, extra)
	return ""
}

// errorFlags counts the flags that repeat an error (enforced rules).
func errorFlags(r *Result) int {
	n := 0
	for _, f := range r.Flags {
		if f.Severity == severityError {
			n++
		}
	}
	return n
}

func TestSumEquals(t *testing.T) {
	out := `{"items":[{"p":10.0},{"p":20.5}],"total":30.5,"bad":"x"}`
	runIntegrity(t, []integrityCase{
		{desc: "sum_equals passes when the values sum to equals_field", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals_field":"total"}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "sum_equals passes when the values sum to equals", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals":30.5}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "sum_equals fails beyond the default tolerance", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals":30.500001}]`, enforce},
			result: "fail", blocking: []string{"consistency:sum_equals"}, integrity: Tally{0, 1},
			errors:  []string{"enforce_rules: consistency:sum_equals at 'items[].p': values sum to 30.5, expected 30.500001"},
			details: []ErrorDetail{{Check: "consistency:sum_equals", Path: "$.items[].p", Expected: "a sum equal to 30.500001", Found: "sum 30.5"}}},
		{desc: "sum_equals passes within a given tolerance", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals":31,"tolerance":0.5}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "sum_equals fails just outside a given tolerance", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals":31,"tolerance":0.49}]`, enforce},
			result: "fail", blocking: []string{"consistency:sum_equals"}, integrity: Tally{0, 1},
			errors: []string{"enforce_rules: consistency:sum_equals at 'items[].p': values sum to 30.5, expected 31.0"}},
		{desc: "sum_equals without enforce_rules is a warning flag and the result passes", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals":1}]`},
			result: "pass", integrity: Tally{0, 1},
			flags: []Flag{{Check: "consistency:sum_equals", Field: "items[].p", Severity: "warning", Detail: "values sum to 30.5, expected 1.0"}}},
		{desc: "sum_equals over a missing field fails", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"none[].p","equals":1}]`, enforce},
			result: "fail", blocking: []string{"consistency:sum_equals"}, integrity: Tally{0, 1},
			errors: []string{"enforce_rules: consistency:sum_equals at 'none[].p': no value at this path (set if_present to skip the rule when it is absent)"}},
		{desc: "sum_equals over a missing field with if_present passes", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"none[].p","equals":1,"if_present":true}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "sum_equals against a missing equals_field fails", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals_field":"grand_total"}]`, enforce},
			result: "fail", blocking: []string{"consistency:sum_equals"}, integrity: Tally{0, 1},
			errors: []string{"enforce_rules: consistency:sum_equals at 'grand_total': no value at 'grand_total' to compare with (set if_present to skip the rule when it is absent)"}},
		{desc: "sum_equals against a missing equals_field with if_present passes", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals_field":"grand_total","if_present":true}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "sum_equals against a non-number equals_field fails", output: out, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals_field":"bad"}]`, enforce},
			result: "fail", blocking: []string{"consistency:sum_equals"}, integrity: Tally{0, 1},
			errors: []string{"enforce_rules: consistency:sum_equals at 'bad': the value at 'bad' is a string, not a number"}},
		{desc: "sum_equals over a non-number value fails at that value", output: `{"items":[{"p":1},{"p":"2"}],"total":3}`, extra: []string{`rules=[{"type":"sum_equals","field":"items[].p","equals_field":"total"}]`, enforce},
			result: "fail", blocking: []string{"consistency:sum_equals"}, integrity: Tally{0, 1},
			errors:  []string{"enforce_rules: consistency:sum_equals at 'items[1].p': the value is a string, not a number"},
			details: []ErrorDetail{{Check: "consistency:sum_equals", Path: "$.items[1].p", Expected: "numbers", Found: "type string"}}},
	})
}

func TestGteAndLte(t *testing.T) {
	out := `{"qty":[3,5,7],"min":5,"max":6}`
	runIntegrity(t, []integrityCase{
		{desc: "gte passes when every value is at least value", output: out, extra: []string{`rules=[{"type":"gte","field":"qty[]","value":3}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "gte fails at each value below other_field", output: out, extra: []string{`rules=[{"type":"gte","field":"qty[]","other_field":"min"}]`, enforce},
			result: "fail", blocking: []string{"consistency:gte"}, integrity: Tally{0, 1},
			errors:  []string{"enforce_rules: consistency:gte at 'qty[0]': value 3.0 is less than min (5.0)"},
			details: []ErrorDetail{{Check: "consistency:gte", Path: "$.qty[0]", Expected: ">= min (5.0)", Found: "3.0"}}},
		{desc: "lte fails at each value above value", output: out, extra: []string{`rules=[{"type":"lte","field":"qty[]","value":4}]`, enforce},
			result: "fail", blocking: []string{"consistency:lte"}, integrity: Tally{0, 1},
			errors: []string{"enforce_rules: consistency:lte at 'qty[1]': value 5.0 is greater than 4.0", "enforce_rules: consistency:lte at 'qty[2]': value 7.0 is greater than 4.0"}},
		{desc: "lte passes within tolerance", output: out, extra: []string{`rules=[{"type":"lte","field":"qty[]","other_field":"max","tolerance":1}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "gte over a missing field fails", output: out, extra: []string{`rules=[{"type":"gte","field":"nope","value":1}]`, enforce},
			result: "fail", blocking: []string{"consistency:gte"}, integrity: Tally{0, 1},
			errors: []string{"enforce_rules: consistency:gte at 'nope': no value at this path (set if_present to skip the rule when it is absent)"}},
		{desc: "gte over a missing field with if_present passes", output: out, extra: []string{`rules=[{"type":"gte","field":"nope","value":1,"if_present":true}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "gte over a non-number fails", output: `{"a":[1,null]}`, extra: []string{`rules=[{"type":"gte","field":"a[]","value":0}]`, enforce},
			result: "fail", blocking: []string{"consistency:gte"}, integrity: Tally{0, 1},
			errors: []string{"enforce_rules: consistency:gte at 'a[1]': the value is null, not a number"}},
		{desc: "lte without enforce_rules only flags", output: out, extra: []string{`rules=[{"type":"lte","field":"qty[]","value":6}]`},
			result: "pass", integrity: Tally{0, 1},
			flags: []Flag{{Check: "consistency:lte", Field: "qty[]", Severity: "warning", Detail: "value 7.0 is greater than 6.0"}}},
	})
}

func TestExistsIn(t *testing.T) {
	out := `{"lines":[{"sku":"A"},{"sku":"B"},{"sku":"Z"}],"catalog":[{"sku":"A"},{"sku":"B"}],"codes":[1,2.0]}`
	runIntegrity(t, []integrityCase{
		{desc: "exists_in passes when every value is in values", output: out, extra: []string{`rules=[{"type":"exists_in","field":"lines[].sku","values":["A","B","Z"]}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "exists_in compares numbers by value", output: out, extra: []string{`rules=[{"type":"exists_in","field":"codes[]","values":[2,1.0]}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "exists_in fails at each value missing from in_field, without echoing it", output: out, extra: []string{`rules=[{"type":"exists_in","field":"lines[].sku","in_field":"catalog[].sku"}]`, enforce},
			result: "fail", blocking: []string{"consistency:exists_in"}, integrity: Tally{0, 1},
			errors:  []string{"enforce_rules: consistency:exists_in at 'lines[2].sku': the value is not among the values at 'catalog[].sku'"},
			details: []ErrorDetail{{Check: "consistency:exists_in", Path: "$.lines[2].sku", Expected: "one of the values at catalog[].sku", Found: "a string"}}},
		{desc: "exists_in against a missing in_field fails", output: out, extra: []string{`rules=[{"type":"exists_in","field":"lines[].sku","in_field":"products[].sku"}]`, enforce},
			result: "fail", blocking: []string{"consistency:exists_in"}, integrity: Tally{0, 1},
			errors: []string{"enforce_rules: consistency:exists_in at 'products[].sku': no value at 'products[].sku' to look values up in (set if_present to skip the rule when it is absent)"}},
		{desc: "exists_in with if_present and nothing at field passes", output: out, extra: []string{`rules=[{"type":"exists_in","field":"none[]","values":[1],"if_present":true}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
	})
}

func TestUnique(t *testing.T) {
	runIntegrity(t, []integrityCase{
		{desc: "unique passes on distinct values", output: `{"ids":["a","b",1,true,null,{"x":1}]}`, extra: []string{`rules=[{"type":"unique","field":"ids[]"}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "unique fails at each repeat, naming the first occurrence", output: `{"l":[{"id":"a"},{"id":"b"},{"id":"a"},{"id":"a"}]}`, extra: []string{`rules=[{"type":"unique","field":"l[].id"}]`, enforce},
			result: "fail", blocking: []string{"consistency:unique"}, integrity: Tally{0, 1},
			errors: []string{
				"enforce_rules: consistency:unique at 'l[2].id': the value duplicates the value at 'l[0].id'",
				"enforce_rules: consistency:unique at 'l[3].id': the value duplicates the value at 'l[0].id'"},
			details: []ErrorDetail{
				{Check: "consistency:unique", Path: "$.l[2].id", Expected: "values distinct from each other", Found: "a duplicate of $.l[0].id"},
				{Check: "consistency:unique", Path: "$.l[3].id", Expected: "values distinct from each other", Found: "a duplicate of $.l[0].id"}}},
		{desc: "unique treats 1 and 1.0 and reordered objects as equal", output: `{"v":[1,1.0,{"a":1,"b":2},{"b":2,"a":1}]}`, extra: []string{`rules=[{"type":"unique","field":"v[]"}]`, enforce},
			result: "fail", blocking: []string{"consistency:unique"}, integrity: Tally{0, 1},
			errors: []string{
				"enforce_rules: consistency:unique at 'v[1]': the value duplicates the value at 'v[0]'",
				"enforce_rules: consistency:unique at 'v[3]': the value duplicates the value at 'v[2]'"}},
		{desc: "unique over a missing field fails", output: `{}`, extra: []string{`rules=[{"type":"unique","field":"ids[]"}]`, enforce},
			result: "fail", blocking: []string{"consistency:unique"}, integrity: Tally{0, 1},
			errors: []string{"enforce_rules: consistency:unique at 'ids[]': no value at this path (set if_present to skip the rule when it is absent)"}},
		{desc: "unique over a missing field with if_present passes", output: `{}`, extra: []string{`rules=[{"type":"unique","field":"ids[]","if_present":true}]`, enforce},
			result: "pass", integrity: Tally{1, 1}},
	})
}

func TestBounds(t *testing.T) {
	out := `{"items":[{"price":-1},{"price":50},{"price":150},{"price":"9"}],"total":10}`
	runIntegrity(t, []integrityCase{
		{desc: "a bound within range passes, one check per limit", output: out, extra: []string{`bounds={"total":{"min":0,"max":10}}`},
			result: "pass", integrity: Tally{2, 2}},
		{desc: "bounds check every value at the path and always block", output: out, extra: []string{`bounds={"items[].price":{"min":0,"max":100}}`},
			result: "fail", blocking: []string{"bounds:min", "bounds:max"}, integrity: Tally{0, 2},
			errors: []string{
				"bounds:min at 'items[0].price': value -1.0 is below the minimum 0.0",
				"bounds:min at 'items[3].price': the value is a string, not a number",
				"bounds:max at 'items[2].price': value 150.0 is above the maximum 100.0",
				"bounds:max at 'items[3].price': the value is a string, not a number"},
			details: []ErrorDetail{
				{Check: "bounds:min", Path: "$.items[0].price", Expected: "a number >= 0.0", Found: "-1.0"},
				{Check: "bounds:min", Path: "$.items[3].price", Expected: "a number >= 0.0", Found: "type string"},
				{Check: "bounds:max", Path: "$.items[2].price", Expected: "a number <= 100.0", Found: "150.0"},
				{Check: "bounds:max", Path: "$.items[3].price", Expected: "a number <= 100.0", Found: "type string"}}},
		{desc: "a bound on a missing path fails", output: out, extra: []string{`bounds={"discount":{"max":5}}`},
			result: "fail", blocking: []string{"bounds:max"}, integrity: Tally{0, 1},
			errors: []string{"bounds:max at 'discount': no value at this path (set if_present to allow its absence)"}},
		{desc: "a bound on a missing path with if_present passes", output: out, extra: []string{`bounds={"discount":{"max":5,"if_present":true}}`},
			result: "pass", integrity: Tally{1, 1}},
		{desc: "bounds block even without enforce_rules, in sorted path order", output: out, extra: []string{`bounds={"total":{"max":1},"$.items[].price":{"max":1000}}`},
			result: "fail", blocking: []string{"bounds:max"}, integrity: Tally{0, 2},
			errors: []string{"bounds:max at 'items[3].price': the value is a string, not a number", "bounds:max at 'total': value 10.0 is above the maximum 1.0"}},
	})
}

func TestStrictContentCheck(t *testing.T) {
	strict := `strict_content_check=true`
	runIntegrity(t, []integrityCase{
		{desc: "strict mode adds two passing checks on clean output", output: `{"a":"real","b":["x",1]}`, extra: []string{strict},
			result: "pass", integrity: Tally{2, 2}},
		{desc: "strict mode fails empty strings and placeholders anywhere, trimmed and case-insensitively", output: `{"a":"","b":[" todo ","ok",{"c":"N/A"}],"d":"Lorem ipsum dolor","e":"TBD","f":"...","g":"   ","h":"todo list"}`, extra: []string{strict},
			result: "fail", blocking: []string{"strict:placeholder"}, integrity: Tally{1, 2},
			errors: []string{
				"strict:placeholder at 'a': the string is empty",
				"strict:placeholder at 'b[0]': the string is placeholder content",
				"strict:placeholder at 'b[2].c': the string is placeholder content",
				"strict:placeholder at 'd': the string is placeholder content",
				"strict:placeholder at 'e': the string is placeholder content",
				"strict:placeholder at 'f': the string is placeholder content",
				"strict:placeholder at 'g': the string is empty"}},
		{desc: "placeholders are not checked without strict mode", output: `{"a":"TODO"}`,
			result: "pass", integrity: Tally{0, 0}},
	})
}

func TestStrictModeFailsUndeclaredProperties(t *testing.T) {
	v := New(Config{})
	r := check(t, v, body(`expected_schema={"type":"object","properties":{"a":{"type":"object","properties":{"b":{}}}}}`,
		`submitted_output={"a":{"b":1,"x":2},"y":3}`, `strict_content_check=true`))
	want := []string{
		"strict:undeclared_property at 'a.x': the schema does not declare this property",
		"strict:undeclared_property at 'y': the schema does not declare this property",
	}
	if r.Result != ResultFail || !reflect.DeepEqual(r.Errors, want) || !reflect.DeepEqual(r.BlockingChecks, []string{"strict:undeclared_property"}) {
		t.Fatalf("result %s blocking %q errors %q", r.Result, r.BlockingChecks, r.Errors)
	}
	if r.Integrity != (Tally{1, 2}) {
		t.Errorf("integrity = %+v", r.Integrity)
	}
	// Without strict mode the same output passes.
	r = check(t, v, body(`expected_schema={"type":"object","properties":{"a":{"type":"object","properties":{"b":{}}}}}`,
		`submitted_output={"a":{"b":1,"x":2},"y":3}`))
	if r.Result != ResultPass {
		t.Errorf("without strict mode: %s %q", r.Result, r.Errors)
	}
}

func TestSchemaFailuresBlockAndHint(t *testing.T) {
	v := New(Config{})
	r := check(t, v, body(`expected_schema={"type":"object","required":["n"],"properties":{"n":{"type":"integer","minimum":1}}}`,
		`submitted_output={"n":0}`, `rules=[{"type":"gte","field":"n","value":5}]`))
	if r.Result != ResultFail || !reflect.DeepEqual(r.BlockingChecks, []string{"schema:minimum"}) {
		t.Fatalf("result %s blocking %q", r.Result, r.BlockingChecks)
	}
	if len(r.Errors) != 1 || !strings.HasPrefix(r.Errors[0], "schema:minimum at 'n': ") {
		t.Errorf("errors = %q", r.Errors)
	}
	if len(r.ErrorsDetail) != 1 || r.ErrorsDetail[0].Path != "$.n" || r.ErrorsDetail[0].Message == "" {
		t.Errorf("errors_detail = %+v", r.ErrorsDetail)
	}
	// The rule is not enforced: a flag, and both findings get hints in order.
	if len(r.Flags) != 1 || r.Flags[0].Check != "consistency:gte" {
		t.Errorf("flags = %+v", r.Flags)
	}
	if len(r.Hints) != 2 || r.Hints[0].Source != "schema" || r.Hints[0].Check != "schema:minimum" || r.Hints[1].Source != "integrity" {
		t.Errorf("hints = %+v", r.Hints)
	}
	if r.Schema.Passed != r.Schema.Total-1 || r.Overall.Total != r.Schema.Total+1 {
		t.Errorf("tallies %+v %+v", r.Schema, r.Overall)
	}
}

func TestListsAreCappedWithTotalsAndOmitted(t *testing.T) {
	var items []string
	for i := range 7 {
		items = append(items, strconv.Itoa(-i-1))
	}
	out := `{"v":[` + strings.Join(items, ",") + `]}`
	for _, tc := range []struct {
		desc    string
		cap     int
		shown   int
		omitted int
	}{
		{desc: "a list longer than the cap shows cap entries and counts the rest as omitted", cap: 3, shown: 3, omitted: 4},
		{desc: "a list within the cap omits nothing", cap: 50, shown: 7, omitted: 0},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			v := New(Config{ListCap: tc.cap})
			r := check(t, v, body(`expected_schema={}`, `submitted_output=`+out, `bounds={"v[]":{"min":0}}`, `rules=[{"type":"gte","field":"v[]","value":0}]`))
			m := resultMap(t, r)
			for _, list := range []string{"errors", "errors_detail", "flags"} {
				if got := len(m[list].([]any)); got != tc.shown {
					t.Errorf("%s shows %d, want %d", list, got, tc.shown)
				}
				if m[list+"_total"] != 7.0 || m[list+"_omitted"] != float64(tc.omitted) {
					t.Errorf("%s_total %v _omitted %v", list, m[list+"_total"], m[list+"_omitted"])
				}
			}
			if got := len(m["hints"].([]any)); got != min(tc.cap, 14) || m["hints_total"] != 14.0 || m["hints_omitted"] != float64(14-min(tc.cap, 14)) {
				t.Errorf("hints %d total %v omitted %v", got, m["hints_total"], m["hints_omitted"])
			}
		})
	}
}

func TestFormatNumber(t *testing.T) {
	tests := []struct {
		desc string
		in   float64
		want string
	}{
		{desc: "an integral value keeps one decimal", in: 135, want: "135.0"},
		{desc: "a fraction is written shortest", in: 129.5, want: "129.5"},
		{desc: "zero is 0.0", in: 0, want: "0.0"},
		{desc: "negative zero is 0.0", in: -0.0, want: "0.0"},
		{desc: "negative values keep their sign", in: -1, want: "-1.0"},
		{desc: "the shortest round-trip digits are used", in: pointOne + pointTwo, want: "0.30000000000000004"},
		{desc: "1e-4 is still plain", in: 0.0001, want: "0.0001"},
		{desc: "below 1e-4 an exponent is used", in: 0.00001, want: "1e-05"},
		{desc: "below 1e16 plain digits are used", in: 1e15, want: "1000000000000000.0"},
		{desc: "from 1e16 an exponent is used", in: 1e16, want: "1e+16"},
		{desc: "exponents keep their significant digits", in: 1.5e300, want: "1.5e+300"},
		{desc: "an overflowing sum reads inf", in: math.Inf(1), want: "inf"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			if got := FormatNumber(tc.in); got != tc.want {
				t.Errorf("FormatNumber(%v) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// Variables, so the compiler does not fold 0.1 + 0.2 to an exact 0.3.
var pointOne, pointTwo = 0.1, 0.2

func TestBlockingChecksAreNamedEvenBeyondTheListCap(t *testing.T) {
	v := New(Config{ListCap: 1})
	r := check(t, v, body(`expected_schema={}`, `submitted_output={"v":[-1,-2,50]}`, `bounds={"v[]":{"min":0,"max":10}}`,
		`rules=[{"type":"unique","field":"v[]"},{"type":"gte","field":"v[]","value":0}]`))
	if want := []string{"bounds:min", "bounds:max"}; !reflect.DeepEqual(r.BlockingChecks, want) {
		t.Errorf("blocking_checks = %q, want %q", r.BlockingChecks, want)
	}
	if r.ErrorsTotal != 3 || len(r.Errors) != 1 || r.FlagsTotal != 2 || len(r.Flags) != 1 || r.HintsTotal != 5 || len(r.Hints) != 1 {
		t.Errorf("errors %d/%d flags %d/%d hints %d/%d", len(r.Errors), r.ErrorsTotal, len(r.Flags), r.FlagsTotal, len(r.Hints), r.HintsTotal)
	}
	if r.Integrity != (Tally{1, 4}) {
		t.Errorf("integrity = %+v", r.Integrity)
	}
}
