package schema

import (
	"fmt"
	"regexp"
	"regexp/syntax"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Regular expressions are Go's regexp (RE2 syntax), which matches in time
// linear in the input, but linear with the size of the compiled program as
// its factor: a 20-character pattern such as (?:a?){1000}a{1000}b compiles
// to some 3,000 instructions, and matching it against a 1 MB string costs
// billions of steps. So every pattern has a size (an estimate of its
// program's instruction count, from the parsed expression), a pattern over
// MaxPatternSize does not compile, and every evaluation has a budget of
// regular-expression work (Options.MaxRegexWork) charged, before each
// match runs, at the pattern's size times the length of the string it is
// matched against.

// DefaultMaxPatternSize bounds the size of one pattern (in program
// instructions, as patternSize estimates them) when a Cache is given none.
// Real patterns ("^INV-[0-9]{4}$": 12) are far below it.
const DefaultMaxPatternSize = 10_000

// DefaultMaxRegexWork bounds the regular-expression work of one evaluation
// when Options.MaxRegexWork is 0: pattern size × string length, summed over
// every match. A 1,000-line invoice with a pattern on every SKU takes about
// 200,000; this allows a 100-instruction pattern over 100 KB of text. One
// unit costs about 10 ns at worst (every instruction live at every byte),
// and the validator repeats the walk's matches, so a verification spends at
// most about 0.2 s of CPU on patterns.
const DefaultMaxRegexWork = 10_000_000

// sizedRegexp is a compiled pattern with its size.
type sizedRegexp struct {
	*regexp.Regexp
	size int
}

// PatternTooLargeError is the compile error of a pattern whose program
// would exceed the size limit.
type PatternTooLargeError struct {
	Size, Max int
}

func (e *PatternTooLargeError) Error() string {
	return fmt.Sprintf("the regular expression compiles to about %d instructions, more than the limit of %d", e.Size, e.Max)
}

// MaxPatternsSize bounds the distinct patterns of one schema together, in
// program instructions as patternSize estimates them. Compiling costs about
// 0.4 µs and keeps about 45 bytes per instruction (measured with
// [\p{L}]{999}), and the gateway compiles a request's schema to answer its
// 402, unpaid: 4,900 patterns each within the per-pattern limit cost it 2 s
// of CPU and kept 222 MB per schema. A pattern written in many places is
// compiled once (regexpEngine), so at the limit a schema's patterns cost
// about 40 ms and 5 MB; real schemas use a few patterns of a few dozen
// instructions.
const MaxPatternsSize = 100_000

// bytesPerInstruction is the heap a compiled pattern keeps per instruction
// (about 45 bytes measured), for the cache's byte bound.
const bytesPerInstruction = 64

// PatternsTooLargeError is the compile error of a schema whose patterns
// together exceed MaxPatternsSize.
type PatternsTooLargeError struct {
	Size, Max int
}

func (e *PatternsTooLargeError) Error() string {
	return fmt.Sprintf("the schema's regular expressions compile to about %d instructions, more than the limit of %d", e.Size, e.Max)
}

// regexpEngine returns the compiler's regexp engine for one schema: Go's
// regexp, refusing patterns larger than maxSize before compiling them
// (compiling a huge program is itself expensive), compiling each distinct
// pattern once (the compiler asks for every place it is written, and once
// more for the metaschema's format check), and refusing a new pattern that
// takes the schema's total, *total, past MaxPatternsSize.
func regexpEngine(maxSize int, total *int) jsonschema.RegexpEngine {
	compiled := map[string]*sizedRegexp{}
	return func(pat string) (jsonschema.Regexp, error) {
		if re, ok := compiled[pat]; ok {
			return re, nil
		}
		size, err := patternSize(pat)
		if err != nil {
			return nil, err
		}
		if size > maxSize {
			return nil, &PatternTooLargeError{Size: size, Max: maxSize}
		}
		if *total+size > MaxPatternsSize {
			return nil, &PatternsTooLargeError{Size: *total + size, Max: MaxPatternsSize}
		}
		*total += size
		re, err := regexp.Compile(pat)
		if err != nil {
			return nil, err
		}
		sre := &sizedRegexp{Regexp: re, size: size}
		compiled[pat] = sre
		return sre, nil
	}
}

// patternSize parses pat and estimates the instruction count of its
// compiled program, counting repetitions expanded as the compiler expands
// them. It saturates far above any limit instead of overflowing.
func patternSize(pat string) (int, error) {
	re, err := syntax.Parse(pat, syntax.Perl)
	if err != nil {
		return 0, err
	}
	return progSize(re), nil
}

const sizeCap = 1 << 40

func progSize(re *syntax.Regexp) int {
	sat := func(n int) int { return min(n, sizeCap) }
	switch re.Op {
	case syntax.OpLiteral:
		return max(len(re.Rune), 1)
	case syntax.OpCapture:
		return sat(2 + progSize(re.Sub[0]))
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		return sat(1 + progSize(re.Sub[0]))
	case syntax.OpRepeat:
		sub := progSize(re.Sub[0])
		n := re.Max
		if n < 0 {
			n = re.Min + 1
		}
		return sat(max(n, 1)*sub + 1)
	case syntax.OpConcat, syntax.OpAlternate:
		n := len(re.Sub)
		for _, s := range re.Sub {
			n = sat(n + progSize(s))
		}
		return n
	}
	return 1 // character classes, anchors, empty matches: one instruction
}

// regexCost is the work of matching re against s.
func regexCost(re jsonschema.Regexp, s string) int64 {
	size := 1
	if r, ok := re.(*sizedRegexp); ok {
		size = r.size
	}
	return int64(size) * int64(len(s)+1)
}

// regexFormatCost is the work of checking that s is a regular expression
// (format "regex"): parsing it, and compiling it when its program is at
// most maxSize instructions (a larger one is refused uncompiled).
func regexFormatCost(s string, maxSize int) int64 {
	size, err := patternSize(s)
	if err != nil || size > maxSize {
		size = 0
	}
	return int64(len(s)) + 1 + int64(size)
}
