package schema

import (
	"strconv"
	"strings"
	"testing"
)

// Every application scans all the entries of dependentRequired,
// dependentSchemas and draft-07 dependencies, in the walk and in the
// validator, looking each name up in the object, and costs a step per
// namesPerStep entries, present or not: here 400 entries naming members
// the object lacks.
func TestDependentEntriesAreCharged(t *testing.T) {
	const n = 400
	entries := func(val string) string {
		e := make([]string, n)
		for i := range e {
			e[i] = `"m` + strconv.Itoa(i) + `": ` + val
		}
		return `{` + strings.Join(e, ", ") + `}`
	}
	const draft7 = `"$schema": "http://json-schema.org/draft-07/schema#", `
	obj := decode(t, `{"z": 1}`)
	for _, tc := range []struct{ name, schema string }{
		{"dependentRequired", `{"dependentRequired": ` + entries(`["z"]`) + `}`},
		{"dependentSchemas", `{"dependentSchemas": ` + entries(`true`) + `}`},
		{"dependencies of arrays", `{` + draft7 + `"dependencies": ` + entries(`["z"]`) + `}`},
		{"dependencies of schemas", `{` + draft7 + `"dependencies": ` + entries(`true`) + `}`},
	} {
		if got, want := stepsOf(t, mustCompile(t, tc.schema), obj), 1+n/namesPerStep; got != want {
			t.Errorf("%s of %d entries: %d steps; want %d", tc.name, n, got, want)
		}
	}
}
