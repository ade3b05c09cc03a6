package schema

import (
	"context"
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// counts is the tally of one evaluation: checks evaluated and how many of
// them failed. An evaluation is valid exactly when failed is zero.
type counts struct{ total, failed int }

func (c *counts) add(o counts) { c.total += o.total; c.failed += o.failed }

var oneFailed = counts{1, 1}

// walker evaluates a compiled schema against an instance the way the
// validator does, counting checks by the rules of the package doc. One
// walker serves one Evaluate call.
//
// It mirrors jsonschema/v6's validator (validator.go) step for step: the
// same order of keywords, the same dynamic scope for $dynamicRef and
// $recursiveRef, the same tracking of evaluated properties and items for
// unevaluated*. Where the validator stops early for a yes/no answer, the
// walker keeps going, because a count needs every keyword.
type walker struct {
	s *Schema

	// scope is the dynamic scope: every schema being evaluated, outermost
	// first, with the depth of the instance it is evaluated at. base is
	// where the current scope starts (propertyNames starts a fresh one).
	scope []scopeEntry
	base  int

	// steps counts schema evaluations (and the work of uniqueItems, const
	// and enum, see compare), cheap the comparisons charged one step per
	// 16, and regexWork the work of regular expressions (regexCost); past
	// limit or maxRegexWork, or once ctx is done, the walk stops and stop
	// says why.
	steps, limit, cheap     int
	regexWork, maxRegexWork int64
	ctx                     context.Context
	stop                    error

	// Undeclared-property tracking, only when asked for. rendered holds,
	// for each depth of path, that location rendered ("$.a.b"), or "" until
	// a declaration there needs it: every declaration at one location
	// shares one string (declPath).
	undeclared bool
	path       []pathElem
	rendered   []string
	decls      []decl
}

// scopeEntry is one schema of the dynamic scope. loc is the length of the
// keyword location the validator renders for the scope ending there
// (kwLoc), at most: see locBytes.
type scopeEntry struct {
	sch *jsonschema.Schema
	vid int
	loc int
}

// decl records that schema s, which declares properties, was applied to
// the object at path.
type decl struct {
	path string
	obj  map[string]any
	sch  *jsonschema.Schema
}

// uneval tracks the properties and items of one instance that no
// subschema has evaluated yet (only when an unevaluated* keyword needs it).
type uneval struct {
	props map[string]struct{}
	items map[int]struct{}
}

func (u *uneval) empty() bool { return len(u.props) == 0 && len(u.items) == 0 }

// merge keeps only what other left unevaluated too.
func (u *uneval) merge(other *uneval) {
	for k := range u.props {
		if _, ok := other.props[k]; !ok {
			delete(u.props, k)
		}
	}
	for i := range u.items {
		if _, ok := other.items[i]; !ok {
			delete(u.items, i)
		}
	}
}

// size is the number of members and items u holds.
func (u *uneval) size() int { return len(u.props) + len(u.items) }

// initUneval fills u with the members or items of v that s leaves
// unevaluated, when s or its caller needs them, and charges the copy;
// false once the walk has stopped. The validator makes the same copy
// (unevalFrom) at the same applications, and every application under a
// caller whose set is not empty copies it, then intersects its caller's
// set with what it left (merge, charged by self), so one application of
// a schema that says nothing about members costs the whole set twice in
// the walk and twice in the validator: 7,000 members under 2,730
// applications took 11.5 s and 2.2 GB when an application cost one step.
// Each copy costs a step per unevalMembersPerStep members and items.
func (w *walker) initUneval(u *uneval, v any, s *jsonschema.Schema, callerNeeds bool) bool {
	initUneval(u, v, s, callerNeeds)
	return w.spend(u.size() / unevalMembersPerStep)
}

// unevalMembersPerStep is the number of members or items copied into a
// set, or looked up in one, that costs a step: with the allocation and
// garbage collection of the maps, the walk and the validator together
// spend 0.1 to 0.3 µs on a member each time (measured: a step of it
// costs 0.5 to 1.1 µs, where a step stands for 1.6 µs), and the copies
// allocate about 200 bytes a step.
const unevalMembersPerStep = 4

func initUneval(u *uneval, v any, s *jsonschema.Schema, callerNeeds bool) {
	switch v := v.(type) {
	case map[string]any:
		if s.AdditionalProperties == nil && (callerNeeds || s.UnevaluatedProperties != nil) {
			u.props = make(map[string]struct{}, len(v))
			for k := range v {
				u.props[k] = struct{}{}
			}
		}
	case []any:
		all, n := itemsEvaluated(s)
		if !all && (callerNeeds || s.UnevaluatedItems != nil) && n < len(v) {
			u.items = make(map[int]struct{}, len(v)-n)
			for i := n; i < len(v); i++ {
				u.items[i] = struct{}{}
			}
		}
	}
}

// itemsEvaluated reports whether s evaluates every item of an array, or
// else how many leading items it evaluates.
func itemsEvaluated(s *jsonschema.Schema) (bool, int) {
	if s.DraftVersion < 2020 {
		if s.AdditionalItems != nil {
			return true, 0
		}
		switch items := s.Items.(type) {
		case *jsonschema.Schema:
			return true, 0
		case []*jsonschema.Schema:
			return false, len(items)
		}
		return false, 0
	}
	return s.Items2020 != nil, len(s.PrefixItems)
}

// self evaluates s at the same instance (allOf, $ref, then, ...). A valid
// evaluation passes on what it evaluated to the caller's tracking.
func (w *walker) self(s *jsonschema.Schema, v any, parent *uneval, vid int) counts {
	var u uneval
	if !w.initUneval(&u, v, s, !parent.empty()) || !w.spend(parent.size()/unevalMembersPerStep) {
		return counts{}
	}
	c := w.eval(s, v, &u, vid)
	if c.failed == 0 {
		parent.merge(&u)
	}
	return c
}

// child evaluates s at a member of the instance.
func (w *walker) child(s *jsonschema.Schema, v any, vid int, key string, idx int) counts {
	var u uneval
	if !w.initUneval(&u, v, s, false) {
		return counts{}
	}
	if w.undeclared {
		w.path = append(w.path, pathElem{key: key, idx: idx})
		w.rendered = append(w.rendered, "")
	}
	c := w.eval(s, v, &u, vid+1)
	if w.undeclared {
		w.path = w.path[:len(w.path)-1]
		w.rendered = w.rendered[:len(w.rendered)-1]
	}
	return c
}

func (w *walker) eval(s *jsonschema.Schema, v any, u *uneval, vid int) counts {
	if !w.spend(1) {
		return counts{}
	}
	if s.Bool != nil {
		if *s.Bool {
			return counts{}
		}
		return w.failure(oneFailed, vid)
	}
	i := len(w.scope) - 1
	for ; i >= w.base && w.scope[i].vid == vid; i-- {
		if w.scope[i].sch == s { // a reference cycle that never reaches an instance
			if !w.spend(w.cycleCost(s)) {
				return counts{}
			}
			return w.failure(oneFailed, vid)
		}
	}
	if !w.spend((len(w.scope) - 1 - i) / cycleEntriesPerStep) {
		return counts{}
	}
	w.scope = append(w.scope, scopeEntry{s, vid, w.locBytes(s)})
	c := w.evalObject(s, v, u, vid)
	w.scope = w.scope[:len(w.scope)-1]
	if c.failed > 0 {
		return w.failure(c, vid)
	}
	return c
}

// cycleEntriesPerStep is the number of schemas applied at one location
// that the search for a reference cycle may pass for a step. The validator
// makes the same search (checkCycle) through its scope's linked list at
// every application, so a chain of k $refs costs k²/2 comparisons per
// instance against k steps: 1,200 over 833 items (39 KB) took 2.9 s
// within the budget, and 4,900 over 204 kept the validator running past
// the Timeout. Both searches together cost about 5 ns a schema passed.
const cycleEntriesPerStep = 128

// locBytes is the length of the keyword location the validator renders
// for the dynamic scope once s joins it, at most: the location of the
// scope's top plus s's own part, which is the part of s's schema location
// past its parent's, or "/$ref", "/$dynamicRef" or "/$recursiveRef" when
// a reference led to s (counted as the longer of the two, since the walk
// does not track which). The root of a scope has none.
func (w *walker) locBytes(s *jsonschema.Schema) int {
	if len(w.scope) == w.base {
		return 0
	}
	top := w.scope[len(w.scope)-1]
	return top.loc + max(len(s.Location)-len(top.sch.Location), len("/$recursiveRef"))
}

// cycleCost is the charge for a reference cycle closed by s. The
// validator's error for it renders two keyword locations (kind.RefCycle),
// each by walking the dynamic scope to its root and prepending every
// schema's part to what it has so far with fmt.Sprintf: a call and a copy
// of the location so far per schema, so time and garbage grow with the
// square of the scope's length, and the error then keeps both. A cycle
// under a deep scope (a chain of 120 $refs at each of 60 nested arrays, a
// 4 KB request) allocated 24 GB and ran for minutes when it cost what any
// failure does. So a cycle costs, for each of the two locations, a step
// per kwLocCallsPerStep schemas in the scope, one per kwLocBytesPerStep
// bytes copied (at most the scope's length times the location's) and one
// per failureBytesPerStep bytes kept. Measured, a step of it is 0.4 to
// 0.6 µs of CPU, less than the 1.6 µs a step stands for: the bytes are
// charged as copying a string is (stringCopyBytes), so that the garbage
// of a verification stays about a KB a step.
func (w *walker) cycleCost(s *jsonschema.Schema) int {
	n, loc := len(w.scope)-w.base+1, w.locBytes(s)
	return 2 * (n/kwLocCallsPerStep + n*loc/kwLocBytesPerStep + loc/failureBytesPerStep)
}

const (
	kwLocCallsPerStep   = 8
	kwLocBytesPerStep   = 1024
	failureBytesPerStep = 64
)

// failure charges a failing schema application at instance depth vid for
// the errors the validator will keep for it, and returns c (or nothing
// once the walk has stopped). The validator keeps every error of an
// evaluation in one tree until it returns: each holds about 100 bytes
// and its own copy of the instance location, 16 bytes a token, and a
// failing application makes about two (its own and the one its caller
// wraps it in). So a failure costs failureSteps plus one step per
// failureDepthPerStep levels of depth, a step standing for about 64 bytes
// kept: at the step budget the tree holds about 64 MB, where one 1 MiB
// output of 520,000 items failing 60 levels deep held 850 MB and ran for
// seconds. Failures inside not and if cost the same: the validator asks
// those for a yes or no, but still makes an error for every failure in
// them and keeps them all until not or if returns (500,000 items failing
// under not, 976 KB, allocated 408 MB and held 150 MB when they were free).
func (w *walker) failure(c counts, vid int) counts {
	if w.spend(failureSteps + vid/failureDepthPerStep) {
		return c
	}
	return counts{}
}

const (
	failureSteps        = 3
	failureDepthPerStep = 2
)

func (w *walker) evalObject(s *jsonschema.Schema, v any, u *uneval, vid int) (c counts) {
	t := typeOf(v)
	if t == 0 {
		return oneFailed
	}
	if s.Types != nil && !s.Types.IsEmpty() {
		c.total++
		want := typeMask(*s.Types)
		if want&t == 0 && !(want&tInteger != 0 && t == tNumber && isInteger(v)) {
			c.failed++
			return c
		}
	}
	if s.Const != nil {
		c.total++
		eq, ok := w.compare(v, *s.Const)
		if !ok {
			return counts{}
		}
		if !eq {
			c.failed++
			return c
		}
	}
	if s.Enum != nil {
		c.total++
		found := false
		for _, item := range s.Enum.Values {
			eq, ok := w.compare(v, item)
			if !ok {
				return counts{}
			}
			if eq {
				found = true
				break
			}
		}
		if !found {
			c.failed++
			return c
		}
	}
	if s.Format != nil {
		if str, ok := v.(string); ok && !w.checkFormat(s.Format, str) {
			return counts{}
		}
		err := s.Format.Validate(v)
		if t == tString || err != nil {
			c.total++
		}
		if err != nil {
			c.failed++
			return c
		}
	}
	if s.Ref != nil {
		c.add(w.self(s.Ref, v, u, vid))
		if s.DraftVersion < 2019 {
			return c
		}
	}

	switch v := v.(type) {
	case map[string]any:
		w.object(s, v, u, vid, &c)
	case []any:
		w.array(s, v, u, vid, &c)
	case string:
		if !w.spend(len(v) / stringCopyBytes) {
			return counts{}
		}
		if s.MinLength != nil || s.MaxLength != nil {
			n := utf8.RuneCountInString(v)
			if s.MinLength != nil {
				c.total++
				if n < *s.MinLength {
					c.failed++
				}
			}
			if s.MaxLength != nil {
				c.total++
				if n > *s.MaxLength {
					c.failed++
				}
			}
		}
		if s.Pattern != nil {
			c.total++
			if !w.match(s.Pattern, v) {
				c.failed++
			}
		}
	default:
		if t == tNumber {
			w.number(s, v, &c)
		}
	}

	if s.DraftVersion >= 2019 {
		if r := s.RecursiveRef; r != nil {
			if r.RecursiveAnchor {
				if !w.searchScope() {
					return counts{}
				}
				r = w.resolveRecursive(r)
			}
			c.add(w.self(r, v, u, vid))
		}
		if d := s.DynamicRef; d != nil {
			r := d.Ref
			if d.Anchor != "" && r.DynamicAnchor == d.Anchor {
				if !w.searchScope() {
					return counts{}
				}
				r = w.resolveDynamic(d.Anchor, r)
			}
			c.add(w.self(r, v, u, vid))
		}
	}
	w.conditional(s, v, u, vid, &c)
	if s.DraftVersion >= 2019 {
		w.unevaluated(s, v, u, vid, &c)
	}
	return c
}

// stringCopyBytes is the length of string that costs one more step each
// time a schema is applied to it. The validator copies the string at
// every application (jsonschema/v6 strValidate does []byte(str) for
// contentEncoding, whether or not the schema has one): with the garbage
// collection it brings, about 0.8 ns a byte, so a step's work per 2 KB.
// Charging per KB keeps a long string under many applications (nested
// allOf) within the budget's CPU; honest strings are a few steps at most.
const stringCopyBytes = 1024

// checkFormat charges the format check of str before it runs, in the walk
// and then in the validator; false once the walk has stopped. format
// "regex" parses str as a pattern and is charged as regular-expression
// work (regexFormatCost); every other format by str's length.
func (w *walker) checkFormat(f *jsonschema.Format, str string) bool {
	if f.Name == "regex" {
		return w.charge(regexFormatCost(str, w.s.maxPattern))
	}
	return w.spend(len(str) / formatBytesPerStep)
}

// formatBytesPerStep is the length of string that costs one more step
// each time a format is checked on it. The library's checks read the
// whole string, and most do more: json-pointer, relative-json-pointer,
// uuid, ipv4, duration and semver split it (a 16-byte slice entry per
// separator, so a string of "/" allocates 16 times its length), the uri
// and iri ones parse it whole. The check runs twice, in the walk and in
// the validator; together, with the garbage collection they bring, they
// cost up to 120 to 220 ns a byte (json-pointer on "/", the worst;
// uri-template about 50, iri-reference 25), where a step stands for
// about 1.6 µs (stringCopyBytes). A 60 KB string under 16,384
// json-pointer schemas (a 61 KB request) ran into the Timeout with
// 5.5 GB allocated when a check cost only the copy; a date costs a step
// more, a 50-byte e-mail address or URI six.
const formatBytesPerStep = 8

// charge adds regular-expression work; false once the budget is spent or
// the context is done (the walk then stops).
func (w *walker) charge(cost int64) bool {
	if w.stop != nil {
		return false
	}
	w.regexWork += cost
	if w.regexWork > w.maxRegexWork {
		w.stop = &RegexBudgetError{MaxWork: w.maxRegexWork}
		return false
	}
	if cost > 1<<16 && w.ctx.Err() != nil {
		w.stop = w.ctx.Err()
		return false
	}
	return true
}

// compare reports whether v equals want, a const or an enum member, once
// the step budget has paid for the check; ok is false once the walk has
// stopped (the answer is then meaningless). The validator makes the same
// checks after the walk, comparing numbers as big.Rat, and nothing
// interrupts it, so a large const applied many times, or a long enum of
// numbers over many values, would otherwise cost it seconds the budget
// never saw. A check is charged:
//
//   - compareCost when it goes past the top level (two objects with as
//     many members, two arrays of one length, two long strings of one
//     length): the size of the smaller value;
//   - for two numbers, the size of the larger (valueSize: the validator
//     parses both into big.Rat, a step's work for ordinary numbers and
//     one per digitsPerValue digits of a long one);
//   - else, a comparison of two short strings, or of values that differ
//     at the top, one step per 16 of them.
func (w *walker) compare(v, want any) (eq, ok bool) {
	if w.stop != nil {
		return false, false
	}
	cost := compareCost(v, want, 0, 0)
	if cost == 1 && (typeOf(v) != tNumber || typeOf(want) != tNumber) {
		w.cheap++
		cost = 0
		if w.cheap%16 == 0 {
			cost = 1
		}
	}
	if !w.spend(cost) {
		return false, false
	}
	return equal(v, want), true
}

// match runs re on s if the budget allows it. Past the budget it reports
// false, which is never a verdict: the walk has stopped and the evaluation
// returns an error.
func (w *walker) match(re jsonschema.Regexp, s string) bool {
	return w.charge(regexCost(re, s)) && re.MatchString(s)
}

func (w *walker) object(s *jsonschema.Schema, obj map[string]any, u *uneval, vid int, c *counts) {
	// The validator ranges over every member at every application to an
	// object, looking each up in the schema's properties and
	// patternProperties whether the schema has them or not, and this walk
	// does the same when it has: a step per namesPerStep members. 2,000
	// members under 32,768 applications of a properties schema (a 21 KB
	// request) cost 10 s of CPU at one step an application; 8,000 under
	// 10,922 applications of {"type": "object"} cost the validator 4 s
	// while only schemas with properties were charged.
	if !w.spend(len(obj) / namesPerStep) {
		return
	}
	if s.MinProperties != nil {
		c.total++
		if len(obj) < *s.MinProperties {
			c.failed++
		}
	}
	if s.MaxProperties != nil {
		c.total++
		if len(obj) > *s.MaxProperties {
			c.failed++
		}
	}
	if len(s.Required) > 0 {
		c.total++
		failed, ok := w.missing(obj, s.Required)
		if !ok {
			return
		}
		if failed {
			c.failed++
		}
	}
	if len(s.Dependencies) > 0 {
		if !w.scanEntries(len(s.Dependencies)) {
			return
		}
		arrays, failed := false, false
		for name, dep := range s.Dependencies {
			switch dep := dep.(type) {
			case []string:
				arrays = true
				if _, ok := obj[name]; ok {
					m, ok := w.missing(obj, dep)
					if !ok {
						return
					}
					failed = failed || m
				}
			case *jsonschema.Schema:
				if _, ok := obj[name]; ok {
					c.add(w.self(dep, obj, u, vid))
				}
			}
		}
		if arrays {
			c.total++
			if failed {
				c.failed++
			}
		}
	}
	if w.undeclared && s.Properties != nil {
		p, ok := w.declPath(obj)
		if !ok {
			return
		}
		w.decls = append(w.decls, decl{path: p, obj: obj, sch: s})
	}
	if s.Properties != nil || s.PatternProperties != nil || s.AdditionalProperties != nil {
		for name, pv := range obj {
			evaluated := false
			if ps, ok := s.Properties[name]; ok {
				evaluated = true
				c.add(w.child(ps, pv, vid, name, -1))
			}
			for re, ps := range s.PatternProperties {
				if w.match(re, name) {
					evaluated = true
					c.add(w.child(ps, pv, vid, name, -1))
				}
			}
			if !evaluated && s.AdditionalProperties != nil {
				evaluated = true
				switch ap := s.AdditionalProperties.(type) {
				case bool:
					if !ap {
						c.add(oneFailed)
						// The validator lists every member additionalProperties
						// refuses in the error it keeps, and each is described
						// as a failure of its own, as each name required
						// lacks is (missing): a step each.
						if !w.spend(1) {
							return
						}
					}
				case *jsonschema.Schema:
					c.add(w.child(ap, pv, vid, name, -1))
				}
			}
			if evaluated && u.props != nil {
				delete(u.props, name)
			}
		}
	}
	if s.DraftVersion == 4 {
		return
	}
	if s.PropertyNames != nil {
		for name := range obj {
			c.add(w.propertyName(s.PropertyNames, name))
		}
	}
	if s.DraftVersion == 6 {
		return
	}
	if !w.scanEntries(len(s.DependentSchemas)) {
		return
	}
	for name, ds := range s.DependentSchemas {
		if _, ok := obj[name]; ok {
			c.add(w.self(ds, obj, u, vid))
		}
	}
	if len(s.DependentRequired) > 0 {
		if !w.scanEntries(len(s.DependentRequired)) {
			return
		}
		c.total++
		failed := false
		for name, req := range s.DependentRequired {
			if _, ok := obj[name]; ok {
				m, ok := w.missing(obj, req)
				if !ok {
					return
				}
				failed = failed || m
			}
		}
		if failed {
			c.failed++
		}
	}
}

// scanEntries charges the scan of n entries of dependencies,
// dependentSchemas or dependentRequired; false once the walk has stopped.
// The walk and the validator range over every entry at every application,
// looking its name up in the object, whether or not the member is there:
// a step per namesPerStep entries. 5,500 entries naming absent members
// under a fan-out of 16,384 applications (a 49 KB request) ran past the
// Timeout when only the entries naming present members were charged.
func (w *walker) scanEntries(n int) bool {
	return w.spend(n / namesPerStep)
}

// declPath is the rendered path of the object being evaluated, for a
// declaration of its properties; ok is false once the walk has stopped.
// It is rendered once per visit of the location, however many schemas
// declare properties there (nested allOf over shared $refs apply tens of
// thousands at one location, and a copy each of a 60 KB member name held
// 500 MB), and charged when rendered: one step per declPathBytes of the
// path for the string kept, and as much again for each member of obj,
// since undeclaredPaths writes the path once more for every member it
// finds undeclared.
func (w *walker) declPath(obj map[string]any) (string, bool) {
	top := len(w.rendered) - 1
	if p := w.rendered[top]; p != "" {
		return p, true
	}
	p := renderPath(w.path)
	if !w.spend(len(p) / declPathBytes * (1 + len(obj))) {
		return "", false
	}
	w.rendered[top] = p
	return p, true
}

// declPathBytes is the length of rendered path that costs a step, about
// the memory a step of failure stands for (failure): ordinary paths cost
// nothing.
const declPathBytes = 64

// propertyName evaluates a property name as an instance of its own, in a
// fresh dynamic scope, as the validator does.
func (w *walker) propertyName(s *jsonschema.Schema, name string) counts {
	base, undeclared := w.base, w.undeclared
	w.base, w.undeclared = len(w.scope), false
	var u uneval
	c := w.eval(s, name, &u, 0)
	w.base, w.undeclared = base, undeclared
	return c
}

// missing reports whether obj lacks any of names (required, the array
// form of dependencies, dependentRequired); ok is false once the walk has
// stopped. The validator looks up every name and keeps a list of all the
// missing ones in its error, for every object that fails, so the check is
// charged that work: one step per name missing and one per namesPerStep
// looked up. 3,000 required names over 15,000 empty objects (a 64 KB
// request) held 1.1 GB when the check cost one step.
func (w *walker) missing(obj map[string]any, names []string) (failed, ok bool) {
	n := 0
	for _, name := range names {
		if _, found := obj[name]; !found {
			n++
		}
	}
	return n > 0, w.spend(n + len(names)/namesPerStep)
}

// namesPerStep is the number of member names looked up in a map that
// costs a step.
const namesPerStep = 16

func (w *walker) array(s *jsonschema.Schema, arr []any, u *uneval, vid int, c *counts) {
	if s.MinItems != nil {
		c.total++
		if len(arr) < *s.MinItems {
			c.failed++
		}
	}
	if s.MaxItems != nil {
		c.total++
		if len(arr) > *s.MaxItems {
			c.failed++
		}
	}
	if s.UniqueItems {
		c.total++
		dup := w.hasDuplicates(arr)
		if w.stop != nil {
			return
		}
		if dup {
			c.failed++
		}
	}
	if s.DraftVersion < 2020 {
		evaluated := 0
		switch items := s.Items.(type) {
		case *jsonschema.Schema:
			for i, item := range arr {
				c.add(w.child(items, item, vid, "", i))
			}
			evaluated = len(arr)
		case []*jsonschema.Schema:
			evaluated = min(len(arr), len(items))
			for i, item := range arr[:evaluated] {
				c.add(w.child(items[i], item, vid, "", i))
			}
		}
		switch ai := s.AdditionalItems.(type) {
		case bool:
			if !ai && evaluated != len(arr) {
				extra := len(arr) - evaluated
				c.add(counts{extra, extra})
			}
		case *jsonschema.Schema:
			for i, item := range arr[evaluated:] {
				c.add(w.child(ai, item, vid, "", evaluated+i))
			}
		}
	} else {
		evaluated := min(len(s.PrefixItems), len(arr))
		for i, item := range arr[:evaluated] {
			c.add(w.child(s.PrefixItems[i], item, vid, "", i))
		}
		if s.Items2020 != nil {
			for i, item := range arr[evaluated:] {
				c.add(w.child(s.Items2020, item, vid, "", evaluated+i))
			}
		}
	}
	if s.Contains != nil {
		mark := len(w.decls)
		matched := 0
		for i, item := range arr {
			if w.child(s.Contains, item, vid, "", i).failed == 0 {
				matched++
				if s.DraftVersion >= 2020 && u.items != nil {
					delete(u.items, i)
				}
			}
		}
		w.decls = w.decls[:mark]
		c.total++
		if s.MinContains != nil {
			if matched < *s.MinContains {
				c.failed++
			}
		} else if matched == 0 {
			c.failed++
		}
		if s.MaxContains != nil {
			c.total++
			if matched > *s.MaxContains {
				c.failed++
			}
		}
	}
}

func (w *walker) conditional(s *jsonschema.Schema, v any, u *uneval, vid int, c *counts) {
	if s.Not != nil {
		mark := len(w.decls)
		r := w.self(s.Not, v, u, vid)
		w.decls = w.decls[:mark]
		c.total++
		if r.failed == 0 {
			c.failed++
		}
	}
	for _, sub := range s.AllOf {
		c.add(w.self(sub, v, u, vid))
	}
	if len(s.AnyOf) > 0 {
		c.add(w.branches(s.AnyOf, v, u, vid, false))
	}
	if len(s.OneOf) > 0 {
		c.add(w.branches(s.OneOf, v, u, vid, true))
	}
	if s.If != nil {
		mark := len(w.decls)
		r := w.self(s.If, v, u, vid)
		w.decls = w.decls[:mark]
		if r.failed == 0 {
			if s.Then != nil {
				c.add(w.self(s.Then, v, u, vid))
			}
		} else if s.Else != nil {
			c.add(w.self(s.Else, v, u, vid))
		}
	}
}

// branches counts anyOf (one == false) or oneOf: the passing branches when
// any passes (plus one failed check when oneOf has several), else all.
func (w *walker) branches(subs []*jsonschema.Schema, v any, u *uneval, vid int, one bool) counts {
	var all, valid counts
	nvalid := 0
	mark := len(w.decls)
	var spans [][2]int // decl ranges of the failing branches, when tracking
	for _, sub := range subs {
		start := len(w.decls)
		r := w.self(sub, v, u, vid)
		all.add(r)
		if r.failed == 0 {
			nvalid++
			valid.add(r)
		} else if w.undeclared && len(w.decls) > start {
			spans = append(spans, [2]int{start, len(w.decls)})
		}
	}
	if nvalid == 0 {
		return all
	}
	if len(spans) > 0 { // keep the declarations of the passing branches only
		kept := w.decls[:mark]
		next := 0
		for i := mark; i < len(w.decls); i++ {
			if next < len(spans) && i >= spans[next][0] {
				if i == spans[next][1]-1 {
					next++
				}
				continue
			}
			kept = append(kept, w.decls[i])
		}
		w.decls = kept
	}
	if one && nvalid > 1 {
		valid.add(oneFailed)
	}
	return valid
}

func (w *walker) unevaluated(s *jsonschema.Schema, v any, u *uneval, vid int, c *counts) {
	if obj, ok := v.(map[string]any); ok && s.UnevaluatedProperties != nil {
		for name := range u.props {
			if pv, ok := obj[name]; ok {
				c.add(w.child(s.UnevaluatedProperties, pv, vid, name, -1))
			}
		}
		u.props = nil
	}
	if arr, ok := v.([]any); ok && s.UnevaluatedItems != nil {
		for i := range u.items {
			c.add(w.child(s.UnevaluatedItems, arr[i], vid, "", i))
		}
		u.items = nil
	}
}

// searchScope charges a search of the whole dynamic scope, which
// resolving a $recursiveRef or $dynamicRef to an anchor does in the walk
// and again in the validator (resolveRecursiveAnchor,
// resolveDynamicAnchor): one step per namesPerStep schemas in it, each
// a lookup of the anchor in its resource; false once the walk has
// stopped. A chain of k references each searching it costs k²/2 lookups
// per instance against k steps: 1,200 of them over a few hundred items
// (a 61 KB request) kept the validator busy past the Timeout, for 7.85 s.
func (w *walker) searchScope() bool {
	return w.spend((len(w.scope) - w.base) / namesPerStep)
}

// resolveRecursive finds the outermost schema in the dynamic scope whose
// resource has $recursiveAnchor: true (2019-09).
func (w *walker) resolveRecursive(fallback *jsonschema.Schema) *jsonschema.Schema {
	sch := fallback
	for i := len(w.scope) - 1; i >= w.base; i-- {
		if r := resourceOf(w.scope[i].sch); r != nil && r.RecursiveAnchor {
			sch = w.scope[i].sch
		}
	}
	return sch
}

// resolveDynamic finds the outermost resource in the dynamic scope that
// declares $dynamicAnchor name (2020-12).
func (w *walker) resolveDynamic(name string, fallback *jsonschema.Schema) *jsonschema.Schema {
	sch := fallback
	for i := len(w.scope) - 1; i >= w.base; i-- {
		if d, ok := dynamicAnchors(resourceOf(w.scope[i].sch))[name]; ok {
			sch = d
		}
	}
	return sch
}

// --- numbers

// numBounds caches the float64 form of a schema's numeric limits, so most
// comparisons need no big.Rat arithmetic. exact is false when the limit
// has no exact float64 form; comparisons then use big.Rat.
type numBounds struct {
	min, max, exMin, exMax bound
	multInt                int64 // multipleOf when it is a positive integer that fits, else 0
}

type bound struct {
	f     float64
	exact bool // f == the limit
	short bool // and the limit has at most 15 significant decimal digits
}

func makeBound(r *big.Rat) bound {
	if r == nil {
		return bound{}
	}
	f, exact := r.Float64()
	b := bound{f: f, exact: exact}
	if exact {
		s := strconv.FormatFloat(f, 'g', -1, 64)
		if d, ok := new(big.Rat).SetString(s); ok && d.Cmp(r) == 0 && sigDigits(s) <= 15 {
			b.short = true
		}
	}
	return b
}

// sigDigits counts the significant digits of a decimal number literal
// (trailing zeros included, which only makes the count conservative).
func sigDigits(s string) int {
	n, leading := 0, true
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == 'e' || c == 'E' {
			break
		}
		if c < '0' || c > '9' {
			continue
		}
		if leading && c == '0' {
			continue
		}
		leading = false
		n++
	}
	return n
}

