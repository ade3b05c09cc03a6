package caddymodule

import (
	"fmt"
	"net/http"
	"testing"
)

// The placements README's x402 section gives as the safe forms gate the
// route: the gate first inside a route (handlers in a route run in the
// order written), and behind a rewrite either a matcher on the rewritten
// path or the gate first in a route matching the path the client sent.
// The wrong forms it warns of (the proxy first in the route, the gate
// matching the path before uri strip_prefix) load and serve free; Caddy
// gives the gate no view of its siblings to refuse them.
func TestGatePlacementsTheReadmeGivesGate(t *testing.T) {
	const gate = `x402 %s{
			accept devnet $0.02 ` + cfgPayTo + `
			facilitator http http://127.0.0.1:1
			store badger {data}/gate
		}`
	for _, tc := range []struct {
		name, site, path string
	}{
		{"gate first in route", `route /paid/* {
		` + fmt.Sprintf(gate, "") + `
		respond "paid content"
	}`, "/paid/x"},
		{"rewritten path matched", `uri strip_prefix /api
	` + fmt.Sprintf(gate, "/paid/* ") + `
	respond /paid/* "paid content"`, "/api/paid/x"},
		{"gate before the rewrite in route", `route /api/paid/* {
		` + fmt.Sprintf(gate, "") + `
		uri strip_prefix /api
		respond "paid content"
	}`, "/api/paid/x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := startCaddy(t, ":{port} {\n\t"+tc.site+"\n}\n")
			resp, err := testClient.Get(base + tc.path)
			if err != nil {
				t.Fatal(err)
			}
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusPaymentRequired {
				t.Fatalf("unpaid GET %s: %d %q, want 402", tc.path, resp.StatusCode, body)
			}
		})
	}
}
