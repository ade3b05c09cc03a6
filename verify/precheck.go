package verify

import (
	"errors"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/strictjson"
	"github.com/aovhq/aov/verify/schema"
)

// Precheck reads a request as Parse does (strict JSON, every rule of SPEC
// §3, the hashes, the schema compiled) but never evaluates the schema on the
// output. It is the gateway's check before it demands payment: enough to
// tell a request that can never succeed (422) from one worth paying for,
// at a cost that does not grow with the output's evaluation. The paid or
// free call itself is then parsed and evaluated once, by the verification
// service. It refuses every request Parse refuses for its fields or its
// schema, with the same error for the first problem.
func (v *Verifier) Precheck(body []byte) error {
	if int64(len(body)) > v.cfg.MaxBodyBytes {
		return apierr.TooLarge(v.cfg.MaxBodyBytes)
	}
	tree, err := strictjson.Decode(body, strictjson.Limits{MaxDepth: v.cfg.MaxDepth})
	if err != nil {
		var se *strictjson.Error
		if !errors.As(err, &se) {
			return apierr.Internal(err)
		}
		field := se.Path
		if field == "" {
			field = "body"
		}
		return apierr.Invalid(apierr.Field{Field: field, Problem: se.Problem, Fix: se.Fix})
	}
	return v.PrecheckTree(tree)
}

// PrecheckTree is Precheck of a request already decoded by strictjson (the
// arguments of an MCP tool call, read with the envelope around them).
func (v *Verifier) PrecheckTree(tree any) error {
	doc, ok := tree.(map[string]any)
	if !ok {
		return apierr.Invalid(apierr.Field{Field: "body", Problem: "is " + typeName(tree) + ", not a JSON object",
			Fix: `Send a JSON object with at least "task_id", "expected_schema" and "submitted_output".`})
	}
	req, err := v.parseDoc(doc, false)
	if err != nil {
		return err
	}
	sch, ok := doc["expected_schema"].(map[string]any)
	if !ok {
		return nil // parseDoc refuses every such request
	}
	if _, err := v.cache.Compile(sch, req.Hashes.Schema); err != nil {
		var ce *schema.CompileError
		if errors.As(err, &ce) {
			return apierr.Invalid(ce.Fields...)
		}
		return apierr.Invalid(apierr.Field{Field: "expected_schema", Problem: "does not compile as a JSON Schema", Fix: "Check the schema against its dialect's metaschema."})
	}
	return nil
}
