package schema

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp/syntax"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// hostilePattern is small to write and large to run: about 3,000
// instructions, so each byte of input costs thousands of steps.
const hostilePattern = `(?:a?){1000}a{1000}b`

func TestPatternSizeEstimatesTheProgram(t *testing.T) {
	for _, pat := range []string{
		`^INV-[0-9]{4}$`, `a`, `(a|b)*c`, `[a-z]+@[a-z]+\.[a-z]{2,}`, `(?i)hello`, `x{3,}`, `(?:ab){10,20}`,
		`^\p{L}{1,100}$`, hostilePattern, `((a{10}){10}){10}`, `a{1000}`, `(?:a?){1000}`,
	} {
		m, err := patternSize(pat)
		est := m.work
		if err != nil {
			t.Fatalf("%s: %v", pat, err)
		}
		re, _ := syntax.Parse(pat, syntax.Perl)
		prog, err := syntax.Compile(re.Simplify())
		if err != nil {
			t.Fatal(err)
		}
		// An estimate for budgets: never far below the real program (a
		// pattern must not be cheaper than it runs), never wildly above.
		if real := len(prog.Inst); est < real/2 || est > 4*real+8 {
			t.Errorf("patternSize(%s) = %d; the program has %d instructions", pat, est, real)
		}
	}
}

func TestPatternTooLargeDoesNotCompile(t *testing.T) {
	c := NewCacheConfig(CacheConfig{MaxPatternSize: 1000})
	for _, schema := range []string{
		`{"type": "string", "pattern": "` + hostilePattern + `"}`,
		`{"patternProperties": {"` + hostilePattern + `": {}}}`,
	} {
		_, err := c.Compile(decode(t, schema), hashOf(schema))
		var ce *CompileError
		if !errors.As(err, &ce) || len(ce.Fields) != 1 || !strings.Contains(ce.Fields[0].Problem, "too large to evaluate") ||
			!strings.HasPrefix(ce.Fields[0].Field, "expected_schema") {
			t.Errorf("%s: %v; want a CompileError naming the pattern as too large", schema, err)
		}
	}
	small := `{"type": "string", "pattern": "^INV-[0-9]{4}$"}`
	if _, err := c.Compile(decode(t, small), hashOf(small)); err != nil {
		t.Errorf("a small pattern: %v", err)
	}
}

func TestRegexWorkBudget(t *testing.T) {
	s := mustCompile(t, `{"properties": {"s": {"type": "string", "pattern": "`+hostilePattern+`"}}}`)
	long := map[string]any{"s": strings.Repeat("a", 100_000)}
	_, err := s.EvaluateWithin(long, Options{})
	var rb *RegexBudgetError
	if !errors.As(err, &rb) || rb.MaxWork != DefaultMaxRegexWork || rb.Fields()[0].Field != "expected_schema" {
		t.Fatalf("the hostile pattern on 100 KB: %v; want a *RegexBudgetError at the default budget", err)
	}
	// The same pattern on a short string is within the budget and runs.
	rep, err := s.EvaluateWithin(map[string]any{"s": strings.Repeat("a", 1000) + "b"}, Options{})
	if err != nil || rep.Total != 2 || rep.Passed != 2 {
		t.Errorf("the pattern on 1,001 bytes: %+v, %v; want 2 passing checks", rep, err)
	}
	// patternProperties matches are charged too.
	pp := mustCompile(t, `{"patternProperties": {"`+hostilePattern+`": {}}}`)
	if _, err := pp.EvaluateWithin(map[string]any{strings.Repeat("a", 100_000): 1}, Options{}); !errors.As(err, &rb) {
		t.Errorf("patternProperties on a 100 KB name: %v; want a *RegexBudgetError", err)
	}
	// Evaluate reports it as a failed complexity check (fail closed).
	if rep := s.Evaluate(long, Options{}); rep.Passed != 0 || len(rep.Failures) != 1 || rep.Failures[0].Keyword != "complexity" {
		t.Errorf("Evaluate over the regex budget = %+v; want one failed complexity check", rep)
	}
	// format "regex" on the output is charged for its parse: its length
	// and its class ranges (it is never compiled).
	fr := mustCompile(t, `{"items": {"format": "regex"}}`)
	pats := make([]any, 2000)
	for i := range pats {
		pats[i] = strings.Repeat(`\pL`, 30)
	}
	if _, err := fr.EvaluateWithin(pats, Options{MaxRegexWork: 1_000_000}); !errors.As(err, &rb) {
		t.Errorf("2,000 class-heavy patterns under format regex: %v; want a *RegexBudgetError", err)
	}
}

