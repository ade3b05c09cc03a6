package receipt

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

// invoiceRequest is the worked example of SPEC §10 (the failing one: line
// totals 87.0 + 42.5 = 129.5 against a total of 135.0).
const invoiceRequest = `{
  "task_id": "invoice-7731",
  "agent_id": "test-seller-1",
  "expected_schema": {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["invoice_id", "currency", "line_items", "total"],
    "properties": {
      "invoice_id": {"type": "string", "pattern": "^INV-[0-9]{4}$"},
      "currency": {"enum": ["USD", "EUR"]},
      "line_items": {
        "type": "array", "minItems": 1,
        "items": {
          "type": "object",
          "required": ["sku", "qty", "line_total"],
          "properties": {
            "sku": {"type": "string"},
            "qty": {"type": "integer", "minimum": 1},
            "line_total": {"type": "number", "minimum": 0}
          }
        }
      },
      "total": {"type": "number"}
    }
  },
  "submitted_output": {
    "invoice_id": "INV-7731",
    "currency": "USD",
    "line_items": [
      {"sku": "WIDGET-A", "qty": 3, "line_total": 87.0},
      {"sku": "GADGET-B", "qty": 1, "line_total": 42.5}
    ],
    "total": 135.0
  },
  "rules": [{"type": "sum_equals", "field": "line_items[].line_total", "equals_field": "total"}],
  "enforce_rules": true
}`

const fixtureTime = "2026-11-29T21:22:28.123456+00:00"

// hashesOf computes output, schema and rules hashes of a request body the way
// SPEC §5 defines them (request_hash needs defaults filled in, which is the
// verify package's job; tests that need it set it themselves).
func hashesOf(t testing.TB, body string) Hashes {
	t.Helper()
	req := decodeTree(t, []byte(body)).(map[string]any)
	h := func(v any) string {
		c, err := AppendCanonical(nil, v)
		if err != nil {
			t.Fatal(err)
		}
		return Hash(c)
	}
	return Hashes{
		Output: h(req["submitted_output"]),
		Schema: h(req["expected_schema"]),
		Rules:  h(map[string]any{"bounds": req["bounds"], "rules": req["rules"]}),
	}
}

// fullResponse builds a realistic full verification response (SPEC §4 key
// order, the §10 failing invoice) without its attestation.
func fullResponse(t testing.TB, keyVersion string) []byte {
	t.Helper()
	hs := hashesOf(t, invoiceRequest)
	resp := `{"summary":{"result":"fail","blocking_checks":["consistency:sum_equals"]},` +
		`"next_actions":[{"action":"repair_and_reverify","using":"hints"}],` +
		`"result":"fail","verification_id":"5b1f4c9e-8d0a-4f8e-9b3c-2a7d6e1f0c44","task_id":"invoice-7731","agent_id":"test-seller-1",` +
		`"output_hash":"` + hs.Output + `","schema_hash":"` + hs.Schema + `","rules_hash":"` + hs.Rules + `",` +
		`"request_hash":"9a3e0d1c2b4f5a6e7d8c9b0a1f2e3d4c5b6a7f8e9d0c1b2a3f4e5d6c7b8a9f0e",` +
		`"verified_at":"` + fixtureTime + `","verifier_version":"1.0.0","enforce_rules":true,"strict_content_check":false,` +
		`"errors":["enforce_rules: consistency:sum_equals at 'line_items[].line_total': values sum to 129.5, expected total (135.0)"],` +
		`"errors_total":1,"errors_omitted":0,` +
		`"errors_detail":[{"check":"consistency:sum_equals","path":"$.line_items[].line_total","expected":"a sum equal to total (135.0)","found":"sum 129.5","message":"values sum to 129.5, expected total (135.0)"}],` +
		`"errors_detail_total":1,"errors_detail_omitted":0,"flags":[],"flags_total":0,"flags_omitted":0,` +
		`"hints":[{"source":"integrity","check":"consistency:sum_equals","path":"$.line_items[].line_total","expected":"a sum equal to total (135.0)","found":"sum 129.5"}],` +
		`"hints_total":1,"hints_omitted":0,` +
		`"schema_compliance":{"ratio":1.0,"passed":22,"total":22},"integrity_checks":{"ratio":0.0,"passed":0,"total":1},"overall":{"ratio":0.956522,"passed":22,"total":23},` +
		`"verify":{"public_key_url":"https://verifier.example/.well-known/agent-card.json","key_version":"` + keyVersion + `","canonicalization":"RFC 8785 (JCS)","hash_algorithm":"SHA-256","service":"aov","mcp":"https://verifier.example/mcp"}}`
	if !json.Valid([]byte(resp)) {
		t.Fatal("fixture is not JSON")
	}
	return []byte(resp)
}

