package schema

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"sort"
	"strconv"
	"strings"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// Options select optional parts of an evaluation.
type Options struct {
	// Undeclared also lists the properties no applied schema declares, for
	// strict_content_check (SPEC §4).
	Undeclared bool
	// MaxSteps bounds the work of one evaluation, in schema applications
	// (one subschema applied at one instance location). 0 means
	// DefaultMaxSteps.
	MaxSteps int
	// MaxRegexWork bounds the regular-expression work of one evaluation
	// (pattern size × string length, see DefaultMaxRegexWork). 0 means
	// DefaultMaxRegexWork.
	MaxRegexWork int64
	// MaxFailures caps Report.Failures: only the first MaxFailures (in
	// Report order) are described and kept, the rest only counted, so an
	// output with a hundred thousand bad values does not hold a hundred
	// thousand descriptions. 0 keeps them all.
	MaxFailures int
}

// DefaultMaxSteps bounds an evaluation when Options.MaxSteps is 0. A
// 1,000-line invoice takes about 8,000 steps. Applicators over shared
// subschemas (allOf: [{$ref: a}, {$ref: a}] nested twenty times) make the
// work exponential in the schema's size, so a small schema could otherwise
// pin a CPU for hours; the budget makes such a request fail fast instead.
const DefaultMaxSteps = 1 << 20

// TooComplexError reports an evaluation that needed more than its step
// budget. It is a problem of the request (schema and output together), not
// a verdict on the output.
type TooComplexError struct {
	MaxSteps int
}

func (e *TooComplexError) Error() string {
	return fmt.Sprintf("evaluating the schema needs more than %d steps", e.MaxSteps)
}

// Fields describe the problem for an invalid_request answer.
func (e *TooComplexError) Fields() []apierr.Field {
	return []apierr.Field{{
		Field:   field,
		Problem: fmt.Sprintf("needs more than %d evaluation steps on this output", e.MaxSteps),
		Fix:     "Simplify the schema: avoid allOf, anyOf or oneOf branches that apply the same subschemas again at the same location, and nesting them; apply uniqueItems to large arrays, and const or enum with large values, once.",
	}}
}

// RegexBudgetError reports an evaluation whose regular expressions needed
// more work than its budget (Options.MaxRegexWork). Like TooComplexError it
// is a problem of the request, found before any pattern ran past it.
type RegexBudgetError struct {
	MaxWork int64
}

func (e *RegexBudgetError) Error() string {
	return fmt.Sprintf("evaluating the schema's patterns needs more than %d units of regular-expression work", e.MaxWork)
}

// Fields describe the problem for an invalid_request answer.
func (e *RegexBudgetError) Fields() []apierr.Field {
	return []apierr.Field{{
		Field:   field,
		Problem: fmt.Sprintf("needs more than %d units of regular-expression work on this output (each match costs the pattern's size times the string's length)", e.MaxWork),
		Fix:     "Use smaller patterns (large repetition counts such as {1000} multiply their size), bound the strings with maxLength before the pattern applies, or send shorter strings.",
	}}
}

// Report is the outcome of one evaluation.
type Report struct {
	// Passed and Total count checks by the rules of the package doc;
	// Total-Passed checks failed.
	Passed, Total int
	// Failures describe what failed, sorted by path. One failed check can
	// yield several entries (required lists each missing property), so
	// len(Failures) need not equal Total-Passed; it is zero exactly when
	// every check passed. With Options.MaxFailures it holds at most that
	// many; FailuresTotal counts them all.
	Failures      []Failure
	FailuresTotal int
	// Keywords lists the keyword of every failure, kept or not, once each,
	// in the order of each keyword's first failure.
	Keywords []string
	// Undeclared holds, when Options.Undeclared is set, the instance paths
	// ("$.a.b") of properties that appear in an object to which schemas
	// declaring "properties" apply, but that none of those schemas declares
	// in properties or matches with patternProperties. Sorted.
	Undeclared []string
}

