package apidocs

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// Header names the documents describe. They are the gateway's wire names;
// the caddymodule tests check the two sides agree.
const (
	HeaderFreeRemaining = "Free-Allowance-Remaining"
	HeaderFreeLimit     = "Free-Allowance-Limit"
	HeaderFreeResets    = "Free-Allowance-Resets"
)

// Tags group the operations on the interactive page, in this order.
const (
	tagVerify    = "Verification"
	tagHistory   = "Reputation and scores"
	tagDiscovery = "Discovery and docs"
	tagMCP       = "MCP"
	tagOther     = "Other paid routes"
)

// op is how the contract describes one operation; the price comes from the
// live route of the same name.
type op struct {
	method, path, tag, id, summary, desc string
	paid                                 bool // sold with x402 (unless unpriced in this config)
	neverFree                            bool
	body                                 bool // reads a JSON request body
	// tools: an MCP endpoint, priced per tool by the live routes that
	// name its method and path with a Tool (Service.tools), never as a
	// whole nor by another route's price.
	tools bool
	build func(s *Service, o obj)
}

// contract lists the SPEC §2 endpoints.
var contract = []op{
	{method: "POST", path: "/verify/schema", tag: tagVerify, id: "verifySchema", paid: true, body: true,
		summary: "Verify an agent's JSON output",
		desc:    "Checks `submitted_output` against `expected_schema` (JSON Schema), bounds and cross-field rules; answers pass/fail, the share of checks passed, repair hints, and an Ed25519 receipt anyone can verify offline. A fail is a complete answer and is charged like a pass; an error is never charged.",
		build:   verifyOp},
	{method: "POST", path: "/verify/deliverable", tag: tagVerify, id: "verifyDeliverable", paid: true, body: true,
		summary: "Verify a deliverable (same check as /verify/schema)",
		desc:    "The same check as POST /verify/schema under a second name, with the same request, result, receipt and price.",
		build:   verifyOp},
	{method: "GET", path: "/score/{agent_id}", tag: tagHistory, id: "getScore", paid: true, neverFree: true,
		summary: "An agent's trust score (paid, never free)",
		desc:    "A trust score from the agent's verification history, signed with the trust-score attestation context. Never served from the free allowance. Agents whose id starts with `test-` never get a score. The score rewards sustained passing and discounts old and few data points.",
		build:   scoreOp},
	{method: "GET", path: "/reputation/{agent_id}", tag: tagHistory, id: "getReputation",
		summary: "An agent's free pass/fail history (paged)",
		desc:    "Counts and the newest verifications (id, time, result, hashes), newest first; never the content, the task id or who paid. Page with `limit` and the previous page's `next_cursor`.",
		build:   reputationOp},
	{method: "GET", path: "/health", tag: tagDiscovery, id: "getHealth", summary: "Liveness",
		build: simpleOp("application/json", ref("Health"), "The service is up.")},
	{method: "GET", path: "/.well-known/agent-card.json", tag: tagDiscovery, id: "getAgentCard",
		summary: "Agent card: discovery and every public key version",
		desc:    "The A2A agent card. Its attestation extension lists every Ed25519 public key version ever used, so receipts stay verifiable after key rotation.",
		build:   simpleOp("application/json", ref("AgentCard"), "The agent card.")},
	{method: "GET", path: "/.well-known/x402", tag: tagDiscovery, id: "getX402Manifest",
		summary: "x402 discovery manifest (live prices)",
		build:   simpleOp("application/json", ref("X402Manifest"), "Every paid route with its live prices, networks and free allowance policy.")},
	{method: "GET", path: "/llms.txt", tag: tagDiscovery, id: "getLLMsTxt", summary: "llms.txt: the service for agents, from the live configuration",
		build: simpleOp("text/plain", obj{"type": "string"}, "Markdown.")},
	{method: "GET", path: "/openapi.json", tag: tagDiscovery, id: "getOpenAPI", summary: "This OpenAPI 3.1 document, from the live configuration",
		build: simpleOp("application/json", obj{"type": "object"}, "The document.")},
	{method: "GET", path: "/docs", tag: tagDiscovery, id: "getDocs", summary: "Interactive API docs (this page)",
		build: simpleOp("text/html", obj{"type": "string"}, "The page.")},
	{method: "POST", path: "/mcp", tag: tagMCP, id: "mcp", body: true, summary: "MCP endpoint (Streamable HTTP)",
		tools: true,
		build: mcpOp},
}

