// Package jsontree walks a JSON document decoded into any (maps, slices
// and scalars), as tests read adapted Caddy configs and decoded requests.
package jsontree

import "encoding/json"

// Objects returns every JSON object in v, v itself included, parents
// before their children.
func Objects(v any) []map[string]any {
	var out []map[string]any
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			out = append(out, v)
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
	return out
}

// Numbers returns every json.Number in v (a tree decoded with UseNumber,
// or by strictjson), in no particular order.
func Numbers(v any) []json.Number {
	var out []json.Number
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case json.Number:
			out = append(out, v)
		case map[string]any:
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(v)
	return out
}
