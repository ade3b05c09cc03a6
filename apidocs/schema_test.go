package apidocs

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/verify"
)

func decode(t testing.TB, raw []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("decoding: %v", err)
	}
	return v
}

// compileFrom compiles the schema at url+fragment of the JSON document raw,
// asserting formats when assertFormat is set (2020-12 makes format an
// annotation by default).
func compileFrom(t testing.TB, url string, raw []byte, fragment string, assertFormat bool) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if assertFormat {
		c.AssertFormat()
	}
	if err := c.AddResource(url, decode(t, raw)); err != nil {
		t.Fatalf("adding %s: %v", url, err)
	}
	s, err := c.Compile(url + fragment)
	if err != nil {
		t.Fatalf("compiling %s%s: %v", url, fragment, err)
	}
	return s
}

// componentValidator compiles the document's component schema name, or the
// schema at name when it is a JSON pointer fragment ("#/paths/...").
func componentValidator(t testing.TB, name string) *jsonschema.Schema {
	t.Helper()
	raw, err := OpenAPI(testService())
	if err != nil {
		t.Fatal(err)
	}
	fragment := "#/components/schemas/" + name
	if strings.HasPrefix(name, "#") {
		fragment = name
	}
	return compileFrom(t, "https://verify.example.com/openapi.json", raw, fragment, true)
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// signedResult is a real result of the verifier for a request, with the
// verify and attestation blocks a signed answer carries.
func signedResult(t *testing.T, body []byte, detail string) []byte {
	t.Helper()
	v := verify.New(verify.Config{VerifierVersion: "test"})
	req, err := v.Parse(body)
	if err != nil {
		t.Fatalf("the verifier refuses the request: %v", err)
	}
	res := v.Check(req, "3b241101-e2bb-4255-8caf-4136c566a962", time.Date(2026, 11, 29, 21, 22, 28, 123456000, time.UTC))
	res.Detail = detail
	res.Verify = receipt.VerifyBlock{
		PublicKeyURL: "https://verify.example.com/.well-known/agent-card.json", KeyVersion: "k1",
		Canonicalization: receipt.Canonicalization, HashAlgorithm: receipt.HashAlgorithm,
		Service: "Agent Output Verifier", MCP: "https://verify.example.com/mcp",
	}
	res.Attestation = &receipt.Attestation{Algorithm: receipt.Algorithm, KeyVersion: "k1", Timestamp: res.VerifiedAt, Signature: strings.Repeat("A", 86) + "=="}
	out, err := res.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSchemasDescribeTheRealShapes validates what the service really sends
// and accepts against the document's schemas, and shows that the schemas
// refuse what the service refuses.
func TestSchemasDescribeTheRealShapes(t *testing.T) {
	pass := mustJSON(t, invoiceRequest(129.5))
	fail := mustJSON(t, invoiceRequest(135.0))
	const verifyOK = "#/paths/~1verify~1schema/post/responses/200/content/application~1json/schema"
	compact := bytes.Replace(pass, []byte(`{`), []byte(`{"detail":"compact",`), 1)
	cases := []struct {
		desc, schema string
		doc          []byte
		valid        bool
	}{
		{"the SPEC §10 example request (pass) is a valid request", "VerificationRequest", pass, true},
		{"the SPEC §10 example request (fail) is a valid request", "VerificationRequest", fail, true},
		{"an unknown top-level field is refused", "VerificationRequest", []byte(`{"task_id":"t","expected_schema":{},"submitted_output":1,"colour":"red"}`), false},
		{"an unknown rule type is refused", "VerificationRequest", []byte(`{"task_id":"t","expected_schema":{},"submitted_output":1,"rules":[{"type":"approx","field":"a"}]}`), false},
		{"a task_id over 200 characters is refused", "VerificationRequest", []byte(`{"task_id":"` + strings.Repeat("x", 201) + `","expected_schema":{},"submitted_output":1}`), false},
		{"a missing submitted_output is refused", "VerificationRequest", []byte(`{"task_id":"t","expected_schema":{}}`), false},
		{"a full pass result of the verifier", "VerificationResult", signedResult(t, pass, verify.DetailFull), true},
		{"a full fail result of the verifier", "VerificationResult", signedResult(t, fail, verify.DetailFull), true},
		{"a compact result of the verifier", "VerificationResultCompact", signedResult(t, compact, verify.DetailCompact), true},
		{"a compact result is not a full one", "VerificationResult", signedResult(t, compact, verify.DetailCompact), false},
		{"the 200 of /verify/schema takes a full result", verifyOK, signedResult(t, pass, verify.DetailFull), true},
		{"the 200 of /verify/schema takes a compact result", verifyOK, signedResult(t, compact, verify.DetailCompact), true},
		{"the 200 of /verify/schema refuses an error", verifyOK, mustJSON(t, apierr.TooLarge(1)), false},
		{"invalid_request", "Error", mustJSON(t, apierr.Invalid(apierr.Field{Field: "rules[0].type", Problem: "p", Fix: "f"})), true},
		{"payload_too_large", "Error", mustJSON(t, apierr.TooLarge(1<<20)), true},
		{"upstream_unavailable", "Error", mustJSON(t, apierr.Unavailable("verifier", 5, nil)), true},
		{"an error claiming a charge is not the error shape", "Error", []byte(`{"code":"x","message":"m","status":500,"retryable":false,"charged":true,"next_actions":[]}`), false},
	}
	for _, tc := range cases {
		t.Run(tc.desc, func(t *testing.T) {
			err := componentValidator(t, tc.schema).Validate(decode(t, tc.doc))
			if tc.valid && err != nil {
				t.Fatalf("refused: %v\n%s", err, tc.doc)
			}
			if !tc.valid && err == nil {
				t.Fatalf("accepted:\n%s", tc.doc)
			}
		})
	}
}

// TestExamplesAreWhatTheyClaim runs the documented examples through the
// real verifier: the pass example passes and the fail example fails on the
// sum rule, as SPEC §10 says.
func TestExamplesAreWhatTheyClaim(t *testing.T) {
	for _, tc := range []struct {
		desc     string
		total    float64
		result   string
		blocking string
	}{
		{"total 129.5 passes", 129.5, "pass", ""},
		{"total 135.0 fails on consistency:sum_equals", 135.0, "fail", "consistency:sum_equals"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			var out map[string]any
			json.Unmarshal(signedResult(t, mustJSON(t, invoiceRequest(tc.total)), verify.DetailFull), &out)
			if out["result"] != tc.result {
				t.Fatalf("result %v, want %s", out["result"], tc.result)
			}
			sc := out["schema_compliance"].(map[string]any)
			if sc["passed"] != 22.0 || sc["total"] != 22.0 {
				t.Errorf("schema checks %v/%v, want 22/22 (SPEC §10)", sc["passed"], sc["total"])
			}
			if tc.blocking != "" && !strings.Contains(string(mustJSON(t, out["summary"])), tc.blocking) {
				t.Errorf("summary %v lacks %s", out["summary"], tc.blocking)
			}
		})
	}
}
