package apidocs

// The component schemas of the OpenAPI document: the contract's shapes
// (SPEC §3 request, §4 result, §6 error, §7 free_trial, §8 reputation) as
// JSON Schema 2020-12, which OpenAPI 3.1 uses as is.

type obj = map[string]any

func ref(name string) obj { return obj{"$ref": "#/components/schemas/" + name} }

func str(desc string) obj { return obj{"type": "string", "description": desc} }

func hexHash(desc string) obj {
	return obj{"type": "string", "pattern": "^[0-9a-f]{64}$", "description": desc}
}

func arrayOf(items obj, desc string) obj {
	return obj{"type": "array", "items": items, "description": desc}
}

func count(desc string) obj { return obj{"type": "integer", "minimum": 0, "description": desc} }

func closed(required []string, props obj, desc string) obj {
	o := obj{"type": "object", "properties": props, "additionalProperties": false, "description": desc}
	if len(required) > 0 {
		o["required"] = required
	}
	return o
}

const pathDoc = "A path into submitted_output: dot-separated keys from the root, `[]` after a key means every element of that array (`total`, `line_items[].line_total`). A `$.` prefix is accepted and ignored."

func componentSchemas() obj {
	ruleTypes := []any{"sum_equals", "gte", "lte", "exists_in", "unique"}
	resultEnum := obj{"type": "string", "enum": []any{"pass", "fail"}}
	nullableStr := func(desc string) obj { return obj{"type": []any{"string", "null"}, "description": desc} }
	nullableNum := func(desc string) obj { return obj{"type": []any{"number", "null"}, "description": desc} }

	tally := closed([]string{"ratio", "passed", "total"}, obj{
		"ratio":  obj{"type": "number", "minimum": 0, "maximum": 1, "description": "passed/total rounded to 6 decimals; 1.0 when there are no checks."},
		"passed": count("Checks passed."),
		"total":  count("Checks run."),
	}, "One family of checks.")

	fullKeys := []string{"summary", "next_actions", "result", "verification_id", "task_id", "agent_id",
		"output_hash", "schema_hash", "rules_hash", "request_hash", "verified_at", "verifier_version",
		"enforce_rules", "strict_content_check", "errors", "errors_total", "errors_omitted",
		"errors_detail", "errors_detail_total", "errors_detail_omitted", "flags", "flags_total",
		"flags_omitted", "hints", "hints_total", "hints_omitted", "schema_compliance",
		"integrity_checks", "overall", "verify", "attestation"}
	compactKeys := []string{"summary", "next_actions", "result", "verification_id", "task_id", "agent_id",
		"output_hash", "schema_hash", "rules_hash", "verified_at", "verifier_version", "enforce_rules",
		"strict_content_check", "verify", "attestation"}
	resultProps := obj{
		"summary": closed([]string{"result", "blocking_checks"}, obj{
			"result":          resultEnum,
			"blocking_checks": arrayOf(obj{"type": "string"}, "Names of the failed blocking checks, first failure first (e.g. `consistency:sum_equals`)."),
		}, "The verdict and what blocked it."),
		"next_actions":          arrayOf(ref("NextAction"), "On pass: attach_receipt (seller), proceed_to_payment (buyer). On fail: repair_and_reverify using hints."),
		"result":                resultEnum,
		"verification_id":       obj{"type": "string", "format": "uuid", "description": "UUID v4 of this verification."},
		"task_id":               str("The caller's task id."),
		"agent_id":              nullableStr("The agent that produced the output, or null."),
		"output_hash":           hexHash("SHA-256 of the RFC 8785 form of submitted_output."),
		"schema_hash":           hexHash("SHA-256 of the RFC 8785 form of expected_schema."),
		"rules_hash":            hexHash("SHA-256 of the RFC 8785 form of {\"bounds\": ..., \"rules\": ...} exactly as sent."),
		"request_hash":          hexHash("SHA-256 of the RFC 8785 form of the request with every default filled in (full detail only)."),
		"verified_at":           obj{"type": "string", "pattern": `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00$`, "description": "UTC, RFC 3339 with microseconds and +00:00."},
		"verifier_version":      str("Version of the verifier that ran the checks."),
		"enforce_rules":         obj{"type": "boolean"},
		"strict_content_check":  obj{"type": "boolean"},
		"errors":                arrayOf(obj{"type": "string"}, "One sentence per blocking failure (capped)."),
		"errors_total":          count("All errors, shown or not."),
		"errors_omitted":        count("Errors left out by the cap."),
		"errors_detail":         arrayOf(ref("ErrorDetail"), "Structured blocking failures (capped)."),
		"errors_detail_total":   count(""),
		"errors_detail_omitted": count(""),
		"flags":                 arrayOf(ref("Flag"), "Every rule violation: severity error when it blocks (enforce_rules), warning otherwise (capped)."),
		"flags_total":           count(""),
		"flags_omitted":         count(""),
		"hints":                 arrayOf(ref("Hint"), "Where and what to repair, for an agent."),
		"hints_total":           count(""),
		"hints_omitted":         count(""),
		"schema_compliance":     ref("Tally"),
		"integrity_checks":      ref("Tally"),
		"overall":               ref("Tally"),
		"verify":                ref("VerifyBlock"),
		"attestation":           ref("Attestation"),
	}
	pick := func(keys []string) obj {
		o := obj{}
		for _, k := range keys {
			o[k] = resultProps[k]
		}
		return o
	}

	return obj{
		"VerificationRequest": obj{
			"type":                 "object",
			"additionalProperties": false,
			"required":             []any{"task_id", "expected_schema", "submitted_output"},
			"description":          "SPEC §3. Unknown fields, wrong types, unknown rule types, unparsable paths, missing operands, duplicate keys, invalid UTF-8 and integers outside ±(2^53−1) are all invalid_request (422).",
			"properties": obj{
				"task_id":              obj{"type": "string", "minLength": 1, "maxLength": 200, "description": "Your id for the task."},
				"agent_id":             obj{"type": []any{"string", "null"}, "maxLength": 200, "default": nil, "description": "The agent that produced the output: an unauthenticated label unless bound by X-Wallet-Auth. Ids starting with `test-` are for examples and never get a score."},
				"expected_schema":      obj{"type": "object", "description": "A JSON Schema; dialect from `$schema`, default 2020-12. Never fetched from the network: `$ref` must stay inside the document."},
				"submitted_output":     obj{"description": "The output being checked: any JSON value."},
				"strict_content_check": obj{"type": "boolean", "default": false, "description": "Also fail undeclared properties and placeholder content (empty strings, TODO, TBD, lorem ipsum, N/A, ...)."},
				"bounds":               obj{"type": []any{"object", "null"}, "default": nil, "additionalProperties": ref("Bound"), "description": "Numeric ranges, path → bound. " + pathDoc},
				"rules":                obj{"type": []any{"array", "null"}, "default": nil, "items": ref("Rule"), "description": "Cross-field rules."},
				"enforce_rules":        obj{"type": "boolean", "default": false, "description": "Rule violations block a pass (otherwise they are warnings in flags)."},
				"detail":               obj{"type": "string", "enum": []any{"full", "compact"}, "default": "full", "description": "Response shape only; not part of any hash."},
			},
		},
		"Bound": closed(nil, obj{
			"min":        obj{"type": "number"},
			"max":        obj{"type": "number"},
			"if_present": obj{"type": "boolean", "default": false, "description": "A path that resolves to nothing passes."},
		}, "A numeric range: min and/or max."),
		"Rule": closed([]string{"type", "field"}, obj{
			"type":         obj{"type": "string", "enum": ruleTypes},
			"field":        str(pathDoc),
			"equals_field": nullableStr("sum_equals: the path whose value the sum must equal."),
			"equals":       nullableNum("sum_equals: the number the sum must equal."),
			"other_field":  nullableStr("gte/lte: compare against the value at this path."),
			"value":        nullableNum("gte/lte: compare against this number."),
			"in_field":     nullableStr("exists_in: the values must occur among the values at this path."),
			"values":       obj{"type": []any{"array", "null"}, "description": "exists_in: the allowed values."},
			"tolerance":    obj{"type": "number", "minimum": 0, "default": 1e-9, "description": "sum_equals: allowed difference of the sum; gte and lte: slack past the limit. Exact decimal arithmetic on the numbers as written."},
			"if_present":   obj{"type": "boolean", "default": false, "description": "A path that resolves to nothing skips the rule (it passes)."},
		}, "A cross-field rule. sum_equals needs equals_field or equals; gte/lte need other_field or value; exists_in needs in_field or values."),
		"VerificationResult": obj{
			"type": "object", "additionalProperties": false, "required": fullKeys, "properties": pick(fullKeys),
			"description": "SPEC §4 full result (`detail: \"full\"`), keys in this order. A fail is a complete answer and is charged like a pass.",
		},
		"VerificationResultCompact": obj{
			"type": "object", "additionalProperties": false, "required": compactKeys, "properties": pick(compactKeys),
			"description": "SPEC §4 compact result (`detail: \"compact\"`).",
		},
		"NextAction": obj{"type": "object", "required": []any{"action"}, "properties": obj{
			"action": str("attach_receipt, proceed_to_payment or repair_and_reverify."),
			"for":    str("Who the action is for: seller or buyer."),
			"using":  str("What to use: hints."),
		}},
		"ErrorDetail": obj{"type": "object", "required": []any{"check", "path", "expected", "found", "message"}, "properties": obj{
			"check": str("`schema:<keyword>`, `bounds:min`, `bounds:max`, `consistency:<rule type>`, `strict:undeclared_property` or `strict:placeholder`."),
			"path":  str("Instance path, `$` for the root."), "expected": str(""), "found": str("Never the submitted content itself."),
			"message": str("The same text as the matching errors entry."),
		}},
		"Flag": closed([]string{"check", "field", "severity", "detail"}, obj{
			"check": str(""), "field": str("The rule's field exactly as the request wrote it."),
			"severity": obj{"type": "string", "enum": []any{"error", "warning"}}, "detail": str("The finding, without the check name."),
		}, "A rule violation."),
		"Hint": closed([]string{"source", "check", "path", "expected", "found"}, obj{
			"source": obj{"type": "string", "enum": []any{"schema", "integrity"}}, "check": str(""), "path": str(""), "expected": str(""), "found": str(""),
		}, "A repair hint."),
		"Tally": tally,
		"VerifyBlock": closed([]string{"public_key_url", "key_version", "canonicalization", "hash_algorithm", "service", "mcp"}, obj{
			"public_key_url":   obj{"type": "string", "format": "uri", "description": "The agent card holding every public key version ever used."},
			"key_version":      str("The key version that signed this response."),
			"canonicalization": obj{"const": "RFC 8785 (JCS)"},
			"hash_algorithm":   obj{"const": "SHA-256"},
			"service":          str("The service name."),
			"mcp":              obj{"type": "string", "format": "uri"},
		}, "How to verify this response offline."),
		"Attestation": closed([]string{"algorithm", "key_version", "timestamp", "signature"}, obj{
			"algorithm":   obj{"const": "Ed25519"},
			"key_version": str(""),
			"timestamp":   str("The same instant as verified_at, or as a trust score's computed_at."),
			"signature":   obj{"type": "string", "contentEncoding": "base64", "description": "Standard base64 of the 64-byte Ed25519 signature over the RFC 8785 form of {context, algorithm, key_version, attested_at, response}."},
		}, "The Ed25519 receipt."),
		"Error": obj{
			"type":        "object",
			"required":    []any{"code", "message", "status", "retryable", "charged", "next_actions"},
			"description": "SPEC §6: every error that is not a payment refusal. Never charged; never echoes input.",
			"properties": obj{
				"code":        obj{"type": "string", "enum": errorCodeEnum(), "description": "Stable; switch on it.\n\n" + errorCodeTable()},
				"message":     str("One sentence: says nothing was charged and what to do."),
				"status":      obj{"type": "integer"},
				"retryable":   obj{"type": "boolean", "description": "Whether the same request can succeed later."},
				"retry_after": obj{"type": "integer", "minimum": 1, "description": "Seconds; present when retryable (also the Retry-After header)."},
				"charged":     obj{"const": false},
				"next_actions": arrayOf(obj{"type": "object", "required": []any{"action"}, "properties": obj{
					"action":        obj{"type": "string"},
					"fields":        arrayOf(obj{"type": "string"}, ""),
					"after_seconds": obj{"type": "integer"},
					"using":         obj{"type": "string"},
					"for":           obj{"type": "string"},
				}}, "Machine-readable next steps."),
				"fields": arrayOf(closed([]string{"field", "problem", "fix"}, obj{
					"field": str("e.g. rules[0].type"), "problem": str(""), "fix": str("A concrete fix."),
				}, ""), "invalid_request: every field problem."),
			},
		},
		"PaymentRequirements": obj{
			"type":     "object",
			"required": []any{"scheme", "network", "amount", "asset", "payTo", "maxTimeoutSeconds"},
			"properties": obj{
				"scheme":            obj{"type": "string", "examples": []any{"exact"}},
				"network":           obj{"type": "string", "description": "CAIP-2 chain id, e.g. eip155:8453 (Base)."},
				"amount":            obj{"type": "string", "pattern": "^[0-9]+$", "description": "Price in the asset's atomic units."},
				"asset":             str("Token address (USDC by default)."),
				"payTo":             str("Address that receives the payment."),
				"maxTimeoutSeconds": obj{"type": "integer"},
				"extra":             obj{"type": "object", "description": "Exact EVM: the token's EIP-712 name and version."},
			},
		},
		"PaymentRequired": obj{
			"type":        "object",
			"required":    []any{"x402Version", "resource", "accepts"},
			"description": "x402 v2 PaymentRequired, base64-encoded in the PAYMENT-REQUIRED header.",
			"properties": obj{
				"x402Version": obj{"const": 2},
				"error":       obj{"type": "string"},
				"resource": obj{"type": "object", "required": []any{"url"}, "properties": obj{
					"url": obj{"type": "string"}, "description": obj{"type": "string"}, "mimeType": obj{"type": "string"},
				}},
				"accepts":    arrayOf(ref("PaymentRequirements"), "The ways to pay."),
				"extensions": obj{"type": "object"},
			},
		},
		"PaymentRequiredBody": obj{
			"description": "The JSON body of a 402 (or of a 400 for a payment header that does not decode): the PaymentRequired document, the refusal reason, and the caller's live free allowance.",
			"allOf": []any{ref("PaymentRequired"), obj{"type": "object", "properties": obj{
				"reason":     obj{"type": "string", "description": "Why a payment was refused; absent on a plain demand for payment. Nothing was charged.\n\n" + paymentCodeTable()},
				"free_trial": ref("FreeTrial"),
			}}},
		},
		"FreeTrial": obj{
			"type":        "object",
			"description": "SPEC §7: the caller's live free allowance.",
			"required": []any{"available", "via", "transport", "url", "tool", "calls_per_client_per_day",
				"remaining_calls_today", "resets_at", "client", "rest_free", "launch", "message"},
			"properties": obj{
				"available":                obj{"type": "boolean"},
				"via":                      obj{"const": "mcp+rest"},
				"transport":                obj{"const": "streamable-http"},
				"url":                      obj{"type": "string", "description": "The MCP endpoint."},
				"tool":                     obj{"type": "string", "examples": []any{"verify_schema"}},
				"calls_per_client_per_day": count(""),
				"remaining_calls_today":    count(""),
				"resets_at":                obj{"type": "string", "format": "date-time", "description": "The next UTC midnight."},
				"client":                   str("How the client is identified."),
				"rest_free":                obj{"type": "boolean"},
				"launch":                   obj{"type": "boolean"},
				"message":                  str(""),
				"code":                     obj{"const": "free_trial_exhausted", "description": "Only when available is false."},
			},
		},
		"SettleResponse": obj{
			"type":        "object",
			"description": "x402 v2 SettleResponse, base64-encoded in the PAYMENT-RESPONSE header.",
			"required":    []any{"success", "transaction", "network"},
			"properties": obj{
				"success": obj{"type": "boolean"}, "errorReason": obj{"type": "string"}, "payer": obj{"type": "string"},
				"transaction": obj{"type": "string"}, "network": obj{"type": "string"}, "amount": obj{"type": "string"},
			},
		},
		"Reputation": obj{
			"type":     "object",
			"required": []any{"agent_id", "test_agent", "counts", "first_verified_at", "last_verified_at", "verifications", "next_cursor"},
			"properties": obj{
				"agent_id":   obj{"type": "string"},
				"test_agent": obj{"type": "boolean", "description": "Ids starting with `test-` are examples: recorded apart, never scored."},
				"owned":      obj{"type": "boolean", "description": "The agent_id has an owner (its address, or the first wallet that bound it): only the verifications its owner authenticated count toward its trust score."},
				"counts": obj{"type": "object", "required": []any{"pass", "fail", "total", "pass_ratio"}, "properties": obj{
					"pass": count(""), "fail": count(""), "total": count(""),
					"pass_ratio":         obj{"type": "number", "minimum": 0, "maximum": 1},
					"authenticated_pass": count("Calls whose agent_id was bound to a wallet proven with X-Wallet-Auth."),
					"authenticated_fail": count(""),
				}},
				"first_verified_at": obj{"type": []any{"string", "null"}},
				"last_verified_at":  obj{"type": []any{"string", "null"}},
				"verifications": arrayOf(obj{"type": "object", "required": []any{"verification_id", "verified_at", "result"}, "properties": obj{
					"verification_id": obj{"type": "string"}, "verified_at": obj{"type": "string"}, "result": resultEnum,
					"output_hash": hexHash(""), "schema_hash": hexHash(""), "rules_hash": hexHash(""), "request_hash": hexHash(""),
					"authenticated":       obj{"type": "boolean"},
					"counts_toward_score": obj{"type": "boolean", "description": "Whether this record is evidence by the score's rules: a delivered call (not a paid one whose settlement is pending or failed), any of an agent without an owner, only its owner's authenticated ones of an owned one, none of a test- agent. The score's window can still leave it out: a record older than the horizon, behind max_records newer pieces of evidence, or behind the read limit (twice max_records) of newer records, evidence or not."},
				}}, "Newest first."),
				"next_cursor": obj{"type": []any{"string", "null"}, "description": "Pass as `cursor` for the next (older) page; null on the last page."},
			},
		},
		"TrustScore": obj{
			"type":        "object",
			"description": "SPEC §8: the agent's trust score with the method and every input it was computed from, signed with the trust-score context (json-schema-verifier/trust-score-attestation/v1).",
			"required":    []any{"agent_id", "score", "method", "verify", "attestation"},
			"properties": obj{
				"agent_id": obj{"type": "string"},
				"score":    obj{"type": "number", "minimum": 0, "maximum": 1, "description": "Time-decayed Wilson lower bound of the pass rate, 6 decimals."},
				"method": obj{"type": "object", "required": []any{"name", "version", "params"}, "properties": obj{
					"name": obj{"type": "string", "examples": []any{"time-decayed-wilson-lower-bound"}}, "version": obj{"type": "string"},
					"description": obj{"type": "string"},
					"params": obj{"type": "object", "properties": obj{
						"half_life_days": obj{"type": "number"}, "horizon_days": obj{"type": "number"}, "max_records": obj{"type": "integer"},
						"authenticated_weight": obj{"type": "number"}, "unauthenticated_weight": obj{"type": "number"}, "z": obj{"type": "number"},
					}},
				}},
				"inputs":      obj{"type": "object", "description": "Whether the agent has an owner (`owned`: then only its owner's verifications are evidence), the evidence window (`to`: where it ends, the same instant as computed_at, as verifiers require; `not_counted`: verifications recorded under the id that are not evidence of this score, that is `counts.total` minus `records`: others' labels of an owned id, and records older than the horizon or beyond the record cap or the read limit; `truncated`: evidence inside the horizon was, or may have been, left out because the record cap was reached or twice `max_records` records were read), the exact counts in it and the decayed counts the bound was computed from."},
				"counts":      obj{"type": "object", "description": "All-time totals, authenticated apart from unauthenticated."},
				"computed_at": obj{"type": "string", "description": "When the score was computed: the same instant as attestation.timestamp, as verifiers require."},
				"verify":      ref("VerifyBlock"),
				"attestation": ref("Attestation"),
			},
		},
		"Health": obj{"type": "object", "description": "Liveness of the service."},
		"AgentCard": obj{
			"type":        "object",
			"description": "The A2A agent card: name, skills and, under capabilities.extensions (uri starting with urn:json-schema-verifier:extension:attestation:), every public key version ever used.",
			"properties": obj{
				"name": obj{"type": "string"}, "url": obj{"type": "string"},
				"capabilities": obj{"type": "object", "properties": obj{"extensions": arrayOf(obj{"type": "object", "properties": obj{
					"uri": obj{"type": "string"}, "params": obj{"type": "object"},
				}}, "")}},
			},
		},
		"X402Manifest": obj{
			"type":     "object",
			"required": []any{"version", "x402Version", "resources", "items"},
			"properties": obj{
				"version": obj{"type": "integer"}, "x402Version": obj{"const": 2},
				"resources":    arrayOf(obj{"type": "string"}, "`METHOD /path` of every paid route."),
				"items":        arrayOf(obj{"type": "object"}, "Each route with its live accepts and free allowance policy."),
				"instructions": obj{"type": "string"},
			},
		},
		"JSONRPCRequest": obj{
			"type":     "object",
			"required": []any{"jsonrpc", "method"},
			"properties": obj{
				"jsonrpc": obj{"const": "2.0"}, "id": obj{"type": []any{"string", "integer"}},
				"method": obj{"type": "string", "examples": []any{"initialize", "tools/list", "tools/call"}},
				"params": obj{"type": "object"},
			},
		},
	}
}