// OpenAPI returns the OpenAPI 3.1 document of the service as configured:
// every contract route with its answers and headers, and, per operation,
// the live price and free allowance in the x-payment-info extension.
func OpenAPI(s Service) ([]byte, error) {
	doc := openAPIDoc(&s)
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encoding the OpenAPI document: %w", err)
	}
	return append(b, '\n'), nil
}

func openAPIDoc(s *Service) obj {
	version := s.Version
	if version == "" {
		version = "1"
	}
	paths := obj{}
	known := map[string]bool{}
	for _, c := range contract {
		known[c.method+" "+c.path] = true
		o := operation(s, c)
		item, _ := paths[c.path].(obj)
		if item == nil {
			item = obj{}
			paths[c.path] = item
		}
		item[strings.ToLower(c.method)] = o
	}
	// Paid routes the contract does not name (a seller's own agent behind
	// the gateway): documented generically, with their live prices.
	var extra []Route
	for _, r := range s.Routes {
		if !known[r.key()] {
			extra = append(extra, r)
		}
	}
	sort.Slice(extra, func(i, j int) bool {
		if extra[i].key() != extra[j].key() {
			return extra[i].key() < extra[j].key()
		}
		return extra[i].Tool < extra[j].Tool
	})
	for _, r := range extra {
		item, _ := paths[r.Path].(obj)
		if item == nil {
			item = obj{}
			paths[r.Path] = item
		}
		m := strings.ToLower(r.Method)
		if o, _ := item[m].(obj); r.Tool != "" && o != nil {
			addTool(o, r)
			continue
		}
		o := genericOp(s, r)
		if r.Tool != "" {
			o["summary"] = r.Method + " " + r.Path + " (MCP tools)"
			o["description"] = "An MCP endpoint (Streamable HTTP) whose priced tools are each paid in the tool call's `params._meta[\"x402/payment\"]` (x402's MCP transport); every other message is free. The prices are in `x-payment-info.tools`, by tool name."
			o["x-payment-info"] = obj{"protocol": "x402", "x402Version": x402.Version, "transport": "mcp", "tools": obj{}}
			addTool(o, r)
		}
		item[m] = o
	}

	tags := []any{
		obj{"name": tagVerify, "description": "Check an output; get a signed receipt."},
		obj{"name": tagHistory, "description": "An agent's history (free) and trust score (paid)."},
		obj{"name": tagMCP, "description": "The same tools over the Model Context Protocol."},
		obj{"name": tagDiscovery, "description": "Liveness, discovery documents, public keys, these docs."},
	}
	if len(extra) > 0 {
		tags = append(tags, obj{"name": tagOther, "description": "Other payment-gated routes of this gateway."})
	}
	return obj{
		"openapi": "3.1.0",
		"info": obj{
			"title":       s.name(),
			"version":     version,
			"summary":     "Deterministic verification of agents' JSON outputs, with Ed25519 receipts; paid per call with x402 v2.",
			"description": infoDescription(s),
		},
		"servers":    []any{obj{"url": s.BaseURL}},
		"tags":       tags,
		"paths":      paths,
		"components": components(),
		"externalDocs": obj{
			"description": "llms.txt: the same service described for agents",
			"url":         s.BaseURL + "/llms.txt",
		},
	}
}

