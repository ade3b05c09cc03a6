package verify

import (
	"testing"

	"github.com/aovhq/aov/receipt"
	"github.com/aovhq/aov/strictjson"
)

// specVectors are the request_hash test vectors of SPEC §5, verbatim.
var specVectors = []struct {
	desc, request, canonical, hash string
}{
	{
		desc:      "vector 1: a minimal request gets every default filled in",
		request:   `{"task_id":"tv-1","expected_schema":{"type":"object","required":["ok"],"properties":{"ok":{"type":"boolean"}}},"submitted_output":{"ok":true}}`,
		canonical: `{"agent_id":null,"bounds":null,"enforce_rules":false,"expected_schema":{"properties":{"ok":{"type":"boolean"}},"required":["ok"],"type":"object"},"rules":null,"strict_content_check":false,"submitted_output":{"ok":true},"task_id":"tv-1"}`,
		hash:      "5366542000b4226c5efb411c15ec8f0aac3c63844343997aa1bcc3c585086f97",
	},
	{
		desc:      "vector 2: every bound and rule gets every field, numbers canonicalized",
		request:   `{"task_id":"tv-2","agent_id":"seller-7","expected_schema":{"type":"object","required":["items","total"],"properties":{"items":{"type":"array","items":{"type":"object","required":["id","price"],"properties":{"id":{"type":"string"},"price":{"type":"number"}}}},"total":{"type":"number"}}},"submitted_output":{"total":30.5,"items":[{"id":"a","price":10.0},{"id":"b","price":20.5}]},"bounds":{"items[].price":{"min":0,"max":100}},"rules":[{"type":"sum_equals","field":"items[].price","equals_field":"total","tolerance":0.01},{"type":"unique","field":"items[].id"}],"enforce_rules":true}`,
		canonical: `{"agent_id":"seller-7","bounds":{"items[].price":{"if_present":false,"max":100,"min":0}},"enforce_rules":true,"expected_schema":{"properties":{"items":{"items":{"properties":{"id":{"type":"string"},"price":{"type":"number"}},"required":["id","price"],"type":"object"},"type":"array"},"total":{"type":"number"}},"required":["items","total"],"type":"object"},"rules":[{"equals":null,"equals_field":"total","field":"items[].price","if_present":false,"in_field":null,"other_field":null,"tolerance":0.01,"type":"sum_equals","value":null,"values":null},{"equals":null,"equals_field":null,"field":"items[].id","if_present":false,"in_field":null,"other_field":null,"tolerance":1e-9,"type":"unique","value":null,"values":null}],"strict_content_check":false,"submitted_output":{"items":[{"id":"a","price":10},{"id":"b","price":20.5}],"total":30.5},"task_id":"tv-2"}`,
		hash:      "1aa064d21a2c1487d5d319ded6efec48c18dfee45b93f741266b1f491c2e099f",
	},
	{
		desc:      "vector 3: literal UTF-8, exponents and if_present as given",
		request:   `{"task_id":"tv-3","expected_schema":{"type":"object","properties":{"name":{"type":"string"},"n":{"type":"number"}}},"submitted_output":{"n":1.0,"name":"café ✓","z":[1e+21,1e-06]},"strict_content_check":true,"rules":[{"type":"gte","field":"n","value":0,"if_present":true}]}`,
		canonical: `{"agent_id":null,"bounds":null,"enforce_rules":false,"expected_schema":{"properties":{"n":{"type":"number"},"name":{"type":"string"}},"type":"object"},"rules":[{"equals":null,"equals_field":null,"field":"n","if_present":true,"in_field":null,"other_field":null,"tolerance":1e-9,"type":"gte","value":0,"values":null}],"strict_content_check":true,"submitted_output":{"n":1,"name":"café ✓","z":[1e+21,0.000001]},"task_id":"tv-3"}`,
		hash:      "037abd3fe4643c14e68d9fd57ca93b460c177c5372f058aa2920a2ef120c0432",
	},
}

