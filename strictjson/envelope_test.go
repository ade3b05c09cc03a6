package strictjson

import (
	"encoding/json"
	"testing"
)

// A number below the data path that Decode refuses is kept as written and
// reported, so the envelope around it stays readable; anywhere else it
// refuses the document, as does any other problem below the data path.
func TestDecodeEnvelopeKeepsDataNumbers(t *testing.T) {
	data := []string{"params", "arguments"}
	doc := []byte(`{"id":1,"params":{"arguments":{"a":{"n":1e400},"b":[9007199254740993],"c":1.5}}}`)
	e, err := DecodeEnvelope(doc, Limits{}, nil, data)
	if err != nil {
		t.Fatal(err)
	}
	if e.Number == nil || e.Number.Path != "params.arguments.a.n" || e.Number.Problem != "a number is too large to be represented as a double" {
		t.Fatalf("the first refused number: %+v", e.Number)
	}
	args := e.Value.(map[string]any)["params"].(map[string]any)["arguments"].(map[string]any)
	if n := args["a"].(map[string]any)["n"]; n != json.Number("1e400") {
		t.Fatalf("kept as %#v", n)
	}
	if n := args["b"].([]any)[0]; n != json.Number("9007199254740993") {
		t.Fatalf("kept as %#v", n)
	}
	for _, bad := range []string{
		`{"id":9007199254740993,"params":{"arguments":{}}}`,       // the envelope's own
		`{"params":{"arguments":1e400}}`,                          // the data path itself
		`{"params":{"_meta":{"n":1e400},"arguments":{}}}`,         // beside it
		`{"params":[{"arguments":{"n":1e400}}]}`,                  // an index is no member
		`{"params":{"arguments":{"n":1,"n":2}}}`,                  // not a number problem
		`{"params":{"arguments":{"n":1e400,"m":0.` + "1e" + `}}}`, // a syntax error after one
	} {
		if _, err := DecodeEnvelope([]byte(bad), Limits{}, nil, data); err == nil {
			t.Errorf("%s was read", bad)
		}
	}
	if _, err := Decode(doc, Limits{}); err == nil {
		t.Fatal("Decode read the numbers DecodeEnvelope keeps")
	}
}