func (w *walker) number(s *jsonschema.Schema, v any, c *counts) {
	if s.Minimum == nil && s.Maximum == nil && s.ExclusiveMinimum == nil && s.ExclusiveMaximum == nil && s.MultipleOf == nil {
		return
	}
	nb := w.s.nums[s]
	if nb == nil {
		nb = &numBounds{}
	}
	if s.Minimum != nil {
		c.total++
		if cmpNum(v, s.Minimum, nb.min) < 0 {
			c.failed++
		}
	}
	if s.Maximum != nil {
		c.total++
		if cmpNum(v, s.Maximum, nb.max) > 0 {
			c.failed++
		}
	}
	if s.ExclusiveMinimum != nil {
		c.total++
		if cmpNum(v, s.ExclusiveMinimum, nb.exMin) <= 0 {
			c.failed++
		}
	}
	if s.ExclusiveMaximum != nil {
		c.total++
		if cmpNum(v, s.ExclusiveMaximum, nb.exMax) >= 0 {
			c.failed++
		}
	}
	if s.MultipleOf != nil {
		c.total++
		if !isMultiple(v, s.MultipleOf, nb.multInt) {
			c.failed++
		}
	}
}

// cmpNum compares v with r. When r is exactly a float64 and v's float64
// differs from it, the float comparison is exact (rounding is monotonic).
// Equal float64 forms mean equal values when both numbers have at most 15
// significant digits (distinct such decimals have distinct float64 forms).
// Otherwise it falls back to big.Rat.
func cmpNum(v any, r *big.Rat, b bound) int {
	if b.exact {
		if f, ok := toFloat(v); ok {
			switch {
			case f < b.f:
				return -1
			case f > b.f:
				return 1
			}
			switch n := v.(type) {
			case float64:
				return 0
			case json.Number:
				if b.short && sigDigits(string(n)) <= 15 {
					return 0
				}
			}
		}
	}
	x, ok := toRat(v)
	if !ok {
		return 0
	}
	return x.Cmp(r)
}

