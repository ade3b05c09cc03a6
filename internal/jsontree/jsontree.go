// Package jsontree walks a JSON document decoded into any (maps, slices
// and scalars), as tests of adapted Caddy configs read it.
package jsontree

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
