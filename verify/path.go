package verify

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/aovhq/aov/verify/schema"
)

// MaxPathBytes bounds the length of one path in a bound or a rule, not
// counting a "$." prefix.
const MaxPathBytes = 512

// maxPathSteps bounds the steps of one path; it can never need more than the
// nesting depth of the output.
const maxPathSteps = 64

// Path addresses values inside submitted_output. The grammar (SPEC §3):
//
//	path  = [ "$." ] step *( "." step )  |  "$"  |  [ "$" ] 1*"[]" *( "." step )
//	step  = key *"[]"
//	key   = 1*( any character except ".", "[", "]" and control characters )
//
// A key selects that member of an object; "[]" after a key (or at the start,
// for an output that is itself an array) selects every element of an array,
// so "line_items[].line_total" is the line_total of every line item and
// "matrix[][]" every cell of an array of arrays. "$" alone is the whole
// output. Keys are literal: no quoting, no escapes, no numeric indexes and no
// wildcards other than "[]". A leading "$." is accepted and ignored, so
// "$.total" and "total" are the same path.
type Path struct {
	text  string // as normalized: without "$." (or "$" for the root)
	steps []step
}

// step is one key (each == false) or one "every element" (each == true).
type step struct {
	key  string
	each bool
}

// PathError says why a path does not parse (Problem completes the sentence
// "the path ...") and how to write it instead (Fix). It never repeats the
// path.
type PathError struct{ Problem, Fix string }

// Error reports the problem.
func (e *PathError) Error() string { return "path " + e.Problem }

const pathFix = "Write a path like 'total', 'line_items[].line_total' or '$.a.b[].c': keys separated by '.', '[]' after a key for every element of an array."

// ParsePath parses a path of the grammar documented on Path. The gateway's
// seller mode and verifierd both reach it through Parse; it is exported so
// tools can validate a path on its own.
func ParsePath(s string) (Path, *PathError) {
	if s == "" {
		return Path{}, &PathError{"is empty", pathFix}
	}
	tooLong := &PathError{"is longer than " + strconv.Itoa(MaxPathBytes) + " bytes", "Shorten the path to at most " + strconv.Itoa(MaxPathBytes) + " bytes, not counting a '$.' prefix."}
	if len(s) > MaxPathBytes+2 {
		return Path{}, tooLong
	}
	if !utf8.ValidString(s) {
		return Path{}, &PathError{"is not valid UTF-8", pathFix}
	}
	rest := s
	switch {
	case rest == "$":
		return Path{text: "$"}, nil
	case strings.HasPrefix(rest, "$."):
		rest = rest[2:]
	case strings.HasPrefix(rest, "$["):
		rest = rest[1:]
	}
	if rest == "" {
		return Path{}, &PathError{"has nothing after '$.'", pathFix}
	}
	if len(rest) > MaxPathBytes {
		return Path{}, tooLong
	}
	if rest == "$" || strings.HasPrefix(rest, "$.") || strings.HasPrefix(rest, "$[") {
		return Path{}, &PathError{"starts with '$' twice", "Write the '$.' prefix at most once, at the start."}
	}
	steps := make([]step, 0, 4)
	i := 0
	afterDot := false
	for i < len(rest) {
		c := rest[i]
		switch {
		case c == '[':
			if i+1 >= len(rest) || rest[i+1] != ']' {
				return Path{}, &PathError{"has a '[' that is not followed by ']'",
					"Use '[]' (every element); numeric indexes like '[0]' and quoted keys are not supported."}
			}
			if afterDot {
				return Path{}, &PathError{"has '[]' right after a '.'", "Put '[]' directly after a key, as in 'items[].price'."}
			}
			steps = append(steps, step{each: true})
			i += 2
			if i < len(rest) && rest[i] != '.' && rest[i] != '[' {
				return Path{}, &PathError{"has a key directly after '[]'", "Separate the next key with '.', as in 'items[].price'."}
			}
		case c == '.':
			if i == 0 || afterDot {
				return Path{}, &PathError{"has an empty key (two dots, or a dot at the start)", pathFix}
			}
			afterDot = true
			i++
			if i == len(rest) {
				return Path{}, &PathError{"ends with '.'", pathFix}
			}
			continue
		case c == ']':
			return Path{}, &PathError{"has a ']' without a '['", pathFix}
		default:
			j := i
			for j < len(rest) && rest[j] != '.' && rest[j] != '[' && rest[j] != ']' {
				r, size := utf8.DecodeRuneInString(rest[j:])
				if unicode.IsControl(r) {
					return Path{}, &PathError{"contains a control character", pathFix}
				}
				j += size
			}
			steps = append(steps, step{key: rest[i:j]})
			i = j
		}
		afterDot = false
		if len(steps) > maxPathSteps {
			return Path{}, &PathError{"has more than " + strconv.Itoa(maxPathSteps) + " steps", "Use a path of at most " + strconv.Itoa(maxPathSteps) + " steps."}
		}
	}
	return Path{text: rest, steps: steps}, nil
}

