package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// lateBodyUpstream sends its header (flushed) at once, then its body in two
// parts, larger than encode's minimum length: the first after first, the
// second 1500 ms later. first is read per request.
func lateBodyUpstream(t *testing.T, ct string) (*httptest.Server, *atomic.Int64) {
	var first atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", ct)
		w.WriteHeader(http.StatusOK)
		rc := http.NewResponseController(w)
		rc.Flush()
		for i, wait := range []time.Duration{time.Duration(first.Load()), 1500 * time.Millisecond} {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(wait):
			}
			if i == 0 {
				io.WriteString(w, lateBodyFirst)
			} else {
				io.WriteString(w, `"line":2}`)
			}
			rc.Flush()
		}
	}))
	t.Cleanup(up.Close)
	return up, &first
}

// lateBodyFirst is lateBodyUpstream's first part.
var lateBodyFirst = `{"paid_content":true,"pad":"` + strings.Repeat("x", 1024) + `",`

// paidAnswer pays for one call to url and reads its answer.
func paidAnswer(t *testing.T, url string) (*http.Response, string) {
	t.Helper()
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// settle before with `encode` in the route (x402 → encode → the upstream):
// encode holds the header until the first body byte, so upstream_timeout
// bounds the upstream's first body byte, as README says. A first byte in
// time is streamed past the deadline; a header in time whose first body
// byte is late is the gate's 503, charged.
func TestSettleBeforeWithEncodeDeadlineBoundsTheFirstBodyByte(t *testing.T) {
	_, fac := sharedDevnet(t)
	up, first := lateBodyUpstream(t, "application/json")
	host := strings.TrimPrefix(up.URL, "http://")
	site := gateSite(up.URL, fac, 0, "settle before\n\t\t\tupstream_timeout 500ms")
	site = strings.Replace(site, "reverse_proxy "+host, "encode gzip\n\t\treverse_proxy "+host, 1)
	url := startCaddy(t, site) + "/verify/schema"
	// The client asks for gzip and reads the answer decompressed.
	resp, b := paidAnswer(t, url)
	if resp.StatusCode != http.StatusOK || b != lateBodyFirst+`"line":2}` {
		t.Fatalf("first body byte in time, the rest past upstream_timeout: %d %.80q, want the whole stream", resp.StatusCode, b)
	}
	if !resp.Uncompressed {
		t.Fatal("the answer was not gzipped: encode did not run")
	}

	first.Store(int64(1500 * time.Millisecond))
	resp, b = paidAnswer(t, url)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(b, `"charged":true`) {
		t.Fatalf("header in time, first body byte past upstream_timeout: %d %s, want the gate's 503 charged", resp.StatusCode, b)
	}
	settlementOf(t, resp)
}

// settle before with `verify_response` in the route: it holds the whole
// answer and checks it, so upstream_timeout bounds the whole answer and its
// check, as README says. (fail_open: the verifier, absent, is not asked to
// pass anything.)
func TestSettleBeforeWithVerifyResponseDeadlineBoundsTheWholeAnswer(t *testing.T) {
	_, fac := sharedDevnet(t)
	up, _ := lateBodyUpstream(t, "application/json")
	host := strings.TrimPrefix(up.URL, "http://")
	vr := "verify_response {\n\t\t\tschema `{\"type\":\"object\"}`\n\t\t\tverifier_url http://127.0.0.1:1\n\t\t\ton_error fail_open\n\t\t}\n\t\treverse_proxy " + host
	for _, c := range []struct {
		timeout string
		want    int
	}{
		{"5s", http.StatusOK},                    // the whole answer (1.5 s) in time
		{"500ms", http.StatusServiceUnavailable}, // header and first byte in time, the rest late
	} {
		site := gateSite(up.URL, fac, 0, "settle before\n\t\t\tupstream_timeout "+c.timeout)
		site = strings.Replace(site, "reverse_proxy "+host, vr, 1)
		url := startCaddy(t, site) + "/verify/schema"
		resp, b := paidAnswer(t, url)
		if resp.StatusCode != c.want {
			t.Fatalf("upstream_timeout %s, answer ends after 1.5 s: %d %s, want %d", c.timeout, resp.StatusCode, b, c.want)
		}
		if c.want != http.StatusOK && !strings.Contains(b, `"charged":true`) {
			t.Fatalf("upstream_timeout %s: %s, want charged", c.timeout, b)
		}
	}
}
