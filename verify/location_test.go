package verify

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/aovhq/aov/verify/schema"
)

// longNameRequest is a request whose output has one member with a
// nameLen-byte name holding 60 values elem, which fail schemaJSON (or,
// with strict, strict content).
func longNameRequest(nameLen int, schemaJSON string, strict bool, elem string) string {
	items := strings.TrimSuffix(strings.Repeat(elem+",", 60), ",")
	s := "false"
	if strict {
		s = "true"
	}
	return `{"task_id":"t","expected_schema":` + schemaJSON + `,"submitted_output":{"` + strings.Repeat("k", nameLen) +
		`":[` + items + `]},"strict_content_check":` + s + `}`
}

// locations are every location a result shows: the paths of errors_detail
// and hints, and the messages that quote them.
func locations(r *Result) []string {
	var out []string
	for _, d := range r.ErrorsDetail {
		out = append(out, d.Path)
	}
	for _, h := range r.Hints {
		out = append(out, h.Path)
	}
	return out
}

// A result repeats the location of every finding it lists in errors,
// errors_detail (path and message) and hints, ListCap times each: with a
// 400 KB member name over 60 failing values, a 400 KB request made an
// 80 MB result and allocated about 1 GB. Member names are shortened in
// locations as in every path a client is shown, so the result no longer
// depends on how long the names are, and neither does the work of building
// it.
func TestLongMemberNamesDoNotGrowTheResult(t *testing.T) {
	v := New(Config{VerifierVersion: "test"})
	for _, c := range []struct {
		name, schema string
		strict       bool
		elem         string
	}{
		{"schema", `{"additionalProperties":{"items":{"type":"number"}}}`, false, `"x"`},
		{"placeholder", `{}`, true, `""`},
		{"undeclared", `{"additionalProperties":{"items":{"properties":{}}}}`, true, `{"a":1}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			short := check(t, v, longNameRequest(10, c.schema, c.strict, c.elem))
			shortSize := len(short.AppendJSON(nil))
			body := longNameRequest(400_000, c.schema, c.strict, c.elem)
			var r *Result
			var out []byte
			alloc := allocatedBy(func() { r = check(t, v, body); out = r.AppendJSON(nil) })
			t.Logf("request %d bytes: result %d bytes (%d with a 10-byte name), %d KB allocated", len(body), len(out), shortSize, alloc>>10)
			if r.Result != ResultFail || r.ErrorsDetailTotal < 60 || len(r.ErrorsDetail) != r.listCap {
				t.Fatalf("result %s with %d of %d findings listed; the test needs a full list", r.Result, len(r.ErrorsDetail), r.ErrorsDetailTotal)
			}
			// The name costs its 64 bytes shown and its quotes, once per
			// location written (four per finding).
			if len(out) > shortSize+4*r.listCap*(strictjsonKeyShown+8) {
				t.Errorf("result of %d bytes, %d with a short name", len(out), shortSize)
			}
			for _, p := range locations(r) {
				if !strings.HasPrefix(p, `$["`+strings.Repeat("k", 64)+`…"][`) {
					t.Fatalf("location %.100q does not show the name shortened", p)
				}
			}
			// Decoding the 400 KB body, hashing it and evaluating it
			// allocate a few times its size; the 60 locations and the
			// result nothing that grows with the name.
			if alloc > 16<<20 {
				t.Errorf("a %d-byte request allocated %d MB", len(body), alloc>>20)
			}
		})
	}
}

// strictjsonKeyShown is the bytes of a long member name a location shows:
// strictjson.MaxKeyInPath and the "…" after them.
const strictjsonKeyShown = 64 + len("…")

// Shortened locations change what the result shows, not what it attests:
// the hashes are still those of the whole request, so two outputs whose
// long names differ only past what a location shows get the same findings
// and different hashes.
func TestShortenedLocationsStillHashTheWholeOutput(t *testing.T) {
	v := New(Config{VerifierVersion: "test"})
	schemaJSON := `{"additionalProperties":{"items":{"type":"number"}}}`
	a := longNameRequest(1000, schemaJSON, false, `"x"`)
	b := strings.Replace(a, strings.Repeat("k", 1000), strings.Repeat("k", 999)+"z", 1)
	ra, rb := check(t, v, a), check(t, v, b)
	if strings.Join(ra.Errors, "\n") != strings.Join(rb.Errors, "\n") {
		t.Fatal("names that differ past what a location shows gave different findings")
	}
	if ra.Hashes.Output == rb.Hashes.Output || ra.Hashes.Request == rb.Hashes.Request {
		t.Error("the hashes do not cover the whole member name")
	}
	if ra.Hashes.Schema != rb.Hashes.Schema {
		t.Error("the same schema hashed differently")
	}
}

// A location is at most 1024 whatever the output: 60
// levels of 64-byte names that JSON escapes six times over would otherwise
// make each location 23 KB, and a result of ListCap × 4 of them more than
// the signer takes. A cut location ends with "…"; schema findings,
// undeclared properties, placeholders and rule findings are cut alike.
func TestDeepLocationsAreBounded(t *testing.T) {
	v := New(Config{VerifierVersion: "test"})
	name := strings.Repeat("<", 64)
	var out strings.Builder
	for i := 0; i < 60; i++ {
		out.WriteString(`{"` + name + `":`)
	}
	out.WriteString(`[` + strings.TrimSuffix(strings.Repeat(`"",`, 60), ",") + `]`)
	out.WriteString(strings.Repeat("}", 60))
	for _, c := range []struct{ name, schema, extra string }{
		{"schema", `{"additionalProperties":{"$ref":"#"},"items":{"type":"number"}}`, ``},
		{"placeholder", `{}`, `,"strict_content_check":true`},
		{"undeclared", `{"properties":{},"additionalProperties":{"$ref":"#"}}`, `,"strict_content_check":true`},
		// A rule's path is at most 512 bytes, but its location quotes
		// and escapes the names: 60 steps of "<<<<<<<" take 2,760 bytes.
		{"rule", `{}`, `,"rules":[{"type":"gte","field":"` + strings.TrimSuffix(strings.Repeat("<<<<<<<.", 60), ".") + `","value":1}]`},
	} {
		t.Run(c.name, func(t *testing.T) {
			output := out.String()
			if c.name == "rule" {
				output = strings.Repeat(`{"<<<<<<<":`, 60) + `"a"` + strings.Repeat("}", 60)
			}
			body := `{"task_id":"t","expected_schema":` + c.schema + `,"submitted_output":` + output + c.extra + `}`
			r := check(t, v, body)
			locs := locations(r)
			if len(locs) == 0 {
				t.Fatal("no findings")
			}
			cut := false
			for _, p := range locs {
				if len(p) > schema.MaxLocationBytes || !utf8.ValidString(p) {
					t.Fatalf("a location of %d bytes: %.80q…", len(p), p)
				}
				cut = cut || strings.HasSuffix(p, "…")
			}
			if !cut {
				t.Errorf("no location is cut: %.80q…", locs[len(locs)-1])
			}
		})
	}
}

// Strict content groups the schemas that declare properties by the object
// they apply to. Two objects whose long names differ only past what a
// location shows render the same location; each is still checked against
// its own declarations: "a" is undeclared in the second.
func TestUndeclaredPropertiesOfObjectsThatRenderAlike(t *testing.T) {
	v := New(Config{VerifierVersion: "test"})
	x, y := strings.Repeat("n", 70)+"x", strings.Repeat("n", 70)+"y"
	body := `{"task_id":"t","strict_content_check":true,"expected_schema":{"properties":{"` + x + `":{"properties":{"a":{}}},"` +
		y + `":{"properties":{"b":{}}}}},"submitted_output":{"` + x + `":{"a":1},"` + y + `":{"a":1}}}`
	for i := 0; i < 20; i++ { // map order decides which object a merged group would check
		r := check(t, v, body)
		if r.Result != ResultFail || len(r.ErrorsDetail) != 1 || r.ErrorsDetail[0].Check != CheckUndeclaredProperty {
			t.Fatalf("result %s with %v, want the undeclared property of the second object", r.Result, r.Errors)
		}
	}
}

// The four lists of a result hold at most MaxListBytes of text together,
// whatever ListCap is set to: findings are bounded one by one, so ListCap
// bounds a result, but an operator's larger ListCap would let 3,000
// findings at 1 KB locations under names JSON escapes (a 13 KB request)
// make a 25 MB result, past what certd signs. The lists stop at the first
// finding that would pass the bound; the totals still count every one.
func TestResultListsAreBoundedInBytes(t *testing.T) {
	v := New(Config{VerifierVersion: "test", ListCap: 100_000})
	name := strings.Repeat(`\"`, 64)
	output := strings.Repeat(`{"`+name+`":`, 7) + `[` + strings.TrimSuffix(strings.Repeat(`"x",`, 3000), ",") + `]` + strings.Repeat("}", 7)
	schemaJSON := strings.Repeat(`{"additionalProperties":`, 7) + `{"items":{"type":"number"}}` + strings.Repeat("}", 7)
	body := `{"task_id":"t","expected_schema":` + schemaJSON + `,"submitted_output":` + output + `}`
	r := check(t, v, body)
	out := r.AppendCanonical(nil)
	t.Logf("request %d bytes: %d of %d findings shown, result %d bytes", len(body), len(r.Errors), r.ErrorsTotal, len(out))
	if r.ErrorsTotal != 3000 || r.HintsTotal != 3000 {
		t.Fatalf("%d errors and %d hints counted, want 3000", r.ErrorsTotal, r.HintsTotal)
	}
	if len(r.Errors) == 0 || len(r.Errors) != len(r.ErrorsDetail) || len(r.Errors) != len(r.Hints) {
		t.Fatalf("%d errors, %d errors_detail, %d hints shown; want the same findings in each", len(r.Errors), len(r.ErrorsDetail), len(r.Hints))
	}
	if len(out) > MaxListBytes+4<<10 {
		t.Errorf("a result of %d bytes", len(out))
	}
	if len(r.Errors) == 3000 {
		t.Error("every finding is shown")
	}
}

// The schema evaluation renders the location of every failure, kept or
// only counted, to order them: 30,000 failing items 7 levels deep under
// 64-byte names JSON escapes (121 KB) allocated 284 MB rendering each
// whole location, 15 times what the same output with one-letter names
// did. A location now reuses what it shares with the one before it, so
// the names above an array cost once, not once per item.
func TestFailureLocationsRenderTheirSharedSteps(t *testing.T) {
	v := New(Config{VerifierVersion: "test"})
	cost := func(name string) uint64 {
		output := strings.Repeat(`{"`+name+`":`, 7) + `[` + strings.TrimSuffix(strings.Repeat(`"x",`, 30_000), ",") + `]` + strings.Repeat("}", 7)
		schemaJSON := strings.Repeat(`{"additionalProperties":`, 7) + `{"items":{"type":"number"}}` + strings.Repeat("}", 7)
		body := `{"task_id":"t","expected_schema":` + schemaJSON + `,"submitted_output":` + output + `}`
		return allocatedBy(func() { check(t, v, body).AppendJSON(nil) })
	}
	plain, escaped := cost("k"), cost(strings.Repeat(`\"`, 64))
	t.Logf("30,000 failures: %d MB allocated under one-letter names, %d MB under escaped 64-byte names", plain>>20, escaped>>20)
	if escaped > 2*plain {
		t.Errorf("escaped names cost %d MB, one-letter names %d MB", escaped>>20, plain>>20)
	}
}