// Failure is one failed check, described so an agent can repair the
// output: where, which keyword, what was expected and what was found.
// Expected and Found never contain strings from the submitted output
// (numbers and counts, which say nothing private, are allowed); Expected
// may quote the schema (enum members, patterns), which the caller wrote.
type Failure struct {
	Keyword      string // "required", "type", "pattern", ... → check name "schema:"+Keyword
	InstancePath string // "$.line_items[0].qty" ("$" for the root)
	Expected     string // e.g. "integer >= 1", "one of USD, EUR"
	Found        string // e.g. "0", "type string", "missing"
	Message      string // "expected <Expected>, found <Found>"
}

// Evaluate checks instance (a decoded JSON value: map[string]any, []any,
// string, json.Number, bool, nil) against the schema and counts the checks.
//
// The verdict and the failures come from the validator. The counts come
// from the counting walk; the two agree on the whole JSON Schema Test Suite,
// and should they ever disagree the validator wins: a failing instance
// always has at least one failed check and a passing one none, so the
// result can never read "pass" with failures or "fail" without.
//
// An evaluation over a budget (Options.MaxSteps, Options.MaxRegexWork) is
// reported, fail closed, as one failed check with keyword "complexity";
// callers that want to refuse such a request instead use EvaluateWithin.
func (s *Schema) Evaluate(instance any, opts Options) Report {
	rep, err := s.EvaluateWithin(instance, opts)
	if err != nil {
		expected := "an evaluation within its budget"
		var tc *TooComplexError
		if errors.As(err, &tc) {
			expected = fmt.Sprintf("an evaluation within %d steps", tc.MaxSteps)
		}
		return Report{Total: 1, FailuresTotal: 1, Keywords: []string{"complexity"}, Failures: []Failure{{
			Keyword: "complexity", InstancePath: "$",
			Expected: expected, Found: "more steps",
			Message: "expected " + expected + ", found more steps",
		}}}
	}
	return rep
}

// EvaluateWithin is Evaluate, except that an evaluation over its step
// budget returns a *TooComplexError (and no report). The counting walk runs
// first: it does at least the validator's work, so once it has finished
// within the budget the validator will too.
func (s *Schema) EvaluateWithin(instance any, opts Options) (Report, error) {
	return s.EvaluateContext(context.Background(), instance, opts)
}

// EvaluateContext is EvaluateWithin that also stops when ctx is done,
// returning ctx.Err(). Every budget is enforced by the counting walk,
// which runs first and checks ctx as it goes. The validator that runs
// after it takes no context and cannot be interrupted: what bounds it is
// the walk's charge for its work (the applications, comparisons and
// failures it will make), so a request whose validation would cost more
// is refused before it starts. A ctx that ran out while it ran still ends
// the evaluation with ctx.Err(), not a report.
func (s *Schema) EvaluateContext(ctx context.Context, instance any, opts Options) (Report, error) {
	limit, maxRegex := opts.MaxSteps, opts.MaxRegexWork
	if limit <= 0 {
		limit = DefaultMaxSteps
	}
	if maxRegex <= 0 {
		maxRegex = DefaultMaxRegexWork
	}
	c, decls, err := s.walk(ctx, instance, opts.Undeclared, limit, maxRegex)
	if err != nil {
		return Report{}, err
	}

	var rep Report
	invalid := s.sch.Validate(instance)
	if err := ctx.Err(); err != nil {
		return Report{}, err
	}
	if invalid != nil {
		var verr *jsonschema.ValidationError
		fs := failureSet{max: opts.MaxFailures, firsts: map[string]string{}}
		if errors.As(invalid, &verr) {
			collect(verr, instance, s, &fs)
		}
		if fs.total == 0 {
			fs.add(describeOther("schema", "$"))
		}
		rep.Failures, rep.FailuresTotal, rep.Keywords = fs.sorted()
		if c.failed == 0 {
			c.failed = 1
			c.total = max(c.total, 1)
		}
	} else {
		c.failed = 0
	}
	rep.Total, rep.Passed = c.total, c.total-c.failed
	if opts.Undeclared {
		rep.Undeclared = undeclaredPaths(decls)
	}
	return rep, nil
}

