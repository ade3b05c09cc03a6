package server_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// verifierd's own /mcp answers tool arguments nested deeper than a
// verification request's 64 levels, or holding an unpaired surrogate
// escape, with an isError tool result (invalid_request), HTTP 200, naming
// the field below the arguments, as README says of wrong tool arguments.
// The mcp_tool gate in front answers the same bytes with the same result
// and words (caddymodule TestMCPArgumentsTooDeepOrUnpairedAreToolErrors).
func TestMCPArgumentsTooDeepOrUnpairedAreToolErrors(t *testing.T) {
	fx := newFixture(t, fixtureOpts{noSync: true, maxBody: 64 << 10})
	for _, c := range []struct{ desc, args, want string }{
		{"submitted_output nested 65 levels", `{"task_id":"t","expected_schema":{},"submitted_output":` + strings.Repeat("[", 64) + "1" + strings.Repeat("]", 64) + `}`,
			`"field":"submitted_output` + strings.Repeat("[0]", 63) + `","problem":"nesting is deeper than the limit of 64 levels"`},
		{"a lone surrogate in submitted_output", `{"task_id":"t","expected_schema":{},"submitted_output":{"s":"\ud800"}}`,
			`"field":"submitted_output.s","problem":"a string contains an unpaired UTF-16 surrogate escape"`},
	} {
		r := httptest.NewRequest(http.MethodPost, "/mcp", bytes.NewReader(mcpCall("verify_schema", []byte(c.args))))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		fx.h.ServeHTTP(w, r)
		body := w.Body.String()
		if w.Code != 200 || !strings.Contains(body, `"isError":true`) || !strings.Contains(body, "invalid_request") || !strings.Contains(strings.ReplaceAll(body, `\"`, `"`), c.want) {
			t.Errorf("%s: verifierd answered %d %.600s; want an isError invalid_request tool result with %s", c.desc, w.Code, body, c.want)
		}
	}
}
