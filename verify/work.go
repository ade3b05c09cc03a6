package verify

import (
	"encoding/json"
	"strconv"
)

// DefaultMaxIntegrityWork bounds the work of the integrity checks of one
// request (Config.MaxIntegrityWork), in the units below. A unit costs
// 0.1 to 0.15 µs, so the budget is at most about two seconds of CPU, well
// within the default time limit; an honest large request, a 1 MiB output
// of 130,000 numbers under sum_equals, gte, lte, unique, exists_in and a
// bound together, needs about 7,200,000 units, and the SPEC §10 invoice a
// few dozen. A hundred rules over that output would need 200,000,000.
const DefaultMaxIntegrityWork = 1 << 24

// The units of integrity work. Bounds and rules walk the output along
// their paths: one unit per value a path enters (an array element, a
// member found). unique and exists_in also write each value they compare
// in canonical form and look it up, which costs about sixteen times as
// much: canonicalValueWork per value inside it (itself included), plus one
// per canonicalBytesPerWork bytes of its strings, member names and number
// literals. exists_in's allowed values are counted the same way.
const (
	canonicalValueWork    = 16
	canonicalBytesPerWork = 16
)

// integrityWork counts the work of a request's bounds and rules on its
// output without doing it, in the order Check does it, stopping as soon as
// the count passes max. It depends on the request alone, so a request over
// the budget is refused with 422 on every machine, and by the gateway's
// precheck before any payment; the checks themselves then run within the
// verification's time limit. over names the field whose work passed the
// budget ("bounds" or "rules"), or is empty.
func integrityWork(output any, bounds []bound, rules []rule, max int64) (work int64, over string) {
	w := workCount{max: max}
	for i := range bounds {
		b := &bounds[i]
		for _, lim := range []*float64{b.min, b.max} {
			if lim != nil && !w.path(&b.path, output, false) {
				return w.n, "bounds"
			}
		}
	}
	for i := range rules {
		r := &rules[i]
		ok := true
		switch r.typ {
		case RuleSumEquals:
			ok = w.path(r.equalsField, output, false) && w.path(&r.field, output, false)
		case RuleGTE, RuleLTE:
			ok = w.path(r.otherPath, output, false) && w.path(&r.field, output, false)
		case RuleExistsIn:
			ok = w.path(r.inField, output, true)
			for _, v := range r.values {
				ok = ok && w.add(canonicalWork(v))
			}
			ok = ok && w.path(&r.field, output, true)
		case RuleUnique:
			ok = w.path(&r.field, output, true)
		}
		if !ok {
			return w.n, "rules"
		}
	}
	return w.n, ""
}

type workCount struct{ n, max int64 }

// add counts n units; false once the count is past max.
func (w *workCount) add(n int64) bool {
	w.n += n
	return w.n <= w.max
}

// path counts the walk of p (nil: none) over output, and with canonical
// the canonical form of every value it reaches.
func (w *workCount) path(p *Path, output any, canonical bool) bool {
	if p == nil {
		return true
	}
	var steps int64
	ok := true
	p.walkCounting(output, &steps, func(v any, _ []int) bool {
		if canonical {
			ok = w.add(canonicalWork(v))
		}
		return ok
	})
	return ok && w.add(steps)
}

// canonicalWork is the work of writing v in canonical form and looking it
// up.
func canonicalWork(v any) int64 {
	values, bytes := sizeOf(v)
	return canonicalValueWork*values + bytes/canonicalBytesPerWork
}

// sizeOf counts the values in v (itself included) and the bytes of its
// strings, member names and number literals.
func sizeOf(v any) (values, bytes int64) {
	values = 1
	switch x := v.(type) {
	case string:
		bytes = int64(len(x))
	case json.Number:
		bytes = int64(len(x))
	case map[string]any:
		for k, m := range x {
			n, b := sizeOf(m)
			values += n
			bytes += b + int64(len(k))
		}
	case []any:
		for _, e := range x {
			n, b := sizeOf(e)
			values += n
			bytes += b
		}
	}
	return values, bytes
}

// integrityWorkProblem is the refusal of a request over the budget.
func integrityWorkProblem(max int64) string {
	return "need more than " + strconv.FormatInt(max, 10) + " units of integrity-check work on this output " +
		"(one per value a path enters; for each value unique or exists_in compares, 16 per value inside it and one per 16 bytes of its text)"
}

const integrityWorkFix = "Send fewer bounds and rules over large arrays, or point unique and exists_in at small values (an id rather than a whole object)."
