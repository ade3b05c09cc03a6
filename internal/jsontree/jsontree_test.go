package jsontree

import (
	"encoding/json"
	"slices"
	"strings"
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

func TestNumbers(t *testing.T) {
	d := json.NewDecoder(strings.NewReader(`{"a":1,"b":[2.5,{"c":-3e2}],"d":"4","e":null}`))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, n := range Numbers(v) {
		got = append(got, n.String())
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"-3e2", "1", "2.5"}) {
		t.Fatalf("numbers %v, want -3e2, 1 and 2.5", got)
	}
}
