package verify

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/verify/schema"
)

// Check names (SPEC §4) of the checks this package defines; schema checks
// are "schema:" + the JSON Schema keyword.
const (
	CheckBoundsMin           = "bounds:min"
	CheckBoundsMax           = "bounds:max"
	CheckUndeclaredProperty  = "strict:undeclared_property"
	CheckPlaceholder         = "strict:placeholder"
	checkConsistencyPrefix   = "consistency:"
	schemaCheckPrefix        = "schema:"
	sourceSchema             = "schema"
	sourceIntegrity          = "integrity"
	severityWarning          = "warning"
	severityError            = "error"
	enforceRulesErrorPrefix  = "enforce_rules: "
	missingValueFound        = "missing"
	placeholderExpected      = "real content"
	undeclaredExpected       = "only properties the schema declares"
	undeclaredFound          = "an undeclared property"
	undeclaredMessage        = "the schema does not declare this property"
	placeholderMessage       = "the string is placeholder content"
	emptyStringMessage       = "the string is empty"
	placeholderFound         = "a placeholder string"
	emptyStringFound         = "an empty string"
	missingRuleValueFix      = " (set if_present to skip the rule when it is absent)"
	missingBoundValueMessage = "no value at this path (set if_present to allow its absence)"
)

// Check builds the result of a request Parse accepted; id is the
// verification id (a UUID v4 the caller made) and at the verification
// instant. It cannot fail and does no work that grows with the request:
// Parse already evaluated the schema and ran the integrity checks, within
// the verification's budgets, time limit and concurrency slot, so that
// everything that could make a request unanswerable (422, 503) happened
// before the caller made an id, signed or recorded anything.
//
// How checks are counted (SPEC §4):
//
//   - schema: every assertion keyword evaluated at an instance location is
//     one check (package verify/schema documents the exact rules).
//   - integrity: each limit of each bound is one check (a bound with min
//     and max is two: bounds:min and bounds:max), passing when every value
//     at its path satisfies it; each rule is one check (consistency:<type>),
//     passing when the rule holds; with strict_content_check on, two more:
//     strict:undeclared_property (no undeclared property anywhere) and
//     strict:placeholder (no empty or placeholder string anywhere). There
//     are no other built-in integrity checks: the request parser already
//     refuses what they would catch (non-finite numbers, unsafe integers,
//     numbers more precise than their double, duplicate keys, invalid
//     text), so an accepted output has none.
//   - overall: schema and integrity together.
//
// One failing check can report several findings (one per offending value);
// each finding is one entry of errors (or flags) and one of hints, while
// the counts above stay one per check.
//
// What blocks a pass: failed schema checks and bounds always; strict checks
// (only run when strict_content_check is on); rule violations only when
// enforce_rules is true. A blocking finding goes to errors and
// errors_detail (whose message is the errors entry's text). Every rule
// violation is also a flag, as the original service reports them: severity
// "error" when it blocks and "warning" otherwise, the rule's field exactly
// as the caller wrote it, and the finding without the check name as its
// detail. Every finding gets a hint.
//
// Each call returns a new Result; the lists of results of one Request are
// shared, and must not be appended to.
func (v *Verifier) Check(req *Request, id string, at time.Time) *Result {
	res := new(Result)
	*res = req.result
	res.VerificationID = id
	res.VerifiedAt = FormatTime(at)
	return res
}

