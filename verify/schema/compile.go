package schema

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/strictjson"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// field is the request field a compile problem is reported under.
const field = "expected_schema"

// baseURL is the retrieval URI the request's schema is compiled under. The
// .invalid top-level domain never resolves (RFC 2606), so even a bug that
// let a relative $ref reach a network loader could not fetch anything.
const baseURL = "https://expected-schema.invalid/schema.json"

// maxFields caps the problems reported for one schema, so a large broken
// schema cannot produce an unbounded error document.
const maxFields = 20

// Schema is a compiled expected_schema. It is immutable and safe for
// concurrent use by any number of Evaluate calls.
type Schema struct {
	sch  *jsonschema.Schema
	nums map[*jsonschema.Schema]*numBounds
	ints map[string]bool // locations of schemas whose type is integer
	// quotes holds, by location, what a failed const or enum expects: its
	// value written out and clipped once here, not at every failure.
	quotes map[string]*quoted
	// bytes estimates the memory the compiled schema holds, for the
	// cache's byte bound.
	bytes int64
	// maxPattern is the pattern size limit it was compiled with.
	maxPattern int
}

// bytesPerSchema is the measured heap a compiled subschema holds with its
// share of the maps around it (about 1.1 KB; a 1 MB schema of 25,000
// properties holds 28 MB).
const bytesPerSchema = 1152

// CompileError reports a schema that cannot be used: it does not compile,
// names an unsupported dialect, or refers to something outside the request.
// Fields are ready for an invalid_request answer (SPEC §6); none of them
// repeats schema or output content beyond keyword names and JSON pointers.
type CompileError struct {
	Fields []apierr.Field
	cause  error
}

// Error summarises the first problem; the full list is in Fields.
func (e *CompileError) Error() string {
	if len(e.Fields) == 0 {
		return "compiling expected_schema: invalid schema"
	}
	return fmt.Sprintf("compiling expected_schema: %s %s", e.Fields[0].Field, e.Fields[0].Problem)
}

// Unwrap exposes the compiler's own error for logs. Its text may quote the
// schema, so it must never be sent to a client.
func (e *CompileError) Unwrap() error { return e.cause }

// APIError is the 422 answer for this error on its own.
func (e *CompileError) APIError() *apierr.Error {
	a := apierr.Invalid(e.Fields...)
	a.Cause = e.cause
	return a
}

// refuseLoader is the production loader: it loads nothing. The compiler
// resolves the built-in metaschemas before it asks a loader, so everything
// that reaches here is outside the request.
type refuseLoader struct{}

var errNoFetch = errors.New("schemas outside the request are never fetched")

func (refuseLoader) Load(string) (any, error) { return nil, errNoFetch }

// compileOptions exist for the JSON Schema Test Suite only: production
// compiles with the zero value (refuse every load, 2020-12 by default).
type compileOptions struct {
	loader             jsonschema.URLLoader // serves the suite's remotes
	defaultDraft       *jsonschema.Draft    // the suite's draft-04..07 schemas omit $schema
	formatAsAnnotation bool                 // the 2019-09/2020-12 default the suite's required tests assume
	maxPatternSize     int                  // 0: DefaultMaxPatternSize
	maxSchemas         int                  // 0: DefaultMaxSchemas
}

// DefaultMaxSchemas bounds the values of a schema that countObjects counts
// (every subschema is one) when a Cache is given no limit. The compiler's work grows faster
// than linearly with their number (5,000 take about 0.2 s, 25,000 more
// than 3 s), and compiling happens before payment.
const DefaultMaxSchemas = 5000

// isData reports whether member k of an object in a schema tree holds
// data (const, enum, examples, default) rather than schemas. The members
// of a keyword that maps names to subschemas (properties, $defs, ...) are
// schemas whatever their names: a subschema named "const" under $defs is
// compiled like any other, so skipping it let 25,000 of them past
// MaxSchemas. names says whether the object is such a map.
func isData(k string, names bool) bool {
	switch k {
	case "const", "enum", "examples", "default":
		return !names
	}
	return false
}

// namedSchemas are the keywords whose value maps names to subschemas.
var namedSchemas = map[string]bool{
	"properties": true, "patternProperties": true, "$defs": true, "definitions": true,
	"dependentSchemas": true, "dependencies": true,
}

// schemaKeywords are the keywords whose value is a subschema, and
// listKeywords those whose value is an array of subschemas, in the
// supported drafts (items is either before 2020-12). namedSchemas map
// names to subschemas.
var (
	schemaKeywords = map[string]bool{
		"items": true, "additionalItems": true, "contains": true,
		"additionalProperties": true, "propertyNames": true, "unevaluatedItems": true,
		"unevaluatedProperties": true, "if": true, "then": true, "else": true, "not": true,
		"contentSchema": true,
	}
	listKeywords = map[string]bool{"items": true, "prefixItems": true, "allOf": true, "anyOf": true, "oneOf": true}
)

