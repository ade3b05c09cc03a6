package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// reflectingUpstream is a permissive CORS middleware's upstream: it grants
// whatever Origin asks, with credentials, every method and header, and
// exposes a header of its own.
func reflectingUpstream(t *testing.T, body string) string {
	t.Helper()
	return reflectingUpstreamStatus(t, http.StatusOK, body)
}

// reflectingUpstreamStatus is reflectingUpstream answering with status.
func reflectingUpstreamStatus(t *testing.T, status int, body string) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", r.Header.Get("Origin"))
		h.Set("Access-Control-Allow-Credentials", "true")
		h.Set("Access-Control-Allow-Methods", "GET, POST, PUT, DELETE")
		h.Set("Access-Control-Allow-Headers", "*")
		h.Set("Access-Control-Max-Age", "86400")
		h.Set("Access-Control-Expose-Headers", "X-Upstream-Secret")
		w.WriteHeader(status)
		io.WriteString(w, body)
	}))
	t.Cleanup(up.Close)
	return strings.TrimPrefix(up.URL, "http://")
}

// corsHeaders lists the Access-Control-* headers of h.
func corsHeaders(h http.Header) []string {
	var out []string
	for k, v := range h {
		if isCORSHeader(k) {
			out = append(out, k+": "+strings.Join(v, ", "))
		}
	}
	return out
}

// TestCORSIsTheOneAuthorityOnCORS: behind x402_cors, an upstream that
// reflects Origin with credentials grants nothing of its own. A page on an
// origin that is not listed, and a request without Origin, get no
// Access-Control-* header at all, so the browser blocks the page; a listed
// origin gets x402_cors's grant only (no credentials unless `credentials`
// is set, no preflight headers on an actual answer).
func TestCORSIsTheOneAuthorityOnCORS(t *testing.T) {
	up := reflectingUpstream(t, `{"secret":"visitor data"}`)
	for _, credentials := range []bool{false, true} {
		block := ""
		if credentials {
			block = "{\n\t\tcredentials\n\t}"
		}
		base := startCaddy(t, fmt.Sprintf(":{port} {\n\tx402_cors %s %s\n\treverse_proxy %s\n}\n", corsOrigin, block, up))
		for _, origin := range []string{"http://evil.example", ""} {
			hdr := map[string]string{}
			if origin != "" {
				hdr["Origin"] = origin
			}
			resp := corsDo(t, http.MethodGet, base+"/account", hdr)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			if got := corsHeaders(resp.Header); len(got) != 0 {
				t.Errorf("credentials %v, Origin %q (not listed): the answer carries %v", credentials, origin, got)
			}
			if !headerHasToken(resp.Header, "Vary", "Origin") {
				t.Errorf("credentials %v, Origin %q: Vary %q lacks Origin", credentials, origin, resp.Header.Values("Vary"))
			}
		}
		resp := corsDo(t, http.MethodGet, base+"/account", map[string]string{"Origin": corsOrigin})
		h := resp.Header
		if h.Get("Access-Control-Allow-Origin") != corsOrigin {
			t.Errorf("credentials %v: the listed origin got Access-Control-Allow-Origin %q", credentials, h.Get("Access-Control-Allow-Origin"))
		}
		if want := map[bool]string{true: "true"}[credentials]; h.Get("Access-Control-Allow-Credentials") != want {
			t.Errorf("credentials %v: Access-Control-Allow-Credentials %q, want %q", credentials, h.Get("Access-Control-Allow-Credentials"), want)
		}
		for _, k := range []string{"Access-Control-Allow-Methods", "Access-Control-Allow-Headers", "Access-Control-Max-Age"} {
			if v := h.Values(k); len(v) != 0 {
				t.Errorf("credentials %v: an actual answer carries the upstream's %s %q", credentials, k, v)
			}
		}
	}
}