// integrity runs the integrity checks of a parsed request whose schema
// Parse has evaluated, and builds its result (all but the id and instant,
// which Check adds). Their work was counted (integrityWork) and is within the
// budget; it stops with ctx's error when ctx is done.
func (v *Verifier) integrity(ctx context.Context, req *Request) error {
	req.result = Result{
		TaskID:             req.TaskID,
		AgentID:            req.AgentID,
		Hashes:             req.Hashes,
		VerifierVersion:    v.cfg.VerifierVersion,
		EnforceRules:       req.EnforceRules,
		StrictContentCheck: req.StrictContentCheck,
		Detail:             req.Detail,
		listCap:            v.cfg.ListCap,
	}
	res := &req.result
	c := checker{res: res, output: req.output, ctx: ctx}

	rep := req.report
	res.Schema = Tally{Passed: rep.Passed, Total: rep.Total}
	for _, kw := range rep.Keywords {
		res.addBlocking(schemaCheckPrefix + kw)
	}
	// The evaluation kept only the first ListCap failures and counted the
	// rest: they go to the totals only.
	if omitted := rep.FailuresTotal - len(rep.Failures); omitted > 0 {
		res.ErrorsTotal += omitted
		res.ErrorsDetailTotal += omitted
		res.HintsTotal += omitted
	}
	for _, f := range rep.Failures {
		if !c.shown(schemaCheckPrefix+f.Keyword, true, false) {
			continue
		}
		msg := f.Message
		if msg == "" {
			msg = "expected " + f.Expected + ", found " + f.Found
		}
		c.report(finding{
			check: schemaCheckPrefix + f.Keyword, path: f.InstancePath,
			expected: f.Expected, found: f.Found, message: msg,
			source: sourceSchema, blocking: true,
		})
	}
	for _, b := range req.bounds {
		c.bound(b)
	}
	for i := range req.rules {
		c.rule(&req.rules[i], req.EnforceRules)
	}
	if c.err != nil {
		return c.err
	}
	if req.StrictContentCheck {
		c.undeclared(rep.Undeclared)
		c.placeholders()
	}

	res.Overall = Tally{Passed: res.Schema.Passed + res.Integrity.Passed, Total: res.Schema.Total + res.Integrity.Total}
	res.Result = ResultPass
	if len(res.BlockingChecks) > 0 {
		res.Result = ResultFail
	}
	return nil
}

// finding is one offending value of one check.
type finding struct {
	check    string
	path     string // "$.a.b[1]" style
	expected string
	found    string
	message  string // the sentence after "<check> at '<path>': "
	source   string
	blocking bool
	enforced bool // a rule violation that blocks because of enforce_rules
	// flagged marks a rule violation: it is also a flag, under field (the
	// rule's field as the caller wrote it).
	flagged bool
	field   string
}

type checker struct {
	res    *Result
	output any
	scrap  []byte

	// ctx is looked at every liveEvery values; once it is done, err holds
	// its error and every walk stops.
	ctx    context.Context
	err    error
	values int
}

const liveEvery = 1 << 10

// live counts one value and reports whether the checks may go on.
func (c *checker) live() bool {
	if c.values++; c.values%liveEvery == 0 && c.err == nil {
		c.err = c.ctx.Err()
	}
	return c.err == nil
}

// shortPath is a display path without its "$." root, as error sentences
// quote it ("line_items[].line_total").
func shortPath(p string) string {
	if rest, ok := strings.CutPrefix(p, "$."); ok {
		return rest
	}
	if len(p) > 1 && p[0] == '$' && p[1] == '[' {
		return p[1:]
	}
	return p
}

func (c *checker) report(f finding) {
	r := c.res
	sentence := f.check + " at '" + shortPath(f.path) + "': " + f.message
	if f.enforced {
		sentence = enforceRulesErrorPrefix + sentence
	}
	if !r.listsClosed {
		// What the finding adds, written as JSON, to every list it could
		// be shown in: its texts, its check name four times, and
		// listEntryBytes of member names and punctuation.
		n := 2*jsonLen(sentence) + 2*jsonLen(f.path) + 2*(jsonLen(f.expected)+jsonLen(f.found)) +
			jsonLen(f.field) + jsonLen(f.message) + 4*jsonLen(f.check) + listEntryBytes
		if r.listBytes += n; r.listBytes > MaxListBytes {
			r.listsClosed = true
		}
	}
	if r.listsClosed {
		r.count(f.check, f.blocking, f.flagged)
		return
	}
	if f.blocking {
		r.addBlocking(f.check)
		r.ErrorsTotal++
		if len(r.Errors) < r.listCap {
			r.Errors = append(r.Errors, sentence)
		}
		r.ErrorsDetailTotal++
		if len(r.ErrorsDetail) < r.listCap {
			r.ErrorsDetail = append(r.ErrorsDetail, ErrorDetail{Check: f.check, Path: f.path, Expected: f.expected, Found: f.found, Message: sentence})
		}
	}
	if f.flagged {
		severity := severityWarning
		if f.blocking {
			severity = severityError
		}
		r.FlagsTotal++
		if len(r.Flags) < r.listCap {
			r.Flags = append(r.Flags, Flag{Check: f.check, Field: f.field, Severity: severity, Detail: f.message})
		}
	}
	r.HintsTotal++
	if len(r.Hints) < r.listCap {
		r.Hints = append(r.Hints, Hint{Source: f.source, Check: f.check, Path: f.path, Expected: f.expected, Found: f.found})
	}
}

