package verify

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/aovhq/aov/apierr"

	"github.com/aovhq/aov/internal/signflip"
)

// The validator (jsonschema/v6) runs after the counting walk and cannot be
// interrupted, so whatever it does beyond what the walk charged is work no
// budget and no time limit bounds. These requests each made it do far more
// than their size; each is now charged (or its work shared) before it runs.

// allocatedBy reports the bytes fn allocates: a bound on the heap it can
// hold, the same on every machine.
func allocatedBy(fn func()) uint64 {
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// signFlipEnum is a verification whose draft-04 schema enumerates
// signflip.Square(n). The draft-04 metaschema says "enum": {"uniqueItems":
// true}, and the compiler's hash ignores the sign of numbers, so it
// compares every pair of members deeply.
func signFlipEnum(n int) []byte {
	return []byte(`{"task_id":"t","expected_schema":{"$schema":"http://json-schema.org/draft-04/schema#","enum":` + signflip.Square(n) + `},"submitted_output":1}`)
}

// The gateway compiles a request's schema before it asks for payment; 300
// such members cost it 3 s of CPU and 1 GB of allocation. 150 (45 KB)
// allocated 130 MB; now the enum is refused for the work of its duplicate
// check, while an ordinary long enum compiles.
func TestPrecheckRefusesEnumsCostlyToDeduplicate(t *testing.T) {
	v := New(Config{})
	body := signFlipEnum(150)
	var err error
	n := allocatedBy(func() { err = v.Precheck(body) })
	if n > 32<<20 {
		t.Errorf("an unpaid precheck of a %d KB enum allocated %d MB", len(body)>>10, n>>20)
	}
	e := apierr.From(err)
	if e.Status != 422 || e.Code != apierr.CodeInvalidRequest || len(e.Fields) != 1 ||
		e.Fields[0].Field != "expected_schema/enum" || !strings.Contains(e.Fields[0].Problem, "checking the schema's enum values for duplicates") {
		t.Fatalf("%.300v; want 422 invalid_request naming expected_schema/enum", e)
	}
	if strings.Contains(e.Message+e.Fields[0].Problem+e.Fields[0].Fix, "-1") {
		t.Errorf("the refusal repeats the schema: %s", e.Message)
	}

	// Thousands of short strings, the enums people write, in every dialect
	// that checks them.
	words := make([]string, 5000)
	for i := range words {
		words[i] = `"code-` + strconv.Itoa(i) + `"`
	}
	for _, dialect := range []string{"http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2020-12/schema"} {
		ok := `{"task_id":"t","expected_schema":{"$schema":"` + dialect + `","enum":[` + strings.Join(words, ",") + `]},"submitted_output":"code-4999"}`
		if err := v.Precheck([]byte(ok)); err != nil {
			t.Errorf("%s: an enum of 5,000 short strings: %v", dialect, err)
		}
		if _, err := v.Parse([]byte(ok)); err != nil {
			t.Errorf("%s: an enum of 5,000 short strings: %v", dialect, err)
		}
	}
}

// requiredFlood applies r required names through items to n empty
// objects: the validator lists every missing name of every object.
func requiredFlood(r, n int) []byte {
	names := make([]string, r)
	for i := range names {
		names[i] = `"` + strconv.Itoa(i) + `"`
	}
	return []byte(`{"task_id":"t","expected_schema":{"items":{"required":[` + strings.Join(names, ",") +
		`]}},"submitted_output":[` + strings.TrimSuffix(strings.Repeat("{},", n), ",") + `]}`)
}

// 3,000 names over 15,000 objects (64 KB, within the free tier's body
// limit) held 1.1 GB and ran 20 s when required cost one step. 1,000 over
// 3,000 (17 KB) allocated about 100 MB. A missing name now costs a step.
func TestRequiredIsChargedPerMissingName(t *testing.T) {
	v := New(Config{})
	body := requiredFlood(1000, 3000)
	var err error
	n := allocatedBy(func() { _, err = v.Parse(body) })
	if n > 32<<20 {
		t.Errorf("a %d KB request allocated %d MB", len(body)>>10, n>>20)
	}
	e := apierr.From(err)
	if e.Status != 422 || len(e.Fields) != 1 || e.Fields[0].Field != "expected_schema" || !strings.Contains(e.Fields[0].Problem, "evaluation steps") {
		t.Fatalf("%.300v; want 422 naming expected_schema's evaluation steps", e)
	}
	// Fewer missing names are a verdict, every one of them reported.
	req, err := v.Parse(requiredFlood(10, 100))
	if err != nil {
		t.Fatal(err)
	}
	if r := req.report; r.FailuresTotal != 1000 || r.Total != 100 || r.Passed != 0 {
		t.Errorf("10 names over 100 objects: %d failures, %d/%d checks passed; want 1000 failures, 0/100", r.FailuresTotal, r.Passed, r.Total)
	}
}

// deepFailures puts n failing items under depth objects: every error the
// validator keeps holds its own copy of the instance location, depth+1
// tokens long.
func deepFailures(depth, n int) []byte {
	var out strings.Builder
	out.WriteString(strings.Repeat(`{"a":`, depth))
	out.WriteString(`[` + strings.TrimSuffix(strings.Repeat("0,", n), ",") + `]`)
	out.WriteString(strings.Repeat(`}`, depth))
	sch := `{"$defs":{"n":{"properties":{"a":{"$ref":"#/$defs/n"}},"items":false}},"$ref":"#/$defs/n"}`
	return []byte(`{"task_id":"t","expected_schema":` + sch + `,"submitted_output":` + out.String() + `}`)
}

// 520,000 failures 60 levels deep (1 MiB) held 850 MB and ran 17 s past a
// 1 s time limit when a failure cost a step; 100,000 (200 KB) allocated
// about 200 MB. A failure now costs steps by its depth.
func TestDeepFailuresAreChargedByDepth(t *testing.T) {
	v := New(Config{})
	body := deepFailures(60, 100_000)
	var err error
	n := allocatedBy(func() { _, err = v.Parse(body) })
	if n > 48<<20 {
		t.Errorf("a %d KB request allocated %d MB", len(body)>>10, n>>20)
	}
	e := apierr.From(err)
	if e.Status != 422 || len(e.Fields) != 1 || !strings.Contains(e.Fields[0].Problem, "evaluation steps") {
		t.Fatalf("%.300v; want 422 naming expected_schema's evaluation steps", e)
	}
	// A thousand of them are a verdict.
	req, err := v.Parse(deepFailures(60, 1000))
	if err != nil {
		t.Fatal(err)
	}
	if r := req.report; r.FailuresTotal != 1000 || len(r.Failures) != DefaultListCap || r.Passed != 0 || r.Total != 1000 {
		t.Errorf("1,000 deep failures: %d kept of %d, %d/%d checks passed", len(r.Failures), r.FailuresTotal, r.Passed, r.Total)
	}
}

// declFlood applies a schema declaring properties 32^3 times (nested allOf
// over shared $refs, 33,825 steps) at the value of one member whose name
// is keyLen bytes long, with strict_content_check.
func declFlood(keyLen int, value string) []byte {
	refs := func(to string) string {
		return `{"allOf":[` + strings.TrimSuffix(strings.Repeat(`{"$ref":"#/$defs/`+to+`"},`, 32), ",") + `]}`
	}
	sch := `{"additionalProperties":{"$ref":"#/$defs/d3"},"$defs":{"p":{"properties":{}},` +
		`"d1":` + refs("p") + `,"d2":` + refs("d1") + `,"d3":` + refs("d2") + `}}`
	return []byte(`{"task_id":"t","strict_content_check":true,"expected_schema":` + sch +
		`,"submitted_output":{"` + strings.Repeat("k", keyLen) + `":` + value + `}}`)
}

// Each of those applications kept its own copy of the path, 60 KB of
// name: 500 MB held for a 62 KB request. They now share one.
func TestUndeclaredPathRenderedOncePerLocation(t *testing.T) {
	v := New(Config{})
	body := declFlood(60_000, `{}`)
	var err error
	n := allocatedBy(func() { _, err = v.Parse(body) })
	if err != nil {
		t.Fatal(err)
	}
	if n > 32<<20 {
		t.Errorf("a %d KB request allocated %d MB", len(body)>>10, n>>20)
	}
	// A path written again for each of many undeclared members is charged
	// by its length: 2,000 members under the long name would be 120 MB of
	// flags.
	members := make([]string, 2000)
	for i := range members {
		members[i] = `"m` + strconv.Itoa(i) + `":0`
	}
	body = declFlood(60_000, `{`+strings.Join(members, ",")+`}`)
	n = allocatedBy(func() { _, err = v.Parse(body) })
	if n > 32<<20 {
		t.Errorf("a %d KB request with 2,000 undeclared members allocated %d MB", len(body)>>10, n>>20)
	}
	if e := apierr.From(err); e.Status != 422 || len(e.Fields) != 1 || !strings.Contains(e.Fields[0].Problem, "evaluation steps") {
		t.Errorf("%.300v; want 422 naming expected_schema's evaluation steps", e)
	}
	// Under a short name the same members are flagged, every one.
	req, err := v.Parse(declFlood(10, `{`+strings.Join(members[:100], ",")+`}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(req.report.Undeclared) != 100 {
		t.Errorf("%d undeclared members flagged; want 100", len(req.report.Undeclared))
	}
}

// The validator looks every member of an object up at every application
// of a schema with properties: 2,000 members under 32,768 applications of
// one (a 21 KB request) cost 10 s of CPU, charged a step an application.
// 16 members now cost a step.
func TestMembersLookedUpAreCharged(t *testing.T) {
	members := make([]string, 2000)
	for i := range members {
		members[i] = `"m` + strconv.Itoa(i) + `":0`
	}
	body := declFlood(1, `{`+strings.Join(members, ",")+`}`)
	body = []byte(strings.Replace(string(body), `"strict_content_check":true,`, "", 1))
	_, err := New(Config{}).Parse(body)
	if e := apierr.From(err); e.Status != 422 || len(e.Fields) != 1 || !strings.Contains(e.Fields[0].Problem, "evaluation steps") {
		t.Errorf("%.300v; want 422 naming expected_schema's evaluation steps", e)
	}
	// An object of ordinary size under the same schema is a verdict.
	if _, err := New(Config{}).Parse(declFlood(1, `{`+strings.Join(members[:15], ",")+`}`)); err != nil {
		t.Errorf("15 members: %v", err)
	}
}