// schemaCost is what countObjects found a schema tree to cost.
type schemaCost struct {
	// objects counts the objects of the tree and the other values where a
	// subschema belongs; units adds to each one more for every
	// locationBytesPerSchema bytes of its location.
	objects, units int
	// work is the length of every location on the way down to each of
	// them, what the metaschema check writes (MaxLocationWork).
	work int64
}

// countObjects charges a schema tree before it compiles, stopping once its
// units reach limit or its work passes MaxLocationWork. Every object is
// charged, and every other value where a subschema belongs (a member of
// properties, $defs, ..., the value of not, items, ..., an item of allOf,
// prefixItems, ...): true and false are subschemas, and a number, string,
// null or array there is not one but is checked as one before the schema
// is refused. Each costs one unit, one more for each whole
// locationBytesPerSchema bytes of its location, and its work.
//
// Objects are charged wherever they are, data included, and their members
// as those of a schema: the values of const, enum, examples and default are
// data, but a $ref can point into them ("#/const/a", or through an $id, a
// percent-encoded pointer, a $dynamicRef), and the compiler then compiles
// what it finds there as a schema with every subschema under it: 25,000 of
// them under const took 5 s before payment when data was not counted.
// Charging every object as a schema needs no resolution of references to
// be right; a schema whose data alone holds thousands of objects is rare.
// Other values that are data (enum members, required names, booleans such
// as uniqueItems) cost nothing.
//
// The compiler names every subschema by its location, the schema's URL and
// a JSON pointer to it (percent-encoded), and builds and keeps that string
// several times: a member name is copied into the location of every
// subschema under it. 2,000 empty subschemas under one 400 KB property
// name cost it 107 s, 9.2 GB of allocation and 1.5 GB kept, before
// payment. Hence the units for the length of a location (the pointer as
// the compiler encodes it, pointerTokenBytes, each $id above it counted
// whole): at most limit × locationBytesPerSchema bytes of locations fit,
// however the names nest, and locations shorter than that cost nothing.
// And the check against the metaschema, for every value where a subschema
// belongs (numbers there included, before it refuses them), writes the
// value's location again by concatenation, token after token: it writes
// the location of every step on the way down, about the value's depth
// times its location's length, which the work charges (28 levels of
// 60-byte names over 500 subschemas, within the units, allocated 73 MB).
func countObjects(v any, limit int) schemaCost {
	var c schemaCost
	// loc is the length of v's location, work that of every location on
	// the way down to it; at says what belongs there.
	var walk func(v any, loc, work int64, at position)
	walk = func(v any, loc, work int64, at position) {
		if c.units >= limit || c.work > MaxLocationWork {
			return
		}
		switch v := v.(type) {
		case map[string]any:
			c.charge(loc, work)
			for _, id := range []string{"$id", "id"} {
				if s, ok := v[id].(string); ok {
					loc += pointerTokenBytes(s)
				}
			}
			for k, sub := range v {
				next := loc + 1 + pointerTokenBytes(k)
				walk(sub, next, work+next, memberPosition(k, at))
			}
			return
		case []any:
			item := position(0)
			if at&listOfSchemas != 0 {
				item = aSchema
			}
			for i, sub := range v {
				next := loc + 1 + int64(len(strconv.Itoa(i)))
				walk(sub, next, work+next, item)
			}
		}
		if at&aSchema != 0 {
			c.charge(loc, work)
		}
	}
	walk(v, 0, 0, aSchema)
	return c
}

// charge counts one value of the tree at a location of loc bytes, with
// work bytes of locations on the way down to it.
func (c *schemaCost) charge(loc, work int64) {
	c.objects++
	c.units += 1 + int(loc/locationBytesPerSchema)
	c.work += work
}

// position says what belongs where a value of a schema tree is.
type position uint8

const (
	aSchema       position = 1 << iota // a subschema
	listOfSchemas                      // an array of subschemas
	namesSchemas                       // an object mapping names to subschemas
)

// memberPosition is the position of member k of an object at position at,
// the object read as a schema whatever it is (a $ref can make one of any
// object).
func memberPosition(k string, at position) position {
	var p position
	if schemaKeywords[k] {
		p |= aSchema
	}
	if listKeywords[k] {
		p |= listOfSchemas
	}
	if namedSchemas[k] {
		p |= namesSchemas
	}
	if at&namesSchemas != 0 {
		p |= aSchema
	}
	return p
}