// MaxListBytes bounds the text of the four lists of one result together
// (errors, errors_detail, flags, hints), as JSON: once a finding would
// bring them past it, that finding and every later one are counted and
// not shown, as past ListCap. Each finding is bounded (locations by
// schema.MaxLocationBytes, rule paths by MaxPathBytes, schema values
// quoted in descriptions by their clipping), so ListCap alone bounds a
// result; this bound makes it a fixed one whatever ListCap is set to:
// the result certd signs stays far within the 4 MiB it accepts.
const MaxListBytes = 1 << 20

// listEntryBytes is at least the member names and punctuation one finding
// adds to the four lists ({"check":...,"path":...} and the commas).
const listEntryBytes = 192

// jsonLen is at least the length of s written as a JSON string.
func jsonLen(s string) int {
	n := 2
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			n += 2
		case c < 0x20:
			n += 6
		default:
			n++
		}
	}
	return n
}

// shown reports whether a finding of check would appear in any list. When
// every list it would go to is full, it only counts the finding and
// returns false, so the caller skips building strings nobody will see: an
// output with a hundred thousand bad values costs counting, not text.
func (c *checker) shown(check string, blocking, flagged bool) bool {
	r := c.res
	if !r.listsClosed && (len(r.Hints) < r.listCap ||
		blocking && (len(r.Errors) < r.listCap || len(r.ErrorsDetail) < r.listCap) ||
		flagged && len(r.Flags) < r.listCap) {
		return true
	}
	r.count(check, blocking, flagged)
	return false
}

// integrity counts one integrity check.
func (c *checker) integrity(passed bool) {
	c.res.Integrity.Total++
	if passed {
		c.res.Integrity.Passed++
	}
}

// describe says what a value is without echoing submitted text: numbers
// are shown (they are what ranges and sums are about), strings, objects
// and arrays only by type.
func describe(v any) string {
	switch x := v.(type) {
	case json.Number:
		return FormatNumber(number(x))
	case bool:
		if x {
			return "true"
		}
		return "false"
	case nil:
		return "null"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "a value"
}

func (c *checker) bound(b bound) {
	if c.err != nil {
		return
	}
	type limit struct {
		check string
		val   *float64
		below bool // a value below the limit fails (min)
	}
	for _, l := range []limit{{CheckBoundsMin, b.min, true}, {CheckBoundsMax, b.max, false}} {
		if l.val == nil {
			continue
		}
		lim := *l.val
		passed, seen := true, false
		b.path.walk(c.output, func(v any, idx []int) bool {
			if !c.live() {
				return false
			}
			seen = true
			n, ok := v.(json.Number)
			if !ok {
				passed = false
				if !c.shown(l.check, true, false) {
					return true
				}
				c.report(finding{check: l.check, path: b.path.locate(idx), source: sourceIntegrity, blocking: true,
					expected: boundExpected(l.below, lim), found: "type " + jsonType(v),
					message: "the value is " + typeName(v) + ", not a number"})
				return true
			}
			f := number(n)
			if (l.below && f < lim) || (!l.below && f > lim) {
				passed = false
				if !c.shown(l.check, true, false) {
					return true
				}
				word := "below the minimum"
				if !l.below {
					word = "above the maximum"
				}
				c.report(finding{check: l.check, path: b.path.locate(idx), source: sourceIntegrity, blocking: true,
					expected: boundExpected(l.below, lim), found: FormatNumber(f),
					message: "value " + FormatNumber(f) + " is " + word + " " + FormatNumber(lim)})
			}
			return true
		})
		if !seen && !b.ifPresent {
			passed = false
			c.report(finding{check: l.check, path: b.path.Display(), source: sourceIntegrity, blocking: true,
				expected: boundExpected(l.below, lim), found: missingValueFound, message: missingBoundValueMessage})
		}
		c.integrity(passed)
	}
}

func boundExpected(below bool, lim float64) string {
	if below {
		return "a number >= " + FormatNumber(lim)
	}
	return "a number <= " + FormatNumber(lim)
}

// jsonType names a value's JSON type ("string", "object", ...).
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case json.Number:
		return "number"
	case string:
		return "string"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return "unknown"
}

