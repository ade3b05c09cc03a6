package caddymodule

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aovhq/aov/x402"
)

// replaceCacheControlOnScore is gateSite with, on the /score route only, a
// `header` replace that rewrites no-store in place, as Caddy's replace
// edits a header's values.
func replaceCacheControlOnScore(site string) string {
	return strings.Replace(site, "route /score/* {\n", "route /score/* {\n\t\theader >Cache-Control \"no-store\" \"public, max-age=3600\"\n", 1)
}

// One route's `header` replace of the gate's Cache-Control rewrites that
// route's answers only: another route's 402 still says no-store.
func TestHeaderReplaceOnOneRouteLeavesOtherRoutesNoStore(t *testing.T) {
	_, fac := sharedDevnet(t)
	base := startCaddy(t, replaceCacheControlOnScore(gateSite("127.0.0.1:1", fac, 0, "")))
	resp, err := testClient.Get(base + "/score/agent-1")
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	if cc := resp.Header.Get("Cache-Control"); cc != "public, max-age=3600" {
		t.Fatalf("/score's 402, its route replacing no-store: Cache-Control %q", cc)
	}
	after := post(t, base+"/verify/schema", "", nil)
	io.ReadAll(after.Body)
	after.Body.Close()
	if cc := after.Header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("after one /score answer, /verify/schema's 402 (no header directive) says Cache-Control %q, want no-store", cc)
	}
	if exp := after.Header.Get("Access-Control-Expose-Headers"); exp != exposedHeaders {
		t.Fatalf("Access-Control-Expose-Headers %q, want %q", exp, exposedHeaders)
	}
}

// A paid settle before answer on a route without a header directive stays
// no-store after another route's replace has run.
func TestHeaderReplaceOnOneRouteLeavesPaidAnswersNoStore(t *testing.T) {
	_, fac := sharedDevnet(t)
	up, _, _ := stallingUpstream(t, 0)
	base := startCaddy(t, replaceCacheControlOnScore(gateSite(up.URL, fac, 0, "settle before")))
	url := base + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	resp, err := testClient.Get(base + "/score/agent-1")
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	resp.Body.Close()
	paid := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(paid.Body)
	paid.Body.Close()
	if paid.StatusCode != http.StatusOK || !strings.Contains(string(b), "paid_content") {
		t.Fatalf("paid: %d %s", paid.StatusCode, b)
	}
	if cc := paid.Header.Get("Cache-Control"); cc != "no-store" {
		t.Fatalf("paid answer on /verify/schema (no header directive): Cache-Control %q, want no-store", cc)
	}
}

// Concurrent answers of two routes, one of which replaces Cache-Control:
// each answer has its own values (run with -race: shared ones are written
// by one answer's replace while another's are being sent).
func TestConcurrentAnswersWithAReplaceShareNoHeaderValues(t *testing.T) {
	_, fac := sharedDevnet(t)
	base := startCaddy(t, replaceCacheControlOnScore(gateSite("127.0.0.1:1", fac, 0, "")))
	var wg sync.WaitGroup
	bad := make(chan string, 200)
	for range 8 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 10 {
				resp, err := testClient.Get(base + "/score/agent-1")
				if err != nil {
					bad <- err.Error()
					return
				}
				io.ReadAll(resp.Body)
				resp.Body.Close()
			}
		}()
		go func() {
			defer wg.Done()
			for range 10 {
				resp, err := testClient.Post(base+"/verify/schema", "application/json", nil)
				if err != nil {
					bad <- err.Error()
					return
				}
				io.ReadAll(resp.Body)
				resp.Body.Close()
				if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
					bad <- "/verify/schema Cache-Control " + cc
				}
			}
		}()
	}
	wg.Wait()
	close(bad)
	if n := len(bad); n > 0 {
		t.Fatalf("%d of 80 answers: first %s", n, <-bad)
	}
}
