package apidocs

import "strings"

// BazaarVerify is x402's bazaar extension (extensions.bazaar in
// PAYMENT-REQUIRED) for the verification routes: how to call them (info.input,
// with the SPEC §10 invoice as the example body), what comes back
// (info.output), and a JSON Schema of both. Facilitators and agents that
// catalog x402 resources read it to list and call the route without reading
// the docs. The schema is the request schema of the OpenAPI document,
// self-contained under $defs and kept small, because it travels in a header.
func BazaarVerify() map[string]any {
	all := componentSchemas()
	defs := obj{}
	for _, name := range []string{"VerificationRequest", "Bound", "Rule"} {
		defs[name] = localRefs(all[name])
	}
	info := obj{
		"input": obj{"type": "http", "method": "POST", "bodyType": "json", "body": invoiceRequest(129.5)},
		"output": obj{"type": "json", "example": obj{
			"summary": obj{"result": "pass", "blocking_checks": []any{}},
			"result":  "pass",
		}},
	}
	schema := obj{
		"$schema": "https://json-schema.org/draft/2020-12/schema",
		"type":    "object",
		"properties": obj{
			"input": obj{
				"type":     "object",
				"required": []any{"type", "method", "bodyType", "body"},
				"properties": obj{
					"type":     obj{"const": "http"},
					"method":   obj{"const": "POST"},
					"bodyType": obj{"const": "json"},
					"body":     obj{"$ref": "#/$defs/VerificationRequest"},
				},
			},
			"output": obj{
				"type":        "object",
				"description": "The signed verification result (SPEC §4): summary, result, hashes, scores, hints, verify and attestation; see /openapi.json.",
			},
		},
		"required": []any{"input"},
		"$defs":    defs,
	}
	return obj{"info": info, "schema": schema}
}

// localRefs copies v with the OpenAPI component references rewritten to
// $defs of the same document.
func localRefs(v any) any {
	switch t := v.(type) {
	case obj:
		out := make(obj, len(t))
		for k, e := range t {
			if s, ok := e.(string); ok && k == "$ref" {
				out[k] = strings.Replace(s, "#/components/schemas/", "#/$defs/", 1)
				continue
			}
			out[k] = localRefs(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = localRefs(e)
		}
		return out
	}
	return v
}