// ruleFinding builds a finding of rule r.
func ruleFinding(r *rule, enforce bool, path, expected, found, message string) finding {
	return finding{check: r.check, path: path, expected: expected, found: found, message: message,
		source: sourceIntegrity, blocking: enforce, enforced: enforce, flagged: true, field: r.fieldText}
}

// operand resolves a single-value operand path of r. ok is false when the
// rule cannot be evaluated (reported, or skipped under if_present); skip
// is true when it is skipped (passes).
func (c *checker) operand(r *rule, enforce bool, p *Path, expect string) (val float64, ok, skip bool) {
	var got any
	found := false
	p.walk(c.output, func(v any, _ []int) bool {
		got, found = v, true
		return false
	})
	if !found {
		if r.ifPresent {
			return 0, false, true
		}
		c.report(ruleFinding(r, enforce, p.Display(), expect, missingValueFound,
			"no value at '"+p.String()+"' to compare with"+missingRuleValueFix))
		return 0, false, false
	}
	n, isNum := got.(json.Number)
	if !isNum {
		c.report(ruleFinding(r, enforce, p.Display(), expect, "type "+jsonType(got),
			"the value at '"+p.String()+"' is "+typeName(got)+", not a number"))
		return 0, false, false
	}
	return number(n), true, false
}

func (c *checker) rule(r *rule, enforce bool) {
	if c.err != nil {
		return
	}
	passed := true
	switch r.typ {
	case RuleSumEquals:
		passed = c.sumEquals(r, enforce)
	case RuleGTE, RuleLTE:
		passed = c.compare(r, enforce)
	case RuleExistsIn:
		passed = c.existsIn(r, enforce)
	case RuleUnique:
		passed = c.unique(r, enforce)
	}
	c.integrity(passed)
}

// missingField reports that a rule's field resolves to nothing; it reports
// whether the rule passes anyway (if_present).
func (c *checker) missingField(r *rule, enforce bool, expected string) bool {
	if r.ifPresent {
		return true
	}
	c.report(ruleFinding(r, enforce, r.field.Display(), expected, missingValueFound,
		"no value at this path"+missingRuleValueFix))
	return false
}

// sumAt adds the numbers at r.field to sum, exactly (exact.go); every
// non-number is reported. seen says whether the path resolved to anything
// at all.
func (c *checker) sumAt(r *rule, enforce bool, expected string, sum *exactSum) (ok, seen bool) {
	ok = true
	r.field.walk(c.output, func(v any, idx []int) bool {
		if !c.live() {
			return false
		}
		seen = true
		n, isNum := v.(json.Number)
		if !isNum {
			ok = false
			if c.shown(r.check, enforce, true) {
				c.report(ruleFinding(r, enforce, r.field.locate(idx), expected, "type "+jsonType(v),
					"the value is "+typeName(v)+", not a number"))
			}
			return true
		}
		sum.addJSON(n)
		return true
	})
	return ok, seen
}

func (c *checker) sumEquals(r *rule, enforce bool) bool {
	var want float64
	var wantText string // "total (135.0)" or "135.0"
	if r.equals != nil {
		want = *r.equals
		wantText = FormatNumber(want)
	}
	expected := func() string { return "a sum equal to " + wantText }
	if r.equalsField != nil {
		wantText = r.equalsField.String()
		w, ok, skip := c.operand(r, enforce, r.equalsField, "a number to compare the sum with")
		if !ok {
			return skip
		}
		want = w
		wantText = r.equalsField.String() + " (" + FormatNumber(want) + ")"
	}
	var diff exactSum // the sum minus want
	diff.add(-want)
	ok, seen := c.sumAt(r, enforce, "numbers", &diff)
	if !seen {
		return c.missingField(r, enforce, expected())
	}
	if !ok {
		return false
	}
	if diff.within(r.tolerance) {
		return true
	}
	diff.add(want)
	total := diff.float()
	c.report(ruleFinding(r, enforce, r.field.Display(), expected(), "sum "+FormatNumber(total),
		"values sum to "+FormatNumber(total)+", expected "+wantText))
	return false
}