func infoDescription(s *Service) string {
	var b strings.Builder
	b.WriteString("Checks a JSON output against a JSON Schema and cross-field rules and answers pass/fail with repair hints and an Ed25519 receipt that anyone can verify offline with the public keys of the agent card.\n\n")
	b.WriteString("**Payment.** Paid routes answer `402` with a `PAYMENT-REQUIRED` header (x402 v2); send the request again with `PAYMENT-SIGNATURE`. The answer then carries `PAYMENT-RESPONSE`. Errors are never charged; a fail result is charged like a pass. Each operation's `x-payment-info` carries its live prices and free allowance.\n\n")
	if pools := freePools(s); len(pools) > 0 {
		b.WriteString("**Free allowance.** ")
		for i, p := range pools {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "%d free calls per client per day (%s) on %s, bodies up to %d bytes; resets at 00:00 UTC.",
				p.free.PerDay, clientKeyDoc(p.free.Key), andList(p.routes), p.free.MaxBody)
		}
		b.WriteString(" Answers served free carry `Free-Allowance-Remaining`, `Free-Allowance-Limit` and `Free-Allowance-Resets`.\n\n")
	}
	fmt.Fprintf(&b, "**MCP.** Streamable HTTP at `%s` with the tools `verify_schema` and `get_verification_record`. Add it to Claude Code, Cursor, VS Code and other clients with `npx add-mcp %s`; ready configurations are in [llms.txt](%s/llms.txt) (MCP client set-up).", s.mcpURL(), s.mcpURL(), s.BaseURL)
	return b.String()
}

