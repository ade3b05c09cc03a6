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
// program's instruction count, from the parsed expression, plus its
// character classes' rune ranges, rangesPerInstruction to one), a pattern
// over MaxPatternSize does not compile (and one whose classes are far over
// it is not even parsed, classBound), and every evaluation has a budget of
// regular-expression work (Options.MaxRegexWork) charged, before each
// match runs, at the pattern's instructions times the length of the string
// it is matched against.

// DefaultMaxPatternSize bounds the size of one pattern (in program
// instructions, as patternSize estimates them, class ranges included) when
// a Cache is given none.
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

// sizedRegexp is a compiled pattern with its match work per byte
// (patternCost.work) and the pattern as the schema wrote it, which String
// reports (the library describes a pattern failure with it): the
// compiled one may carry the noOnePass prefix, which is ours, not the
// schema's.
type sizedRegexp struct {
	*regexp.Regexp
	work    int
	written string
}

func (r *sizedRegexp) String() string { return r.written }

// PatternTooLargeError is the compile error of a pattern whose program
// would exceed the size limit.
type PatternTooLargeError struct {
	Size, Max int
}

func (e *PatternTooLargeError) Error() string {
	return fmt.Sprintf("the regular expression compiles to about %d instructions, more than the limit of %d", e.Size, e.Max)
}

// MaxPatternsSize bounds the distinct patterns of one schema together, in
// program instructions as patternSize estimates them. The gateway compiles
// a request's schema to answer its 402, unpaid, and keeps it in its schema
// cache: 4,900 patterns each within the per-pattern limit cost it 2 s of
// CPU and kept 222 MB per schema. A pattern written in many places is
// compiled once (regexpEngine), so at the limit a schema's patterns cost
// about 40 ms and keep at most about 6 MB (bytesPerInstruction); real
// schemas use a few patterns of a few dozen instructions.
const MaxPatternsSize = 100_000

// rangesPerInstruction is how many rune ranges of a character class count
// as one instruction of a pattern's size. The instruction estimate alone
// counts a class as one instruction, but \pL is a table of 659 ranges that
// the program keeps (8 bytes each, about 20 when the one-pass matcher
// copies it) and that parsing builds (about 40 ns each): 5,000 \pL were
// "5,000 instructions" and kept 25 MB. Matching still costs a class about
// one instruction (a binary search), so a pattern's match work (regexCost)
// counts only instructions.
const rangesPerInstruction = 2

// bytesPerInstruction is the heap a compiled pattern keeps per unit of its
// size, and bytesPerPattern what every compiled pattern keeps besides, for
// the cache's byte bound. Measured (TestPatternBytesEstimate): about 45
// bytes an instruction, 8 to 20 a class range, 1.7 KB a pattern.
const (
	bytesPerInstruction = 64
	bytesPerPattern     = 2048
)

// PatternsTooLargeError is the compile error of a schema whose patterns
// together exceed MaxPatternsSize.
type PatternsTooLargeError struct {
	Size, Max int
}

func (e *PatternsTooLargeError) Error() string {
	return fmt.Sprintf("the schema's regular expressions compile to about %d instructions, more than the limit of %d", e.Size, e.Max)
}

// maxParseWork bounds the reading and parsing of one compile's patterns:
// the sum, over every distinct pattern asked for (refused ones included),
// of parseCost, in units of about 10 ns. The metaschema checks every
// patternProperties key as format "regex" and collects every error, so
// each new key was parsed even after the schema's total was passed: a
// 973 KB body of keys each just within the class limit cost the gate
// 2.25 s and 3 GB, unpaid, before its 422. At the limit a compile parses
// for about 0.1 s (and compiles again what it keeps, within
// MaxPatternsSize); an internationalised host name pattern,
// (?i)[a-z0-9\x{00a1}-\x{ffff}] four times, costs about 2,200,000.
const maxParseWork = 10_000_000

// parseCost is the work of reading and parsing pat: its length, and, when
// its classes are within the limit (it will be parsed), their cost
// (classScan). bound is classBound(pat).
func parseCost(pat string, maxSize int) (cost, bound int) {
	bound, classes := classScan(pat)
	cost = len(pat) + 1
	if bound <= maxClassRanges(maxSize) {
		cost = satAdd(cost, classes)
	}
	return cost, bound
}

// ParseBudgetError is the compile error of a pattern refused, unparsed,
// because the compile's patterns have used maxParseWork.
type ParseBudgetError struct {
	Work, Max int
}

func (e *ParseBudgetError) Error() string {
	return fmt.Sprintf("parsing the schema's regular expressions takes %d units of work, more than the limit of %d", e.Work, e.Max)
}

