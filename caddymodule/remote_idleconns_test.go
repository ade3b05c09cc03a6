package caddymodule

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// A remote facilitator's connections are closed when its config is
// unloaded (a reload, Caddy's stop): the one a call left idle is closed by
// Cleanup. (Before: it stayed open until its transport's idle timeout, 90
// seconds, a pool of connections to the facilitator per config loaded.)
func TestRemoteFacilitatorClosesItsConnectionsOnUnload(t *testing.T) {
	var open atomic.Int32
	remote := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"kinds":[]}`)
	}))
	remote.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	remote.Start()
	defer remote.Close()
	mod, unload := facLoad(t, "x402.facilitators.http", `{"url":"`+remote.URL+`"}`)
	if _, err := mod.(*HTTPFacilitator).Supported(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := open.Load(); n != 1 {
		t.Fatalf("%d connections open to the facilitator after a call; want 1, kept alive", n)
	}
	unload()
	waitFor(t, "the facilitator's idle connection closed on unload", func() bool { return open.Load() == 0 })
}
