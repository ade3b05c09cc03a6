package strictjson

import (
	"bytes"
	"reflect"
	"testing"
)

// cutPath is the member the DecodeCut tests locate: a.b.
var cutPath = []string{"a", "b"}

// checkCut holds DecodeCut's properties for one document: it accepts and
// refuses exactly what Decode does and returns the same tree; when the
// tree has a.b the Cut locates it, and the document without the cut bytes
// decodes to the tree without a.b, every byte outside the cut as it was;
// when it has none the Cut is zero.
func checkCut(t *testing.T, data []byte) {
	t.Helper()
	want, werr := Decode(data, Limits{})
	v, c, err := DecodeCut(data, Limits{}, cutPath)
	if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
		t.Fatalf("DecodeCut: %v, Decode: %v", err, werr)
	}
	if err != nil {
		return
	}
	if !reflect.DeepEqual(v, want) {
		t.Fatalf("tree %v, Decode gave %v", v, want)
	}
	root, _ := want.(map[string]any)
	a, _ := root["a"].(map[string]any)
	if _, has := a["b"]; !has {
		if c != (Cut{}) {
			t.Fatalf("no a.b, yet a cut %v", c)
		}
		return
	}
	out := c.Remove(data)
	if !bytes.Equal(out[:c.Start], data[:c.Start]) || !bytes.Equal(out[c.Start:], data[c.End:]) {
		t.Fatalf("Remove changed bytes outside the cut %v: %q", c, out)
	}
	got, err := Decode(out, Limits{})
	if err != nil {
		t.Fatalf("without a.b the document does not decode (%v): %q", err, out)
	}
	delete(a, "b")
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("without a.b: %v, want %v (%q)", got, want, out)
	}
}

func TestDecodeCut(t *testing.T) {
	for _, doc := range []string{
		`{"a":{"b":1}}`, `{"a":{ "b" : 1 }}`, `{"a":{"x":1,"b":2}}`, `{"a":{"b":2,"x":1}}`, `{"a":{"x":1 , "b":[2,{"b":3}] , "y":1.00000000000000000001}}`,
		`{"a":{"x":{"b":1}},"b":2}`, `{"b":{"b":1}}`, `{"a":[{"b":1}]}`, `[{"a":{"b":1}}]`, `{"a":{"c":1}}`, `{"a":1}`,
		`{"a":{"b":1,"b":2}}`, `{"a":{"b":1`, `{"a":{"b":1}} x`,
	} {
		checkCut(t, []byte(doc))
	}
	// Numbers keep their text: nothing outside the cut is encoded again.
	doc := []byte(`{"a":{"b":{"x402Version":2},"n":1.00000000000000000001},"m":1E400}`)
	_, c, err := DecodeCut(doc, Limits{}, cutPath)
	if err == nil {
		t.Fatalf("1E400 accepted")
	}
	doc = []byte(`{"a":{"b":{"x402Version":2},"n":1.00000000000000000001},"m":1e2}`)
	if _, c, err = DecodeCut(doc, Limits{}, cutPath); err != nil {
		t.Fatal(err)
	}
	if got := string(c.Remove(doc)); got != `{"a":{"n":1.00000000000000000001},"m":1e2}` {
		t.Fatalf("without a.b: %s", got)
	}
}

func FuzzDecodeCut(f *testing.F) {
	f.Add([]byte(`{"a":{"b":1}}`))
	f.Add([]byte(` { "a" : { "x" : 0.10 , "b" : {"b":[]} , "y" : 1e2 } } `))
	f.Add([]byte(`{"a":{"x":1,"b":"\u0062"}}`))
	f.Fuzz(func(t *testing.T, data []byte) { checkCut(t, data) })
}
