package server_test

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/store/pghistory"
	"github.com/aovhq/aov/verifierd/server"
)

// README ("PostgreSQL down"): "/reputation and /score are 503". With
// PostgreSQL stalled (SIGSTOP: connections accepted, nothing answered),
// their history reads, and the owner binding a verification with a wallet
// proof makes first, are bounded like a record (10 s without an answer-by
// time): each answers 503 upstream_unavailable with Retry-After. (Before:
// they ran under the request's context alone and waited for as long as
// PostgreSQL did, holding a goroutine and a pool connection each.)
func TestHistoryReadsAnswer503WhilePostgresStalled(t *testing.T) {
	pg := servers.StartPostgres(t)
	h, err := pghistory.Open(context.Background(), pg.DSN, pghistory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	f := newFixture(t, fixtureOpts{noSync: true, ungated: true, history: func(*store.DB) server.History { return h }})
	for _, path := range []string{"/reputation/seller-7", "/score/seller-7"} {
		if w := f.do("GET", path, nil, nil); w.Code != 200 {
			t.Fatalf("%s before the stall: %d %s", path, w.Code, w.Body)
		}
	}
	// A verification whose wallet proof binds the agent id writes the
	// owner first: bounded the same way.
	const verify = "POST /verify/schema with a wallet proof binding seller-7"
	for _, path := range []string{"/reputation/seller-7", "/score/seller-7", verify} {
		pg.Pause()
		type answer struct {
			code       int
			retryAfter string
			body       string
		}
		done := make(chan answer, 1)
		start := time.Now()
		go func() {
			var w *httptest.ResponseRecorder
			if path == verify {
				w = f.do("POST", "/verify/schema", invoice("129.5", ""), proves(wallet, "seller-7"))
			} else {
				w = f.do("GET", path, nil, nil)
			}
			done <- answer{w.Code, w.Header().Get("Retry-After"), w.Body.String()}
		}()
		answered := false
		select {
		case a := <-done:
			answered = true
			t.Logf("%s with PostgreSQL stalled: %d after %v", path, a.code, time.Since(start).Round(time.Millisecond))
			if a.code != 503 || a.retryAfter == "" || !strings.Contains(a.body, `"code":"upstream_unavailable"`) {
				t.Errorf("%s with PostgreSQL stalled: %d Retry-After %q %s, want 503 upstream_unavailable with Retry-After", path, a.code, a.retryAfter, a.body)
			}
		case <-time.After(20 * time.Second):
			t.Errorf("%s with PostgreSQL stalled: no answer after 20 s (README: 503)", path)
		}
		pg.Resume()
		if !answered {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatalf("GET %s: no answer 10 s after PostgreSQL resumed", path)
			}
		}
	}
	// Resumed, it answers again.
	if w := f.do("GET", "/reputation/seller-7", nil, nil); w.Code != 200 {
		t.Errorf("after the stall: %d %s", w.Code, w.Body)
	}
}
