package verify

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/aovhq/aov/apierr"
)

// The gateway's unpaid precheck compiles the request's schema. A pattern
// whose classes are too large is refused before it is parsed: 25 patterns
// of 30 KB of \pL cost 3 GB of allocation and seconds of CPU when each was
// parsed (twice) before its size was checked.
func TestPrecheckRefusesClassHeavyPatternsUnparsed(t *testing.T) {
	v := New(Config{})
	props := map[string]any{}
	for i := range 25 {
		props[fmt.Sprintf("p%d", i)] = map[string]any{"type": "string", "pattern": fmt.Sprintf("x%d", i) + strings.Repeat(`\pL`, 10_000)}
	}
	body, _ := json.Marshal(map[string]any{"task_id": "t", "expected_schema": map[string]any{"type": "object", "properties": props}, "submitted_output": map[string]any{}})
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	err := v.Precheck(body)
	runtime.ReadMemStats(&b)
	if n := b.TotalAlloc - a.TotalAlloc; n > 64<<20 {
		t.Errorf("an unpaid precheck of a %d KB body allocated %d MB", len(body)>>10, n>>20)
	}
	e := apierr.From(err)
	if e.Status != 422 || e.Code != apierr.CodeInvalidRequest || len(e.Fields) == 0 ||
		!strings.HasPrefix(e.Fields[0].Field, "expected_schema/properties/p") ||
		!strings.Contains(e.Fields[0].Problem, "character classes are too large to evaluate") {
		t.Fatalf("%+v; want 422 invalid_request naming a pattern's classes", e)
	}
	if strings.Contains(e.Message+e.Fields[0].Problem+e.Fields[0].Fix, `\pL\pL`) {
		t.Errorf("the refusal repeats the pattern: %s", e.Message)
	}
}

// Verifications against one schema with format "regex" share its compiled
// form (the schema cache), whose format check wrote a map without a lock:
// two at once killed the process. Run with -race.
func TestConcurrentFormatRegexVerifications(t *testing.T) {
	v := New(Config{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				body := fmt.Sprintf(`{"task_id":"t","expected_schema":{"type":"string","format":"regex"},"submitted_output":"^a%d_%d$"}`, g, i)
				if _, err := v.Parse([]byte(body)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// The metaschema checks every patternProperties key as a regular
// expression; the keys of one schema share a budget of parsing, so an
// unpaid precheck of 1,500 distinct keys of 30 \pL (each just within the
// class limit) is refused after a few are parsed. Each one was parsed
// before: 700 MB allocated for a 195 KB body.
func TestPrecheckPatternPropertiesKeysParseBudget(t *testing.T) {
	v := New(Config{})
	pp := map[string]any{}
	for i := range 1500 {
		pp[fmt.Sprintf("x%d", i)+strings.Repeat(`\pL`, 30)] = true
	}
	body, _ := json.Marshal(map[string]any{"task_id": "t", "expected_schema": map[string]any{"type": "object", "patternProperties": pp}, "submitted_output": map[string]any{}})
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	err := v.Precheck(body)
	runtime.ReadMemStats(&b)
	if n := b.TotalAlloc - a.TotalAlloc; n > 64<<20 {
		t.Errorf("an unpaid precheck of a %d KB body allocated %d MB", len(body)>>10, n>>20)
	}
	e := apierr.From(err)
	if e.Status != 422 || e.Code != apierr.CodeInvalidRequest || len(e.Fields) == 0 ||
		!strings.HasPrefix(e.Fields[0].Field, "expected_schema/patternProperties/x") {
		t.Fatalf("%.300v; want 422 invalid_request naming a patternProperties key", e)
	}
	budget := false
	for _, f := range e.Fields {
		budget = budget || strings.Contains(f.Problem, "for all of them together")
	}
	if !budget {
		t.Errorf("%.300v; want keys refused for the schema's parsing budget", e.Fields)
	}
	key := strings.TrimPrefix(e.Fields[0].Field, "expected_schema/patternProperties/")
	if strings.Count(e.Message, key) > 1 {
		t.Errorf("the message repeats the pattern: %.300s", e.Message)
	}
}

// A bad patternProperties key is named where it is written, not under a
// member the library validated after it ("expected_schema/type/(").
func TestPrecheckPatternPropertiesKeyPointer(t *testing.T) {
	v := New(Config{})
	for schema, want := range map[string]string{
		`{"type":"object","patternProperties":{"(":true}}`:                                      "expected_schema/patternProperties/(",
		`{"type":"object","properties":{"a":{"type":"object","patternProperties":{"(":true}}}}`: "expected_schema/properties/a/patternProperties/(",
	} {
		e := apierr.From(v.Precheck([]byte(`{"task_id":"t","expected_schema":` + schema + `,"submitted_output":{}}`)))
		if e.Status != 422 || len(e.Fields) != 1 || e.Fields[0].Field != want {
			t.Errorf("%s: %d %+v; want the field %s", schema, e.Status, e.Fields, want)
		}
	}
}