// TestCORSErrorAnswersCarryOnlyItsGrant: an error a wrapped handler
// returns is answered by handle_errors, or by Caddy's default error
// answer, on the server's own writer, with the header map the wrapped
// handlers left. intercept's handle_response leaves an upstream's headers
// there, so without x402_cors clearing them the error answer would carry
// the upstream's reflected grant, with credentials, to any origin. With
// handle_errors and without, an unlisted origin and a request without
// Origin get no Access-Control-* header, and a listed origin gets
// x402_cors's grant only.
func TestCORSErrorAnswersCarryOnlyItsGrant(t *testing.T) {
	up := reflectingUpstreamStatus(t, http.StatusInternalServerError, `{"error":"boom"}`)
	for _, errorsBlock := range []string{"handle_errors {\n\t\trespond \"sorry: {err.status_code}\"\n\t}", ""} {
		base := startCaddy(t, fmt.Sprintf(`:{port} {
	x402_cors %s
	intercept {
		@err status 500
		handle_response @err {
			error "upstream failed" 502
		}
	}
	reverse_proxy %s
	%s
}
`, corsOrigin, up, errorsBlock))
		for _, origin := range []string{"http://evil.example", "", corsOrigin} {
			hdr := map[string]string{}
			if origin != "" {
				hdr["Origin"] = origin
			}
			resp := corsDo(t, http.MethodGet, base+"/account", hdr)
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("handle_errors %v, Origin %q: status %d, want the error's 502", errorsBlock != "", origin, resp.StatusCode)
			}
			if !headerHasToken(resp.Header, "Vary", "Origin") {
				t.Errorf("handle_errors %v, Origin %q: Vary %q lacks Origin", errorsBlock != "", origin, resp.Header.Values("Vary"))
			}
			if origin != corsOrigin {
				if got := corsHeaders(resp.Header); len(got) != 0 {
					t.Errorf("handle_errors %v, Origin %q (not listed): the error answer carries %v", errorsBlock != "", origin, got)
				}
				continue
			}
			h := resp.Header
			if h.Get("Access-Control-Allow-Origin") != corsOrigin || len(h.Values("Access-Control-Allow-Origin")) != 1 || h.Get("Access-Control-Allow-Credentials") != "" {
				t.Errorf("handle_errors %v, listed origin: the error answer carries %v", errorsBlock != "", corsHeaders(h))
			}
		}
	}
}