// MaxLocationWork bounds the work of a schema's locations, in bytes: for
// every object of the schema and every other value where a subschema
// belongs, the length of every location on the way down to it (countObjects;
// for /properties/a: /properties and /properties/a). The metaschema check
// allocates two to three times that, so a schema within it and MaxSchemas
// compiles for at most about 50 MB (measured: 5,000 ordinary subschemas
// 35 MB, 4,900 subschemas five levels deep at this limit 46 MB, 28 levels
// of 60-byte names at this limit 8 MB; TestDeepLocationsAreChargedByTheirWork).
// 5,000 subschemas two levels deep spend a tenth of it.
const MaxLocationWork = 4 << 20

// locationBytesPerSchema is the length of a subschema's location that
// counts as one more object toward MaxSchemas, and as one more subschema
// in the memory the cache counts (bytesPerSchema). The compiler allocates
// about 9 bytes and keeps about 2 per byte of location, and allocates
// about 7 KB and keeps about 1.1 KB per subschema (and, where names nest,
// up to 30 bytes allocated per byte of location), so 256 bytes of location
// cost at most what a subschema costs (measured:
// TestLongPropertyNamesAreChargedBeforeCompiling): the locations of all
// subschemas together stay under 1.3 MB at the default MaxSchemas.
// Ordinary locations, tens of bytes long, count nothing more.
const locationBytesPerSchema = 256

// pointerTokenBytes is an upper bound on the bytes of tok in a location
// the compiler writes: escaped for a JSON pointer ("~" and "/" take two
// bytes), then percent-encoded (any byte but a letter, a digit and
// "-._~$" may take three).
func pointerTokenBytes(tok string) int64 {
	n := int64(0)
	for i := 0; i < len(tok); i++ {
		switch c := tok[i]; {
		case c == '~' || c == '/':
			n += 2
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '.', c == '_', c == '$':
			n++
		default:
			n += 3
		}
	}
	return n
}

// MaxEnumSteps bounds the work of checking that the arrays of one schema
// the metaschemas require unique (uniqueKeywords) hold no duplicates, in
// the steps of the evaluation budget (unique.go): about 0.15 s of CPU at
// worst.
//
// The compiler validates a schema against its metaschema before payment
// (the gateway compiles to tell 422 from 402), with nothing to interrupt
// it, and that checks every such array for duplicates: it runs
// uniqueItems before it checks the items' type, so an array under
// required that should hold strings is deduplicated whatever it holds.
// Its hash ignores the sign of numbers, so members that differ only in
// signs are compared pairwise and deeply, as exact rationals: 300 arrays
// of 300 numbers (181 KB) cost it 3 s of CPU and 1 GB of allocation under
// enum, 5.7 s under required. uniqueItems in the schema is charged where
// it applies to the output (walker.hasDuplicates).
const MaxEnumSteps = DefaultMaxSteps / 4

// uniqueKeywords are the keywords whose arrays the metaschemas of the
// supported drafts (the library's metaschemas directory) declare
// "uniqueItems": true, directly (enum in draft-04, -06 and -07; type and
// required in all), or for every member of an object (dependentRequired
// in 2019-09 and 2020-12; the array form of dependencies in all of them,
// through their stringArray definition).
var uniqueKeywords = map[string]bool{
	"enum": false, "type": false, "required": false,
	"dependentRequired": true, "dependencies": true,
}

// checkUniqueArrays charges the duplicate check of every array the
// metaschemas require unique (uniqueKeywords), the compiler's buckets as
// the walk prices uniqueItems (walker.hasDuplicates), to one MaxEnumSteps
// budget, and refuses the schema at the array that passes it. Every such
// array is charged wherever it is, whatever the dialect: an embedded
// resource can name draft-04 with its own $schema, and a $ref can make a
// schema of data. An ordinary enum (thousands of short strings) costs a
// step per value.
//
// The arrays are first charged in the order they are found, which costs
// no allocation beyond the check's own. Only a schema past the budget is
// charged again, in the order of their locations, so the array named is
// the same on every compile of one schema.
func checkUniqueArrays(tree any) (apierr.Field, bool) {
	w := walker{limit: MaxEnumSteps, ctx: context.Background()}
	uniqueArrays(tree, nil, func(_ string, arr []any) bool {
		w.hasDuplicates(arr)
		return w.stop == nil
	})
	if w.stop == nil {
		return apierr.Field{}, true
	}
	type arrayAt struct {
		loc     []string
		keyword string
		arr     []any
	}
	var arrays []arrayAt
	var path []string
	uniqueArrays(tree, &path, func(keyword string, arr []any) bool {
		arrays = append(arrays, arrayAt{slices.Clone(path), keyword, arr})
		return true
	})
	sort.Slice(arrays, func(i, j int) bool { return slices.Compare(arrays[i].loc, arrays[j].loc) < 0 })
	w = walker{limit: MaxEnumSteps, ctx: context.Background()}
	for _, a := range arrays {
		if w.hasDuplicates(a.arr); w.stop != nil {
			return apierr.Field{
				Field:   field + shortPointer(a.loc),
				Problem: fmt.Sprintf("brings the work of checking the schema's %s values for duplicates past %d steps", a.keyword, MaxEnumSteps),
				Fix:     "Send shorter arrays there: members that differ only in the signs of their numbers are compared with each other one pair at a time, and long numbers cost more to compare, so list fewer of them.",
			}, false
		}
	}
	// Not reached: the same arrays in another order cost the same.
	return apierr.Field{Field: field, Problem: "brings the work of checking the schema's arrays for duplicates past the limit", Fix: "Send a smaller schema."}, false
}

