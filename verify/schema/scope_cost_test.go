package schema

import (
	"strconv"
	"strings"
	"testing"
)

// chain is a schema applying k linked subschemas to each item, each
// holding link (a $dynamicRef or $recursiveRef to $defs/d or the root).
func chain(head, link string, k int) string {
	var b strings.Builder
	b.WriteString(`{` + head + `"items": {"$ref": "#/$defs/c0"}, "$defs": {"d": {"$dynamicAnchor": "a"}`)
	for i := range k {
		b.WriteString(`, "c` + strconv.Itoa(i) + `": {` + link)
		if i+1 < k {
			b.WriteString(`, "$ref": "#/$defs/c` + strconv.Itoa(i+1) + `"`)
		}
		b.WriteString(`}`)
	}
	b.WriteString(`}}`)
	return b.String()
}

// A $dynamicRef whose target holds its anchor, or a $recursiveRef to a
// $recursiveAnchor, searches the whole dynamic scope and costs one step
// per namesPerStep schemas in it; the same references without the search
// cost nothing more. In a chain of 40, link i searches i+3 schemas (the
// root, the items schema, then c0 to ci).
func TestScopeSearchSteps(t *testing.T) {
	const k = 40
	search := 0
	for i := range k {
		search += (i + 3) / namesPerStep
	}
	const draft2019 = `"$schema": "https://json-schema.org/draft/2019-09/schema", `
	for _, tc := range []struct{ name, with, without string }{
		{"$dynamicRef",
			chain("", `"$dynamicRef": "#a"`, k),
			chain("", `"$dynamicRef": "#/$defs/d"`, k)},
		{"$recursiveRef",
			chain(draft2019+`"$recursiveAnchor": true, `, `"$recursiveRef": "#"`, k),
			chain(draft2019, `"$recursiveRef": "#"`, k)},
	} {
		inst := decode(t, `[0]`)
		with, without := stepsOf(t, mustCompile(t, tc.with), inst), stepsOf(t, mustCompile(t, tc.without), inst)
		if with-without != search {
			t.Errorf("%s: %d steps with the search, %d without; want %d more", tc.name, with, without, search)
		}
	}
}

// Every application looks for a reference cycle among the schemas applied
// at the same location, in the walk and again in the validator, and costs
// one step per cycleEntriesPerStep of them: link i of a $ref chain under
// items is reached with i+1 schemas at its item (the items schema, then
// c0 to c(i-1)).
func TestCycleCheckSteps(t *testing.T) {
	const k = 600
	want := 2 + k // the root, the items schema, the links
	for i := range k {
		want += (i + 1) / cycleEntriesPerStep
	}
	s := mustCompile(t, chain("", `"type": "number"`, k))
	if got := stepsOf(t, s, decode(t, `[0]`)); got != want {
		t.Errorf("a chain of %d $refs: %d steps; want %d", k, got, want)
	}
}

// selfChain is a chain of k $refs under items whose last link refers to
// itself: a reference cycle closed with k+3 schemas in the dynamic scope.
func selfChain(k int) string {
	var b strings.Builder
	b.WriteString(`{"items": {"$ref": "#/$defs/c0"}, "$defs": {`)
	for i := range k {
		next := i + 1
		if next == k {
			next = i
		}
		if i > 0 {
			b.WriteString(`, `)
		}
		b.WriteString(`"c` + strconv.Itoa(i) + `": {"$ref": "#/$defs/c` + strconv.Itoa(next) + `"}`)
	}
	b.WriteString(`}}`)
	return b.String()
}

// A reference cycle costs the two keyword locations the validator renders
// for it by walking the whole dynamic scope, copying the location so far
// at each schema: each at least a step per kwLocBytesPerStep bytes copied,
// here (k+3) schemas times a location of at least 14 bytes per schema
// (locBytes), so its cost grows with the square of the scope, while a
// cycle under a short scope costs a few steps like any failure.
func TestRefCycleStepsGrowWithTheScope(t *testing.T) {
	inst := decode(t, `[0]`)
	short := stepsOf(t, mustCompile(t, selfChain(4)), inst)
	if short > 40 {
		t.Errorf("a cycle under a scope of 7: %d steps; want a few", short)
	}
	const k = 800
	n := k + 3
	if got, want := stepsOf(t, mustCompile(t, selfChain(k)), inst), 2*n*14*(n-1)/kwLocBytesPerStep; got < want {
		t.Errorf("a cycle under a scope of %d: %d steps; want more than %d", n, got, want)
	}
}