// ClassesTooLargeError is the error of a pattern refused before it is
// parsed: its character classes would hold more rune ranges (classBound)
// than a pattern of the size limit can (rangesPerInstruction per
// instruction).
type ClassesTooLargeError struct {
	Ranges, Max int
}

func (e *ClassesTooLargeError) Error() string {
	return fmt.Sprintf("the regular expression's character classes hold up to %d ranges, more than the limit of %d", e.Ranges, e.Max)
}

// maxClassRanges is the most class ranges a pattern of maxSize may hold.
func maxClassRanges(maxSize int) int { return maxSize * rangesPerInstruction }

// regexpEngine is the compiler's regexp engine for one schema: Go's
// regexp, refusing patterns larger than maxSize before compiling them
// (compiling a huge program is itself expensive), and a pattern whose
// classes are too large before parsing it; compiling each distinct pattern
// once (the compiler asks for every place it is written, and once more for
// the metaschema's format check) and keeping its verdict, refusals
// included, so a pattern is parsed once per compile and translate can say
// why it was refused; and refusing a new pattern that takes the schema's
// total past MaxPatternsSize.
//
// The library also uses the engine, for good, as the check of format
// "regex" on the instances of the compiled schema, which is shared by every
// evaluation through the cache. So once compile returns it is frozen: a
// check then writes nothing and depends on nothing but the string (its
// work charged by the walk to the evaluation, regexFormatCost), as
// concurrent evaluations and the verdict's independence from earlier
// requests need.
type regexpEngine struct {
	maxSize  int
	verdicts map[string]verdict // every pattern asked for while compiling
	total    int                // size of the distinct patterns compiled
	count    int                // how many
	read     int                // parse work of the distinct patterns asked for (maxParseWork)
	frozen   bool
}

type verdict struct {
	re  *sizedRegexp
	err error
}

func newRegexpEngine(maxSize int) *regexpEngine {
	return &regexpEngine{maxSize: maxSize, verdicts: map[string]verdict{}}
}

// compile is the jsonschema.RegexpEngine.
func (e *regexpEngine) compile(pat string) (jsonschema.Regexp, error) {
	if e.frozen {
		// Only the format check asks now, and it keeps no Regexp.
		_, err := measurePattern(pat, e.maxSize)
		return nil, err
	}
	v, ok := e.verdicts[pat]
	if !ok {
		v = e.compileNew(pat)
		e.verdicts[pat] = v
	}
	if v.err != nil {
		return nil, v.err
	}
	return v.re, nil
}

func (e *regexpEngine) compileNew(pat string) verdict {
	cost, bound := parseCost(pat, e.maxSize)
	e.read = satAdd(e.read, cost)
	if e.read > maxParseWork && bound <= maxClassRanges(e.maxSize) {
		// It would be parsed: refuse it unparsed. (One refused for its
		// classes is refused as that: it costs no parsing.)
		return verdict{err: &ParseBudgetError{Work: e.read, Max: maxParseWork}}
	}
	m, err := measureBounded(pat, bound, e.maxSize)
	if err != nil {
		return verdict{err: err}
	}
	if e.total+m.size > MaxPatternsSize {
		return verdict{err: &PatternsTooLargeError{Size: e.total + m.size, Max: MaxPatternsSize}}
	}
	src := pat
	if !m.onePass {
		src = noOnePass + pat
	}
	re, err := regexp.Compile(src)
	if err != nil {
		return verdict{err: err}
	}
	e.total += m.size
	e.count++
	return verdict{re: &sizedRegexp{Regexp: re, work: m.work, written: pat}}
}

// refusal returns the refusal of a pattern the compile asked for, if any.
func (e *regexpEngine) refusal(pat string) error {
	return e.verdicts[pat].err
}

// bytes estimates the heap the compiled patterns keep.
func (e *regexpEngine) bytes() int64 {
	return int64(e.total)*bytesPerInstruction + int64(e.count)*bytesPerPattern
}

// patternCost is what a pattern costs: size, for the limits and the
// memory it keeps (instructions, plus its class ranges at
// rangesPerInstruction), and work, the instructions a match steps through
// for each byte (regexCost). onePass says whether it is compiled as
// written, so that Go may build its one-pass matcher (then size counts
// what that keeps), or behind noOnePass.
type patternCost struct {
	size, work int
	onePass    bool
}