// uniqueArrays calls fn with every array in v that the metaschemas require
// unique (uniqueKeywords), and its keyword, until fn returns false. When
// path is not nil it holds the array's location during the call (tracking
// it costs an allocation per array index passed).
func uniqueArrays(v any, path *[]string, fn func(keyword string, arr []any) bool) bool {
	push := func(tok string) {
		if path != nil {
			*path = append(*path, tok)
		}
	}
	pop := func() {
		if path != nil {
			*path = (*path)[:len(*path)-1]
		}
	}
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			push(k)
			perMember, unique := uniqueKeywords[k]
			if arr, ok := sub.([]any); ok && unique && !perMember && !fn(k, arr) {
				return false
			}
			if m, ok := sub.(map[string]any); ok && perMember {
				for name, dep := range m {
					if arr, ok := dep.([]any); ok {
						push(name)
						more := fn(k, arr)
						pop()
						if !more {
							return false
						}
					}
				}
			}
			if !uniqueArrays(sub, path, fn) {
				return false
			}
			pop()
		}
	case []any:
		for i, sub := range v {
			if path != nil {
				push(strconv.Itoa(i))
			}
			if !uniqueArrays(sub, path, fn) {
				return false
			}
			pop()
		}
	}
	return true
}

// compile builds a Schema from a decoded tree.
func compile(tree any, opts compileOptions) (*Schema, error) {
	switch tree.(type) {
	case map[string]any, bool:
	default:
		return nil, &CompileError{Fields: []apierr.Field{{
			Field:   field,
			Problem: "is not a JSON Schema (it must be an object)",
			Fix:     `Send a JSON Schema object, for example {"type": "object", "properties": {...}}.`,
		}}}
	}
	if f, ok := checkDialect(tree); !ok {
		return nil, &CompileError{Fields: []apierr.Field{f}}
	}
	maxSchemas := opts.maxSchemas
	if maxSchemas <= 0 {
		maxSchemas = DefaultMaxSchemas
	}
	cost := countObjects(tree, maxSchemas+1)
	switch {
	case cost.objects > maxSchemas:
		return nil, &CompileError{Fields: []apierr.Field{{
			Field:   field,
			Problem: fmt.Sprintf("has more than %d objects and subschemas together (every object, those in its const, enum, default and examples values too, and every value where a subschema belongs, true and false included)", maxSchemas),
			Fix:     "Send a smaller schema: share repeated parts through $defs and $ref instead of writing them out again, and keep large example documents out of it.",
		}}}
	case cost.units > maxSchemas:
		return nil, &CompileError{Fields: []apierr.Field{{
			Field: field,
			Problem: fmt.Sprintf("has more than %d objects, each counting one more for every %d bytes of its location (the JSON pointer to it, which repeats every property name above it)",
				maxSchemas, locationBytesPerSchema),
			Fix: "Use shorter property names, above all for properties with many subschemas under them: a name is written again in the location of every subschema below it.",
		}}}
	case cost.work > MaxLocationWork:
		return nil, &CompileError{Fields: []apierr.Field{{
			Field: field,
			Problem: fmt.Sprintf("has locations that cost more than %d bytes together: each subschema costs the length of every location on the way down to it (the JSON pointers to it and to each value above it, which repeat every property name above them)",
				MaxLocationWork),
			Fix: "Nest subschemas less deeply and use shorter property names, above all for properties with many subschemas under them: a location costs about its depth times its length.",
		}}}
	}
	if f, ok := checkUniqueArrays(tree); !ok {
		return nil, &CompileError{Fields: []apierr.Field{f}}
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if opts.defaultDraft != nil {
		c.DefaultDraft(opts.defaultDraft)
	}
	if !opts.formatAsAnnotation {
		c.AssertFormat()
	}
	var loader jsonschema.URLLoader = refuseLoader{}
	if opts.loader != nil {
		loader = opts.loader
	}
	c.UseLoader(loader)
	maxPattern := opts.maxPatternSize
	if maxPattern <= 0 {
		maxPattern = DefaultMaxPatternSize
	}
	engine := newRegexpEngine(maxPattern)
	c.UseRegexpEngine(engine.compile)
	if err := c.AddResource(baseURL, tree); err != nil {
		return nil, translate(err, tree, engine)
	}
	sch, err := c.Compile(baseURL)
	if err != nil {
		return nil, translate(err, tree, engine)
	}
	// From here the schema is shared, and the engine is its format check.
	engine.frozen = true
	nums, ints, quotes, n, held := precompute(sch)
	// Long locations are kept as long as the compiler keeps its schemas.
	bytes := int64(n+cost.units-cost.objects)*bytesPerSchema + engine.bytes() + held
	return &Schema{sch: sch, nums: nums, ints: ints, quotes: quotes, bytes: bytes, maxPattern: maxPattern}, nil
}

// dialects are the $schema values accepted, without scheme and trailing '#'.
var dialects = map[string]bool{
	"json-schema.org/draft/2020-12/schema": true,
	"json-schema.org/draft/2019-09/schema": true,
	"json-schema.org/draft-07/schema":      true,
	"json-schema.org/draft-06/schema":      true,
	"json-schema.org/draft-04/schema":      true,
}

const dialectFix = "Set $schema to one of https://json-schema.org/draft/2020-12/schema, " +
	"https://json-schema.org/draft/2019-09/schema, http://json-schema.org/draft-07/schema#, " +
	"http://json-schema.org/draft-06/schema# or http://json-schema.org/draft-04/schema#, " +
	"or leave it out for 2020-12."

// checkDialect refuses a root $schema that is not a string or that names a
// json-schema.org dialect the service does not implement (draft-03, the
// unversioned "latest" alias, drafts yet to come). A $schema naming any
// other URL is a custom metaschema, which the loader refuses like any
// other external reference.
func checkDialect(tree any) (apierr.Field, bool) {
	obj, ok := tree.(map[string]any)
	if !ok {
		return apierr.Field{}, true
	}
	v, ok := obj["$schema"]
	if !ok {
		return apierr.Field{}, true
	}
	s, ok := v.(string)
	if !ok {
		return apierr.Field{Field: field + "/$schema", Problem: "is not a string", Fix: dialectFix}, false
	}
	u := strings.TrimSuffix(s, "#")
	if rest, ok := strings.CutPrefix(u, "https://"); ok {
		u = rest
	} else if rest, ok := strings.CutPrefix(u, "http://"); ok {
		u = rest
	}
	if strings.HasPrefix(u, "json-schema.org/") && !dialects[u] {
		return apierr.Field{Field: field + "/$schema", Problem: "names a JSON Schema dialect this service does not support", Fix: dialectFix}, false
	}
	return apierr.Field{}, true
}

// ref is a reference found in the raw schema, for naming the field of a
// reference that cannot be resolved.
type ref struct {
	ptr, val string
}

// scanRefs lists the string values of $ref, $dynamicRef, $recursiveRef and
// $schema in schema positions, skipping keywords whose values are data
// (names: v maps names to subschemas, see isData). path is the location
// of v; a pointer is written only for a reference found, since a member
// name is part of the location of everything under it.
func scanRefs(v any, path []string, names bool, out []ref) []ref {
	switch v := v.(type) {
	case map[string]any:
		for k, sub := range v {
			if isData(k, names) {
				continue
			}
			switch k {
			case "$ref", "$dynamicRef", "$recursiveRef", "$schema":
				if s, ok := sub.(string); ok && !names {
					out = append(out, ref{pointer(append(path, k)), s})
					continue
				}
			}
			out = scanRefs(sub, append(path, k), !names && namedSchemas[k], out)
		}
	case []any:
		for i, sub := range v {
			out = scanRefs(sub, append(path, strconv.Itoa(i)), false, out)
		}
	}
	return out
}

func escapePtr(tok string) string {
	if !strings.ContainsAny(tok, "~/") {
		return tok
	}
	return strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1")
}

// findRef returns the pointer of the reference that resolves to url,
// comparing the parts a relative reference keeps after resolution.
func findRef(refs []ref, url string, fragment bool) (ref, bool) {
	doc, frag, _ := strings.Cut(url, "#")
	best, found := ref{}, false
	for _, r := range refs {
		rdoc, rfrag, _ := strings.Cut(r.val, "#")
		if fragment {
			if rfrag == frag && (rdoc == "" || strings.HasSuffix(doc, rdoc)) {
				best, found = r, true
				break
			}
			continue
		}
		if rdoc != "" && strings.HasSuffix(doc, strings.TrimSuffix(rdoc, "/")) {
			if !found || len(r.ptr) < len(best.ptr) {
				best, found = r, true
			}
		}
	}
	return best, found
}

const inlineFix = `Inline the referenced schema under "$defs" and point "$ref" at it, for example "#/$defs/address"; schemas outside the request are never fetched.`

// translate maps a compiler error to request fields. The compiler's messages
// quote schema content, so none of their text is reused. engine holds the
// verdicts on the patterns the compile asked for.
func translate(err error, tree any, engine *regexpEngine) error {
	refs := scanRefs(tree, nil, false, nil)
	sort.Slice(refs, func(i, j int) bool { return refs[i].ptr < refs[j].ptr })
	ce := &CompileError{cause: err}
	add := func(ptr, problem, fix string) {
		ce.Fields = append(ce.Fields, apierr.Field{Field: field + shortenPointer(ptr), Problem: problem, Fix: fix})
	}

	var (
		load     *jsonschema.LoadURLError
		scheme   *jsonschema.UnsupportedURLSchemeError
		notFound *jsonschema.JSONPointerNotFoundError
		badPtr   *jsonschema.InvalidJsonPointerError
		anchor   *jsonschema.AnchorNotFoundError
		meta     *jsonschema.SchemaValidationError
		regex    *jsonschema.InvalidRegexError
		dupID    *jsonschema.DuplicateIDError
		dupAnc   *jsonschema.DuplicateAnchorError
		draft    *jsonschema.UnsupportedDraftError
		vocab    *jsonschema.UnsupportedVocabularyError
	)
	switch {
	case errors.As(err, &meta):
		var verr *jsonschema.ValidationError
		if errors.As(meta.Err, &verr) {
			seen := map[string]bool{}
			named := func(loc []string, name string) []string { return memberPath(tree, loc, name) }
			metaFields(verr, nil, seen, named, func(loc []string, ptr, problem, fix string) {
				// The metaschema's format "regex" refuses a pattern too
				// large to evaluate just as one that does not parse; say
				// which, from the engine's verdict (never parsing the
				// pattern again).
				if problem == problemInvalidRegex {
					// A pattern is a value (pattern) or a member name
					// (patternProperties, checked by propertyNames).
					pat, ok := atPath(tree, loc).(string)
					if !ok && len(loc) > 0 {
						pat, ok = loc[len(loc)-1], true
					}
					if ok {
						problem, fix = regexProblem(engine.refusal(pat))
					}
				}
				ce.Fields = append(ce.Fields, apierr.Field{Field: field + ptr, Problem: problem, Fix: fix})
			})
			// The metaschema's errors come in the order the library met
			// them, which follows Go map iteration over the schema's
			// members: order them by path, so the first problem (the
			// 422's message) is the same on every compile of one schema.
			sort.SliceStable(ce.Fields, func(i, j int) bool { return ce.Fields[i].Field < ce.Fields[j].Field })
		}
		if len(ce.Fields) == 0 {
			add("", "is not valid against the metaschema of its dialect", "Correct the schema so it validates against its dialect's metaschema.")
		}
	case errors.As(err, &load), errors.As(err, &scheme):
		url := ""
		if load != nil {
			url = load.URL
		}
		if r, ok := findRef(refs, url, false); ok && url != "" {
			if strings.HasSuffix(r.ptr, "/$schema") {
				add(r.ptr, "names a metaschema that is not one of the supported dialects", dialectFix)
			} else {
				add(r.ptr, "refers to a schema outside the request", inlineFix)
			}
		} else {
			add("", "refers to a schema outside the request", inlineFix)
		}
	case errors.As(err, &notFound), errors.As(err, &badPtr), errors.As(err, &anchor):
		url := ""
		switch {
		case notFound != nil:
			url = notFound.URL
		case badPtr != nil:
			url = badPtr.URL
		case anchor != nil:
			url = anchor.Reference
		}
		fix := `Point "$ref" at a subschema that exists in the request, for example "#/$defs/address", or add the missing definition.`
		if r, ok := findRef(refs, url, true); ok {
			add(r.ptr, "points at a location that does not exist in the schema", fix)
		} else {
			add("", "has a $ref that points at a location that does not exist in the schema", fix)
		}
	case errors.As(err, &regex):
		problem, fix := regexProblem(regex.Err)
		add(urlPointer(regex.URL), problem, fix)
	case errors.As(err, &dupID):
		add(dupID.Ptr2, "repeats an $id used elsewhere in the same schema", "Give every embedded schema resource a distinct $id.")
	case errors.As(err, &dupAnc):
		add(dupAnc.Ptr2, "repeats an anchor used elsewhere in the same schema resource", "Give every $anchor and $dynamicAnchor a distinct name within its resource.")
	case errors.As(err, &draft), errors.As(err, &vocab):
		add("/$schema", "names a dialect or vocabulary this service does not support", dialectFix)
	default:
		add("", "does not compile as a JSON Schema", "Check the schema against its dialect's metaschema, and that every $id, $anchor and $ref is a valid URI reference.")
	}
	return ce
}

// regexProblem describes the refusal of a pattern.
func regexProblem(err error) (problem, fix string) {
	var big *PatternTooLargeError
	var classes *ClassesTooLargeError
	var all *PatternsTooLargeError
	var read *ParseBudgetError
	switch {
	case errors.As(err, &big):
		return tooLargeProblem(big.Size, big.Max), tooLargeFix
	case errors.As(err, &classes):
		return classesTooLargeProblem(classes.Ranges, classes.Max), classesTooLargeFix
	case errors.As(err, &all):
		return patternsTooLargeProblem(all.Size), patternsTooLargeFix
	case errors.As(err, &read):
		return parseBudgetProblem(read.Work, read.Max), patternsTooLargeFix
	}
	return problemInvalidRegex, invalidRegexFix
}

const (
	problemInvalidRegex = "is not a valid regular expression"
	invalidRegexFix     = "Use a regular expression in RE2 syntax (no lookaround, no backreferences)."
	classesTooLargeFix  = "Use fewer character classes: each Unicode class such as \\pL or \\p{Greek} is a table of up to hundreds of ranges, so write one class with a repetition ([\\p{L} ]{1,64}) instead of many."
	tooLargeFix         = "Use a smaller pattern: large repetition counts such as {1000} are expanded, so write fewer and smaller ones, or check the length with minLength/maxLength instead."
)

const patternsTooLargeFix = "Use fewer and smaller patterns (one pattern written in many places counts once), or check lengths with minLength/maxLength."

func patternsTooLargeProblem(size int) string {
	return fmt.Sprintf("brings the schema's regular expressions to about %d instructions, more than the limit of %d for all of them together", size, MaxPatternsSize)
}

func parseBudgetProblem(work, max int) string {
	return fmt.Sprintf("brings the work of parsing the schema's regular expressions to %d units, more than the limit of %d for all of them together", work, max)
}

func classesTooLargeProblem(ranges, max int) string {
	return fmt.Sprintf("is a regular expression whose character classes are too large to evaluate (up to %d character ranges; the limit is %d)", ranges, max)
}

func tooLargeProblem(size, max int) string {
	return fmt.Sprintf("is a regular expression too large to evaluate (about %d instructions; the limit is %d)", size, max)
}

// atPath returns the value at location loc in tree, or nil.
func atPath(tree any, loc []string) any {
	cur := tree
	for _, tok := range loc {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[tok]
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil
			}
			cur = c[i]
		default:
			return nil
		}
	}
	return cur
}

