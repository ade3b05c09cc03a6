package caddymodule

import (
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// A free call holds its reserved unit from before the upstream runs until
// its answer is judged, and the store lets a reservation lapse after
// store.DefaultReservationTTL (5m). A call allowed to outlive it would have
// its commit refused (the call never counted) while the lapsed unit is
// granted again, so concurrent calls exceed per_day. Caddy therefore
// refuses an upstream_timeout on a free route, or a verify_response
// verifier_timeout, that together could reach the reservation's lifetime.
func TestFreeCallCannotOutliveItsReservation(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	for _, tc := range []struct {
		desc, gate, verify, want string
	}{
		{"the longest upstream_timeout a free route takes", "upstream_timeout 3m", "", ""},
		{"an upstream_timeout past it", "upstream_timeout 4m", "", "upstream_timeout 4m0s is too long for a route with a free allowance"},
		{"an upstream_timeout as long as the reservation", "upstream_timeout 5m", "", "use at most 3m0s"},
		{"the longest verifier_timeout", "", "verifier_timeout 1m", ""},
		{"a verifier_timeout past it", "", "verifier_timeout 61s", "verifier_timeout 1m1s is over 1m0s"},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			site := gateSite(up.URL, fac, 1, tc.gate)
			// An offer's max_timeout must outlast upstream_timeout
			// (checkOffers): give it room, so that what refuses here is
			// the free allowance's ceiling alone.
			site = strings.Replace(site, "accept devnet $0.02 "+payTo.Hex(), "accept {\n\t\t\t\tnetwork devnet\n\t\t\t\tprice $0.02\n\t\t\t\tpay_to "+payTo.Hex()+"\n\t\t\t\tmax_timeout 10m\n\t\t\t}", 1)
			if tc.verify != "" {
				// verify_response after the gate, as a seller's route has it.
				site = strings.Replace(site, "\t\treverse_proxy", fmt.Sprintf("\t\tverify_response {\n\t\t\tschema `{\"type\":\"object\"}`\n\t\t\tverifier_url http://127.0.0.1:9\n\t\t\t%s\n\t\t}\n\t\treverse_proxy", tc.verify), 1)
			}
			err := tryLoadCaddy(t, freePort(t), site)
			if err == nil {
				t.Cleanup(func() { caddy.Stop() })
			}
			wantErr(t, err, tc.want)
		})
	}
}