// Go's regexp builds a one-pass matcher for a program of fewer than 1,000
// instructions that starts with ^ (regexp/onepass.go), and it keeps, for
// every instruction, a copy of the ranges the match may take next: a
// class's whole table at each instruction a repetition expands it to, and
// at each alternation, capture or empty-width instruction the union of
// what follows. ^[\p{L}]{990}$ kept 990 copies of 659 ranges, 8 MB, for a
// size of 1,320 (85 KB), and 330 alternatives starting with different
// characters 1 MB. The matcher only makes matches faster, so a pattern
// whose copies could pass maxOnePassCopies rune ranges is compiled behind
// an empty group, noOnePass: the same language, but a program whose first
// instruction is not ^, which the one-pass compiler declines (the anchor
// still makes the search anchored). One that stays one-pass counts its
// copies in its size, with another instruction for each (the matcher's
// copy of the program).
const (
	maxOnePassCopies = 4096
	noOnePass        = "(?:)"
)

// measurePattern checks pat against maxSize: its classes lexically
// (classBound), before anything is parsed, then its parsed size.
func measurePattern(pat string, maxSize int) (patternCost, error) {
	return measureBounded(pat, classBound(pat), maxSize)
}

// measureBounded is measurePattern given classBound(pat).
func measureBounded(pat string, bound, maxSize int) (patternCost, error) {
	if limit := maxClassRanges(maxSize); bound > limit {
		return patternCost{}, &ClassesTooLargeError{Ranges: bound, Max: limit}
	}
	m, err := patternSize(pat)
	if err != nil {
		return m, err
	}
	if m.size > maxSize {
		return m, &PatternTooLargeError{Size: m.size, Max: maxSize}
	}
	return m, nil
}

// patternSize parses pat and estimates its compiled program: instructions,
// counting repetitions expanded as the compiler expands them, and class
// ranges, counted once (an expanded repetition shares its class's table).
// It saturates far above any limit instead of overflowing.
func patternSize(pat string) (patternCost, error) {
	re, err := syntax.Parse(pat, syntax.Perl)
	if err != nil {
		return patternCost{}, err
	}
	work := progSize(re)
	ranges := classRanges(re)
	m := patternCost{size: satAdd(work, (ranges+rangesPerInstruction-1)/rangesPerInstruction), work: work}
	expanded, copiers := onePassSize(re)
	if copies := expanded * (1 + copiers); expanded <= maxOnePassCopies && copiers <= maxOnePassCopies && copies <= maxOnePassCopies {
		m.onePass = true
		m.size = satAdd(m.size, work+(copies+rangesPerInstruction-1)/rangesPerInstruction)
	}
	return m, nil
}

// onePassSize bounds what a one-pass matcher of re would copy: expanded,
// the rune ranges of its rune instructions with repetitions expanded as
// the compiler expands them (a case-folded literal up to four), and
// copiers, its other instructions, each of which may hold a copy of all
// of them. Like progSize it saturates instead of overflowing.
func onePassSize(re *syntax.Regexp) (expanded, copiers int) {
	sat := func(n int) int { return min(n, sizeCap) }
	switch re.Op {
	case syntax.OpCharClass:
		return len(re.Rune) / 2, 0
	case syntax.OpLiteral:
		if re.Flags&syntax.FoldCase != 0 {
			return 4 * len(re.Rune), 0
		}
		return len(re.Rune), 0
	case syntax.OpAnyChar, syntax.OpAnyCharNotNL:
		return 2, 0
	case syntax.OpCapture:
		e, c := onePassSize(re.Sub[0])
		return e, sat(c + 2)
	case syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		e, c := onePassSize(re.Sub[0])
		return e, sat(c + 1)
	case syntax.OpRepeat:
		e, c := onePassSize(re.Sub[0])
		n := re.Max
		if n < 0 {
			n = re.Min + 1
		}
		n = max(n, 1)
		return sat(n * e), sat(n*c + n)
	case syntax.OpConcat, syntax.OpAlternate:
		for _, s := range re.Sub {
			e, c := onePassSize(s)
			expanded, copiers = sat(expanded+e), sat(copiers+c+1)
		}
		return expanded, copiers
	}
	return 0, 1 // anchors, empty matches: one instruction that copies
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
	work := 1
	if r, ok := re.(*sizedRegexp); ok {
		work = r.work
	}
	return int64(work) * int64(len(s)+1)
}

// regexFormatCost is the work of checking that s is a regular expression
// (format "regex"): reading it, and parsing it when its classes are within
// the limit (parseCost). It is never compiled (the check keeps nothing).
func regexFormatCost(s string, maxSize int) int64 {
	cost, _ := parseCost(s, maxSize)
	return int64(cost)
}
