package verify

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"
)

// collidingMembers is an output object whose member names agree in their
// first 64 bytes, so every location a result shows for them is the same
// (strictjson.ShortKey), with values of the given JSON texts.
func collidingMembers(vals ...string) string {
	pre := strings.Repeat("n", 64)
	var b strings.Builder
	b.WriteString("{")
	for i, val := range vals {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"` + pre + string(rune('a'+i)) + `":` + val)
	}
	b.WriteString("}")
	return b.String()
}

// A result is signed, so one request must give it byte for byte on every
// run (SPEC §1). Members whose names agree in their first 64 bytes show
// the same location, and their failures then agreed in everything the
// order of a result compared (location, keyword, expected): they came in
// the order the validator met them, Go's random map order, and with a
// small ListCap which of them were kept changed from run to run too.
func TestCollidingLocationsGiveTheSameResultEveryRun(t *testing.T) {
	vals := []string{`"s"`, `true`, `null`, `{}`, `[]`, `"t"`, `1.5`, `false`}
	cases := []struct {
		name    string
		listCap int
		body    string
	}{
		{"schema failures", 0, `{"task_id":"t","expected_schema":{"additionalProperties":{"type":"integer"}},"submitted_output":` +
			collidingMembers(vals...) + `}`},
		{"schema failures past ListCap", 3, `{"task_id":"t","expected_schema":{"additionalProperties":{"type":"integer"}},"submitted_output":` +
			collidingMembers(vals...) + `}`},
		{"undeclared properties and placeholders", 3, `{"task_id":"t","expected_schema":{"properties":{"x":{}}},"strict_content_check":true,"submitted_output":` +
			collidingMembers(`"TODO"`, `""`, `"tbd"`, `{"x":"n/a"}`, `["..."]`, `"ok"`) + `}`},
		{"names that differ in leading zeros", 3, `{"task_id":"t","expected_schema":{"properties":{"x":{}},"additionalProperties":{"type":"integer"}},"strict_content_check":true,"submitted_output":` +
			`{"a1":"s","a01":true,"a001":null,"a0001":"u","a00001":[]}}`},
		{"rule findings", 3, `{"task_id":"t","expected_schema":{},"rules":[` +
			`{"type":"gte","field":"` + strings.Repeat("n", 64) + `a[]","value":5},` +
			`{"type":"gte","field":"` + strings.Repeat("n", 64) + `b[]","value":5}],"submitted_output":` +
			collidingMembers(`[1,2,"x"]`, `[3,null,4]`) + `}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v := New(Config{VerifierVersion: "test", ListCap: c.listCap})
			first := ""
			for i := 0; i < 60; i++ {
				r := check(t, v, c.body)
				got := string(r.AppendCanonical(nil)) // the same id and instant every run
				if i == 0 {
					first = got
					if r.HintsTotal < 2 {
						t.Fatalf("the request finds %d findings, want several: %s", r.HintsTotal, got)
					}
					continue
				}
				if got != first {
					t.Fatalf("run %d gave another result for the same request:\n%s\nfirst run:\n%s", i, got, first)
				}
			}
		})
	}
}

// Outputs that differ only in how a number is spelled (1.0, 1, 1e0,
// 10e-1) have one output_hash, so they must get one signed result. The
// result of a schema bound quoted the submitted spelling in found, so the
// same hashes came with different texts. (Before: "found": "1.0" for one
// and "1e0" for another.)
func TestNumberSpellingsOfOneOutputGetOneResult(t *testing.T) {
	v := New(Config{VerifierVersion: "test"})
	first := ""
	for _, n := range []string{`1`, `1.0`, `1e0`, `10e-1`, `1.000E+0`} {
		body := `{"task_id":"t","expected_schema":{"properties":{"n":{"minimum":2},"m":{"maximum":0.5},"k":{"type":"integer","exclusiveMaximum":0}}},` +
			`"submitted_output":{"n":` + n + `,"m":` + n + `,"k":` + n + `}}`
		r := check(t, v, body)
		got := string(r.AppendCanonical(nil))
		if r.ErrorsDetailTotal < 3 {
			t.Fatalf("%s: want three schema failures: %s", n, got)
		}
		if first == "" {
			first = got
			continue
		}
		if got != first {
			t.Fatalf("%s gave another result than 1:\n%s\nfor 1:\n%s", n, got, first)
		}
	}
}

// A bound whose min and max are both the wrong type: the two problems
// must come back in one order on every run, min first. (Before: they came
// in Go's map order, so the 422's fields and message changed run to run.)
func TestBoundProblemsComeInOneOrder(t *testing.T) {
	v := New(Config{})
	b := []byte(body(`bounds={"total":{"min":"a","max":"b","if_present":1}}`))
	want := []string{"bounds.total.min", "bounds.total.max", "bounds.total.if_present"}
	for i := 0; i < 100; i++ {
		_, err := v.Parse(b)
		var e *apierr.Error
		if !errors.As(err, &e) {
			t.Fatalf("Parse: %v, want an *apierr.Error", err)
		}
		var got []string
		for _, f := range e.Fields {
			got = append(got, f.Field)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("run %d: fields %v, want %v", i, got, want)
		}
	}
}