func components() obj {
	errorBody := func(desc string, example any) obj {
		return obj{"description": desc, "content": obj{"application/json": obj{"schema": ref("Error"), "example": example}}}
	}
	return obj{
		"schemas": componentSchemas(),
		"parameters": obj{
			"PaymentSignature": obj{
				"name": x402.HeaderPaymentSignature, "in": "header", "required": false,
				"description": "x402 v2 payment: base64 of the JSON PaymentPayload signed for one of the offers in PAYMENT-REQUIRED. Without it the call is served from the free allowance when one applies, otherwise answered 402.",
				"schema":      obj{"type": "string", "contentEncoding": "base64"},
			},
			"AgentID": obj{
				"name": "agent_id", "in": "path", "required": true,
				"description": "The agent_id used in verification requests (1 to 200 characters, URL-encoded).",
				"schema":      obj{"type": "string", "minLength": 1, "maxLength": 200},
				"example":     "seller-7",
			},
		},
		"headers": obj{
			"PaymentRequired": obj{"description": "base64 of the JSON x402 v2 PaymentRequired (see the PaymentRequired schema): the live offers.", "schema": obj{"type": "string", "contentEncoding": "base64"}},
			"PaymentResponse": obj{"description": "base64 of the JSON x402 v2 SettleResponse (see the SettleResponse schema): the settlement's transaction.", "schema": obj{"type": "string", "contentEncoding": "base64"}},
			"FreeRemaining":   obj{"description": "Free calls left today for this client (answers served free).", "schema": obj{"type": "integer", "minimum": 0}},
			"FreeLimit":       obj{"description": "Free calls per client per day.", "schema": obj{"type": "integer", "minimum": 0}},
			"FreeResets":      obj{"description": "When the allowance resets: the next UTC midnight, RFC 3339.", "schema": obj{"type": "string", "format": "date-time"}},
			"RetryAfter":      obj{"description": "Seconds to wait before retrying the same request.", "schema": obj{"type": "integer", "minimum": 1}},
		},
		"responses": obj{
			"PaymentRequired": obj{
				"description": "Payment required: no payment and no free allowance left (or the body is over the free tier's size, or a payment was refused: see `reason`). Pay for one of the offers in PAYMENT-REQUIRED and send the request again with PAYMENT-SIGNATURE. A browser asking for text/html gets a page instead of JSON.",
				"headers":     obj{x402.HeaderPaymentRequired: obj{"$ref": "#/components/headers/PaymentRequired"}, x402.HeaderPaymentResponse: obj{"$ref": "#/components/headers/PaymentResponse"}},
				"content":     obj{"application/json": obj{"schema": ref("PaymentRequiredBody")}},
			},
			"BadPayment": obj{
				"description": "PAYMENT-SIGNATURE does not decode as an x402 v2 payment (reason invalid_payload or invalid_version). Nothing was charged.",
				"headers":     obj{x402.HeaderPaymentRequired: obj{"$ref": "#/components/headers/PaymentRequired"}},
				"content":     obj{"application/json": obj{"schema": ref("PaymentRequiredBody")}},
			},
			"TooLarge":   errorBody("payload_too_large: the body is over the absolute size limit; nothing was charged.", apierr.TooLarge(1<<20)),
			"URITooLong": errorBody("uri_too_long: the request URL without its query is longer than a 402 may name as its resource; refused before any payment logic, nothing was charged.", apierr.URITooLong(store.MaxDiscoveryResourceBytes)),
			"Invalid":    errorBody("invalid_request: the request breaks the contract; nothing was charged and it is never offered for sale.", exampleInvalid()),
			"Unavailable": obj{
				"description": "upstream_unavailable (a daemon, the state store or the facilitator is down) or settlement_pending (a payment's outcome is not known yet, or it settled and is not recorded yet: do not pay again). Retryable: send the same request after Retry-After seconds. Nothing was charged, save a settlement_pending with charged true.",
				"headers":     obj{"Retry-After": obj{"$ref": "#/components/headers/RetryAfter"}},
				"content":     obj{"application/json": obj{"schema": ref("Error"), "example": apierr.Unavailable("payment facilitator", 2, nil)}},
			},
			"RateLimited": obj{
				"description": "rate_limited: this client (its IP address, an IPv6 client per /64) is over its rate limit: on a free route or an MCP message that is not a priced tool call, its requests; on a priced route, its refused and unpaid answers (402, 4xx). Answered before any work; nothing was charged and the refused request does not count. Retryable: send the same request after Retry-After seconds.",
				"headers":     obj{"Retry-After": obj{"$ref": "#/components/headers/RetryAfter"}},
				"content":     obj{"application/json": obj{"schema": ref("Error"), "example": apierr.RateLimited(20)}},
			},
			"NotFound": errorBody("not_found.", apierr.NotFound("endpoint")),
			"MethodNotAllowed": obj{
				"description": "method_not_allowed: the Allow header lists the methods.",
				"headers":     obj{"Allow": obj{"schema": obj{"type": "string"}}},
				"content":     obj{"application/json": obj{"schema": ref("Error")}},
			},
			"Internal": obj{"description": "internal_error: a fault of ours; nothing was charged.", "content": obj{"application/json": obj{"schema": ref("Error")}}},
		},
	}
}

func respRef(name string) obj { return obj{"$ref": "#/components/responses/" + name} }

// operation builds one contract operation with its live payment info.
func operation(s *Service, c op) obj {
	o := obj{"operationId": c.id, "summary": c.summary, "tags": []any{c.tag}}
	if c.desc != "" {
		o["description"] = c.desc
	}
	o["responses"] = obj{"500": respRef("Internal")}
	if c.build != nil {
		c.build(s, o)
	}
	if !c.paid {
		// The free routes and MCP's unpriced messages are rate limited
		// per client (SPEC §2; aov_rate_limit in the gateway).
		o["responses"].(obj)["429"] = respRef("RateLimited")
		if o["x-payment-info"] == nil {
			o["x-payment-info"] = obj{"free": true, "protocol": "none"}
		}
		return o
	}
	r, live := s.route(c.method, c.path)
	if !live {
		addAnswers(o, Route{}, c.body)
		o["x-payment-info"] = obj{"protocol": "x402", "x402Version": x402.Version, "configured": false,
			"note": "No price is configured for this route on this gateway."}
		o["description"] = fmt.Sprint(o["description"]) + "\n\n**Price:** not payment-gated in this configuration."
		return o
	}
	if c.neverFree {
		r.Free = nil
	}
	addPayment(o, r, c.body)
	return o
}