// memberPath is the location of the member name of an object at depth
// len(loc) in tree, loc being that object's location as the library
// reported it, which may have been overwritten (metaFields): of the
// objects at that depth that have the member, one that is the value of a
// keyword whose member names the metaschemas check (propertyNames:
// patternProperties, $vocabulary) before any other (a $defs member of the
// same name is no candidate), then the one whose location agrees with loc
// in the most tokens, the first in the order of their tokens on a tie.
// Where none has it, loc is taken as it is. No pointer is written: a
// member name is part of the location of everything under it.
func memberPath(tree any, loc []string, name string) []string {
	var best []string
	bestScore := -1
	path := make([]string, 0, len(loc))
	var walk func(v any)
	walk = func(v any) {
		obj, ok := v.(map[string]any)
		if !ok {
			if arr, isArr := v.([]any); isArr && len(path) < len(loc) {
				for i, sub := range arr {
					path = append(path, strconv.Itoa(i))
					walk(sub)
					path = path[:len(path)-1]
				}
			}
			return
		}
		if len(path) == len(loc) {
			if _, has := obj[name]; has {
				score := 0
				if n := len(path); n > 0 && namesChecked[path[n-1]] {
					score = len(loc) + 1 // more than any agreement with loc
				}
				for i, tok := range path {
					if tok == loc[i] {
						score++
					}
				}
				if score > bestScore || (score == bestScore && slices.Compare(path, best) < 0) {
					best, bestScore = append(best[:0], path...), score
				}
			}
			return
		}
		for k, sub := range obj {
			path = append(path, k)
			walk(sub)
			path = path[:len(path)-1]
		}
	}
	walk(tree)
	if bestScore < 0 {
		best = append(best[:0], loc...)
	}
	return append(best, name)
}