// walk runs the counting walk; the error says which budget stopped it.
func (s *Schema) walk(ctx context.Context, instance any, undeclared bool, limit int, maxRegex int64) (counts, []decl, error) {
	w := walker{s: s, undeclared: undeclared, limit: limit, maxRegexWork: maxRegex,
		ctx: ctx, scope: make([]scopeEntry, 0, 16)}
	if undeclared {
		w.rendered = []string{""}
	}
	var u uneval
	w.initUneval(&u, instance, s.sch, false)
	c := w.eval(s.sch, instance, &u, 0)
	return c, w.decls, w.stop
}

// count runs the counting walk alone, with no regex budget; ok is false
// when it ran out of steps.
func (s *Schema) count(instance any, undeclared bool, limit int) (counts, []decl, bool) {
	c, decls, err := s.walk(context.Background(), instance, undeclared, limit, 1<<62)
	return c, decls, err == nil
}

// failureLess is the order of Report.Failures: by path (array indexes by
// number), then keyword, expected and found. It is a total order on what a
// report shows of a failure (the message only repeats expected and found),
// so failures it calls equal are the same text, and which are kept and
// their order do not depend on the order the validator met them (Go's map
// order): paths shorten long member names (MaxLocationBytes), so members
// of one object whose names agree in their first bytes fail at the same
// path, and a result is signed.
func failureLess(a, b *Failure) bool {
	switch {
	case a.InstancePath != b.InstancePath:
		return pathLess(a.InstancePath, b.InstancePath)
	case a.Keyword != b.Keyword:
		return a.Keyword < b.Keyword
	case a.Expected != b.Expected:
		return a.Expected < b.Expected
	}
	return a.Found < b.Found
}

// failureSet gathers failures, keeping only the first max of them in
// Report order (all when max is 0): a failure that would sort after every
// kept one while the set is full is only counted, and never described.
// One that ties with the greatest kept one at path and keyword is
// described to be compared, since which of the tied failures are kept
// must not depend on the order the validator meets them (Go's map order
// for dependentSchemas); a description builds no text for that (Expected
// and Found are fixed or written at compile, or short), and the Message,
// which repeats them, is written in sorted for the kept failures alone.
type failureSet struct {
	max    int
	kept   []Failure // a max-heap by failureLess while full
	total  int
	firsts map[string]string // keyword → path of its first failure

	// loc renders the failures' locations; scratch is where a failure's
	// undeclared properties are rendered to be counted.
	loc     locator
	scratch []byte
}

// wants reports whether a failure at path with keyword could be kept.
func (fs *failureSet) wants(path []byte, keyword string) bool {
	if fs.max <= 0 || len(fs.kept) < fs.max {
		return true
	}
	top := &fs.kept[0]
	if top.InstancePath != string(path) {
		return pathLess(path, top.InstancePath)
	}
	return keyword <= top.Keyword
}

// count records a failure that is not kept; the path is copied only when
// it is the keyword's first.
func count[P ~string | ~[]byte](fs *failureSet, path P, keyword string, n int) {
	fs.total += n
	if p, ok := fs.firsts[keyword]; !ok || pathLess(path, p) {
		fs.firsts[keyword] = string(path)
	}
}

func (fs *failureSet) add(f Failure) {
	count(fs, f.InstancePath, f.Keyword, 1)
	if fs.max <= 0 || len(fs.kept) < fs.max {
		fs.kept = append(fs.kept, f)
		if fs.max > 0 && len(fs.kept) == fs.max {
			heap.Init((*failureHeap)(&fs.kept))
		}
		return
	}
	if failureLess(&f, &fs.kept[0]) {
		fs.kept[0] = f
		heap.Fix((*failureHeap)(&fs.kept), 0)
	}
}

