package apidocs

import (
	"fmt"
	"strings"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/x402"
)

// LLMsTxt returns the service's llms.txt (llmstxt.org conventions: an H1,
// a one-paragraph summary in a blockquote, then sections of markdown):
// what the service does, its routes and live prices, the free allowance
// with its live numbers, how to pay, the rate limits (429), the error
// codes, the trust score, how to verify a receipt, and the MCP endpoint.
func LLMsTxt(s Service) []byte {
	var b strings.Builder
	base := s.BaseURL
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }

	w("# %s\n\n", s.name())
	w("> Checks an agent's JSON output, deterministically, against a JSON Schema and cross-field rules (\"line totals sum to the total\") and answers pass/fail, the share of checks passed, repair hints, and an Ed25519 receipt over RFC 8785 canonical JSON that anyone can verify offline with the published public keys. Paid per call with x402 v2 (USDC), with a daily free allowance per client.\n\n")
	w("Buyers check a seller agent's deliverable before paying; sellers check their own output before sending it and ship it with the receipt. Base URL: %s. Interactive docs: %s/docs. Machine-readable API: %s/openapi.json. Everything below that is a price or a number is this server's live configuration.\n\n", base, base, base)

	w("## Routes and prices\n\n")
	w("| route | price | what it does |\n|---|---|---|\n")
	row := func(r Route) {
		desc := r.Description
		switch {
		case desc != "":
		case r.Tool != "":
			desc = "paid MCP tool"
		default:
			desc = "paid route"
		}
		w("| %s | %s | %s |\n", routeName(r), llmsRoutePrice(r), desc)
	}
	for _, c := range contract {
		w("| `%s %s` | %s | %s |\n", c.method, c.path, llmsPrice(&s, c), c.summary)
		if c.tools {
			for _, r := range s.tools(c.method, c.path) {
				row(r)
			}
		}
	}
	for _, r := range s.Routes {
		if _, ok := contractOp(r.Method, r.Path); !ok {
			row(r)
		}
	}
	w("\nPrices are also in the `x-payment-info` of each operation in /openapi.json, in %s/.well-known/x402 and in every 402's `PAYMENT-REQUIRED` header, all from the same live configuration.\n\n", base)

	w("## Free allowance\n\n")
	pools := freePools(&s)
	if len(pools) == 0 {
		w("No free allowance is configured on this server: every paid route answers 402 until paid.\n\n")
	}
	for _, p := range pools {
		f := p.free
		again := ""
		if p.again {
			again = " (another store: its count is not the other's)"
		}
		w("- Pool `%s`%s: **%d free calls per client per UTC day**, shared by %s.\n", f.Pool, again, f.PerDay, andList(p.routes))
		w("- Client: %s.\n", clientKeyLong(f.Key))
		w("- Largest request body served free: %d bytes (a larger body goes to payment; the absolute limit still answers 413).\n", f.MaxBody)
		w("- Resets at the next UTC midnight (00:00 UTC).\n")
	}
	if len(pools) > 0 {
		w("- How: send the request without `PAYMENT-SIGNATURE`. A free answer carries `%s`, `%s` and `%s` (RFC 3339 UTC).\n", HeaderFreeRemaining, HeaderFreeLimit, HeaderFreeResets)
		w("- Not free even while allowance remains: a body over the free size, a request that carries a payment (it is settled), and anything after the day's allowance (402 with `free_trial.code` `free_trial_exhausted`). Scores are never free.\n")
		w("- A call that ends in an error is not counted. Free checks count for reputation and scores exactly like paid ones.\n")
		w("- An unpaid 402's JSON body reports your live state in `free_trial` (`available`, `calls_per_client_per_day`, `remaining_calls_today`, `resets_at`, `url` of the MCP endpoint, `tool`).\n\n")
	}

	w("## How to pay (x402 v2)\n\n")
	w("1. Send the request. Without a payment (and without free allowance) the answer is `402 Payment Required` with the header `%s`: base64 of JSON `{x402Version: 2, resource, accepts: [{scheme, network, amount, asset, payTo, maxTimeoutSeconds, extra}]}`. `amount` is in the asset's atomic units (USDC has 6 decimals: 20000 = $0.02).\n", x402.HeaderPaymentRequired)
	w("2. Pick one offer of `accepts`, sign it (scheme `exact` on EVM: an EIP-3009 `transferWithAuthorization` for exactly `amount` to `payTo`, EIP-712 domain from `extra.name`/`extra.version`), and send the same request again with the header `%s`: base64 of JSON `{x402Version: 2, resource, accepted: <the offer>, payload: {signature, authorization}}`.\n", x402.HeaderPaymentSignature)
	w("3. The gateway verifies the payment, runs the request, and settles only if the answer is a success. The answer carries `%s`: base64 of JSON `{success, transaction, network, payer}`.\n", x402.HeaderPaymentResponse)
	w("4. An error (4xx/5xx in the error shape below) is never charged; a `fail` verification result is a complete answer and is charged like a `pass`. A payment is single-use: never send the same `PAYMENT-SIGNATURE` twice.\n")
	w("5. An invalid request is refused with 422 before any payment logic; a POST with no body at all is the x402 discovery probe and gets the 402.\n\n")
	w("Any x402 v2 client (for example `@x402/fetch`) does steps 1 to 3 automatically.\n\n")

	w("## Rate limits\n\n")
	var free []string
	for _, c := range contract {
		if !c.paid && !c.tools {
			free = append(free, "`"+c.method+" "+c.path+"`")
		}
	}
	mcpFree := " and every MCP message that is not a priced tool call are"
	if _, ok := s.endpoint("POST", "/mcp"); ok {
		mcpFree = " are" // every MCP message is priced
	}
	w("The free routes (%s)%s rate limited per client (its IP address, an IPv6 client per /64). Past the limit the answer is HTTP 429 `rate_limited` in the error shape below, with `retry_after` and the `Retry-After` header, before any work is done; the refused request does not count. A priced call, paid or from the free allowance, never counts against this limit. A priced route counts its refused and unpaid answers (402, 4xx) per client instead, with the same 429 past its limit. The limits are this server's configuration.\n\n", strings.Join(free, ", "), mcpFree)

	w("## Errors\n\n")
	w("Every error that is not a payment refusal has one shape, in REST and in MCP tool results; it is never charged and never echoes input:\n\n")
	w("```json\n%s\n```\n\n", exampleJSON(exampleInvalid()))
	w("A retryable error also carries `retry_after` (seconds) and the `Retry-After` header: send the same request again after it.\n\n")
	w("%s", errorCodeTable())
	w("\n## Payment errors\n\n")
	w("A refused payment is a 402 with a fresh `PAYMENT-REQUIRED` (a 400 for a payment header that does not decode) and the reason in the body's `reason`; over MCP the payment-required tool result carries it in `_meta.reason`. Nothing was charged. Every reason this service or its facilitator sends:\n\n")
	w("%s", paymentCodeTable())
	w("\nA remote facilitator may send other reasons of the x402 specification; treat an unknown reason as \"not paid, sign a new payment\". Never send the same `PAYMENT-SIGNATURE` twice.\n\n")

	w("## Trust score\n\n")
	w("`GET /score/{agent_id}` returns a trust score computed from the agent's verification history (`GET /reputation/{agent_id}`, free), signed like a verification receipt but with the context `%s`. It rewards sustained passing and discounts old and few data points; checks whose agent_id is bound to a wallet with `X-Wallet-Auth` count as authenticated. Agents whose id starts with `test-` are examples and never get a score.\n\n", receipt.ContextScore)
	w("%s\n\n", strings.TrimSpace(s.scoreMethod()))

	w("## Verifying a receipt (offline)\n\n")
	w("Every `/verify/*` and `/score/*` response (and MCP tool result) carries a `verify` block and an `attestation` `{algorithm: \"Ed25519\", key_version, timestamp, signature}`.\n\n")
	w("1. Fetch the agent card at `verify.public_key_url` (%s/.well-known/agent-card.json), or use a saved copy.\n", base)
	w("2. In `capabilities.extensions`, take the entry whose `uri` starts with `%s`; in its `params.publicKeys`, take the key whose `keyVersion` equals `attestation.key_version`. `publicKey` is base64 of the raw 32-byte Ed25519 key. The card lists every key version ever used, so old receipts stay verifiable after rotation; a key marked `compromised` is not trusted for receipts dated at or after its `compromisedSince` (none at all without one).\n", receipt.ExtensionURIPrefix)
	w("3. Remove `attestation` from the response. Build the five-key object `{\"context\": C, \"algorithm\": \"Ed25519\", \"key_version\": K, \"attested_at\": T, \"response\": <the response without attestation>}` with C = `%s` for `/verify/schema`, `/verify/deliverable` and the MCP tool `verify_schema`, or `%s` for `/score/{agent_id}` and `get_verification_record` (holding only the receipt, tell them apart as `aov receipt verify` does: a response with an `output_hash` member is a verification, anything else a score); K = `attestation.key_version`; T = `attestation.timestamp`. Refuse the receipt when its `verify` is not an object or its `verify.key_version` is not `attestation.key_version`, or when its `verified_at`, `computed_at` (which every score carries) or `inputs.window.to`, wherever present and whatever the context (the signer picks it), is not a string naming the same instant as `attestation.timestamp`, or a score's `inputs.window.from`, `oldest_evidence_at` or `newest_evidence_at` is neither null nor a time at or before it: all are signed, so only these checks stop a leaked retired key from signing a receipt dated within its service life that says it was verified, or its score computed, later.\n", receipt.ContextVerify, receipt.ContextScore)
	w("4. Canonicalize it with RFC 8785 (JCS): keys sorted by UTF-16 code units, no whitespace, numbers as ECMAScript prints doubles. Verify the Ed25519 signature (base64 `attestation.signature`) over those UTF-8 bytes.\n")
	w("5. Recompute the hashes from the data you hold: `output_hash` = SHA-256 (lowercase hex) of the JCS of `submitted_output`; `schema_hash` of `expected_schema`; `rules_hash` of `{\"bounds\": <as sent or null>, \"rules\": <as sent or null>}`; `request_hash` (full detail) of the request with every default filled in. They must equal the receipt's.\n\n")
	w("The `aov` command does all of this offline: `aov receipt verify --card <card file or URL> [--request request.json] response.json` (or `--public-key <base64>` instead of a card).\n\n")

	w("## MCP\n\n")
	w("- Endpoint: `%s` (Streamable HTTP).\n", s.mcpURL())
	tools := map[string]Route{}
	for _, r := range s.tools("POST", "/mcp") {
		tools[r.Tool] = r
	}
	// A gate pricing the endpoint as a whole charges every message, a
	// tool call too, whatever the tool's own gate says (or without one).
	endpoint, priced := s.endpoint("POST", "/mcp")
	for _, tw := range mcpTwins {
		var price []string
		if priced {
			price = append(price, "every message to this endpoint: "+withPool(endpoint))
		}
		if r, ok := tools[tw.tool]; ok {
			p := withPool(r)
			if priced {
				p = "on top, this tool's own: " + p
			}
			price = append(price, p)
		}
		if len(price) == 0 {
			price = append(price, "not priced on this server")
		}
		w("- `%s`: the same input and output as `%s %s`. Price: %s.\n", tw.tool, tw.method, tw.path, strings.Join(price, "; "))
	}
	if priced {
		w("- Every message to this endpoint (initialize, tools/list and every tool call alike) is priced: %s. Without a payment, once any free calls are used, it is answered HTTP 402 with `%s`; pay as on a REST route, with `%s` on the HTTP request.\n", withPool(endpoint), x402.HeaderPaymentRequired, x402.HeaderPaymentSignature)
	}
	if !priced || len(tools) > 0 {
		w("- A priced tool call without a payment, once any free calls are used, gets a payment-required tool result (x402 MCP transport, `free_trial_exhausted` in `_meta` after the day's free calls); pay by sending the PaymentPayload in `params._meta[\"x402/payment\"]`.\n")
	}
	w("\n")
	w("%s\n", MCPClientSetup(s.mcpURL()))

	w("## Docs\n\n")
	w("- [OpenAPI 3.1](%s/openapi.json): every route with its answers, headers, schemas and live prices\n", base)
	w("- [Interactive API docs](%s/docs): try the routes from the browser\n", base)
	w("- [x402 discovery manifest](%s/.well-known/x402): the paid routes with their live offers\n", base)
	w("- [Agent card](%s/.well-known/agent-card.json): service discovery and every public key version\n", base)
	return []byte(b.String())
}