// scoreResponse is a trust-score response: no output_hash.
func scoreResponse(keyVersion string) []byte {
	return []byte(`{"agent_id":"seller-7","score":0.87,"verifications":41,"passed":38,"computed_at":"` + fixtureTime + `",` +
		`"verify":{"public_key_url":"https://verifier.example/.well-known/agent-card.json","key_version":"` + keyVersion + `","canonicalization":"RFC 8785 (JCS)","hash_algorithm":"SHA-256","service":"aov","mcp":"https://verifier.example/mcp"}}`)
}

// attach signs resp and splices the attestation before the final '}', as
// verifierd does.
func attach(t testing.TB, priv ed25519.PrivateKey, context, kv, at string, resp []byte) []byte {
	t.Helper()
	att, err := Sign(priv, context, kv, at, resp)
	if err != nil {
		t.Fatal(err)
	}
	return withAttestation(t, resp, att)
}

func withAttestation(t testing.TB, resp []byte, att Attestation) []byte {
	t.Helper()
	a, err := json.Marshal(att)
	if err != nil {
		t.Fatal(err)
	}
	i := bytes.LastIndexByte(resp, '}')
	out := append([]byte(nil), resp[:i]...)
	out = append(out, `,"attestation":`...)
	out = append(out, a...)
	return append(out, '}')
}

// seededKey returns a deterministic key pair so failures reproduce.
func seededKey(b byte) (ed25519.PublicKey, ed25519.PrivateKey) {
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	return priv.Public().(ed25519.PublicKey), priv
}

type cardKey struct {
	version, status, compromisedSince string
	// createdAt defaults to 2026-01-01T00:00:00Z; retiredAt is left out
	// when empty.
	createdAt, retiredAt string
	pub                  ed25519.PublicKey
}

// cardWith builds an agent card in the shape agentcard/ publishes.
func cardWith(current string, keys ...cardKey) []byte {
	var pks []string
	for _, k := range keys {
		created := k.createdAt
		if created == "" {
			created = "2026-01-01T00:00:00Z"
		}
		e := `{"keyVersion":"` + k.version + `","algorithm":"Ed25519","publicKey":"` + base64.StdEncoding.EncodeToString(k.pub) + `","publicKeyEncoding":"base64","status":"` + k.status + `","createdAt":"` + created + `"`
		if k.retiredAt != "" {
			e += `,"retiredAt":"` + k.retiredAt + `"`
		}
		if k.compromisedSince != "" {
			e += `,"compromisedSince":"` + k.compromisedSince + `"`
		}
		pks = append(pks, e+"}")
	}
	return []byte(`{"name":"Agent Output Verifier","description":"Checks agent output.","url":"https://verifier.example","version":"1.0.0","skills":[],` +
		`"capabilities":{"extensions":[{"uri":"urn:example:other","params":{}},{"uri":"` + ExtensionURI + `","description":"Signed receipts","required":false,` +
		`"params":{"publicKeys":[` + strings.Join(pks, ",") + `],"currentKeyVersion":"` + current + `","canonicalization":"RFC 8785 (JCS)","hashAlgorithm":"SHA-256",` +
		`"contexts":{"verify":"` + ContextVerify + `","score":"` + ContextScore + `"},"signedDocument":"{context, algorithm, key_version, attested_at, response}"}}]}}`)
}