// sorted returns the kept failures in order, the total, and the keywords
// in the order of their first failures.
func (fs *failureSet) sorted() ([]Failure, int, []string) {
	sort.SliceStable(fs.kept, func(i, j int) bool { return failureLess(&fs.kept[i], &fs.kept[j]) })
	for i := range fs.kept {
		f := &fs.kept[i]
		f.Message = "expected " + f.Expected + ", found " + f.Found
	}
	kws := make([]string, 0, len(fs.firsts))
	for k := range fs.firsts {
		kws = append(kws, k)
	}
	sort.Slice(kws, func(i, j int) bool {
		a, b := fs.firsts[kws[i]], fs.firsts[kws[j]]
		if a != b {
			return pathLess(a, b)
		}
		return kws[i] < kws[j]
	})
	return fs.kept, fs.total, kws
}

// failureHeap orders kept failures with the greatest on top.
type failureHeap []Failure

func (h failureHeap) Len() int           { return len(h) }
func (h failureHeap) Less(i, j int) bool { return failureLess(&h[j], &h[i]) }
func (h failureHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *failureHeap) Push(any)          { panic("failureHeap has a fixed size") }
func (h *failureHeap) Pop() any          { panic("failureHeap has a fixed size") }

// collect turns the leaves of the validator's error tree into failures.
// Group nodes (allOf, anyOf, $ref, a oneOf no branch of which matched)
// only carry their branches' failures; contains and propertyNames are
// reported themselves, since what failed inside them is a search or a
// property name.
func collect(e *jsonschema.ValidationError, inst any, s *Schema, fs *failureSet) {
	switch k := e.ErrorKind.(type) {
	case *kind.Group, *kind.Schema, *kind.AllOf, *kind.AnyOf, *kind.Reference:
		for _, c := range e.Causes {
			collect(c, inst, s, fs)
		}
		return
	case *kind.OneOf:
		if k.Subschemas == nil {
			for _, c := range e.Causes {
				collect(c, inst, s, fs)
			}
			return
		}
	case *kind.Contains, *kind.MinContains, *kind.PropertyNames:
	default:
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				collect(c, inst, s, fs)
			}
			return
		}
	}
	at := fs.loc.locate(inst, e.InstanceLocation)
	kw := leafKeyword(e)
	if !fs.wants(at, kw) {
		// Every failure of this leaf sorts after the kept ones (those of
		// additionalProperties are at paths below path, which sort after
		// it): count them without describing.
		switch k := e.ErrorKind.(type) {
		case *kind.Required:
			count(fs, at, kw, len(k.Missing))
		case *kind.DependentRequired:
			count(fs, at, kw, len(k.Missing))
		case *kind.Dependency:
			count(fs, at, kw, len(k.Missing))
		case *kind.AdditionalProperties:
			for _, p := range k.Properties {
				fs.scratch = AppendLocationKey(append(fs.scratch[:0], at...), p)
				count(fs, fs.scratch, kw, 1)
			}
		default:
			count(fs, at, kw, 1)
		}
		return
	}
	var buf [4]Failure
	for _, f := range describe(e, s, string(at), buf[:0]) {
		fs.add(f)
	}
}

