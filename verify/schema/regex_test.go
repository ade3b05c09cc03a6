package schema

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unicode"
)

// classHeavy is 30 KB of \pL: 10,000 classes of 659 ranges, a quarter of a
// second and 60 MB to parse.
var classHeavy = strings.Repeat(`\pL`, 10_000)

// allocated returns the bytes fn allocates.
func allocated(fn func()) uint64 {
	runtime.GC()
	var a, b runtime.MemStats
	runtime.ReadMemStats(&a)
	fn()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// A compiled schema is shared by every evaluation (through the cache), and
// its format "regex" check is the compile's regexp engine: evaluations at
// once must not write anything of it. Run with -race; before the fix the
// runtime killed the process ("concurrent map writes").
func TestFormatRegexConcurrentEvaluations(t *testing.T) {
	s := mustCompile(t, `{"items": {"type": "string", "format": "regex"}}`)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				out := []any{fmt.Sprintf("^a%d_%d$", g, i), "("}
				rep, err := s.EvaluateWithin(out, Options{})
				if err != nil || len(rep.Failures) != 1 || rep.Failures[0].InstancePath != "$[1]" {
					t.Errorf("%+v, %v; want the valid regex to pass and the broken one to fail", rep, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// The verdict of format "regex" on an output depends on the output alone:
// before the fix every distinct regex an output carried was added to the
// schema's pattern total, and once it passed MaxPatternsSize every new
// valid regex failed.
func TestFormatRegexVerdictIndependentOfHistory(t *testing.T) {
	s := mustCompile(t, `{"type": "string", "format": "regex"}`)
	large := "x" + strings.Repeat("[a-z]", 3_000) // valid, about 7,500 of the 10,000
	for i := range 20 {
		if rep := s.Evaluate(fmt.Sprintf("%d%s", i, large), Options{}); rep.Passed != rep.Total {
			t.Fatalf("large valid regex %d: %+v", i, rep)
		}
	}
	for i := range 200 {
		s.Evaluate(fmt.Sprintf("y%d", i), Options{})
	}
	if rep := s.Evaluate("^INV-[0-9]{4}$", Options{}); rep.Passed != rep.Total {
		t.Fatalf("an honest regex fails after earlier outputs: %+v", rep)
	}
	// The check stays size-checked.
	if rep := s.Evaluate(hostilePattern+hostilePattern+hostilePattern+hostilePattern, Options{}); rep.Passed == rep.Total {
		t.Errorf("a regex over the size limit passes format regex: %+v", rep)
	}
}

// A pattern whose character classes are too large is refused before it is
// parsed, with its own message, naming it and not repeating it; before the
// fix it was parsed twice (250 ms and 60 MB each) and then refused.
func TestClassHeavyPatternRefusedBeforeParse(t *testing.T) {
	for _, tc := range []struct{ schema, field string }{
		{`{"properties": {"p": {"type": "string", "pattern": "x` + strings.ReplaceAll(classHeavy, `\`, `\\`) + `"}}}`, "expected_schema/properties/p/pattern"},
		{`{"patternProperties": {"x` + strings.ReplaceAll(classHeavy, `\`, `\\`) + `": {}}}`, "expected_schema/patternProperties/x"},
	} {
		tree := decode(t, tc.schema)
		var err error
		n := allocated(func() { _, err = NewCache(4).Compile(tree, hashOf(tc.schema)) })
		var ce *CompileError
		if !errors.As(err, &ce) || len(ce.Fields) != 1 || !strings.HasPrefix(ce.Fields[0].Field, tc.field) ||
			ce.Fields[0].Problem != "is a regular expression whose character classes are too large to evaluate (up to 6590001 character ranges; the limit is 20000)" {
			t.Fatalf("%v; want a CompileError naming the pattern's classes", err)
		}
		if strings.Contains(ce.Fields[0].Problem+ce.Fields[0].Fix, `\pL\pL`) {
			t.Errorf("the refusal repeats the pattern: %+v", ce.Fields[0])
		}
		if n > 4<<20 {
			t.Errorf("refusing a 30 KB pattern allocated %d MB; it must not be parsed", n>>20)
		}
	}
}

// An output string under format "regex" is refused the same way, for the
// evaluation's own budget, before it is parsed.
func TestFormatRegexClassHeavyOutput(t *testing.T) {
	s := mustCompile(t, `{"type": "string", "format": "regex"}`)
	var rep Report
	n := allocated(func() { rep = s.Evaluate(classHeavy, Options{}) })
	if len(rep.Failures) != 1 || rep.Failures[0].Keyword != "format" {
		t.Errorf("%+v; want the format check to fail", rep)
	}
	if n > 4<<20 {
		t.Errorf("checking a 30 KB regex allocated %d MB; it must not be parsed", n>>20)
	}
	if cost := regexFormatCost(strings.Repeat(`\pL`, 30), DefaultMaxPatternSize); cost < 13*30*659 {
		t.Errorf("format regex on 30 \\pL is charged %d; parsing it builds 19,770 ranges", cost)
	}
}

// Parsing is charged for what it costs (regexFormatCost, and a compile's
// maxParseWork), in units of about 10 ns, measured on the parser: a class
// range up to 130 ns where a bracket merges tables, a case-folded class
// escape about 400 ns a range, a case-folded bracket range about 73 ns for
// each character of it the parser visits (it folds them one by one), which
// its ranges do not show: (?i)[\x{42}-\x{1e942}] parses to one range in
// 9 ms. Before, a range was charged 4 (40 ns), and 2,000 outputs of 30 \pL
// took an evaluation 165 ms and 50 MB before its budget refused them.
func TestPatternParseCost(t *testing.T) {
	for pat, least := range map[string]int64{
		strings.Repeat(`[\p{Lu}\p{Mn}]`, 20): 13 * 19_780,
		`(?i)\pL`:                            40 * 660,
		`(?i)[\x{42}-\x{1e942}]`:             8 * (0x1e942 - 0x42),
		`(?i)[a-z\x{100}-\x{1300}]`:          8 * (0x1300 - 0x100),
	} {
		if cost := regexFormatCost(pat, DefaultMaxPatternSize); cost < least {
			t.Errorf("%.40s is charged %d to parse; at least %d", pat, cost, least)
		}
	}
	s := mustCompile(t, `{"type": "array", "items": {"type": "string", "format": "regex"}}`)
	out := make([]any, 2000)
	for i := range out {
		out[i] = fmt.Sprintf("%d%s", i, strings.Repeat(`\pL`, 30))
	}
	var rep Report
	var err error
	n := allocated(func() { rep, err = s.EvaluateWithin(out, Options{}) })
	if err == nil && (len(rep.Failures) != 1 || rep.Failures[0].Keyword != "complexity") {
		t.Errorf("%.200v, %v; want the evaluation refused for its budget", rep, err)
	}
	if n > 32<<20 {
		t.Errorf("checking 2,000 regexes of 30 \\pL allocated %d MB before the budget refused them", n>>20)
	}
}

// A compile parses each pattern once, even one it refuses: the metaschema's
// format check and the keyword's compile share the verdict.
func TestPatternParsedOncePerCompile(t *testing.T) {
	pat := strings.Repeat(`\pL`, 30) + strings.Repeat("a{1000}", 10) // classes within the limit, size over it
	one := allocated(func() { syntax.Parse(pat, syntax.Perl) })
	schema := `{"properties": {"p": {"type": "string", "pattern": "` + strings.ReplaceAll(pat, `\`, `\\`) + `"}}}`
	tree := decode(t, schema)
	var err error
	n := allocated(func() { _, err = NewCache(4).Compile(tree, hashOf(schema)) })
	var ce *CompileError
	if !errors.As(err, &ce) || !strings.Contains(ce.Fields[0].Problem, "is a regular expression too large to evaluate (about ") {
		t.Fatalf("%v; want the pattern refused as too large", err)
	}
	if n > one*3/2 {
		t.Errorf("the compile allocated %d KB, a parse of the pattern %d KB: it was parsed more than once", n>>10, one>>10)
	}
}

// wideClass is a bracket of n separate characters (no two adjacent, so n
// ranges), escaped for a JSON string.
func wideClass(n int) string {
	var b strings.Builder
	b.WriteString("[")
	for i := range n {
		b.WriteRune(rune(0x4e00 + 2*i))
	}
	b.WriteString("]")
	return b.String()
}

// wideAlternation is a group of n two-character alternatives that start
// with n different characters.
func wideAlternation(n int) string {
	alts := make([]string, n)
	for i := range alts {
		alts[i] = string(rune(0x4e00+2*i)) + "x"
	}
	return "(?:" + strings.Join(alts, "|") + ")"
}

// The cache's byte bound must see what compiled patterns keep: the
// estimate (Schema.bytes) is never less than half the heap a schema
// really keeps. Before the fix a class counted as one instruction, and ten
// patterns of \pL kept 25 times their estimate; then a repeated class
// counted its table once, but Go's one-pass matcher (a program under 1,000
// instructions anchored at ^) copies the table into every instruction:
// ten ^[\p{L}]{990}$ kept 80 MB under an 880 KB estimate, and one bracket of
// 18,000 characters repeated 990 times 209 MB.
func TestPatternBytesEstimate(t *testing.T) {
	for _, tc := range []struct {
		shape string
		n     int // patterns of the shape in the schema
	}{
		{`^x%d` + strings.Repeat(`\\pL`, 25) + `$`, 10}, // one-pass: the tables are copied
		{`x%d` + strings.Repeat(`\\pL`, 25), 10},
		{`(?i)x%d` + strings.Repeat(`\\p{Greek}`, 200), 10},
		{`x%d[\\p{L}]{999}`, 10},
		{`x%d(?:a?){1000}`, 10},
		{`x%d[a-z0-9]{500}`, 10},
		{`^INV-%d-[0-9]{4}$`, 10},
		{`^x%d[\\p{L}]{990}$`, 10},
		{`^x%d\\p{Lu}{990}$`, 10},
		{`^x%d[\\p{L}\\p{M}' -]{1,100}$`, 10},
		{`^x%d[a-z0-9]{500}$`, 10},
		{`^x%d` + wideClass(2_000) + `{990}$`, 1},
		{`^x%d` + wideAlternation(330) + `$`, 10},
	} {
		shape := tc.shape
		var b strings.Builder
		b.WriteString(`{"properties": {`)
		for i := range tc.n {
			if i > 0 {
				b.WriteString(",")
			}
			fmt.Fprintf(&b, `"p%d": {"type": "string", "pattern": "`+shape+`"}`, i, i)
		}
		b.WriteString(`}}`)
		tree := decode(t, b.String())
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s, err := compile(tree, compileOptions{})
		if err != nil {
			t.Fatalf("%s: %v", shape, err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		kept := int64(after.HeapAlloc) - int64(before.HeapAlloc)
		runtime.KeepAlive(s)
		t.Logf("%-40.40s kept %9d, estimated %9d", shape, kept, s.bytes)
		if kept > 2*s.bytes {
			t.Errorf("%.60s: %d patterns keep %d bytes, estimated %d", shape, tc.n, kept, s.bytes)
		}
	}
}

// classBound relies on the parser's fold bounds and orbits.
func TestFoldBounds(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r++ {
		orbit := 1
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			orbit++
		}
		if orbit > 1 && (r < minFold || r > maxFold) {
			t.Fatalf("%U folds, outside [minFold, maxFold]", r)
		}
		if orbit > 4 {
			t.Fatalf("%U has an orbit of %d characters; the pre-scan assumes at most four", r, orbit)
		}
	}
}

// Patterns people write are accepted: the pre-scan's bound on a
// case-folded range counts the characters in it that fold, not its width
// (it counted four ranges per character, so the usual internationalised
// host name pattern, which parses to four ranges, was refused at 261,613).
func TestLegitPatternsAccepted(t *testing.T) {
	for _, pat := range []string{
		`^[\p{L}\p{M}' -]{1,100}$`,
		`^[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}$`,
		`(?i)^[a-z0-9_-]+$`,
		`(?i)^[a-z0-9\x{00a1}-\x{ffff}]+$`,
		`(?i)^(?:[a-z0-9\x{00a1}-\x{ffff}](?:[a-z0-9\x{00a1}-\x{ffff}-]{0,61}[a-z0-9\x{00a1}-\x{ffff}])?\.)+[a-z\x{00a1}-\x{ffff}]{2,63}$`,
		`(?i)^[\x{0020}-\x{D7FF}]*$`,
		`(?i)^[\p{L}\p{N}_-]{3,64}$`,
		`(?i)^[a-z\x{00C0}-\x{024F}\x{1E00}-\x{1EFF}' -]+$`,
		`(?i)^(mon|tue|wed|thu|fri|sat|sun)$`,
		`^\p{Lu}[\p{Ll}\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{Mn}\p{Mc}\p{Nd}\p{Pc}]{0,254}$`,
		`^(?:[\p{L}\p{M}\p{N}]+(?:[ '.-][\p{L}\p{M}\p{N}]+)*)$`,
	} {
		if _, err := measurePattern(pat, DefaultMaxPatternSize); err != nil {
			t.Errorf("%s: %v", pat, err)
		}
	}
}

func TestClassBound(t *testing.T) {
	for pat, want := range map[string]int{
		`^INV-[0-9]{4}$`:         1 + 1,
		`\pL`:                    659 + 1,
		`[\pL\pN]`:               659 + 137 + 1,
		`\Q\pL\E`:                1,
		`\\pL`:                   1,
		`(?i:\pL)|a`:             660 + 3*4,
		`(?i)[a-z]`:              3 + 24 + 2*3 + 4, // k and s have orbits of three
		`(?i)[\x{20}-\x{D7FF}]`:  3 + 2486 + 4,     // its letters weigh 2,486, its width is 55,264
		`(?i)[\x{0}-\x{10FFFF}]`: 1 + 4,
		`[^a]`:                   3 + 1,
	} {
		if got := classBound(pat); got != want {
			t.Errorf("classBound(%s) = %d, want %d", pat, got, want)
		}
	}
}

// FuzzClassBound checks the lexical bound against the parser: it is never
// below the ranges the parsed classes hold (a pattern let through is never
// more expensive than counted), and, without case folding, brackets or
// alternatives, where it claims to be exact, never above them by more than
// the alternatives it counts (it refuses nothing it need not).
func FuzzClassBound(f *testing.F) {
	for _, s := range []string{`^INV-[0-9]{4}$`, `\pL\p{Greek}\PN`, `(?i)[a-zA-Z\x{100}-\x{200}\w]`, `[^\p{^Han}[:alpha:]\d]`,
		`\Q[\pL\E\pL`, `(?i:a|b)|c`, `(?-i)[k]`, `(?i)k|s|\x{3b8}`, `[]a]`, `[a-]`, `\x{41}-\101`, `(?P<n>\pL)(?i)\p{Lu}`,
		`(?i)^[a-z0-9\x{00a1}-\x{ffff}]+$`, `(?i)^[\x{0020}-\x{D7FF}]*$`, `(?i)[\x{1f00}-\x{1fff}\x{10400}-\x{1e943}]`,
		`(?i)[\x{130}-\x{131}k-s\x{212a}]`, `(?i)[^\x{0}-\x{40}]`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pat string) {
		bound := classBound(pat)
		re, err := syntax.Parse(pat, syntax.Perl)
		if err != nil {
			return
		}
		got := classRanges(re)
		if got > bound {
			t.Fatalf("classBound(%q) = %d; the parsed classes hold %d ranges", pat, bound, got)
		}
		if !foldsAnywhere(pat) && !strings.ContainsAny(pat, "[|") && bound > got+1+strings.Count(pat, "(") {
			t.Fatalf("classBound(%q) = %d; the parsed classes hold %d ranges", pat, bound, got)
		}
	})
}

// A pattern whose one-pass matcher would copy its classes too often is
// compiled behind noOnePass, which must not change what it matches; a
// small anchored pattern keeps its one-pass matcher.
func TestNoOnePassMatchesTheSame(t *testing.T) {
	for pat, onePass := range map[string]bool{
		`^INV-[0-9]{4}$`:                  true,
		`(?i)^[a-z0-9_-]+$`:               true,
		`^[\p{L}]{990}$`:                  false,
		`^[\p{L}\p{M}' -]{1,100}$`:        false,
		`^x` + wideAlternation(330) + `$`: false,
		`a|^b$`:                           true,
		`(?i)^k|\Qab`:                     true,
		`^(?:a|b)*c$|\QX)`:                true,
	} {
		m, err := measurePattern(pat, DefaultMaxPatternSize)
		if err != nil || m.onePass != onePass {
			t.Errorf("%.40s: %+v, %v; want one-pass %v", pat, m, err, onePass)
		}
		plain, wrapped := regexp.MustCompile(pat), regexp.MustCompile(noOnePass+pat)
		for _, s := range []string{"", "INV-1234", "INV-12345", "aK_9", "b", "xab", "K", "\u212a", "abc", "ababc", "X)", "Zoë d'Arc", "x\u4e02x", strings.Repeat("é", 990)} {
			if plain.MatchString(s) != wrapped.MatchString(s) {
				t.Errorf("%.40s on %.20q: %v as written, %v behind %s", pat, s, plain.MatchString(s), wrapped.MatchString(s), noOnePass)
			}
		}
	}
}

// classHeavyKeys is a schema of n patternProperties keys, each 30 \pL
// (19,770 ranges, just within the class limit) and distinct.
func classHeavyKeys(n int) string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf(`"x%d%s": true`, i, strings.Repeat(`\\pL`, 30))
	}
	return `{"type": "object", "patternProperties": {` + strings.Join(keys, ",") + `}}`
}

// The patterns of one compile share a budget of parsing (maxParseWork):
// the metaschema checks every patternProperties key as format "regex",
// collecting every error, and each distinct key was parsed even after the
// schema's pattern total was passed. 1,500 keys of 30 \pL (a 70 KB
// schema) allocated 572 MB before the 422; now the schema's limits
// refuse all but a few unparsed.
func TestPatternParseBudget(t *testing.T) {
	schema := classHeavyKeys(1500)
	tree := decode(t, schema)
	var err error
	n := allocated(func() { _, err = NewCache(4).Compile(tree, hashOf(schema)) })
	var ce *CompileError
	if !errors.As(err, &ce) || len(ce.Fields) == 0 || !strings.HasPrefix(ce.Fields[0].Field, "expected_schema/patternProperties/x") {
		t.Fatalf("%.200v; want a CompileError naming a patternProperties key", err)
	}
	found := false
	for _, f := range ce.Fields {
		found = found || strings.Contains(f.Problem, "for all of them together")
		if strings.Contains(f.Problem+f.Fix, `\pL\pL`) {
			t.Errorf("the refusal repeats the pattern: %+v", f)
		}
	}
	if !found {
		t.Errorf("first of %d fields: %.200s; want keys refused for the schema's pattern limits", len(ce.Fields), ce.Fields[0].Problem)
	}
	if n > 64<<20 {
		t.Errorf("refusing %d KB of patterns allocated %d MB", len(schema)>>10, n>>20)
	}
	// A schema within the budget compiles: ten such keys.
	mustCompile(t, classHeavyKeys(10))
	// Folding visits every character of a range: fifty patterns of one
	// range (9 ms each to parse) pass the budget.
	keys := make([]string, 50)
	for i := range keys {
		keys[i] = fmt.Sprintf(`"x%d(?i)[\\x{42}-\\x{1e942}]": true`, i)
	}
	tree = decode(t, `{"patternProperties": {`+strings.Join(keys, ",")+`}}`)
	_, err = compile(tree, compileOptions{})
	if !errors.As(err, &ce) || !strings.Contains(ce.Fields[0].Problem, "brings the work of parsing the schema's regular expressions to ") {
		t.Errorf("%.300v; want wide case-folded patterns refused for the parsing budget", err)
	}
}

// FuzzNoOnePassMatchesTheSame: a pattern that compiles as written matches
// the same strings, at the same places, behind noOnePass.
func FuzzNoOnePassMatchesTheSame(f *testing.F) {
	for _, s := range [][2]string{{`^INV-[0-9]{4}$`, "INV-1234"}, {`a|^b$`, "b"}, {`(?i)^k|\Qab`, "K"}, {`(?m)^a$`, "b\na"}, {`(?s)^.$`, "\n"}, {`(?U)^a+`, "aa"}, {`\Aa|b\z`, "ab"}, {``, "x"}, {`$`, ""}, {`^*`, "a"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, pat, s string) {
		plain, err := regexp.Compile(pat)
		if err != nil {
			return
		}
		wrapped, err := regexp.Compile(noOnePass + pat)
		if err != nil {
			t.Fatalf("%q compiles as written but not behind %s: %v", pat, noOnePass, err)
		}
		if a, b := plain.FindStringIndex(s), wrapped.FindStringIndex(s); fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("%q on %q: %v as written, %v behind %s", pat, s, a, b, noOnePass)
		}
	})
}
