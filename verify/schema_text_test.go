package verify

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Schemas whose canonical JSON is the same (1.0 and 1, 1e2 and 100 are one
// number in RFC 8785) share a schema_hash and so one cache entry: what a
// failed const or enum expects must be written from the canonical value,
// so one request's signed result never depends on whose schema was cached
// first. (Before: request b's errors_detail said "the value 1.0" after a
// request a cached its spelling, "the value 1" on a fresh verifier.)
func TestConstAndEnumTextsDoNotDependOnWhichSpellingWasCachedFirst(t *testing.T) {
	a := `{"task_id":"t","expected_schema":{"properties":{"n":{"const":1.0},"e":{"enum":[1e2]},"o":{"const":{"b":1E0,"a":[2.50]}}}},"submitted_output":{"n":2,"e":3,"o":4}}`
	b := `{"task_id":"t","expected_schema":{"properties":{"n":{"const":1},"e":{"enum":[100]},"o":{"const":{"a":[2.5],"b":1}}}},"submitted_output":{"n":2,"e":3,"o":4}}`
	details := func(v *Verifier, body string) (string, string) {
		req, err := v.Parse([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		r := v.Check(req, "id", time.Unix(1700000000, 0))
		return fmt.Sprintf("%+v", r.ErrorsDetail), req.Hashes.Schema
	}
	fresh, hb := details(New(Config{}), b)
	shared := New(Config{})
	_, ha := details(shared, a)
	after, _ := details(shared, b)
	if ha != hb {
		t.Fatalf("the two schemas should share a schema_hash: %s, %s", ha, hb)
	}
	if fresh != after {
		t.Errorf("request b verified twice differs by what was cached before it:\nfresh:   %s\nafter a: %s", fresh, after)
	}
	for _, want := range []string{"Expected:the value 1 ", "Expected:one of 100 ", `Expected:the value {"a":[2.5],"b":1} `} {
		if !strings.Contains(fresh, want) {
			t.Errorf("errors_detail lacks %q: %s", want, fresh)
		}
	}
}