// leafKeyword names the keyword of a leaf error, the check name of its
// failures.
func leafKeyword(e *jsonschema.ValidationError) string {
	switch e.ErrorKind.(type) {
	case *kind.Type, *kind.InvalidJsonValue:
		return "type"
	case *kind.Enum:
		return "enum"
	case *kind.Const:
		return "const"
	case *kind.Format:
		return "format"
	case *kind.Pattern:
		return "pattern"
	case *kind.MinLength:
		return "minLength"
	case *kind.MaxLength:
		return "maxLength"
	case *kind.Minimum:
		return "minimum"
	case *kind.Maximum:
		return "maximum"
	case *kind.ExclusiveMinimum:
		return "exclusiveMinimum"
	case *kind.ExclusiveMaximum:
		return "exclusiveMaximum"
	case *kind.MultipleOf:
		return "multipleOf"
	case *kind.MinItems:
		return "minItems"
	case *kind.MaxItems:
		return "maxItems"
	case *kind.MinProperties:
		return "minProperties"
	case *kind.MaxProperties:
		return "maxProperties"
	case *kind.Required:
		return "required"
	case *kind.DependentRequired:
		return "dependentRequired"
	case *kind.Dependency:
		return "dependencies"
	case *kind.AdditionalProperties:
		return "additionalProperties"
	case *kind.AdditionalItems:
		return "additionalItems"
	case *kind.UniqueItems:
		return "uniqueItems"
	case *kind.Contains:
		return "contains"
	case *kind.MinContains:
		return "minContains"
	case *kind.MaxContains:
		return "maxContains"
	case *kind.PropertyNames:
		return "propertyNames"
	case *kind.Not:
		return "not"
	case *kind.OneOf:
		return "oneOf"
	case *kind.FalseSchema:
		return falseKeyword(e.SchemaURL)
	case *kind.RefCycle:
		return "$ref"
	}
	if kp := e.ErrorKind.KeywordPath(); len(kp) > 0 {
		return kp[0]
	}
	return "schema"
}

// describe appends the failures of one leaf error of s, without their
// Message (see failureSet).
func describe(e *jsonschema.ValidationError, s *Schema, path string, out []Failure) []Failure {
	keyword := leafKeyword(e)
	noun := "number"
	if s.ints[e.SchemaURL] {
		noun = "integer"
	}
	add := func(p, expected, found string) {
		out = append(out, Failure{Keyword: keyword, InstancePath: p, Expected: expected, Found: found})
	}
	switch k := e.ErrorKind.(type) {
	case *kind.Type:
		add(path, "type "+strings.Join(k.Want, " or "), "type "+k.Got)
	case *kind.Enum:
		add(path, s.quoted(e.SchemaURL).enum, "a value not in the list")
	case *kind.Const:
		add(path, s.quoted(e.SchemaURL).constant, "a different value")
	case *kind.Format:
		add(path, "a string in format "+k.Want, "a string that is not a valid "+k.Want)
	case *kind.Pattern:
		add(path, "a string matching "+clip(k.Want, 120), "a string that does not match")
	case *kind.MinLength:
		add(path, "a string of at least "+plural(k.Want, "character"), plural(k.Got, "character"))
	case *kind.MaxLength:
		add(path, "a string of at most "+plural(k.Want, "character"), plural(k.Got, "character"))
	case *kind.Minimum:
		add(path, noun+" >= "+formatRat(k.Want), formatRat(k.Got))
	case *kind.Maximum:
		add(path, noun+" <= "+formatRat(k.Want), formatRat(k.Got))
	case *kind.ExclusiveMinimum:
		add(path, noun+" > "+formatRat(k.Want), formatRat(k.Got))
	case *kind.ExclusiveMaximum:
		add(path, noun+" < "+formatRat(k.Want), formatRat(k.Got))
	case *kind.MultipleOf:
		add(path, "a multiple of "+formatRat(k.Want), formatRat(k.Got))
	case *kind.MinItems:
		add(path, "an array of at least "+plural(k.Want, "item"), plural(k.Got, "item"))
	case *kind.MaxItems:
		add(path, "an array of at most "+plural(k.Want, "item"), plural(k.Got, "item"))
	case *kind.MinProperties:
		add(path, "an object with at least "+plural(k.Want, "property"), plural(k.Got, "property"))
	case *kind.MaxProperties:
		add(path, "an object with at most "+plural(k.Want, "property"), plural(k.Got, "property"))
	case *kind.Required:
		for _, m := range k.Missing {
			add(path, "property "+clip(m, 80), "missing")
		}
	case *kind.DependentRequired:
		for _, m := range k.Missing {
			add(path, "property "+clip(m, 80)+" (required when "+clip(k.Prop, 80)+" is present)", "missing")
		}
	case *kind.Dependency:
		for _, m := range k.Missing {
			add(path, "property "+clip(m, 80)+" (required when "+clip(k.Prop, 80)+" is present)", "missing")
		}
	case *kind.AdditionalProperties:
		for _, p := range k.Properties {
			add(LocationKey(path, p), "no property here (the schema allows only the properties it declares)", "an undeclared property")
		}
	case *kind.AdditionalItems:
		add(path, "no items beyond those the schema lists", plural(k.Count, "extra item"))
	case *kind.UniqueItems:
		add(path, "unique items", fmt.Sprintf("items %d and %d are equal", k.Duplicates[0], k.Duplicates[1]))
	case *kind.Contains:
		add(path, "an array with an item matching the contains schema", "no matching item")
	case *kind.MinContains:
		add(path, "at least "+plural(k.Want, "item")+" matching the contains schema", plural(len(k.Got), "matching item"))
	case *kind.MaxContains:
		add(path, "at most "+plural(k.Want, "item")+" matching the contains schema", plural(len(k.Got), "matching item"))
	case *kind.PropertyNames:
		add(path, "property names valid against propertyNames", "a property name that is not")
	case *kind.Not:
		add(path, "a value that does not match the not schema", "a value that matches it")
	case *kind.OneOf:
		add(path, "a value matching exactly one oneOf schema", fmt.Sprintf("a value matching schemas %d and %d", k.Subschemas[0], k.Subschemas[1]))
	case *kind.FalseSchema:
		add(path, "no value here (the schema at this location is false)", "a value")
	case *kind.RefCycle:
		add(path, "a schema whose references reach the instance", "a reference cycle")
	case *kind.InvalidJsonValue:
		add(path, "a JSON value", "a value JSON cannot represent")
	default:
		out = append(out, describeOther(keyword, path))
	}
	return out
}