// namesChecked are the keywords whose member names the metaschemas
// check with propertyNames.
var namesChecked = map[string]bool{"patternProperties": true, "$vocabulary": true}

// shortPointer is the JSON pointer of loc as a refusal shows it: every
// token shortened as every path a client is shown shortens member names
// (strictjson.ShortKey), within MaxLocationBytes as locations in results
// are, so a refusal's size depends on how many fields it names, not on
// the names.
func shortPointer(loc []string) string {
	b := make([]byte, 0, 64)
	for _, tok := range loc {
		step := escapePtr(strictjson.ShortKey(tok))
		if !stepFits(len(b), 1+len(step)) {
			return string(append(b, locationCut...))
		}
		b = append(append(b, '/'), step...)
	}
	return string(b)
}

// shortenPointer is shortPointer of a JSON pointer ("" or "/a/b").
func shortenPointer(ptr string) string {
	if len(ptr) <= strictjson.MaxKeyInPath {
		return ptr // no token to shorten
	}
	loc := strings.Split(ptr, "/")[1:]
	for i, tok := range loc {
		loc[i] = unescapePtr(tok)
	}
	return shortPointer(loc)
}

func pointer(loc []string) string {
	var b strings.Builder
	for _, tok := range loc {
		b.WriteByte('/')
		b.WriteString(escapePtr(tok))
	}
	return b.String()
}

