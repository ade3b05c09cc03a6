package strictjson

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// checkMembers holds DecodeMembers' properties for one document: it
// accepts and refuses exactly what Decode does, returns the same object,
// and each member's bytes are the value encoding/json splits out of the
// same document, and decode to that member of the object.
func checkMembers(t *testing.T, data []byte) {
	t.Helper()
	want, werr := Decode(data, Limits{FoldedNames: true})
	m, spans, err := DecodeMembers(data, Limits{FoldedNames: true})
	if (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
		t.Fatalf("DecodeMembers: %v, Decode: %v", err, werr)
	}
	if err != nil {
		return
	}
	obj, isObj := want.(map[string]any)
	if !isObj {
		if m != nil || spans != nil {
			t.Fatalf("not an object, yet a map %v and spans %q", m, spans)
		}
		return
	}
	if !reflect.DeepEqual(m, obj) {
		t.Fatalf("object %v, Decode gave %v", m, obj)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("encoding/json refuses what strictjson accepted: %v", err)
	}
	if len(spans) != len(raw) {
		t.Fatalf("spans of %d members, encoding/json sees %d", len(spans), len(raw))
	}
	for k, r := range raw {
		if !bytes.Equal(spans[k], r) {
			t.Fatalf("member %q: span %q, encoding/json %q", k, spans[k], r)
		}
		v, err := Decode(spans[k], Limits{FoldedNames: true})
		if err != nil || !reflect.DeepEqual(v, obj[k]) {
			t.Fatalf("member %q: span decodes to %v (%v), the object has %v", k, v, err, obj[k])
		}
	}
}

func TestDecodeMembers(t *testing.T) {
	for _, doc := range []string{
		`{}`, ` { "a" : 1 , "b":[1,{"c":"d"}],"e":{"f":{"g":null}} } `, `{"s":"x\"y\\u00e9","n":-1.5e3,"t":true}`,
		`[{"a":1}]`, `"s"`, `1`, `null`, `{"a":1,"A":2}`, `{"a":`, `{"a":1} x`, "\xef\xbb\xbf{}",
	} {
		checkMembers(t, []byte(doc))
	}
}

func FuzzDecodeMembers(f *testing.F) {
	f.Add([]byte(`{"x402Version":2,"payload":{"signature":"0x","authorization":{"from":"0x1"}},"accepted":{"extra":{"n":1}}}`))
	f.Add([]byte(`[{"a":1},{"b":[]}]`))
	f.Add([]byte(` {"a" : "\ud83d\ude00" , "b" : [ ] } `))
	f.Fuzz(func(t *testing.T, data []byte) { checkMembers(t, data) })
}