func TestEvaluationStopsWithItsContext(t *testing.T) {
	s := mustCompile(t, `{"items": {"type": "integer"}}`)
	inst := make([]any, 10_000)
	for i := range inst {
		inst[i] = "x"
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.EvaluateContext(ctx, inst, Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled evaluation: %v; want context.Canceled", err)
	}
	if _, err := s.EvaluateContext(context.Background(), inst, Options{}); err != nil {
		t.Fatal(err)
	}
}

// The capped report is the uncapped one cut short: same first failures,
// same total, same keyword order, whatever order the validator found
// them in (object members come in map order).
func TestFailuresCapped(t *testing.T) {
	s := mustCompile(t, `{"additionalProperties": {"type": "object", "required": ["a", "b"],
		"properties": {"n": {"type": "integer", "minimum": 5}, "s": {"type": "string"}}, "additionalProperties": false}}`)
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 20 {
		obj := map[string]any{}
		for i := range 300 {
			item := map[string]any{}
			switch r.IntN(5) {
			case 0:
				item["n"] = fmt.Sprint(r.IntN(10))
			case 1:
				item["s"] = 1.5
			case 2:
				item["x"+fmt.Sprint(r.IntN(3))] = true
			case 3:
				item["a"], item["b"] = 1, 2
			}
			obj[fmt.Sprintf("k%d", i)] = item
		}
		all, err := s.EvaluateWithin(obj, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for _, limit := range []int{1, 7, 50} {
			capped, err := s.EvaluateWithin(obj, Options{MaxFailures: limit})
			if err != nil {
				t.Fatal(err)
			}
			if capped.FailuresTotal != len(all.Failures) || capped.Total != all.Total || capped.Passed != all.Passed {
				t.Fatalf("round %d cap %d: total %d, checks %d/%d; want %d, %d/%d", round, limit,
					capped.FailuresTotal, capped.Passed, capped.Total, len(all.Failures), all.Passed, all.Total)
			}
			if !slices.Equal(capped.Failures, all.Failures[:limit]) {
				t.Fatalf("round %d cap %d: kept %v\nwant %v", round, limit, capped.Failures, all.Failures[:limit])
			}
			if !slices.Equal(capped.Keywords, all.Keywords) {
				t.Fatalf("round %d cap %d: keywords %v; want %v", round, limit, capped.Keywords, all.Keywords)
			}
		}
		var firsts []string
		for _, f := range all.Failures {
			if !slices.Contains(firsts, f.Keyword) {
				firsts = append(firsts, f.Keyword)
			}
		}
		if !slices.Equal(all.Keywords, firsts) {
			t.Fatalf("keywords %v; want them in first-failure order %v", all.Keywords, firsts)
		}
	}
}

func TestCacheBoundedInBytes(t *testing.T) {
	big := func(n, tag int) string {
		var b strings.Builder
		fmt.Fprintf(&b, `{"$comment": "%d", "properties": {`, tag)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"p%d": {"type": "integer"}`, i)
		}
		b.WriteString(`}}`)
		return b.String()
	}
	const limit = 1 << 20 // about 900 subschemas
	c := NewCacheConfig(CacheConfig{Entries: 100, MaxBytes: limit})
	for tag := range 10 {
		sch := big(300, tag)
		if _, err := c.Compile(decode(t, sch), hashOf(sch)); err != nil {
			t.Fatal(err)
		}
		if c.Bytes() > limit {
			t.Fatalf("after %d schemas the cache holds %d bytes; want at most %d", tag+1, c.Bytes(), limit)
		}
	}
	if c.Len() >= 10 || c.Len() == 0 {
		t.Errorf("Len() = %d; want the byte bound, not the entry bound, to have evicted", c.Len())
	}
	// A schema larger than the whole bound is used but not kept.
	huge := big(1000, 99)
	if s, err := c.Compile(decode(t, huge), hashOf(huge)); err != nil || s == nil {
		t.Fatal(err)
	}
	if c.Bytes() > limit {
		t.Errorf("a schema over the bound was kept: %d bytes", c.Bytes())
	}
}

func TestTooManySubschemas(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"properties": {`)
	for i := range DefaultMaxSchemas {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"p%d": {}`, i)
	}
	b.WriteString(`}}`)
	_, err := NewCache(1).Compile(decode(t, b.String()), "h")
	var ce *CompileError
	if !errors.As(err, &ce) || ce.Fields[0].Field != "expected_schema" || !strings.Contains(ce.Fields[0].Problem, "more than 5000 objects") {
		t.Fatalf("a schema of %d objects: %v; want a CompileError naming the limit", DefaultMaxSchemas+1, err)
	}
	// Subschemas count whatever their names: under a schema named like a
	// data keyword, $defs/const, they once did not.
	for _, named := range []string{"const", "enum", "examples", "default"} {
		hidden := `{"$defs": {"` + named + `": ` + b.String() + `}}`
		if _, err := NewCache(1).Compile(decode(t, hidden), "h"+named); !errors.As(err, &ce) || !strings.Contains(ce.Fields[0].Problem, "more than 5000 objects") {
			t.Errorf("%d objects under $defs/%s: %v; want a CompileError naming the limit", DefaultMaxSchemas+2, named, err)
		}
	}
	// Objects in data count too, since a $ref can point into it
	// (TestObjectsInDataCountTowardMaxSchemas); data of other values does
	// not.
	enum := `{"enum": [` + strings.TrimSuffix(strings.Repeat(`{},`, DefaultMaxSchemas), ",") + `]}`
	if _, err := NewCache(1).Compile(decode(t, enum), "e"); !errors.As(err, &ce) || !strings.Contains(ce.Fields[0].Problem, "more than 5000 objects") {
		t.Errorf("%d objects inside enum: %v; want a CompileError naming the limit", DefaultMaxSchemas, err)
	}
	strs := `{"enum": [` + strings.TrimSuffix(strings.Repeat(`"s",[1],`, 2*DefaultMaxSchemas), ",") + `]}`
	if _, err := NewCache(1).Compile(decode(t, strs), "s"); err != nil {
		t.Errorf("strings and arrays inside enum counted as objects: %v", err)
	}
}

// A long enum over many values is charged to the step budget.
func TestLongEnumIsCharged(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"items": {"enum": [`)
	for i := range 20_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"v%d"`, i)
	}
	b.WriteString(`]}}`)
	s := mustCompile(t, b.String())
	inst := make([]any, 2000)
	for i := range inst {
		inst[i] = "absent"
	}
	var tc *TooComplexError
	if _, err := s.EvaluateWithin(inst, Options{}); !errors.As(err, &tc) {
		t.Fatalf("20,000 enum members × 2,000 values: %v; want a *TooComplexError", err)
	}
	if rep, err := s.EvaluateWithin(inst[:10], Options{}); err != nil || rep.Total != 10 {
		t.Errorf("the same enum on 10 values: %+v, %v", rep, err)
	}
}

// The patterns of one schema are bounded together, every place a pattern
// is written counted: the gateway compiles a request's schema to answer
// its 402, unpaid, and 4,900 patterns of [\p{L}]{999}, each within the
// per-pattern limit, cost it 2 s of CPU and kept 222 MB per schema.
func TestPatternsOfASchemaAreBoundedTogether(t *testing.T) {
	c := NewCacheConfig(CacheConfig{})
	props := func(n int, pattern string) string {
		var b strings.Builder
		b.WriteString(`{"type": "object", "properties": {`)
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(`"p` + strconv.Itoa(i) + `": {"type": "string", "pattern": "` + pattern + `"}`)
		}
		b.WriteString(`}}`)
		return b.String()
	}
	// 4,900 distinct patterns of about 1,000 instructions each.
	var b strings.Builder
	b.WriteString(`{"type": "object", "properties": {`)
	for i := range 4900 {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`"p` + strconv.Itoa(i) + `": {"type": "string", "pattern": "[\\p{L}]{` + strconv.Itoa(999-i%500) + `}"}`)
	}
	b.WriteString(`}}`)
	hostile := b.String()
	_, err := c.Compile(decode(t, hostile), hashOf(hostile))
	var ce *CompileError
	if !errors.As(err, &ce) || len(ce.Fields) == 0 || !strings.Contains(ce.Fields[0].Problem, "more than the limit of 100000 for all of them together") ||
		!strings.HasPrefix(ce.Fields[0].Field, "expected_schema/properties/p") {
		t.Fatalf("4,900 distinct patterns of up to 1,000 instructions: %v; want a CompileError naming the patterns' total", err)
	}
	// One pattern written in 4,900 places is compiled, and counted, once.
	same := props(4900, `[\\p{L}]{999}`)
	s, err := c.Compile(decode(t, same), hashOf(same))
	if err != nil {
		t.Fatalf("one pattern in 4,900 places: %v", err)
	}
	if s.bytes > 4901*bytesPerSchema+2000*bytesPerInstruction {
		t.Errorf("one pattern in 4,900 places is estimated at %d bytes, as if compiled more than once", s.bytes)
	}
	// Many small patterns, as real schemas have, are far below it.
	honest := props(200, `^INV-[0-9]{4}$`)
	s, err = c.Compile(decode(t, honest), hashOf(honest))
	if err != nil {
		t.Fatalf("200 small patterns: %v", err)
	}
	// The cache's byte bound sees what the patterns keep.
	if s.bytes < 201*bytesPerSchema+12*bytesPerInstruction {
		t.Errorf("a schema of 200 properties and a pattern is estimated at %d bytes", s.bytes)
	}
}