// addPayment adds the x402 parameters, answers, extension and price text.
func addPayment(o obj, r Route, body bool) {
	addAnswers(o, r, body)
	o["x-payment-info"] = paymentInfo(r)
	var b strings.Builder
	if d, _ := o["description"].(string); d != "" {
		b.WriteString(d)
		b.WriteString("\n\n")
	}
	b.WriteString("**Price:** " + priceText(r.Accepts) + ".")
	if f := r.Free; f != nil && f.PerDay > 0 {
		fmt.Fprintf(&b, " **Free allowance:** %d calls per client per day (%s, pool `%s`), request bodies up to %d bytes, resets at 00:00 UTC.",
			f.PerDay, clientKeyDoc(f.Key), f.Pool, f.MaxBody)
	} else {
		b.WriteString(" Never free.")
	}
	o["description"] = b.String()
}

// addAnswers adds the request header and the answers of a paid route: the
// contract's, whether or not this gateway prices the route right now.
func addAnswers(o obj, r Route, body bool) {
	params, _ := o["parameters"].([]any)
	o["parameters"] = append(params, obj{"$ref": "#/components/parameters/PaymentSignature"})
	resp := o["responses"].(obj)
	resp["400"] = respRef("BadPayment")
	resp["402"] = respRef("PaymentRequired")
	resp["414"] = respRef("URITooLong")
	resp["422"] = respRef("Invalid")
	resp["429"] = respRef("RateLimited") // the gate's rate_limit, on by default
	resp["503"] = respRef("Unavailable")
	if body {
		resp["413"] = respRef("TooLarge")
	}
	if ok, _ := resp["200"].(obj); ok != nil {
		h, _ := ok["headers"].(obj)
		if h == nil {
			h = obj{}
			ok["headers"] = h
		}
		h[x402.HeaderPaymentResponse] = obj{"$ref": "#/components/headers/PaymentResponse"}
		if r.Free != nil && r.Free.PerDay > 0 {
			h[HeaderFreeRemaining] = obj{"$ref": "#/components/headers/FreeRemaining"}
			h[HeaderFreeLimit] = obj{"$ref": "#/components/headers/FreeLimit"}
			h[HeaderFreeResets] = obj{"$ref": "#/components/headers/FreeResets"}
		}
	}
}

// paymentInfo is the x-payment-info extension of a paid operation.
func paymentInfo(r Route) obj {
	accepts := make([]any, 0, len(r.Accepts))
	for _, a := range r.Accepts {
		accepts = append(accepts, PriceOf(a))
	}
	info := obj{
		"protocol":    "x402",
		"x402Version": x402.Version,
		"configured":  true,
		"accepts":     accepts,
		"settle":      r.Settle,
	}
	if len(r.Accepts) > 0 {
		info["price"] = PriceOf(r.Accepts[0])
	}
	if f := r.Free; f != nil && f.PerDay > 0 {
		info["freeAllowance"] = obj{
			"pool": f.Pool, "callsPerClientPerDay": f.PerDay, "clientKey": f.Key,
			"maxBodyBytes": f.MaxBody, "resets": "daily at 00:00 UTC",
		}
	} else {
		info["freeAllowance"] = nil
	}
	return info
}

func priceText(accepts []x402.PaymentRequirements) string {
	parts := make([]string, 0, len(accepts))
	for _, a := range accepts {
		p := PriceOf(a)
		parts = append(parts, fmt.Sprintf("%s (%s atomic units) on %s to `%s`", p.Display, p.Amount, p.Network, p.PayTo))
	}
	if len(parts) == 0 {
		return "not configured"
	}
	return strings.Join(parts, ", or ")
}

