package schema

import (
	"reflect"
	"unsafe"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Resolving $dynamicRef and $recursiveRef needs the schema resource each
// compiled schema belongs to and the dynamic anchors of that resource. The
// validator keeps both in unexported fields of jsonschema.Schema
// ("resource" and "dynamicAnchors") and offers no accessor. The counting
// walk must resolve references exactly as the validator does, or its
// verdict could disagree with the validator's, so it reads those two fields.
// The offsets are looked up by name and type once; if a future version of
// the library renamed or retyped them, the lookups fail closed (no
// resource: references resolve to their static target) and the JSON Schema
// Test Suite test reports the disagreement.
var (
	resourceOffset, anchorsOffset = fieldOffsets()
)

func fieldOffsets() (res, anchors uintptr) {
	t := reflect.TypeFor[jsonschema.Schema]()
	res, anchors = ^uintptr(0), ^uintptr(0)
	if f, ok := t.FieldByName("resource"); ok && f.Type == reflect.TypeFor[*jsonschema.Schema]() {
		res = f.Offset
	}
	if f, ok := t.FieldByName("dynamicAnchors"); ok && f.Type == reflect.TypeFor[map[string]*jsonschema.Schema]() {
		anchors = f.Offset
	}
	return res, anchors
}

// resourceOf returns the schema resource s belongs to, or nil.
func resourceOf(s *jsonschema.Schema) *jsonschema.Schema {
	if s == nil || resourceOffset == ^uintptr(0) {
		return nil
	}
	return *(**jsonschema.Schema)(unsafe.Add(unsafe.Pointer(s), resourceOffset))
}

// dynamicAnchors returns the $dynamicAnchor names a resource declares.
func dynamicAnchors(res *jsonschema.Schema) map[string]*jsonschema.Schema {
	if res == nil || anchorsOffset == ^uintptr(0) {
		return nil
	}
	return *(*map[string]*jsonschema.Schema)(unsafe.Add(unsafe.Pointer(res), anchorsOffset))
}

// precompute visits every compiled schema reachable from root and records
// the float64 forms of numeric limits, which schemas want integers and
// what their const and enum failures expect (both for describing failures
// by location), and how many schemas there are.
func precompute(root *jsonschema.Schema) (map[*jsonschema.Schema]*numBounds, map[string]bool, map[string]*quoted, int) {
	nums := map[*jsonschema.Schema]*numBounds{}
	ints := map[string]bool{}
	quotes := map[string]*quoted{}
	n := 0
	eachSchema(root, func(s *jsonschema.Schema) {
		n++
		if s.Types != nil && typeMask(*s.Types)&(tInteger|tNumber) == tInteger {
			ints[s.Location] = true
		}
		if s.Const != nil || s.Enum != nil {
			quotes[s.Location] = quote(s)
		}
		if s.Minimum == nil && s.Maximum == nil && s.ExclusiveMinimum == nil && s.ExclusiveMaximum == nil && s.MultipleOf == nil {
			return
		}
		nb := &numBounds{
			min: makeBound(s.Minimum), max: makeBound(s.Maximum),
			exMin: makeBound(s.ExclusiveMinimum), exMax: makeBound(s.ExclusiveMaximum),
		}
		if m := s.MultipleOf; m != nil && m.IsInt() && m.Sign() > 0 && m.Num().IsInt64() {
			nb.multInt = m.Num().Int64()
		}
		nums[s] = nb
	})
	return nums, ints, quotes, n
}

// eachSchema calls fn once for every schema reachable from root.
func eachSchema(root *jsonschema.Schema, fn func(*jsonschema.Schema)) {
	seen := map[*jsonschema.Schema]bool{}
	var visit func(s *jsonschema.Schema)
	visit = func(s *jsonschema.Schema) {
		if s == nil || seen[s] {
			return
		}
		seen[s] = true
		fn(s)
		for _, sub := range []*jsonschema.Schema{s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else,
			s.PropertyNames, s.UnevaluatedProperties, s.Contains, s.Items2020, s.UnevaluatedItems, s.ContentSchema} {
			visit(sub)
		}
		if s.DynamicRef != nil {
			visit(s.DynamicRef.Ref)
		}
		for _, list := range [][]*jsonschema.Schema{s.AllOf, s.AnyOf, s.OneOf, s.PrefixItems} {
			for _, sub := range list {
				visit(sub)
			}
		}
		for _, sub := range s.Properties {
			visit(sub)
		}
		for _, sub := range s.PatternProperties {
			visit(sub)
		}
		for _, sub := range s.DependentSchemas {
			visit(sub)
		}
		for _, dep := range s.Dependencies {
			if sub, ok := dep.(*jsonschema.Schema); ok {
				visit(sub)
			}
		}
		for _, x := range []any{s.AdditionalProperties, s.AdditionalItems, s.Items} {
			switch x := x.(type) {
			case *jsonschema.Schema:
				visit(x)
			case []*jsonschema.Schema:
				for _, sub := range x {
					visit(sub)
				}
			}
		}
		res := resourceOf(s)
		visit(res)
		for _, sub := range dynamicAnchors(res) {
			visit(sub)
		}
	}
	visit(root)
}
