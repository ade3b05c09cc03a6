package jsontree

import (
	"encoding/json"
	"slices"
	"testing"
)

func TestObjects(t *testing.T) {
	var v any
	if err := json.Unmarshal([]byte(`{"n":"a","x":[{"n":"b","y":{"n":"c"}},1,"s",[{"n":"d"}]],"z":null}`), &v); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range Objects(v) {
		names = append(names, o["n"].(string))
	}
	slices.Sort(names)
	if !slices.Equal(names, []string{"a", "b", "c", "d"}) {
		t.Fatalf("objects %v, want a, b, c and d", names)
	}
	if got := Objects("scalar"); len(got) != 0 {
		t.Fatalf("a scalar has %d objects, want none", len(got))
	}
}