func decodeDoc(t *testing.T, body string) map[string]any {
	t.Helper()
	tree, err := strictjson.Decode([]byte(body), strictjson.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return tree.(map[string]any)
}

func canonicalOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := receipt.AppendCanonical(nil, v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestSpecRequestHashVectorsReproduceByteForByte(t *testing.T) {
	v := New(Config{})
	for _, tc := range specVectors {
		t.Run(tc.desc, func(t *testing.T) {
			doc := decodeDoc(t, tc.request)
			canon, err := requestCanonical(doc)
			if err != nil {
				t.Fatal(err)
			}
			if string(canon) != tc.canonical {
				t.Fatalf("canonical request\n got %s\nwant %s", canon, tc.canonical)
			}
			if got := receipt.Hash(canon); got != tc.hash {
				t.Fatalf("hash of the canonical form = %s, want %s", got, tc.hash)
			}
			req, err := v.Parse([]byte(tc.request))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if req.Hashes.Request != tc.hash {
				t.Errorf("Parse request_hash = %s, want %s", req.Hashes.Request, tc.hash)
			}
			hs, err := ComputeHashes([]byte(tc.request))
			if err != nil {
				t.Fatalf("ComputeHashes: %v", err)
			}
			if hs != req.Hashes {
				t.Errorf("ComputeHashes = %+v, Parse = %+v", hs, req.Hashes)
			}
		})
	}
}

func TestHashesCoverExactlyWhatSpecSays(t *testing.T) {
	v := New(Config{})
	for _, tc := range specVectors {
		t.Run(tc.desc, func(t *testing.T) {
			doc := decodeDoc(t, tc.request)
			req, err := v.Parse([]byte(tc.request))
			if err != nil {
				t.Fatal(err)
			}
			if want := receipt.Hash(canonicalOf(t, doc["submitted_output"])); req.Hashes.Output != want {
				t.Errorf("output_hash = %s, want the hash of submitted_output %s", req.Hashes.Output, want)
			}
			if want := receipt.Hash(canonicalOf(t, doc["expected_schema"])); req.Hashes.Schema != want {
				t.Errorf("schema_hash = %s, want the hash of expected_schema %s", req.Hashes.Schema, want)
			}
			rules := map[string]any{"bounds": doc["bounds"], "rules": doc["rules"]}
			if want := receipt.Hash(canonicalOf(t, rules)); req.Hashes.Rules != want {
				t.Errorf("rules_hash = %s, want the hash of {bounds, rules} as sent %s", req.Hashes.Rules, want)
			}
		})
	}
}

func TestRulesHashIsOfBoundsAndRulesAsSent(t *testing.T) {
	v := New(Config{})
	base := `"task_id":"t","expected_schema":{},"submitted_output":{"a":[1,2]}`
	tests := []struct {
		desc, extra, canonical string
	}{
		{desc: "absent bounds and rules hash as nulls", extra: ``, canonical: `{"bounds":null,"rules":null}`},
		{desc: "explicit nulls hash as nulls", extra: `,"bounds":null,"rules":null`, canonical: `{"bounds":null,"rules":null}`},
		{desc: "empty bounds and rules hash as sent, not as null", extra: `,"bounds":{},"rules":[]`, canonical: `{"bounds":{},"rules":[]}`},
		{desc: "defaults are not filled in", extra: `,"rules":[{"field":"a[]","type":"unique"}]`, canonical: `{"bounds":null,"rules":[{"field":"a[]","type":"unique"}]}`},
		{desc: "numbers are canonicalized", extra: `,"bounds":{"a[]":{"max":1.50E2}}`, canonical: `{"bounds":{"a[]":{"max":150}},"rules":null}`},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			req, err := v.Parse([]byte("{" + base + tc.extra + "}"))
			if err != nil {
				t.Fatal(err)
			}
			if want := receipt.Hash([]byte(tc.canonical)); req.Hashes.Rules != want {
				t.Errorf("rules_hash = %s, want hash of %s", req.Hashes.Rules, tc.canonical)
			}
		})
	}
}

func TestRequestHashIgnoresDetailAndSpelling(t *testing.T) {
	v := New(Config{})
	a, err := v.Parse([]byte(`{"task_id":"t","expected_schema":{"type":"object"},"submitted_output":{"x":1.0,"y":"é"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := v.Parse([]byte(` { "submitted_output" : {"y":"\u00e9","x":1}, "detail":"compact", "expected_schema":{"type":"object"},
		"task_id":"t", "agent_id":null, "bounds":{}, "rules":[], "enforce_rules":false, "strict_content_check":false } `))
	if err != nil {
		t.Fatal(err)
	}
	if a.Hashes.Request != b.Hashes.Request || a.Hashes.Output != b.Hashes.Output {
		t.Fatalf("hashes differ for the same request: %+v vs %+v", a.Hashes, b.Hashes)
	}
	if a.Hashes.Rules == b.Hashes.Rules {
		t.Fatal("rules_hash must distinguish absent bounds/rules from empty ones as sent")
	}
}

func TestComputeHashesRefusesWhatIsNotARequest(t *testing.T) {
	for _, body := range []string{``, `[]`, `{"task_id":"t"}`, `{"task_id":"t","expected_schema":{},"submitted_output":1,"x":1}`} {
		if _, err := ComputeHashes([]byte(body)); err == nil {
			t.Errorf("ComputeHashes(%q) succeeded", body)
		}
	}
}