// String returns the path without its "$." prefix, as error messages show it
// ("line_items[].line_total"); the root is "$".
func (p Path) String() string { return p.text }

// Display returns the path with its "$" root, as result details show it
// ("$.line_items[].line_total").
func (p Path) Display() string {
	switch {
	case p.text == "$":
		return "$"
	case strings.HasPrefix(p.text, "["):
		return "$" + p.text
	}
	return "$." + p.text
}

// single reports whether the path names at most one value (no "[]").
func (p Path) single() bool {
	for _, s := range p.steps {
		if s.each {
			return false
		}
	}
	return true
}

// walk calls fn for every value the path resolves to, in document order.
// idx holds the array index chosen at each "[]" step so far, for locate;
// fn returns false to stop. Members that are absent, and steps that meet
// the wrong kind of value (a key on a non-object, "[]" on a non-array),
// resolve to nothing.
func (p Path) walk(v any, fn func(v any, idx []int) bool) {
	var steps int64
	p.walkCounting(v, &steps, fn)
}

// walkCounting is walk that also adds to *steps one per value the walk
// enters (an array element, or a member found), the work a bound or a rule
// pays for its path (work.go).
func (p Path) walkCounting(v any, steps *int64, fn func(v any, idx []int) bool) {
	var idx []int
	p.walkFrom(v, 0, &idx, steps, fn)
}

func (p Path) walkFrom(v any, at int, idx *[]int, steps *int64, fn func(any, []int) bool) bool {
	for ; at < len(p.steps); at++ {
		s := p.steps[at]
		if s.each {
			a, ok := v.([]any)
			if !ok {
				return true
			}
			*steps += int64(len(a))
			for i, e := range a {
				*idx = append(*idx, i)
				more := p.walkFrom(e, at+1, idx, steps, fn)
				*idx = (*idx)[:len(*idx)-1]
				if !more {
					return false
				}
			}
			return true
		}
		m, ok := v.(map[string]any)
		if !ok {
			return true
		}
		if v, ok = m[s.key]; !ok {
			return true
		}
		*steps++
	}
	return fn(v, *idx)
}

// locate renders the concrete location of one resolved value, with the
// index chosen at each "[]" ("$.line_items[1].line_total"), as the schema's
// findings render theirs (within schema.MaxLocationBytes).
func (p Path) locate(idx []int) string {
	b := make([]byte, 1, 64)
	b[0] = '$'
	n := 0
	for _, s := range p.steps {
		if s.each {
			if n < len(idx) { // walk chose an index at every "[]"
				b = schema.AppendLocationIndex(b, idx[n])
			}
			n++
			continue
		}
		b = schema.AppendLocationKey(b, s.key)
	}
	return string(b)
}