func unescapePtr(tok string) string {
	return strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
}

// urlPointer returns the JSON pointer part of a compiled location.
func urlPointer(u string) string {
	_, frag, _ := strings.Cut(u, "#")
	return frag
}

// metaFields adds one field per schema location at which the metaschema
// failed, from the leaves of its error tree: add gets the location and its
// pointer as a refusal shows it (shortPointer); locations that show alike
// are one field.
//
// Inside propertyNames the metaschema validates a member name, and the
// locations below it are relative to that name: prefix is then the
// location of the name's member ("patternProperties", <name>), which named
// finds in the schema (memberPath): the library keeps the location of a
// propertyNames failure without copying it (validator.go,
// "verr.InstanceLocation = vd.vloc"), so the members it validates next
// overwrite its tokens, and only its length can be trusted.
func metaFields(e *jsonschema.ValidationError, prefix []string, seen map[string]bool, named func(loc []string, name string) []string, add func(loc []string, ptr, problem, fix string)) {
	if len(seen) >= maxFields {
		return
	}
	if len(e.Causes) > 0 {
		if pn, ok := e.ErrorKind.(*kind.PropertyNames); ok {
			prefix = append(slices.Clip(prefix), named(e.InstanceLocation, pn.Property)...)
		}
		for _, c := range e.Causes {
			metaFields(c, prefix, seen, named, add)
		}
		return
	}
	loc := append(slices.Clip(prefix), e.InstanceLocation...)
	ptr := shortPointer(loc)
	if seen[ptr] {
		return
	}
	seen[ptr] = true
	problem, fix := "is not valid for its keyword", "Correct this value so the schema validates against its dialect's metaschema."
	switch k := e.ErrorKind.(type) {
	case *kind.Type:
		problem = "has type " + k.Got + " where " + strings.Join(k.Want, " or ") + " is required"
		fix = "Use a value of type " + strings.Join(k.Want, " or ") + " here."
	case *kind.Enum:
		problem = "is not one of the values this keyword allows"
	case *kind.Minimum, *kind.ExclusiveMinimum:
		problem = "is below the smallest value this keyword allows"
		fix = "Use a non-negative value here."
	case *kind.MinItems:
		problem = fmt.Sprintf("needs at least %d entries", k.Want)
	case *kind.UniqueItems:
		problem = "has duplicate entries"
		fix = "List each entry once."
	case *kind.Format:
		if k.Want == "regex" {
			problem = problemInvalidRegex
			fix = invalidRegexFix
		} else {
			problem = "is not a valid " + k.Want
		}
	case *kind.FalseSchema:
		problem = "is not allowed here"
		fix = "Remove it."
	case *kind.Pattern:
		problem = "does not have the form this keyword requires"
	}
	add(loc, ptr, problem, fix)
}
