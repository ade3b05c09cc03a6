package caddymodule

import (
	"strings"
	"testing"
)

// route is "<METHOD> <path>": a known HTTP method in upper case, a space,
// and a path from its leading slash. Anything else is a config error
// naming the option. (Before: "POST .evil.example/v" loaded, and
// /.well-known/x402 listed https://verify.example.com.evil.example/v, a
// URL on another host; "PSOT /v" loaded and every request was 405.)
func TestRouteFormCheckedAtLoad(t *testing.T) {
	acc := "accept base $0.01 " + cfgPayTo
	for _, route := range []string{
		"POST .evil.example/v",
		"POST v.evil.example/v",
		"PSOT /v",
		"post /v",
		"POST",
		"POST ",
		"/v",
		" POST /v",
		"POST  /v",
		"POST /v x",
		"POST /v\t",
	} {
		t.Run(route, func(t *testing.T) {
			err := cfgLoad(t, cfgGate(acc, `route "`+route+`"`))
			if err == nil {
				t.Fatalf("route %q loaded", route)
			}
			if !strings.Contains(err.Error(), "route") {
				t.Fatalf("route %q: the error does not name the option: %v", route, err)
			}
		})
	}
	for _, route := range []string{"GET /score/{agent_id}", "POST /verify/schema", "DELETE /x", "PUT /", "PATCH /a/b"} {
		t.Run(route, func(t *testing.T) {
			if err := cfgLoad(t, cfgGate(acc, `route "`+route+`"`)); err != nil {
				t.Fatalf("route %q refused: %v", route, err)
			}
		})
	}
}