func clientKeyDoc(key string) string {
	if key == "wallet" {
		return "per wallet proven with X-Wallet-Auth"
	}
	return "per client IP address, an IPv6 client per /64"
}

func jsonBody(schema obj, examples obj) obj {
	mt := obj{"schema": schema}
	if examples != nil {
		mt["examples"] = examples
	}
	return obj{"required": true, "content": obj{"application/json": mt}}
}

func verifyOp(s *Service, o obj) {
	o["requestBody"] = jsonBody(ref("VerificationRequest"), obj{
		"invoice_pass": obj{"summary": "SPEC §10 invoice, totals add up: pass", "value": invoiceRequest(129.5)},
		"invoice_fail": obj{"summary": "SPEC §10 invoice, total 135.0 but lines sum to 129.5: fail", "value": invoiceRequest(135.0)},
	})
	o["responses"].(obj)["200"] = obj{
		"description": "The verification result with its receipt (full or compact per `detail`). Served free from the allowance (Free-Allowance-* headers) or paid (PAYMENT-RESPONSE).",
		"content":     obj{"application/json": obj{"schema": obj{"oneOf": []any{ref("VerificationResult"), ref("VerificationResultCompact")}}}},
	}
	o["x-attestation-context"] = receipt.ContextVerify
}

func scoreOp(s *Service, o obj) {
	o["description"] = fmt.Sprint(o["description"]) + "\n\n**Method.** " + strings.TrimSpace(s.scoreMethod())
	o["parameters"] = []any{obj{"$ref": "#/components/parameters/AgentID"}}
	o["responses"].(obj)["200"] = obj{
		"description": "The signed trust score.",
		"content":     obj{"application/json": obj{"schema": ref("TrustScore")}},
	}
	o["x-attestation-context"] = receipt.ContextScore
}

func reputationOp(s *Service, o obj) {
	o["parameters"] = []any{
		obj{"$ref": "#/components/parameters/AgentID"},
		obj{"name": "limit", "in": "query", "description": "Page size.", "schema": obj{"type": "integer", "minimum": 1, "maximum": 100, "default": 20}},
		obj{"name": "cursor", "in": "query", "description": "The previous page's next_cursor.", "schema": obj{"type": "string"}},
	}
	resp := o["responses"].(obj)
	resp["200"] = obj{"description": "The history page.", "content": obj{"application/json": obj{"schema": ref("Reputation")}}}
	resp["422"] = respRef("Invalid")
	resp["503"] = respRef("Unavailable")
}

func simpleOp(mediaType string, schema obj, desc string) func(*Service, obj) {
	return func(_ *Service, o obj) {
		resp := o["responses"].(obj)
		resp["200"] = obj{"description": desc, "content": obj{mediaType: obj{"schema": schema}}}
		resp["503"] = respRef("Unavailable")
	}
}

// mcpTwins are the contract's MCP tools and the REST routes they answer
// like. A twin names what the tool does; its price is the tool's own gate's.
var mcpTwins = []struct{ tool, method, path, context string }{
	{"verify_schema", "POST", "/verify/schema", receipt.ContextVerify},
	{"get_verification_record", "GET", "/score/{agent_id}", receipt.ContextScore},
}