// plural writes a count with its noun: "1 item", "2 items", "0 properties".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	if strings.HasSuffix(noun, "y") {
		return strconv.Itoa(n) + " " + noun[:len(noun)-1] + "ies"
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

func describeOther(keyword, path string) Failure {
	return Failure{Keyword: keyword, InstancePath: path, Expected: "a value valid against the schema",
		Found: "an invalid value"}
}

// falseKeyword names the keyword whose subschema was false.
func falseKeyword(schemaURL string) string {
	ptr := urlPointer(schemaURL)
	last := ptr[strings.LastIndexByte(ptr, '/')+1:]
	switch last {
	case "additionalProperties", "unevaluatedProperties", "items", "additionalItems",
		"unevaluatedItems", "contains", "propertyNames", "then", "else":
		return last
	}
	return "false"
}

// formatRat prints a schema limit briefly: integers exactly, others as the
// shortest float64 form.
func formatRat(r *big.Rat) string {
	if r == nil {
		return "?"
	}
	if r.IsInt() {
		if s := r.Num().String(); len(s) <= 30 {
			return s
		}
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// quoted is what the failures of one schema's const and enum expect.
// A value can be as large as the schema, and its failures as many as the
// step budget allows, each one at the same path with the same keyword
// (an allOf of $refs to one schema, nested), all of which the kept list
// may take; so each text is written once, when the schema compiles (the
// value serialised, then clipped), and a failure only points at it.
type quoted struct {
	constant, enum string
}

func quote(s *jsonschema.Schema) *quoted {
	q := &quoted{}
	if s.Const != nil {
		q.constant = "the value " + shortJSON(*s.Const)
	}
	if s.Enum != nil {
		q.enum = "one of " + listValues(s.Enum.Values)
	}
	return q
}

// quoted returns the texts of the schema at location, or, should the
// validator ever report a schema precompute did not visit, texts that
// quote nothing rather than values written out after the budget.
func (s *Schema) quoted(location string) *quoted {
	if q := s.quotes[location]; q != nil {
		return q
	}
	return &quoted{constant: "the value the schema gives", enum: "one of the values the schema lists"}
}

// listValues prints enum members (from the schema) briefly.
func listValues(vals []any) string {
	const maxShown = 10
	parts := make([]string, 0, min(len(vals), maxShown)+1)
	for i, v := range vals {
		if i == maxShown {
			parts = append(parts, fmt.Sprintf("and %d more", len(vals)-maxShown))
			break
		}
		if s, ok := v.(string); ok {
			parts = append(parts, clip(s, 40))
		} else {
			parts = append(parts, shortJSON(v))
		}
	}
	return strings.Join(parts, ", ")
}

// shortJSON writes a schema value in its RFC 8785 form, clipped. The cache
// shares one compiled schema among every schema of the same schema_hash,
// which covers the canonical form only: written as sent (1.0, 1e2), the
// text of a signed result would depend on which spelling was cached first.
func shortJSON(v any) string {
	b, err := receipt.AppendCanonical(nil, v)
	if err != nil {
		return "a constant"
	}
	return clip(string(b), 60)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && s[cut]&0xC0 == 0x80 { // do not split a UTF-8 sequence
		cut--
	}
	return s[:cut] + "…"
}

// --- paths

type pathElem struct {
	key string
	idx int // >= 0 for an array index
}

func renderPath(path []pathElem) string {
	b := make([]byte, 1, 64)
	b[0] = '$'
	for _, e := range path {
		if e.idx >= 0 {
			b = AppendLocationIndex(b, e.idx)
		} else {
			b = AppendLocationKey(b, e.key)
		}
	}
	return string(b)
}

// pathLess orders paths as a reader expects: array indexes by number
// ("$.a[2]" before "$.a[10]"), everything else bytewise.
func pathLess[A, B ~string | ~[]byte](a A, b B) bool {
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if isDigit(a[i]) && isDigit(b[j]) {
			ea, eb := i, j
			for ea < len(a) && isDigit(a[ea]) {
				ea++
			}
			for eb < len(b) && isDigit(b[eb]) {
				eb++
			}
			for i < ea && a[i] == '0' {
				i++
			}
			for j < eb && b[j] == '0' {
				j++
			}
			if ea-i != eb-j {
				return ea-i < eb-j
			}
			for ; i < ea; i, j = i+1, j+1 {
				if a[i] != b[j] {
					return a[i] < b[j]
				}
			}
			continue
		}
		if a[i] != b[j] {
			return a[i] < b[j]
		}
		i, j = i+1, j+1
	}
	if len(a)-i != len(b)-j {
		return len(a)-i < len(b)-j
	}
	// Equal but for leading zeros ("$.a01", "$.a1"): bytewise, so that
	// only equal paths tie and an order of paths is the same every run.
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// undeclaredPaths lists the properties that none of the schemas declaring
// properties at their object declares.
func undeclaredPaths(decls []decl) []string {
	if len(decls) == 0 {
		return nil
	}
	// The declarations of one object are grouped by the object itself, not
	// by its rendered path: paths shorten long member names
	// (MaxLocationBytes), so two objects can render alike.
	byObj := map[uintptr][]decl{}
	var order []uintptr
	for _, d := range decls {
		id := reflect.ValueOf(d.obj).Pointer()
		if _, ok := byObj[id]; !ok {
			order = append(order, id)
		}
		byObj[id] = append(byObj[id], d)
	}
	var out []string
	for _, id := range order {
		ds := byObj[id]
		p := ds[0].path
	keys:
		for k := range ds[0].obj {
			for _, d := range ds {
				if _, ok := d.sch.Properties[k]; ok {
					continue keys
				}
				for re := range d.sch.PatternProperties {
					if re.MatchString(k) {
						continue keys
					}
				}
			}
			out = append(out, LocationKey(p, k))
		}
	}
	sort.Slice(out, func(i, j int) bool { return pathLess(out[i], out[j]) })
	return out
}
