package schema

import (
	"strings"
	"testing"
)

// A format check is charged one step per 16 bytes of the
// string each time it is applied, on top of the application and the
// copy (a step per KB); format "regex" is charged as regular-expression
// work instead, and a value that is no string costs nothing more.
func TestFormatStepsByLength(t *testing.T) {
	slashes := strings.Repeat("/", 16_000)
	for _, tc := range []struct {
		schema, inst string
		steps        int
	}{
		{`{"format": "json-pointer"}`, `"` + slashes + `"`, 1 + 15 + 16_000/formatBytesPerStep},
		{`{"allOf": [{"format": "uri"}, {"format": "uri"}]}`, `"a:` + slashes + `"`, 3 + 3*15 + 2*16_002/formatBytesPerStep},
		{`{"format": "date"}`, `"2026-12-06"`, 1 + 10/formatBytesPerStep},
		{`{"format": "email"}`, `"` + strings.Repeat("a", 40) + `@example.com"`, 1 + 52/formatBytesPerStep},
		{`{"format": "uri"}`, `12345`, 1},
		{`{"format": "regex"}`, `"` + strings.Repeat("a", 2048) + `"`, 1 + 2},
	} {
		s := mustCompile(t, tc.schema)
		if got := stepsOf(t, s, decode(t, tc.inst)); got != tc.steps {
			t.Errorf("%s on %.40s: %d steps; want %d", tc.schema, tc.inst, got, tc.steps)
		}
	}
}