func mcpOp(s *Service, o obj) {
	o["description"] = fmt.Sprintf("The Model Context Protocol over Streamable HTTP at `%s`: POST JSON-RPC messages (initialize, tools/list, tools/call); the answer is JSON or an SSE stream. Tools: `verify_schema` (same input and output as POST /verify/schema) and `get_verification_record` (same as GET /score/{agent_id}). Each tool is priced by its own gate, as `x-payment-info.tools` lists them: a tool call that must be paid returns a payment-required tool result (x402 MCP transport); pay by sending the PaymentPayload in `params._meta[\"x402/payment\"]`.", s.mcpURL())
	o["requestBody"] = jsonBody(ref("JSONRPCRequest"), obj{
		"tools_call": obj{"summary": "Call verify_schema", "value": obj{
			"jsonrpc": "2.0", "id": 1, "method": "tools/call",
			"params": obj{"name": "verify_schema", "arguments": invoiceRequest(129.5)},
		}},
	})
	resp := o["responses"].(obj)
	resp["200"] = obj{"description": "A JSON-RPC response (application/json) or an SSE stream of them (text/event-stream).",
		"content": obj{"application/json": obj{"schema": obj{"type": "object"}}, "text/event-stream": obj{"schema": obj{"type": "string"}}}}
	resp["202"] = obj{"description": "A notification or response was accepted."}
	resp["400"] = obj{"description": "invalid_message: the body is not one JSON-RPC message the server fully reads (the transport's 400). A JSON-RPC error, code -32700 or -32600 and id null, whose data is the error shape with code invalid_message; nothing was charged and no tool ran.",
		"content": obj{"application/json": obj{"schema": obj{"type": "object"}}}}
	resp["413"] = respRef("TooLarge")
	resp["503"] = respRef("Unavailable")
	var contractTools []any
	for _, tw := range mcpTwins {
		contractTools = append(contractTools, obj{"name": tw.tool, "rest": tw.method + " " + tw.path, "attestationContext": tw.context})
	}
	o["x-mcp-tools"] = contractTools
	tools := obj{}
	o["x-payment-info"] = obj{"protocol": "x402", "x402Version": x402.Version, "transport": "mcp",
		"note": "Each tool is priced by its own gate; a tool not listed with a price is not charged on this server.", "tools": tools}
	if r, ok := s.endpoint("POST", "/mcp"); ok {
		// A gate pricing the endpoint as a whole: every message is paid
		// (over HTTP, PAYMENT-SIGNATURE), each priced tool on top.
		pi := o["x-payment-info"].(obj)
		for k, v := range paymentInfo(r) {
			pi[k] = v
		}
		pi["note"] = "Every message to this endpoint is priced as `accepts` says; each tool under `tools` is priced on top by its own gate."
		o["description"] = o["description"].(string) + "\n\n**Every message:** " + priceText(r.Accepts) + "."
	}
	for _, r := range s.tools("POST", "/mcp") {
		addTool(o, r)
	}
	_, endpoint := s.endpoint("POST", "/mcp")
	for _, tw := range mcpTwins {
		info, _ := tools[tw.tool].(obj)
		if info == nil {
			info = obj{"configured": false}
			if endpoint {
				info["note"] = "No price of its own: a call of it is a message to this endpoint, priced as `accepts` says."
			}
			tools[tw.tool] = info
		}
		info["rest"] = tw.method + " " + tw.path
	}
}

var pathParam = regexp.MustCompile(`\{([^{}/]+)\}`)

// genericOp documents a paid route the contract does not know.
func genericOp(s *Service, r Route) obj {
	summary := r.Description
	if summary == "" {
		summary = r.Method + " " + r.Path
	}
	mime := r.MimeType
	if mime == "" {
		mime = "application/json"
	}
	o := obj{
		"summary": summary, "tags": []any{tagOther},
		"operationId": operationID(r),
		"responses": obj{
			"200": obj{"description": "The paid answer.", "content": obj{mime: obj{}}},
			"500": respRef("Internal"),
		},
	}
	var params []any
	for _, m := range pathParam.FindAllStringSubmatch(r.Path, -1) {
		params = append(params, obj{"name": m[1], "in": "path", "required": true, "schema": obj{"type": "string"}})
	}
	if len(params) > 0 {
		o["parameters"] = params
	}
	body := r.Method == "POST" || r.Method == "PUT" || r.Method == "PATCH"
	if body {
		o["requestBody"] = obj{"content": obj{"application/json": obj{"schema": obj{}}}}
	}
	addPayment(o, r, body)
	return o
}

