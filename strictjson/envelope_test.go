package strictjson

import (
	"encoding/json"
	"strings"
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
	if e.Data == nil || e.Data.Path != "params.arguments.a.n" || e.Data.Problem != "a number is too large to be represented as a double" {
		t.Fatalf("the first refused number: %+v", e.Data)
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

// Nesting past the limit and an unpaired surrogate escape below the data
// path are the data's refusal too, worded as Decode of the data alone
// words it (the limit counts the data value as level 1), and the envelope
// around them stays readable: the deep value is skipped, however deep,
// the string keeps U+FFFD. Outside the data both still refuse the
// document, and the skipped value's syntax is still checked. (Before: both
// refused the whole document, naming the document's limit.)
func TestDecodeEnvelopeKeepsDeepAndUnpairedData(t *testing.T) {
	data := []string{"params", "arguments"}
	lim := Limits{MaxDepth: 8} // the data's own limit: 6
	deep := func(n int) string { return strings.Repeat(`[{"a":`, n) + `"\ud800"` + strings.Repeat(`}]`, n) }
	for _, c := range []struct{ desc, args, path, problem string }{
		{"nested past the limit", `{"s":"x","o":` + deep(3) + `}`, "params.arguments.o[0].a[0].a[0]", "nesting is deeper than the limit of 6 levels"},
		{"nested thousands of levels", `{"o":` + deep(5000) + `}`, "params.arguments.o[0].a[0].a[0]", "nesting is deeper than the limit of 6 levels"},
		{"an unpaired surrogate", `{"o":{"s":"a\ud800b"},"k":"\udc00"}`, "params.arguments.o.s", "a string contains an unpaired UTF-16 surrogate escape"},
		{"an unpaired surrogate in a name", `{"\udc00":1}`, "params.arguments", "a string contains an unpaired UTF-16 surrogate escape"},
	} {
		doc := `{"id":1,"params":{"arguments":` + c.args + `,"name":"t"}}`
		e, err := DecodeEnvelope([]byte(doc), lim, nil, data)
		if err != nil {
			t.Errorf("%s: the document was refused: %v", c.desc, err)
			continue
		}
		if e.Data == nil || e.Data.Path != c.path || e.Data.Problem != c.problem {
			t.Errorf("%s: the data's refusal is %+v, want %s at %s", c.desc, e.Data, c.problem, c.path)
		}
		if e.Value.(map[string]any)["params"].(map[string]any)["name"] != "t" {
			t.Errorf("%s: the envelope after the data was not read", c.desc)
		}
	}
	e, _ := DecodeEnvelope([]byte(`{"params":{"arguments":{"s":"a\ud800b"}}}`), lim, nil, data)
	if s := e.Value.(map[string]any)["params"].(map[string]any)["arguments"].(map[string]any)["s"]; s != "a\uFFFDb" {
		t.Errorf("the unpaired surrogate was kept as %q", s)
	}
	for _, bad := range []string{
		`{"params":{"_meta":` + deep(4) + `,"arguments":{}}}`,        // beside the data
		`{"params":{"name":"\ud800","arguments":{}}}`,                // the envelope's own
		`{"params":{"arguments":{"o":` + deep(4) + `,"n":1,"n":2}}}`, // a duplicate after it
		`{"params":{"arguments":{"o":[[[[[[[[1,]]]]]]]]}}}`,          // a syntax error in the skipped value
		`{"params":{"arguments":{"o":[[[[[[[["\xff"]]]]]]]]}}}`,      // invalid UTF-8 in it
		`{"params":{"arguments":{"o":[[[[[[[[{"a" 1}]]]]]]]]}}}`,     // a key without its colon
		`{"params":{"arguments":{"o":[[[[[[[[1]]]]]]]}}}`,            // a bracket short
	} {
		if _, err := DecodeEnvelope([]byte(bad), lim, nil, data); err == nil {
			t.Errorf("%s was read", bad)
		}
	}
}