func isMultiple(v any, m *big.Rat, mInt int64) bool {
	if mInt > 0 {
		if n, ok := v.(json.Number); ok && !strings.ContainsAny(string(n), ".eE") {
			if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
				return i%mInt == 0
			}
		}
	}
	x, ok := toRat(v)
	if !ok {
		return false
	}
	return new(big.Rat).Quo(x, m).IsInt()
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(n), 64)
		return f, err == nil
	case float64:
		return n, true
	case float32:
		return float64(n), true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	}
	return 0, false
}

func toRat(v any) (*big.Rat, bool) {
	switch n := v.(type) {
	case json.Number:
		return new(big.Rat).SetString(string(n))
	case float64:
		if math.IsInf(n, 0) || math.IsNaN(n) {
			return nil, false
		}
		return new(big.Rat).SetFloat64(n), true
	}
	return new(big.Rat).SetString(toString(v))
}

func toString(v any) string {
	switch n := v.(type) {
	case int:
		return strconv.Itoa(n)
	case int64:
		return strconv.FormatInt(n, 10)
	case float32:
		return strconv.FormatFloat(float64(n), 'g', -1, 32)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// isInteger reports whether a number has no fractional part (1.0 is an
// integer, as the validator and drafts 6+ say).
func isInteger(v any) bool {
	switch n := v.(type) {
	case json.Number:
		s := string(n)
		if !strings.ContainsAny(s, ".eE") {
			return true
		}
		if f, err := strconv.ParseFloat(s, 64); err == nil && f != math.Trunc(f) {
			return false // a float64 with a fraction comes only from a non-integer
		}
		r, ok := new(big.Rat).SetString(s)
		return ok && r.IsInt()
	case float64:
		return !math.IsInf(n, 0) && n == math.Trunc(n)
	case float32:
		return n == float32(math.Trunc(float64(n)))
	}
	return true
}

// --- types and equality

const (
	tNull = 1 << iota
	tBoolean
	tNumber
	tInteger
	tString
	tArray
	tObject
)

func typeOf(v any) int {
	switch v := v.(type) {
	case nil:
		return tNull
	case bool:
		return tBoolean
	case json.Number, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return tNumber
	case float64:
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return 0
		}
		return tNumber
	case float32:
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return 0
		}
		return tNumber
	case string:
		return tString
	case []any:
		return tArray
	case map[string]any:
		return tObject
	}
	return 0
}

