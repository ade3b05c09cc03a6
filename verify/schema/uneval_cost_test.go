package schema

import (
	"strconv"
	"strings"
	"testing"
)

// Under unevaluatedProperties, every application copies the object's
// members into a set of its own and intersects its caller's set with it,
// in the walk and in the validator, and costs a step per
// unevalMembersPerStep members copied or looked up: here the copy of the
// schema holding unevaluatedProperties, then for each of its two allOf
// branches a copy and the intersection, and the 400 members applied to
// unevaluatedProperties.
func TestUnevaluatedSetIsCharged(t *testing.T) {
	const n = 400
	members := make([]string, n)
	for i := range members {
		members[i] = `"m` + strconv.Itoa(i) + `": 0`
	}
	obj := decode(t, `{`+strings.Join(members, ", ")+`}`)
	with := stepsOf(t, mustCompile(t, `{"allOf": [{"unevaluatedProperties": true, "allOf": [{}, {}]}]}`), obj)
	without := stepsOf(t, mustCompile(t, `{"allOf": [{"allOf": [{}, {}]}]}`), obj)
	if want := n/unevalMembersPerStep*(1+2*2) + n; with-without != want {
		t.Errorf("%d members: %d steps under unevaluatedProperties, %d without; want %d more", n, with, without, want)
	}

	// The same for the items of an array under unevaluatedItems.
	arr := decode(t, `[`+strings.TrimSuffix(strings.Repeat("0, ", n), ", ")+`]`)
	with = stepsOf(t, mustCompile(t, `{"allOf": [{"unevaluatedItems": true, "allOf": [{}, {}]}]}`), arr)
	without = stepsOf(t, mustCompile(t, `{"allOf": [{"allOf": [{}, {}]}]}`), arr)
	if want := n/unevalMembersPerStep*(1+2*2) + n; with-without != want {
		t.Errorf("%d items: %d steps under unevaluatedItems, %d without; want %d more", n, with, without, want)
	}
}
