package server_test

import (
	"net/http"
	"strings"
	"testing"
)

// A path that is not clean is no route, even with the gateway's token:
// the gateway routes by the cleaned path (Caddy's matchers clean it) and
// proxies the path as sent, so "/score/x/../../health" came through the
// gateway's free /health route and was served here as a paid score.
func TestUncleanPathsAreNoRoute(t *testing.T) {
	f := newFixture(t, fixtureOpts{localSigner: true})
	gw := map[string]string{"X-Aov-Gateway-Token": gatewayToken}
	for _, p := range []string{
		"/score/x/../../health",
		"/score/victim/..%2F..%2Freputation%2Fa",
		"/score/a/./b",
		"/score//a",
		"/reputation/a/../b",
		"/reputation/a/",
	} {
		w := f.do(http.MethodGet, p, nil, gw)
		m := decode(t, w)
		if w.Code != http.StatusNotFound || m["code"] != "not_found" || strings.Contains(w.Body.String(), `"score"`) {
			t.Errorf("GET %s: %d %s", p, w.Code, w.Body)
		}
	}
	// The clean paths still answer.
	if w := f.do(http.MethodGet, "/reputation/a", nil, gw); w.Code != http.StatusOK {
		t.Errorf("GET /reputation/a: %d %s", w.Code, w.Body)
	}
	if w := f.do(http.MethodGet, "/score/a", nil, gw); w.Code != http.StatusOK {
		t.Errorf("GET /score/a: %d %s", w.Code, w.Body)
	}
}
