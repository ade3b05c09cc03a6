package verify

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/strictjson"
	"github.com/aovhq/aov/verify/schema"
)

// Detail values: the response shape (SPEC §4).
const (
	DetailFull    = "full"
	DetailCompact = "compact"
)

// Rule types (SPEC §3).
const (
	RuleSumEquals = "sum_equals"
	RuleGTE       = "gte"
	RuleLTE       = "lte"
	RuleExistsIn  = "exists_in"
	RuleUnique    = "unique"
)

// DefaultTolerance is a rule's tolerance when the request gives none.
const DefaultTolerance = 1e-9

// defaultToleranceText is DefaultTolerance as it enters request_hash.
const defaultToleranceText = json.Number("1e-9")

// MaxIDChars bounds task_id and agent_id, in Unicode characters (ValidID).
const MaxIDChars = 200

// ValidID reports whether s is a task_id or agent_id this service accepts:
// 1 to 200 characters of UTF-8. A request's JSON carries nothing else (the
// decoder refuses invalid UTF-8), so the UTF-8 half matters to a caller
// that builds the request from other text, as the gateway's seller mode
// does from placeholders a client fills: json.Marshal would send such a
// value as U+FFFD, and the receipt would name an id other than the one the
// caller holds.
func ValidID(s string) bool {
	return s != "" && utf8.ValidString(s) && utf8.RuneCountInString(s) <= MaxIDChars
}

// maxProblems caps the field problems one refusal lists.
const maxProblems = 100

// Request is a parsed, valid verification request. Its exported fields are
// what callers (verifierd, the gateway) need around a verification; the
// checks themselves read the unexported ones.
type Request struct {
	TaskID             string
	AgentID            *string
	Detail             string // DetailFull or DetailCompact
	StrictContentCheck bool
	EnforceRules       bool
	// Hashes are the four receipt hashes of SPEC §5, computed once by Parse.
	Hashes receipt.Hashes

	output any
	report schema.Report // the schema evaluation, done by Parse
	bounds []bound
	rules  []rule
	result Result // the result but for its id and instant, built by Parse
}

// bound is one entry of "bounds", limits parsed.
type bound struct {
	path      Path
	min, max  *float64
	ifPresent bool
}

// rule is one entry of "rules", operands parsed.
type rule struct {
	typ                    string
	check                  string // "consistency:" + typ
	field                  Path
	fieldText              string // field exactly as the caller wrote it, for flags
	equalsField, otherPath *Path  // sum_equals / gte, lte operand paths
	inField                *Path
	equals, value          *float64
	values                 []any
	tolerance              float64
	ifPresent              bool
}

// The fields of a request, in the order problems with them are reported.
var requestFields = []string{"task_id", "agent_id", "expected_schema", "submitted_output",
	"strict_content_check", "bounds", "rules", "enforce_rules", "detail"}

var ruleFields = []string{"type", "field", "equals_field", "equals", "other_field", "value",
	"in_field", "values", "tolerance", "if_present"}

var boundFields = []string{"min", "max", "if_present"}

// operands lists, per rule type, the operand fields it takes (exactly one of
// them must be given; unique takes none).
var operands = map[string][2]string{
	RuleSumEquals: {"equals_field", "equals"},
	RuleGTE:       {"other_field", "value"},
	RuleLTE:       {"other_field", "value"},
	RuleExistsIn:  {"in_field", "values"},
	RuleUnique:    {},
}

const ruleTypeFix = "Use one of: 'sum_equals', 'gte', 'lte', 'exists_in' or 'unique'."

// problems collects every field problem of a request, so one answer names
// them all.
type problems struct {
	fields []apierr.Field
	more   bool
}

func (p *problems) add(field, problem, fix string) {
	if len(p.fields) >= maxProblems {
		p.more = true
		return
	}
	p.fields = append(p.fields, apierr.Field{Field: field, Problem: problem, Fix: fix})
}