// TestCORSUnlistedOriginCannotReadAFreeAnswer: a simple GET (no preflight)
// from a page on an unlisted origin is not served from the visitor's free
// allowance (free_allowance lists only corsOrigin): it gets the 402 offer,
// which carries no grant, the upstream's reflected one included, so the
// page can read neither it nor any Free-Allowance-* header. An origin
// listed in both reads a free answer and its headers.
func TestCORSUnlistedOriginCannotReadAFreeAnswer(t *testing.T) {
	up := reflectingUpstream(t, `{"report":"for the visitor"}`)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	x402_cors %[1]s
	route /report/* {
		x402 {
			accept devnet $0.01 %[2]s
			route "GET /report/{id}"
			facilitator http {
				url http://127.0.0.1:1
			}
			store badger {data}/gate
			free_allowance {
				pool p
				per_day 3
				origins %[1]s
			}
		}
		reverse_proxy %[3]s
	}
}
`, corsOrigin, payTo.Hex(), up))
	resp := corsDo(t, http.MethodGet, base+"/report/1", map[string]string{"Origin": "http://evil.example"})
	if resp.StatusCode != http.StatusPaymentRequired || resp.Header.Get(HeaderFreeRemaining) != "" {
		t.Fatalf("status %d, %s %q: want the 402 offer, no free call", resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
	}
	if got := corsHeaders(resp.Header); len(got) != 0 {
		t.Errorf("the answer to unlisted origin http://evil.example carries %v", got)
	}
	resp = corsDo(t, http.MethodGet, base+"/report/2", map[string]string{"Origin": corsOrigin})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "2" {
		t.Fatalf("listed origin: status %d, %s %q; want a free answer, 2 left", resp.StatusCode, HeaderFreeRemaining, resp.Header.Get(HeaderFreeRemaining))
	}
	wantCORS(t, "a free answer to the listed origin", resp, HeaderFreeRemaining, HeaderFreeLimit)
}

// TestCORSWriterEditsEveryWayAnAnswerStarts: whatever way a handler starts
// its answer (Write, WriteHeader, io.Copy's ReadFrom, a Flush through
// http.ResponseController or http.Flusher before anything is written),
// x402_cors has the last word on the CORS headers: an unlisted origin's
// answer has none, a listed one's carries its grant.
func TestCORSWriterEditsEveryWayAnAnswerStarts(t *testing.T) {
	c := &CORS{Origins: []string{corsOrigin}}
	if err := c.Provision(caddy.Context{}); err != nil {
		t.Fatal(err)
	}
	for name, write := range map[string]func(http.ResponseWriter){
		"Write":       func(w http.ResponseWriter) { w.Write([]byte("x")) },
		"WriteHeader": func(w http.ResponseWriter) { w.WriteHeader(http.StatusTeapot) },
		"ReadFrom":    func(w http.ResponseWriter) { io.Copy(w, io.LimitReader(strings.NewReader("x"), 1)) },
		"ResponseController.Flush": func(w http.ResponseWriter) {
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Errorf("flush: %v", err)
			}
		},
		"Flusher": func(w http.ResponseWriter) {
			f, ok := w.(http.Flusher)
			if !ok {
				t.Error("the writer hides the server's http.Flusher")
				return
			}
			f.Flush()
		},
	} {
		for _, origin := range []string{"http://evil.example", "", corsOrigin} {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			if origin != "" {
				req.Header.Set("Origin", origin)
			}
			err := c.ServeHTTP(rec, req, caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				h := w.Header()
				h.Set("Access-Control-Allow-Origin", "*")
				h.Set("Access-Control-Allow-Credentials", "true")
				h["access-control-allow-origin"] = []string{"http://evil.example"} // not canonical: net/http writes it as is
				write(w)
				return nil
			}))
			if err != nil {
				t.Fatal(err)
			}
			h := rec.Result().Header
			if origin != corsOrigin {
				if got := corsHeaders(h); len(got) != 0 {
					t.Errorf("%s, Origin %q: headers %v", name, origin, got)
				}
				continue
			}
			if h.Get("Access-Control-Allow-Origin") != corsOrigin || len(h.Values("Access-Control-Allow-Origin")) != 1 ||
				h.Get("Access-Control-Allow-Credentials") != "" || len(h["access-control-allow-origin"]) != 0 {
				t.Errorf("%s, listed origin: headers %v", name, h)
			}
		}
	}
}

// BenchmarkFreePathBehindCORS is BenchmarkFreePath with x402_cors in front
// of the gate, as in Caddyfile.example, for a request without Origin (an
// agent), from an unlisted origin and from a listed one: what x402_cors
// adds to the hot path.
func BenchmarkFreePathBehindCORS(b *testing.B) {
	up := benchUpstream(b)
	base := startCaddy(b, fmt.Sprintf(`:{port} {
	x402_cors %s
	x402 {
		accept base $0.02 0x1111111111111111111111111111111111111111
		facilitator instant_benchmark_only
		store badger {data}/gate
		validate verify_request
		free_allowance {
			per_day 1000000000
		}
	}
	reverse_proxy %s
}
`, corsOrigin, up))
	for name, origin := range map[string]string{"no-origin": "", "unlisted": "http://evil.example", "listed": corsOrigin} {
		b.Run(name, func(b *testing.B) {
			var hdr func(int) map[string]string
			if origin != "" {
				hdr = func(int) map[string]string { return map[string]string{"Origin": origin} }
			}
			runPosts(b, base+"/verify/schema", hdr)
		})
	}
}