func (c *checker) compare(r *rule, enforce bool) bool {
	op, word := ">=", "less than"
	if r.typ == RuleLTE {
		op, word = "<=", "greater than"
	}
	var lim float64
	var limText string
	if r.value != nil {
		lim = *r.value
		limText = FormatNumber(lim)
	} else if r.otherPath != nil {
		l, ok, skip := c.operand(r, enforce, r.otherPath, "a number to compare with")
		if !ok {
			return skip
		}
		lim = l
		limText = r.otherPath.String() + " (" + FormatNumber(lim) + ")"
	}
	expected := op + " " + limText
	// gte fails below lim - tolerance, lte above lim + tolerance, exactly
	// (exact.go). Doubles order like the decimals they mean, so a value
	// on the right side of lim passes, and with no tolerance one on the
	// wrong side fails, without the exact arithmetic.
	var edge exactSum
	edge.add(lim)
	if r.typ == RuleGTE {
		edge.add(-r.tolerance)
	} else {
		edge.add(r.tolerance)
	}
	outside := func(f float64, n json.Number) bool {
		switch {
		case r.typ == RuleGTE && f >= lim, r.typ == RuleLTE && f <= lim:
			return false
		case r.tolerance == 0:
			return true
		}
		m, e := exactJSON(n)
		if r.typ == RuleGTE {
			return edge.cmp(m, e) > 0
		}
		return edge.cmp(m, e) < 0
	}
	passed, seen := true, false
	r.field.walk(c.output, func(v any, idx []int) bool {
		if !c.live() {
			return false
		}
		seen = true
		n, isNum := v.(json.Number)
		if !isNum {
			passed = false
			if !c.shown(r.check, enforce, true) {
				return true
			}
			c.report(ruleFinding(r, enforce, r.field.locate(idx), "a number "+expected, "type "+jsonType(v),
				"the value is "+typeName(v)+", not a number"))
			return true
		}
		if f := number(n); outside(f, n) {
			passed = false
			if !c.shown(r.check, enforce, true) {
				return true
			}
			c.report(ruleFinding(r, enforce, r.field.locate(idx), expected, FormatNumber(f),
				"value "+FormatNumber(f)+" is "+word+" "+limText))
		}
		return true
	})
	if !seen {
		return c.missingField(r, enforce, expected)
	}
	return passed
}

// canonicalKey is the equality key of a JSON value: its RFC 8785 form, so
// 1 and 1.0 are equal and object key order does not matter.
// The bytes are scratch space, valid until the next call: map lookups with
// string(key) do not allocate, inserts copy.
func (c *checker) canonicalKey(v any) []byte {
	var err error
	c.scrap, err = receipt.AppendCanonical(c.scrap[:0], v)
	if err != nil { // cannot happen for decoded trees
		c.scrap = append(c.scrap[:0], 0)
		c.scrap = append(c.scrap, jsonType(v)...)
	}
	return c.scrap
}

func (c *checker) existsIn(r *rule, enforce bool) bool {
	allowed := map[string]bool{}
	expected := "one of the allowed values"
	if r.inField != nil {
		expected = "one of the values at " + r.inField.String()
		seen := false
		r.inField.walk(c.output, func(v any, _ []int) bool {
			if !c.live() {
				return false
			}
			seen = true
			allowed[string(c.canonicalKey(v))] = true
			return true
		})
		if !seen {
			if r.ifPresent {
				return true
			}
			c.report(ruleFinding(r, enforce, r.inField.Display(), "values to look the field's values up in", missingValueFound,
				"no value at '"+r.inField.String()+"' to look values up in"+missingRuleValueFix))
			return false
		}
	} else {
		for _, v := range r.values {
			allowed[string(c.canonicalKey(v))] = true
		}
	}
	passed, seen := true, false
	r.field.walk(c.output, func(v any, idx []int) bool {
		if !c.live() {
			return false
		}
		seen = true
		if !allowed[string(c.canonicalKey(v))] {
			passed = false
			if !c.shown(r.check, enforce, true) {
				return true
			}
			where := "the allowed values"
			if r.inField != nil {
				where = "the values at '" + r.inField.String() + "'"
			}
			c.report(ruleFinding(r, enforce, r.field.locate(idx), expected, describe(v),
				"the value is not among "+where))
		}
		return true
	})
	if !seen {
		return c.missingField(r, enforce, expected)
	}
	return passed
}

