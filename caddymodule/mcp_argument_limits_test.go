package caddymodule

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// Tool arguments verifierd's own /mcp refuses as the call's isError tool
// result with invalid_request (as REST answers 422) get that answer from
// the mcp_tool gate too, HTTP 200, in verifierd's words: the limit named
// is the 64 levels of a verification request, at the path below the
// arguments, and the tool never runs. The envelope's own limits stay: the
// same nesting or surrogate outside the arguments refuses the message.
// (Before: the gate refused the whole message, HTTP 400, -32700
// invalid_message, naming "66 levels", which an MCP client's transport
// takes for a failure of the call, not a tool error.)
func TestMCPArgumentsTooDeepOrUnpairedAreToolErrors(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newAnswerFault(t)
	base := startCaddy(t, faultSite(up.URL, fac, ""))
	send := func(body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	nested := strings.Repeat("[", 64) + "1" + strings.Repeat("]", 64)
	for _, c := range []struct{ desc, args, want string }{
		{"submitted_output nested 65 levels", `{"task_id":"t","expected_schema":{},"submitted_output":` + nested + `}`,
			`"field":"submitted_output` + strings.Repeat("[0]", 63) + `","problem":"nesting is deeper than the limit of 64 levels"`},
		{"submitted_output nested thousands of levels", `{"task_id":"t","expected_schema":{},"submitted_output":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}`,
			`"problem":"nesting is deeper than the limit of 64 levels"`},
		{"a lone surrogate in submitted_output", `{"task_id":"t","expected_schema":{},"submitted_output":{"s":"\ud800"}}`,
			`"field":"submitted_output.s","problem":"a string contains an unpaired UTF-16 surrogate escape"`},
		{"a lone surrogate in an argument's name", `{"task_id":"t","expected_schema":{},"submitted_output":{},"\udc00":1}`,
			`"field":"arguments","problem":"a string contains an unpaired UTF-16 surrogate escape"`},
	} {
		code, b := send(`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":` + c.args + `}}`)
		if code != http.StatusOK || !strings.Contains(b, `"isError":true`) || !strings.Contains(b, `invalid_request`) || !strings.Contains(strings.ReplaceAll(b, `\"`, `"`), c.want) {
			t.Errorf("%s: HTTP %d %.600s; want 200, an isError invalid_request tool result with %s", c.desc, code, b, c.want)
		}
		if strings.Contains(b, `"result":"pass"`) {
			t.Errorf("%s: the tool ran", c.desc)
		}
	}
	for _, c := range []struct{ desc, body string }{
		{"_meta nested past the message's limit", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":{},"_meta":{"a":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}}}`},
		{"a lone surrogate in the tool's name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schem\ud800","arguments":{}}}`},
	} {
		if code, b := send(c.body); code != http.StatusBadRequest || !strings.Contains(b, `"code":-32700`) || !strings.Contains(b, `invalid_message`) {
			t.Errorf("%s: HTTP %d %.300s; want 400, -32700 invalid_message", c.desc, code, b)
		}
	}
}