// addTool adds the MCP tool r prices to o, the operation of its endpoint:
// the tools of one endpoint share its path and method, so each is an entry
// of x-payment-info.tools (as the contract's MCP operation has them) and a
// paragraph of the description.
func addTool(o obj, r Route) {
	pi, _ := o["x-payment-info"].(obj)
	tools, _ := pi["tools"].(obj)
	if tools == nil {
		tools = obj{}
		pi["tools"] = tools
	}
	info := paymentInfo(r)
	if r.Description != "" {
		info["description"] = r.Description
	}
	tools[r.Tool] = info
	d, _ := o["description"].(string)
	o["description"] = d + fmt.Sprintf("\n\n**Tool `%s`:** %s.", r.Tool, priceText(r.Accepts))
}

var nonIdent = regexp.MustCompile(`[^A-Za-z0-9]+`)

func operationID(r Route) string {
	return strings.ToLower(r.Method) + strings.Trim(nonIdent.ReplaceAllString(r.Path, "_"), "_")
}

// invoiceRequest is the SPEC §10 worked example with the given total.
func invoiceRequest(total float64) obj {
	return obj{
		"task_id":  "invoice-7731",
		"agent_id": "test-invoice-agent",
		"expected_schema": obj{
			"type":     "object",
			"required": []any{"invoice_id", "currency", "line_items", "total"},
			"properties": obj{
				"invoice_id": obj{"type": "string", "pattern": "^INV-[0-9]{4}$"},
				"currency":   obj{"enum": []any{"USD", "EUR"}},
				"line_items": obj{
					"type": "array", "minItems": 1,
					"items": obj{
						"type":     "object",
						"required": []any{"sku", "qty", "line_total"},
						"properties": obj{
							"sku":        obj{"type": "string"},
							"qty":        obj{"type": "integer", "minimum": 1},
							"line_total": obj{"type": "number", "minimum": 0},
						},
					},
				},
				"total": obj{"type": "number"},
			},
		},
		"submitted_output": obj{
			"invoice_id": "INV-7731",
			"currency":   "USD",
			"line_items": []any{
				obj{"sku": "WIDGET-1", "qty": 2, "line_total": 87.0},
				obj{"sku": "GADGET-2", "qty": 1, "line_total": 42.5},
			},
			"total": total,
		},
		"rules":         []any{obj{"type": "sum_equals", "field": "line_items[].line_total", "equals_field": "total"}},
		"enforce_rules": true,
	}
}

// pool is one free allowance pool and the routes that share it, as
// routeName names them: an MCP tool is named only where a live route
// prices it in the pool. again: an earlier pool of the list has its name
// in another store.
type pool struct {
	free   Free
	routes []string
	again  bool
}

// freePools groups the live free allowances by store and pool, in route
// order: routes naming one pool in different stores never meet in a
// count, so each is a pool of its own with its own terms.
func freePools(s *Service) []pool {
	var out []pool
	idx := map[[2]string]int{}
	named := map[string]bool{}
	for _, r := range s.Routes {
		if r.Free == nil || r.Free.PerDay <= 0 {
			continue
		}
		if c, ok := contractOp(r.Method, r.Path); ok && c.neverFree {
			continue
		}
		k := [2]string{r.Free.Store, r.Free.Pool}
		i, ok := idx[k]
		if !ok {
			i = len(out)
			idx[k] = i
			out = append(out, pool{free: *r.Free, again: named[r.Free.Pool]})
			named[r.Free.Pool] = true
		}
		out[i].routes = append(out[i].routes, routeName(r))
	}
	return out
}

func contractOp(method, path string) (op, bool) {
	for _, c := range contract {
		if c.method == method && c.path == path {
			return c, true
		}
	}
	return op{}, false
}
