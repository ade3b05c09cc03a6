package caddymodule

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
)

// A free call while Redis stalls (accepts, never answers) is refused 503
// with Retry-After within a bounded wait, the upstream untouched. Its
// reservation, already sent, runs when Redis resumes and its release
// cannot follow (README, "What each failure costs"): the client has one
// free call fewer until it lapses, and no more than one.
func TestFreeCallWithStalledRedisCostsAtMostOneUnit(t *testing.T) {
	up := newUpstream(t)
	srv := servers.StartRedis(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept base $0.02 0x1111111111111111111111111111111111111111
			facilitator http {
				url http://127.0.0.1:1
			}
			store redis %s {
				prefix stall
			}
			validate verify_request
			free_allowance {
				pool verify
				per_day 3
			}
		}
		reverse_proxy %s
	}
}
`, srv.Addr, strings.TrimPrefix(up.URL, "http://")))
	url := base + "/verify/schema"
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("free call with Redis up: %d", resp.StatusCode)
	}
	srv.Pause()
	start := time.Now()
	resp := post(t, url, validRequest, nil)
	took := time.Since(start)
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Errorf("free call with Redis stalled: %d, Retry-After %q, %s; want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if took > 5*time.Second {
		t.Errorf("free call with Redis stalled took %v; want a bounded wait", took)
	}
	if n := up.calls.Load(); n != 1 {
		t.Errorf("upstream ran %d times; want 1 (nothing served unpaid)", n)
	}
	srv.Resume()
	time.Sleep(200 * time.Millisecond)
	served := 0
	for range 3 {
		if resp := post(t, url, validRequest, nil); resp.StatusCode == http.StatusOK {
			served++
		}
	}
	// per_day 3, one used: the stalled call may hold one more.
	if served < 1 || served > 2 {
		t.Errorf("after Redis resumed, %d more free calls served; want 1 (one held by the stalled call until it lapses) or 2", served)
	}
	t.Logf("stalled call: %d in %v; %d more free calls after Redis resumed", resp.StatusCode, took, served)
}
