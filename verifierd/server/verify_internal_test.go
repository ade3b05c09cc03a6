package server

import "testing"

// isJSON takes the plain "application/json" on its fast path and decides
// everything else as mime.ParseMediaType reads it.
func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                true,
		"Application/JSON":                true,
		"application/json; charset=utf-8": true,
		"application/problem+json":        true,
		"application/json ":               true,
		"application/jsonx":               false,
		"application/json;":               true,
		"text/json":                       false,
		"text/plain":                      false,
		"application/+json; x":            false,
		"":                                false,
	} {
		if got := isJSON(ct); got != want {
			t.Errorf("isJSON(%q) = %v, want %v", ct, got, want)
		}
	}
}
