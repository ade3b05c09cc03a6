package schema

import (
	"encoding/json"
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
// by location), how many schemas there are, and the estimated bytes of the
// values they keep (valueBytes of every const and enum, and the quotes).
//
// It also drops the annotations validation never reads (title,
// description, $comment, default, examples): the compiled schema would
// otherwise keep them as long as the cache keeps it, and a default of a
// long array within MaxBodyBytes decodes to about 17 MB.
func precompute(root *jsonschema.Schema) (map[*jsonschema.Schema]*numBounds, map[string]bool, map[string]*quoted, int, int64) {
	nums := map[*jsonschema.Schema]*numBounds{}
	ints := map[string]bool{}
	quotes := map[string]*quoted{}
	n := 0
	var held int64
	eachSchema(root, func(s *jsonschema.Schema) {
		n++
		s.Title, s.Description, s.Comment, s.Default, s.Examples = "", "", "", nil, nil
		if s.Const != nil {
			held += valueBytes(*s.Const)
		}
		if s.Enum != nil {
			held += valueBytes(s.Enum.Values)
		}
		if s.Types != nil && typeMask(*s.Types)&(tInteger|tNumber) == tInteger {
			ints[s.Location] = true
		}
		if s.Const != nil || s.Enum != nil {
			q := quote(s)
			quotes[s.Location] = q
			held += quoteEntryBytes + int64(len(s.Location)+len(q.constant)+len(q.enum))
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
	return nums, ints, quotes, n, held
}

// Per-value heap of a decoded JSON value (map[string]any, []any, string,
// json.Number, bool, nil), measured with MemStats
// (TestCacheBytesCoverValuesCompiledSchemasKeep): an array element is an
// interface slot and a boxed string header, about 35 bytes with its
// digits; an object member a map slot with its key and value, about 70 with
// the map's groups. quoteEntryBytes is a quotes map entry with its
// *quoted. Each is rounded up, so the cache overcounts rather than under.
const (
	valueNodeBytes  = 40
	memberBytes     = 96
	quoteEntryBytes = 128
)

// valueBytes estimates the heap a decoded JSON value holds, for the
// cache's byte bound: const and enum values are kept by the compiled
// schema for as long as the cache keeps it. The walk is as deep as the
// value, which the request's decoder has already bounded.
func valueBytes(v any) int64 {
	switch x := v.(type) {
	case string:
		return valueNodeBytes + int64(len(x))
	case json.Number:
		return valueNodeBytes + int64(len(x))
	case []any:
		b := int64(valueNodeBytes)
		for _, e := range x {
			b += valueBytes(e)
		}
		return b
	case map[string]any:
		b := int64(valueNodeBytes)
		for k, e := range x {
			b += memberBytes + int64(len(k)) + valueBytes(e)
		}
		return b
	}
	return valueNodeBytes
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