func (c *checker) unique(r *rule, enforce bool) bool {
	const expected = "values distinct from each other"
	stride := 0
	for _, s := range r.field.steps {
		if s.each {
			stride++
		}
	}
	// Each distinct value maps to where its first occurrence's "[]"
	// indexes start in firsts.
	first := map[string]int{}
	var firsts []int
	passed, seen := true, false
	r.field.walk(c.output, func(v any, idx []int) bool {
		if !c.live() {
			return false
		}
		seen = true
		k := c.canonicalKey(v)
		at, dup := first[string(k)]
		if !dup {
			first[string(k)] = len(firsts)
			firsts = append(firsts, idx...)
			return true
		}
		passed = false
		if c.shown(r.check, enforce, true) {
			firstAt := r.field.locate(firsts[at : at+stride])
			c.report(ruleFinding(r, enforce, r.field.locate(idx), expected, "a duplicate of "+firstAt,
				"the value duplicates the value at '"+shortPath(firstAt)+"'"))
		}
		return true
	})
	if !seen {
		return c.missingField(r, enforce, expected)
	}
	return passed
}

func (c *checker) undeclared(paths []string) {
	for _, p := range paths {
		if !c.shown(CheckUndeclaredProperty, true, false) {
			continue
		}
		c.report(finding{check: CheckUndeclaredProperty, path: p, source: sourceIntegrity, blocking: true,
			expected: undeclaredExpected, found: undeclaredFound, message: undeclaredMessage})
	}
	c.integrity(len(paths) == 0)
}

// placeholderTokens are the strings strict mode treats as placeholder
// content when they are the whole (trimmed) string, ignoring case. A
// string starting with "lorem ipsum" is one too.
var placeholderTokens = []string{"todo", "tbd", "n/a", "...", "…", "lorem ipsum"}

// isPlaceholder reports whether s is empty or placeholder content, and
// which.
func isPlaceholder(s string) (bad, empty bool) {
	t := strings.TrimSpace(s)
	if t == "" {
		return true, true
	}
	if len(t) > 11 {
		return strings.EqualFold(t[:11], "lorem ipsum"), false
	}
	for _, tok := range placeholderTokens {
		if len(t) == len(tok) && strings.EqualFold(t, tok) {
			return true, false
		}
	}
	return false, false
}

// placeholders runs strict:placeholder over every string value of the
// output (object keys are not content). A first pass only looks; when it
// finds something, a second pass walks objects in sorted key order so the
// findings come out in the same order every time.
func (c *checker) placeholders() {
	if !hasPlaceholder(c.output) {
		c.integrity(true)
		return
	}
	var loc []locStep
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			if bad, empty := isPlaceholder(x); bad && c.shown(CheckPlaceholder, true, false) {
				f := finding{check: CheckPlaceholder, path: renderLoc(loc), source: sourceIntegrity, blocking: true,
					expected: placeholderExpected, found: placeholderFound, message: placeholderMessage}
				if empty {
					f.found, f.message = emptyStringFound, emptyStringMessage
				}
				c.report(f)
			}
		case []any:
			for i, e := range x {
				loc = append(loc, locStep{idx: i})
				walk(e)
				loc = loc[:len(loc)-1]
			}
		case map[string]any:
			keys := make([]string, 0, len(x))
			for k := range x {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				loc = append(loc, locStep{key: k, idx: -1})
				walk(x[k])
				loc = loc[:len(loc)-1]
			}
		}
	}
	walk(c.output)
	c.integrity(false)
}

// hasPlaceholder reports whether any string value in v is a placeholder.
func hasPlaceholder(v any) bool {
	switch x := v.(type) {
	case string:
		bad, _ := isPlaceholder(x)
		return bad
	case []any:
		for _, e := range x {
			if hasPlaceholder(e) {
				return true
			}
		}
	case map[string]any:
		for _, e := range x {
			if hasPlaceholder(e) {
				return true
			}
		}
	}
	return false
}

// locStep is one step of a concrete location: a key, or an index (idx >= 0).
type locStep struct {
	key string
	idx int
}

func renderLoc(loc []locStep) string {
	b := make([]byte, 1, 64)
	b[0] = '$'
	for _, s := range loc {
		if s.idx >= 0 {
			b = schema.AppendLocationIndex(b, s.idx)
			continue
		}
		b = schema.AppendLocationKey(b, s.key)
	}
	return string(b)
}
