// Package schema compiles the expected_schema of a verification request and
// evaluates submitted output against it, counting every check (SPEC §4).
//
// It is for JSON Schema only: request parsing, bounds, rules, placeholder
// detection and the result document belong to package verify. Compilation
// and validation are done by github.com/santhosh-tekuri/jsonschema/v6; this
// package adds what a paid verification needs on top of it:
//
//   - No network, ever. The compiler's loader knows only the built-in
//     metaschemas of the supported dialects. A $ref to anything that is not
//     in the request is a compile error whose fix is to inline the schema
//     under $defs. A service that fetched URLs named by its callers would be
//     an open proxy and a way to make verdicts depend on third parties.
//   - Dialects: $schema selects 2020-12 (the default when absent), 2019-09,
//     draft-07, draft-06 or draft-04. Anything else is refused at compile time.
//     format is asserted in every dialect (an "email" that is not an e-mail
//     fails). contentEncoding, contentMediaType and contentSchema stay
//     annotations, as the 2019-09 and 2020-12 specifications require by default.
//   - A bounded LRU cache of compiled schemas keyed by the caller's schema
//     hash, where concurrent requests for the same uncached hash compile once.
//   - Check counting (Report.Total, Report.Passed) and short, input-free
//     failure descriptions (Failure) for hints.
//
// # How checks are counted
//
// Every assertion keyword evaluated at an instance location is one check;
// applicators count nothing themselves, they only decide where the
// assertions of their subschemas are evaluated. Precisely:
//
//   - Type-agnostic assertions count wherever their schema is evaluated:
//     type, enum, const. format counts where the instance is a string.
//     Type-specific assertions count only where the instance has the type
//     they constrain (the specification says they are ignored otherwise):
//     minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf for
//     numbers; minLength, maxLength, pattern for strings; minItems,
//     maxItems, uniqueItems (when true) for arrays; required,
//     minProperties, maxProperties, dependentRequired and the array form of
//     dependencies (one check per keyword, however many names it lists) for
//     objects.
//   - At one location, type, const, enum and format are evaluated first; the
//     first of them that fails ends the evaluation there (the keywords after
//     it are not evaluated and not counted), as the validator does.
//   - The boolean schema false is one failing check wherever it is applied:
//     additionalProperties: false counts one failed check per undeclared
//     property, items: false one per extra item, and so on. true counts
//     nothing.
//   - properties, patternProperties, additionalProperties, items,
//     prefixItems, additionalItems, unevaluatedProperties, unevaluatedItems,
//     propertyNames, dependentSchemas, the schema form of dependencies,
//     allOf, $ref, $dynamicRef and $recursiveRef count the checks of their
//     subschemas at the locations they apply them to.
//   - anyOf: when at least one branch passes, the checks of the passing
//     branches count (all passed); when none passes, the checks of every
//     branch count (so every failure reported is a counted check).
//   - oneOf: like anyOf, and when more than one branch passes, one more
//     failing check (keyword "oneOf") counts for the broken exclusivity.
//   - not: one check; the checks inside it do not count (they describe
//     what must not hold).
//   - if/then/else: the checks of if do not count (it is a condition); the
//     checks of then (when if passes) or else (when it fails) count.
//   - contains: one check (keyword "minContains" when minContains is set,
//     else "contains"), plus one for maxContains when set; the checks of the
//     contains schema on each item do not count (it is a search).
//   - A reference cycle that never reaches an instance (a schema that
//     refers to itself at the same location) is one failing check.
//
// Passed + failed == Total always holds, and Report.Failures is empty
// exactly when failed is zero. The verdict and the failure details come from
// the validator; the count comes from a walk over the compiled schema that
// mirrors the validator's evaluation order. The official JSON Schema Test
// Suite is run through both and they agree on every required test.
//
// Every evaluation has budgets, enforced by the counting walk as it goes
// (it runs before the validator and does at least the validator's work,
// or charges for it):
// steps (Options.MaxSteps, one per subschema applied at one location; for
// const and enum, each comparison by the size of the smaller value when
// it goes past the top level, the larger's size for two numbers, one per
// 16 otherwise, see walker.compare; for uniqueItems one per value hashed
// plus the comparisons the validator will make, see unique.go; a string
// counts one value per 4 KB of its text, a number one per 16 digits (see
// digitsPerValue), and a string costs one step per KB each time a
// schema is applied to it, which the validator copies it for, and one per
// 8 bytes each time a format is checked on it, see formatBytesPerStep; a
// $dynamicRef or $recursiveRef that searches the dynamic scope one per 16
// schemas in it, see walker.searchScope, and every application one per
// 128 schemas applied at its location before it, which the search for
// a reference cycle passes (cycleEntriesPerStep), and a cycle by the
// keyword locations the validator renders for it, see walker.cycleCost;
// under unevaluated*, each application one per 4 members it copies or
// looks up, see walker.initUneval;
// a failing
// application by the errors the validator keeps for it, see
// walker.failure; required names by those missing, as are the members
// additionalProperties: false refuses, and names and members
// looked up one step per 16, see walker.missing, as are the entries of
// dependencies, dependentSchemas and dependentRequired each application
// scans, see walker.scanEntries; strict_content_check's
// paths by their length, see walker.declPath),
// since nested applicators that reapply shared subschemas make the work
// exponential in the schema's size; regular-expression work
// (Options.MaxRegexWork, each match charged its pattern's size times the
// string's length before it runs, see regex.go); and a context, checked as
// the walk goes. An evaluation past a budget stops and never passes.
// The validator runs after the walk, takes no context and cannot be
// interrupted: the walk's charges are the only bound on its work.
// Compilation has limits too: the number of values where a subschema
// belongs and of objects, data included, each counting more for a long
// location (CacheConfig.MaxSchemas, countObjects), and the work of their
// locations (MaxLocationWork), the size of each
// pattern (CacheConfig.MaxPatternSize), its character classes bounded
// before it is parsed (prescan.go), and
// the duplicate check of the arrays the metaschemas require unique
// (MaxEnumSteps, checkUniqueArrays).
// A report keeps at most Options.MaxFailures failures, so the memory of a
// result does not grow with the number of failing values.
//
// Example: the invoice schema of SPEC §10 (type and required at the root,
// type and pattern on invoice_id, enum on currency, type and minItems on
// line_items, per line item type, required and the type and minimum of its
// properties, type on total) on a two-item invoice is 2+2+1+2+2×7+1 = 22
// checks.
package schema