var typeNames = map[string]int{
	"null": tNull, "boolean": tBoolean, "number": tNumber, "integer": tInteger,
	"string": tString, "array": tArray, "object": tObject,
}

// typeMasks maps the validator's Types bit sets to ours, computed once from
// its exported ToStrings so nothing depends on its bit layout.
var typeMasks [256]int8

func init() {
	for i := range typeMasks {
		m := 0
		for _, n := range jsonschema.Types(i).ToStrings() {
			m |= typeNames[n]
		}
		typeMasks[i] = int8(m)
	}
}

func typeMask(t jsonschema.Types) int {
	if t >= 0 && int(t) < len(typeMasks) {
		return int(typeMasks[t])
	}
	m := 0
	for _, n := range t.ToStrings() {
		m |= typeNames[n]
	}
	return m
}

// equal is JSON equality: numbers by value (1 == 1.0), objects by members.
func equal(a, b any) bool {
	switch a := a.(type) {
	case map[string]any:
		b, ok := b.(map[string]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for k, av := range a {
			bv, ok := b[k]
			if !ok || !equal(av, bv) {
				return false
			}
		}
		return true
	case []any:
		b, ok := b.([]any)
		if !ok || len(a) != len(b) {
			return false
		}
		for i := range a {
			if !equal(a[i], b[i]) {
				return false
			}
		}
		return true
	case nil:
		return b == nil
	case bool:
		bb, ok := b.(bool)
		return ok && a == bb
	case string:
		bs, ok := b.(string)
		return ok && a == bs
	}
	if typeOf(a) != tNumber || typeOf(b) != tNumber {
		return false
	}
	if an, ok := a.(json.Number); ok {
		if bn, ok := b.(json.Number); ok && an == bn {
			return true
		}
	}
	af, aok := toFloat(a)
	bf, bok := toFloat(b)
	if aok && bok && af != bf {
		return false // equal values always have equal float64 forms
	}
	ar, aok := toRat(a)
	br, bok := toRat(b)
	return aok && bok && ar.Cmp(br) == 0
}