func llmsPrice(s *Service, c op) string {
	if c.tools {
		if r, ok := s.endpoint(c.method, c.path); ok {
			price := "every message: " + llmsRoutePrice(r)
			if len(s.tools(c.method, c.path)) > 0 {
				price += "; each tool in the rows below on top"
			}
			return price
		}
		if len(s.tools(c.method, c.path)) == 0 {
			return "no tool priced on this server"
		}
		return "per tool, as the rows below"
	}
	if !c.paid {
		return "free"
	}
	r, ok := s.route(c.method, c.path)
	if !ok {
		return "not priced on this server"
	}
	if c.neverFree {
		r.Free = nil
	}
	return llmsRoutePrice(r)
}

// withPool is llmsRoutePrice with the free allowance's pool named.
func withPool(r Route) string {
	p := llmsRoutePrice(r)
	if r.Free != nil && r.Free.PerDay > 0 {
		p += fmt.Sprintf(" (pool `%s`)", r.Free.Pool)
	}
	return p
}

// routeName is how the documents name route r: "`METHOD /path`", with its
// MCP tool when it prices one.
func routeName(r Route) string {
	if r.Tool != "" {
		return "`" + r.key() + "` (MCP tool `" + r.Tool + "`)"
	}
	return "`" + r.key() + "`"
}

// andList joins names as prose: "a", "a and b", "a, b and c".
func andList(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

func llmsRoutePrice(r Route) string {
	var parts []string
	for _, a := range r.Accepts {
		p := PriceOf(a)
		parts = append(parts, fmt.Sprintf("%s (`%s` atomic units of `%s` on `%s`, pay to `%s`)", p.Display, p.Amount, p.Asset, p.Network, p.PayTo))
	}
	out := strings.Join(parts, " or ")
	if out == "" {
		out = "not priced on this server"
	}
	if r.Free != nil && r.Free.PerDay > 0 {
		out += fmt.Sprintf("; %d free calls per client per day", r.Free.PerDay)
	} else {
		out += "; never free"
	}
	return out
}

func clientKeyLong(key string) string {
	if key == "wallet" {
		return "the wallet proven with the `X-Wallet-Auth` header (a request without one gets no free calls)"
	}
	return "its IP address (the real client IP, honouring only the gateway's trusted proxies); the same address's REST and MCP verification calls share one allowance"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