func (p *problems) err() error {
	if len(p.fields) == 0 {
		return nil
	}
	fields := p.fields
	if p.more {
		fields = append(fields, apierr.Field{Field: "request",
			Problem: "has more than " + strconv.Itoa(maxProblems) + " problems; only the first " + strconv.Itoa(maxProblems) + " are listed",
			Fix:     "Fix the listed fields and send the request again to see the rest."})
	}
	return apierr.Invalid(fields...)
}

// key renders a member name as a field path step after prefix.
func key(prefix, name string) string {
	var b strings.Builder
	b.WriteString(prefix)
	strictjson.AppendKey(&b, name)
	return b.String()
}

// addUnknownFields reports every member of m (the object at field) that is
// not one of known, as "is not a field of <what>", in sorted order so a
// request gets the same errors on every run.
func addUnknownFields(p *problems, field string, m map[string]any, known []string, what, fix string) {
	var unknown []string
	for k := range m {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	slices.Sort(unknown)
	for _, k := range unknown {
		p.add(key(field, k), "is not a field of "+what, fix)
	}
}

// typeName names the JSON type of a decoded value, for "is a number, not a
// string" problems: the type, never the value.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case bool:
		return "a boolean"
	case json.Number:
		return "a number"
	case string:
		return "a string"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return "an unknown type"
}

func wrongType(p *problems, field string, v any, want, fix string) {
	p.add(field, "is "+typeName(v)+", not "+want, fix)
}

// Parse reads a request body: strict JSON (strictjson), every rule of SPEC
// §3, the four hashes, and the schema compiled and evaluated against the
// output, so that a schema that cannot be used (it does not compile, it
// refers outside the request, or it needs more than the evaluation's step
// or regular-expression budget on this output) is refused here, as are
// bounds and rules that need more than the integrity-work budget. It then
// runs the integrity checks. A refusal is an *apierr.Error: 413 for a body
// over MaxBodyBytes, 503 verification_timeout past Config.Timeout,
// otherwise 422 naming every problem found with a fix. Check then only
// writes the result.
func (v *Verifier) Parse(body []byte) (*Request, error) {
	return v.ParseContext(context.Background(), body)
}

// ParseContext is Parse under a context: the work stops when ctx is done
// or after Config.Timeout, whichever comes first, and the caller gets a
// 503 verification_timeout (nothing is charged; the same request may
// succeed on a less loaded machine).
func (v *Verifier) ParseContext(ctx context.Context, body []byte) (*Request, error) {
	ctx, cancel := context.WithTimeout(ctx, v.cfg.Timeout)
	defer cancel()
	return v.parse(ctx, body)
}

func (v *Verifier) parse(ctx context.Context, body []byte) (*Request, error) {
	if int64(len(body)) > v.cfg.MaxBodyBytes {
		return nil, apierr.TooLarge(v.cfg.MaxBodyBytes)
	}
	tree, err := strictjson.Decode(body, strictjson.Limits{MaxDepth: v.cfg.MaxDepth})
	if err != nil {
		var se *strictjson.Error
		if !errors.As(err, &se) {
			return nil, apierr.Internal(err)
		}
		field := se.Path
		if field == "" {
			field = "body"
		}
		return nil, apierr.Invalid(apierr.Field{Field: field, Problem: se.Problem, Fix: se.Fix})
	}
	doc, ok := tree.(map[string]any)
	if !ok {
		return nil, apierr.Invalid(apierr.Field{Field: "body", Problem: "is " + typeName(tree) + ", not a JSON object",
			Fix: `Send a JSON object with at least "task_id", "expected_schema" and "submitted_output".`})
	}
	if err := ctx.Err(); err != nil {
		return nil, apierr.Timeout(v.cfg.Timeout, err)
	}
	return v.parseDocContext(ctx, doc, true)
}

// parseDoc checks a decoded request; with compile it also compiles and
// evaluates the schema (without, neither: the hashes alone, or a caller
// that compiles for itself).
func (v *Verifier) parseDoc(doc map[string]any, compile bool) (*Request, error) {
	return v.parseDocContext(context.Background(), doc, compile)
}

