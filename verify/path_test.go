package verify

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestParsePathAcceptsTheGrammar(t *testing.T) {
	tests := []struct {
		desc    string
		in      string
		text    string
		display string
		steps   []step
	}{
		{desc: "a key is a path", in: "total", text: "total", display: "$.total", steps: []step{{key: "total"}}},
		{desc: "dots separate keys", in: "a.b.c", text: "a.b.c", display: "$.a.b.c", steps: []step{{key: "a"}, {key: "b"}, {key: "c"}}},
		{desc: "[] after a key means every element", in: "line_items[].line_total", text: "line_items[].line_total", display: "$.line_items[].line_total",
			steps: []step{{key: "line_items"}, {each: true}, {key: "line_total"}}},
		{desc: "several [] steps nest", in: "a.b[].c[].d", text: "a.b[].c[].d", display: "$.a.b[].c[].d",
			steps: []step{{key: "a"}, {key: "b"}, {each: true}, {key: "c"}, {each: true}, {key: "d"}}},
		{desc: "a $. prefix is accepted and ignored", in: "$.line_items[].sku", text: "line_items[].sku", display: "$.line_items[].sku",
			steps: []step{{key: "line_items"}, {each: true}, {key: "sku"}}},
		{desc: "[][] is every element of every inner array", in: "m[][]", text: "m[][]", display: "$.m[][]", steps: []step{{key: "m"}, {each: true}, {each: true}}},
		{desc: "a leading [] addresses an array output", in: "[].id", text: "[].id", display: "$[].id", steps: []step{{each: true}, {key: "id"}}},
		{desc: "$[] is the same as []", in: "$[]", text: "[]", display: "$[]", steps: []step{{each: true}}},
		{desc: "$ alone is the whole output", in: "$", text: "$", display: "$", steps: nil},
		{desc: "keys may hold spaces, unicode and $", in: "prix unitaire.€.$ref", text: "prix unitaire.€.$ref", display: "$.prix unitaire.€.$ref",
			steps: []step{{key: "prix unitaire"}, {key: "€"}, {key: "$ref"}}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			p, err := ParsePath(tc.in)
			if err != nil {
				t.Fatalf("ParsePath: %s", err.Problem)
			}
			if p.String() != tc.text || p.Display() != tc.display {
				t.Errorf("String %q Display %q, want %q %q", p.String(), p.Display(), tc.text, tc.display)
			}
			if len(p.steps) != len(tc.steps) || (len(tc.steps) > 0 && !reflect.DeepEqual(p.steps, tc.steps)) {
				t.Errorf("steps = %+v, want %+v", p.steps, tc.steps)
			}
		})
	}
}

func TestParsePathRefusesWhatDoesNotParse(t *testing.T) {
	tests := []struct {
		desc, in, problem string
	}{
		{desc: "an empty path is refused", in: "", problem: "is empty"},
		{desc: "an empty segment is refused", in: "a..b", problem: "has an empty key (two dots, or a dot at the start)"},
		{desc: "a leading dot is refused", in: ".a", problem: "has an empty key (two dots, or a dot at the start)"},
		{desc: "a trailing dot is refused", in: "a.", problem: "ends with '.'"},
		{desc: "$. alone is refused", in: "$.", problem: "has nothing after '$.'"},
		{desc: "a numeric index is refused", in: "items[0].id", problem: "has a '[' that is not followed by ']'"},
		{desc: "an unclosed bracket is refused", in: "items[", problem: "has a '[' that is not followed by ']'"},
		{desc: "a stray ] is refused", in: "items]", problem: "has a ']' without a '['"},
		{desc: "[] after a dot is refused", in: "items.[]", problem: "has '[]' right after a '.'"},
		{desc: "a key glued after [] is refused", in: "items[]id", problem: "has a key directly after '[]'"},
		{desc: "a control character is refused", in: "a\nb", problem: "contains a control character"},
		{desc: "a path over the length limit is refused", in: strings.Repeat("a", MaxPathBytes+1), problem: "is longer than 512 bytes"},
		{desc: "a path with too many steps is refused", in: strings.Repeat("a.", 64) + "a", problem: "has more than 64 steps"},
		{desc: "a doubled $ prefix is refused", in: "$.$.a", problem: "starts with '$' twice"},
		{desc: "invalid UTF-8 is refused", in: "a\xff", problem: "is not valid UTF-8"},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := ParsePath(tc.in)
			if err == nil {
				t.Fatal("accepted")
			}
			if err.Problem != tc.problem || err.Fix == "" {
				t.Errorf("problem %q fix %q, want %q", err.Problem, err.Fix, tc.problem)
			}
		})
	}
}

func TestPathResolvesEveryValueInDocumentOrder(t *testing.T) {
	doc := decodeDoc(t, `{"a":{"b":[{"c":[{"d":1},{"d":2},{"x":0}]},{"c":"not an array"},{"c":[{"d":3}]}]},"n":null,"arr":[[1,2],[3]]}`)
	tests := []struct {
		desc  string
		path  string
		want  []any
		where []string
	}{
		{desc: "nested [] steps visit every element", path: "a.b[].c[].d", want: []any{num("1"), num("2"), num("3")},
			where: []string{"$.a.b[0].c[0].d", "$.a.b[0].c[1].d", "$.a.b[2].c[0].d"}},
		{desc: "a missing key resolves to nothing", path: "a.zz", want: nil},
		{desc: "a key on a non-object resolves to nothing", path: "a.b[].c.d", want: nil},
		{desc: "null is a value", path: "n", want: []any{nil}, where: []string{"$.n"}},
		{desc: "[][] flattens arrays of arrays", path: "arr[][]", want: []any{num("1"), num("2"), num("3")},
			where: []string{"$.arr[0][0]", "$.arr[0][1]", "$.arr[1][0]"}},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			p, perr := ParsePath(tc.path)
			if perr != nil {
				t.Fatal(perr.Problem)
			}
			var got []any
			var where []string
			p.walk(doc, func(v any, idx []int) bool {
				got = append(got, v)
				where = append(where, p.locate(idx))
				return true
			})
			if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(where, tc.where) {
				t.Errorf("got %v at %v, want %v at %v", got, where, tc.want, tc.where)
			}
		})
	}
}

func FuzzPath(f *testing.F) {
	for _, s := range []string{"total", "line_items[].line_total", "$.a.b[].c[].d", "$", "$[]", "[].x", "a..b", "a[0]", "a[]b", "a.[]", "é.€[][]"} {
		f.Add(s)
	}
	doc := map[string]any{"a": []any{map[string]any{"b": 1}}}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePath(s)
		if err != nil {
			if err.Problem == "" || err.Fix == "" {
				t.Fatalf("error without problem or fix for %q", s)
			}
			return
		}
		// A parsed path re-parses to itself, from either of its forms.
		for _, form := range []string{p.String(), p.Display()} {
			q, err := ParsePath(form)
			if err != nil {
				t.Fatalf("%q parsed, but its form %q does not: %s", s, form, err.Problem)
			}
			if q.String() != p.String() || !reflect.DeepEqual(q.steps, p.steps) {
				t.Fatalf("%q → %q → %q", s, form, q.String())
			}
		}
		p.walk(doc, func(any, []int) bool { return true })
	})
}

func num(s string) any { return json.Number(s) }
