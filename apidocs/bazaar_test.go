package apidocs

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/aovhq/aov/verify"
)

// TestBazaarVerifyDescribesTheRoute checks the extension against what it
// claims: its schema compiles on its own (no reference leaves it), its
// example input validates against it and is a request the verifier accepts,
// and it stays small enough to travel in a header.
func TestBazaarVerifyDescribesTheRoute(t *testing.T) {
	ext := BazaarVerify()
	raw, err := json.Marshal(ext)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) > 12<<10 {
		t.Errorf("the extension is %d bytes; keep PAYMENT-REQUIRED well under client header limits", len(raw))
	}
	if strings.Contains(string(raw), "#/components/") {
		t.Fatal("a reference points outside the extension")
	}
	var doc map[string]any
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	schemaDoc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(mustJSON(t, doc["schema"]))))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("bazaar.json", schemaDoc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile("bazaar.json")
	if err != nil {
		t.Fatalf("the schema does not compile on its own: %v", err)
	}
	info, err := jsonschema.UnmarshalJSON(strings.NewReader(string(mustJSON(t, doc["info"]))))
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(info); err != nil {
		t.Fatalf("the example does not match the schema: %v", err)
	}
	body := mustJSON(t, doc["info"].(map[string]any)["input"].(map[string]any)["body"])
	if _, err := verify.New(verify.Config{}).Parse(body); err != nil {
		t.Fatalf("the example body is not a valid request: %v", err)
	}
	bad, _ := jsonschema.UnmarshalJSON(strings.NewReader(`{"input":{"type":"http","method":"POST","bodyType":"json","body":{"task_id":""}}}`))
	if sch.Validate(bad) == nil {
		t.Fatal("the schema accepts a request without expected_schema")
	}
}
