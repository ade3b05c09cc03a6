package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeStallingUpstream is a fake for a fault the real upstreams cannot be
// made to have on demand: it sends its headers at once and then, by mode,
// nothing more ("stallbody") or one byte a second ("trickle"); in mode
// "ok" it answers whole.
func fakeStallingUpstream(t *testing.T) (*httptest.Server, *atomic.Value) {
	var mode atomic.Value
	mode.Store("ok")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		switch mode.Load().(string) {
		case "stallbody":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "trickle":
			w.WriteHeader(http.StatusOK)
			for {
				if _, err := io.WriteString(w, " "); err != nil {
					return
				}
				w.(http.Flusher).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(time.Second):
				}
			}
		default:
			io.WriteString(w, `{"ok":true}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &mode
}

// An answer whose headers come in time and whose body runs past
// upstream_timeout fails as a stall before the headers does: 504 (README,
// upstream_timeout), the free call kept. (Before: reverse_proxy's abort of
// the cut-off body made it a 502 with an empty body.)
func TestUpstreamBodyPastDeadlineIs504(t *testing.T) {
	up, mode := fakeStallingUpstream(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	route /free/* {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger {data}/body504
			upstream_timeout 1s
			rate_limit off
			free_allowance {
				per_day 100
			}
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), payTo.Hex()))
	for _, m := range []string{"stallbody", "trickle"} {
		mode.Store(m)
		resp := post(t, base+"/free/x", `{}`, nil)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusGatewayTimeout {
			t.Errorf("%s: the body ran past upstream_timeout: %d %q, want 504", m, resp.StatusCode, body)
		}
	}
	mode.Store("ok")
	resp := post(t, base+"/free/x", `{}`, nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "99" {
		t.Errorf("the first answered call: %d with %s %q, want 200 and 99: the timed-out calls keep their free units", resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
	}
}