func (v *Verifier) parseDocContext(ctx context.Context, doc map[string]any, compile bool) (*Request, error) {
	var p problems
	req := &Request{Detail: DetailFull}

	// task_id
	switch x := doc["task_id"].(type) {
	case string:
		if !ValidID(x) {
			p.add("task_id", "must be 1 to 200 characters long", "Send a task id of 1 to 200 characters.")
		}
		req.TaskID = x
	default:
		if _, ok := doc["task_id"]; !ok {
			p.add("task_id", "is required", "Send your id for this task as \"task_id\", a string of 1 to 200 characters.")
		} else {
			wrongType(&p, "task_id", x, "a string", "Send a task id of 1 to 200 characters as a string.")
		}
	}

	// agent_id
	switch x := doc["agent_id"].(type) {
	case nil:
	case string:
		if !ValidID(x) {
			p.add("agent_id", "must be 1 to 200 characters long", "Send an agent id of 1 to 200 characters, or null.")
		}
		req.AgentID = &x
	default:
		wrongType(&p, "agent_id", x, "a string or null", "Send the agent id as a string of 1 to 200 characters, or null.")
	}

	// expected_schema: its problems come from the compiler below.
	schemaTree, hasSchema := doc["expected_schema"]
	schemaOK := false
	switch schemaTree.(type) {
	case map[string]any:
		schemaOK = true
	default:
		if !hasSchema {
			p.add("expected_schema", "is required", `Send the JSON Schema the output must satisfy, for example {"type": "object"}.`)
		} else {
			wrongType(&p, "expected_schema", schemaTree, "an object", `Send a JSON Schema object; {} accepts any output.`)
		}
	}

	// submitted_output: any JSON value, but present.
	output, hasOutput := doc["submitted_output"]
	if !hasOutput {
		p.add("submitted_output", "is required", "Send the output to check as \"submitted_output\" (any JSON value).")
	}
	req.output = output

	req.StrictContentCheck = boolField(&p, doc, "strict_content_check")
	req.EnforceRules = boolField(&p, doc, "enforce_rules")

	switch x := doc["detail"].(type) {
	case string:
		if x != DetailFull && x != DetailCompact {
			p.add("detail", "is not one of the allowed values", "Use one of: 'full' or 'compact'.")
		}
		req.Detail = x
	default:
		if _, ok := doc["detail"]; ok {
			wrongType(&p, "detail", x, "a string", "Use one of: 'full' or 'compact'.")
		}
	}

	req.bounds = v.parseBounds(&p, doc["bounds"])
	req.rules = v.parseRules(&p, doc["rules"])

	addUnknownFields(&p, "", doc, requestFields, "a verification request",
		"Remove it; the fields are task_id, agent_id, expected_schema, submitted_output, strict_content_check, bounds, rules, enforce_rules and detail.")

	// Every number must be exactly the value its hash records (number.go).
	for _, name := range requestFields {
		if v, ok := doc[name]; ok {
			checkNumbers(&p, name, v)
		}
	}

	// The work of the bounds and rules is counted here, before anything
	// is evaluated (and in the gateway's precheck, before payment): only
	// a well-formed request can be counted.
	if len(p.fields) == 0 {
		if _, over := integrityWork(output, req.bounds, req.rules, v.cfg.MaxIntegrityWork); over != "" {
			p.add(over, integrityWorkProblem(v.cfg.MaxIntegrityWork), integrityWorkFix)
		}
	}

	// Hash before compiling: the schema hash is the cache key. Hashing can
	// only fail on trees strictjson would not produce.
	var hs hashState
	if schemaOK && hasOutput {
		if err := hs.compute(doc); err != nil {
			return nil, apierr.Internal(err)
		}
		req.Hashes = hs.hashes
	}
	if schemaOK && hasOutput && compile {
		// The compile is a verification's work as much as its evaluation
		// (a schema within every limit can cost a fraction of a second
		// and tens of MiB to compile): it runs in the slot, so that
		// MaxConcurrent bounds the memory of many requests compiling at
		// once, not only of those evaluating.
		select {
		case v.slots <- struct{}{}:
		case <-ctx.Done():
			return nil, apierr.Timeout(v.cfg.Timeout, ctx.Err())
		}
		defer func() { <-v.slots }()
		sch, err := v.cache.Compile(schemaTree, req.Hashes.Schema)
		if err != nil {
			var ce *schema.CompileError
			if errors.As(err, &ce) {
				for _, f := range ce.Fields {
					p.add(f.Field, f.Problem, f.Fix)
				}
			} else {
				p.add("expected_schema", "does not compile as a JSON Schema", "Check the schema against its dialect's metaschema.")
			}
		}
		// Evaluate here, not in Check, so that a schema too complex for its
		// output (over the step budget) is a 422 like any other unusable
		// schema, before payment, instead of a charged "fail"; and run the
		// integrity checks here too, so that one time limit and one slot
		// cover all of a verification's work. Only an otherwise valid
		// request is worth the work.
		if sch != nil && len(p.fields) == 0 {
			err := v.verify(ctx, sch, req)
			var budget interface{ Fields() []apierr.Field }
			switch {
			case errors.As(err, &budget):
				for _, f := range budget.Fields() {
					p.add(f.Field, f.Problem, f.Fix)
				}
			case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
				return nil, apierr.Timeout(v.cfg.Timeout, err)
			case err != nil:
				return nil, apierr.Internal(err)
			}
		}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	return req, nil
}

// verify runs the schema evaluation within the verifier's budgets, then
// the integrity checks, until ctx is done, in the MaxConcurrent slot the
// caller took for the schema's compile (parseDocContext).
func (v *Verifier) verify(ctx context.Context, sch *schema.Schema, req *Request) error {
	rep, err := sch.EvaluateContext(ctx, req.output, schema.Options{
		Undeclared: req.StrictContentCheck, MaxSteps: v.cfg.MaxSchemaSteps,
		MaxRegexWork: v.cfg.MaxRegexWork, MaxFailures: v.cfg.ListCap,
	})
	if err != nil {
		return err
	}
	req.report = rep
	return v.integrity(ctx, req)
}

// boolField reads an optional boolean (default false).
func boolField(p *problems, doc map[string]any, name string) bool {
	v, ok := doc[name]
	if !ok {
		return false
	}
	b, ok := v.(bool)
	if !ok {
		wrongType(p, name, v, "a boolean", "Send true or false, or leave it out for false.")
	}
	return b
}

// number parses a decoded number; strictjson guarantees it fits a double.
func number(v json.Number) float64 {
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil || math.IsInf(f, 0) {
		return 0
	}
	return f
}

func (v *Verifier) parseBounds(p *problems, raw any) []bound {
	var m map[string]any
	switch x := raw.(type) {
	case nil:
		return nil
	case map[string]any:
		m = x
	default:
		wrongType(p, "bounds", x, "an object", `Send bounds as an object from path to limits, for example {"total": {"min": 0}}, or leave it out.`)
		return nil
	}
	if len(m) > v.cfg.MaxBounds {
		p.add("bounds", "has more than "+strconv.Itoa(v.cfg.MaxBounds)+" entries",
			"Send at most "+strconv.Itoa(v.cfg.MaxBounds)+" bounds per request.")
		return nil
	}
	paths := make([]string, 0, len(m))
	for k := range m {
		paths = append(paths, k)
	}
	slices.Sort(paths)
	out := make([]bound, 0, len(m))
	for _, k := range paths {
		field := key("bounds", k)
		var b bound
		path, perr := ParsePath(k)
		if perr != nil {
			p.add(field, "is not a valid path: it "+perr.Problem, perr.Fix)
		}
		b.path = path
		entry, ok := m[k].(map[string]any)
		if !ok {
			wrongType(p, field, m[k], "an object", `Send the limits as an object, for example {"min": 0, "max": 100}.`)
			continue
		}
		// In boundFields' order, not the map's: a request's problems come
		// back in one order on every run.
		for _, name := range boundFields {
			val, given := entry[name]
			if !given {
				continue
			}
			switch name {
			case "min", "max":
				switch n := val.(type) {
				case nil:
				case json.Number:
					f := number(n)
					if name == "min" {
						b.min = &f
					} else {
						b.max = &f
					}
				default:
					wrongType(p, field+"."+name, val, "a number", "Send the limit as a JSON number, or leave it out.")
				}
			case "if_present":
				bp, ok := val.(bool)
				if !ok {
					wrongType(p, field+".if_present", val, "a boolean", "Send true or false, or leave it out for false.")
				}
				b.ifPresent = bp
			}
		}
		addUnknownFields(p, field, entry, boundFields, "a bound", "Remove it; a bound has min, max and if_present.")
		switch {
		case entry["min"] == nil && entry["max"] == nil:
			p.add(field, "has neither min nor max", `Give at least one limit, for example {"min": 0}.`)
		case b.min != nil && b.max != nil && *b.min > *b.max:
			p.add(field, "has min greater than max", "Make min less than or equal to max.")
		}
		out = append(out, b)
	}
	return out
}

func (v *Verifier) parseRules(p *problems, raw any) []rule {
	var list []any
	switch x := raw.(type) {
	case nil:
		return nil
	case []any:
		list = x
	default:
		wrongType(p, "rules", x, "an array", `Send rules as an array of rule objects, for example [{"type": "unique", "field": "items[].id"}], or leave it out.`)
		return nil
	}
	if len(list) > v.cfg.MaxRules {
		p.add("rules", "has more than "+strconv.Itoa(v.cfg.MaxRules)+" rules",
			"Send at most "+strconv.Itoa(v.cfg.MaxRules)+" rules per request.")
		return nil
	}
	out := make([]rule, 0, len(list))
	for i, el := range list {
		field := "rules[" + strconv.Itoa(i) + "]"
		m, ok := el.(map[string]any)
		if !ok {
			wrongType(p, field, el, "an object", `Send each rule as an object with "type" and "field".`)
			continue
		}
		out = append(out, parseRule(p, field, m))
	}
	return out
}

func parseRule(p *problems, field string, m map[string]any) rule {
	r := rule{tolerance: DefaultTolerance}

	typeKnown := false
	switch x := m["type"].(type) {
	case string:
		if _, typeKnown = operands[x]; !typeKnown {
			p.add(field+".type", "is not one of the allowed values", ruleTypeFix)
		}
		r.typ, r.check = x, checkConsistencyPrefix+x
	default:
		if _, ok := m["type"]; !ok {
			p.add(field+".type", "is required", ruleTypeFix)
		} else {
			wrongType(p, field+".type", x, "a string", ruleTypeFix)
		}
	}

	if path, ok := pathField(p, field, m, "field", true, false); ok {
		r.field = *path
		r.fieldText, _ = m["field"].(string)
	}

	addUnknownFields(p, field, m, ruleFields, "a rule",
		"Remove it; a rule has type, field, equals_field, equals, other_field, value, in_field, values, tolerance and if_present.")

	switch x := m["tolerance"].(type) {
	case nil:
		if _, ok := m["tolerance"]; ok {
			wrongType(p, field+".tolerance", x, "a number", "Send a non-negative number, or leave it out for 1e-9.")
		}
	case json.Number:
		r.tolerance = number(x)
		if r.tolerance < 0 {
			p.add(field+".tolerance", "is negative", "Send a non-negative number, or leave it out for 1e-9.")
		}
	default:
		wrongType(p, field+".tolerance", x, "a number", "Send a non-negative number, or leave it out for 1e-9.")
	}
	if x, ok := m["if_present"]; ok {
		b, isBool := x.(bool)
		if !isBool {
			wrongType(p, field+".if_present", x, "a boolean", "Send true or false, or leave it out for false.")
		}
		r.ifPresent = b
	}

	// Operands: read every one that is given (null means not given), then
	// check them against what the type takes.
	given := map[string]bool{}
	if path, ok := pathField(p, field, m, "equals_field", false, true); ok {
		r.equalsField, given["equals_field"] = path, path != nil
	}
	if path, ok := pathField(p, field, m, "other_field", false, true); ok {
		r.otherPath, given["other_field"] = path, path != nil
	}
	if path, ok := pathField(p, field, m, "in_field", false, false); ok {
		r.inField, given["in_field"] = path, path != nil
	}
	if f, ok := numberField(p, field, m, "equals"); ok {
		r.equals, given["equals"] = f, f != nil
	}
	if f, ok := numberField(p, field, m, "value"); ok {
		r.value, given["value"] = f, f != nil
	}
	switch x := m["values"].(type) {
	case nil:
	case []any:
		if len(x) == 0 {
			p.add(field+".values", "is empty", "List at least one allowed value, or use 'in_field'.")
		}
		r.values, given["values"] = x, true
	default:
		wrongType(p, field+".values", x, "an array", "Send the allowed values as an array, or use 'in_field'.")
	}
	if !typeKnown {
		return r
	}
	takes := operands[r.typ]
	for _, name := range []string{"equals_field", "equals", "other_field", "value", "in_field", "values"} {
		if given[name] && name != takes[0] && name != takes[1] {
			fix := "Remove it; a 'unique' rule takes no operand."
			if takes[0] != "" {
				fix = "Remove it; a '" + r.typ + "' rule takes '" + takes[0] + "' or '" + takes[1] + "'."
			}
			p.add(field+"."+name, "is not used by a '"+r.typ+"' rule", fix)
		}
	}
	if takes[0] == "" {
		return r
	}
	_, has0 := m[takes[0]]
	_, has1 := m[takes[1]]
	has0 = has0 && m[takes[0]] != nil
	has1 = has1 && m[takes[1]] != nil
	switch {
	case !has0 && !has1:
		p.add(field, "has neither '"+takes[0]+"' nor '"+takes[1]+"'",
			"Add '"+takes[0]+"' (a path into the output) or '"+takes[1]+"' ("+operandKind(takes[1])+").")
	case has0 && has1:
		p.add(field, "has both '"+takes[0]+"' and '"+takes[1]+"'", "Keep only one of them.")
	}
	return r
}

func operandKind(name string) string {
	if name == "values" {
		return "an array of allowed values"
	}
	return "a number"
}

// pathField reads a path-valued rule member. ok is false when it was
// present but unusable (a problem was added); a nil path with ok means
// absent or null. single requires a path to one value (no "[]").
func pathField(p *problems, field string, m map[string]any, name string, required, single bool) (*Path, bool) {
	raw, present := m[name]
	if raw == nil {
		if !required {
			return nil, true
		}
		if present {
			wrongType(p, field+"."+name, raw, "a string", pathFix)
		} else {
			p.add(field+"."+name, "is required", "Send the path of the values the rule checks, for example 'line_items[].line_total'.")
		}
		return nil, false
	}
	s, ok := raw.(string)
	if !ok {
		wrongType(p, field+"."+name, raw, "a string", pathFix)
		return nil, false
	}
	path, perr := ParsePath(s)
	if perr != nil {
		p.add(field+"."+name, "is not a valid path: it "+perr.Problem, perr.Fix)
		return nil, false
	}
	if single && !path.single() {
		p.add(field+"."+name, "names every element of an array ('[]') where one value is compared",
			"Point it at a single value, for example 'total'.")
		return nil, false
	}
	return &path, true
}

// numberField reads a number-valued rule member; nil when absent or null.
func numberField(p *problems, field string, m map[string]any, name string) (*float64, bool) {
	switch x := m[name].(type) {
	case nil:
		return nil, true
	case json.Number:
		f := number(x)
		return &f, true
	default:
		wrongType(p, field+"."+name, x, "a number", "Send a JSON number, or leave it out.")
		return nil, false
	}
}
