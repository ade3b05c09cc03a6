package schema

import (
	"strconv"
	"strings"
	"testing"
)

// Every application to an object costs a step per namesPerStep members,
// whatever the schema says about them: the validator ranges over every
// member at every application, looking each up in the schema's properties
// and patternProperties, present or not. Here the root and its two allOf
// branches, none with a property keyword, over 400 members. (An empty
// schema, {}, is compiled as true and costs one step.)
func TestEveryApplicationToAnObjectIsChargedByItsMembers(t *testing.T) {
	const n = 400
	members := make([]string, n)
	for i := range members {
		members[i] = `"m` + strconv.Itoa(i) + `": 0`
	}
	obj := decode(t, `{`+strings.Join(members, ", ")+`}`)
	if got, want := stepsOf(t, mustCompile(t, `{"allOf": [{"minProperties": 1}, {"type": "object"}]}`), obj), 3*(1+n/namesPerStep); got != want {
		t.Errorf("3 applications to %d members: %d steps; want %d", n, got, want)
	}
}

// A member additionalProperties: false refuses costs a step of its own,
// as a name required lacks does: the validator lists each in its error
// and each is described as a failure.
func TestRefusedAdditionalPropertiesAreChargedEach(t *testing.T) {
	const n = 400
	members := make([]string, n)
	for i := range members {
		members[i] = `"m` + strconv.Itoa(i) + `": 0`
	}
	obj := decode(t, `{`+strings.Join(members, ", ")+`}`)
	refused := stepsOf(t, mustCompile(t, `{"additionalProperties": false}`), obj)
	allowed := stepsOf(t, mustCompile(t, `{"additionalProperties": true}`), obj)
	if want := n + failureSteps; refused-allowed != want {
		t.Errorf("%d members refused: %d steps, %d allowed; want %d more", n, refused, allowed, want)
	}
}
