package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// keptMapTrailerHandler does what net/http's contract allows: it keeps
// the map Header returned, announces a trailer, writes its answer, and
// sets the trailers' values on that map afterwards, one announced and one
// under http.TrailerPrefix, and a PAYMENT-RESPONSE trailer only the gate
// may speak.
type keptMapTrailerHandler struct{}

func (keptMapTrailerHandler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_kept_map_trailer", New: func() caddy.Module { return keptMapTrailerHandler{} }}
}

func (keptMapTrailerHandler) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	io.Copy(io.Discard, r.Body)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Trailer", "X-Checksum")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, `{"paid_content":true}`)
	h.Set("X-Checksum", "abc")
	h.Set(http.TrailerPrefix+"X-Late", "late")
	h.Set(http.TrailerPrefix+x402.HeaderPaymentResponse, "upstream-own")
	return nil
}

func init() {
	caddy.RegisterModule(keptMapTrailerHandler{})
	httpcaddyfile.RegisterHandlerDirective("test_kept_map_trailer", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return keptMapTrailerHandler{}, nil
	})
}

// settle before: trailers a handler sets after its body on the header map
// it kept from before its header reach the buyer, as without the gate;
// an x402 trailer of the upstream's does not.
func TestSettleBeforeTrailersSetOnAKeptHeaderMapArrive(t *testing.T) {
	_, fac := sharedDevnet(t)
	site := gateSite("127.0.0.1:1", fac, 0, "settle before\n\t\t\tupstream_timeout 5s")
	site = strings.Replace(site, "reverse_proxy 127.0.0.1:1", "test_kept_map_trailer", 1)
	url := startCaddy(t, site) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "paid_content") {
		t.Fatalf("answer %d %s", resp.StatusCode, b)
	}
	settlementOf(t, resp)
	if got := resp.Trailer.Get("X-Checksum"); got != "abc" {
		t.Errorf("trailer X-Checksum %q (announced %q), want \"abc\" as the handler set it", got, resp.Header.Get("Trailer"))
	}
	if got := resp.Trailer.Get("X-Late"); got != "late" {
		t.Errorf("trailer X-Late (set under http.TrailerPrefix) %q, want \"late\"", got)
	}
	if got := resp.Trailer.Values(x402.HeaderPaymentResponse); len(got) != 0 {
		t.Errorf("the upstream's PAYMENT-RESPONSE trailer %q reached the buyer", got)
	}
}

// settle before: an upstream's trailers, announced and not, reach the
// buyer through reverse_proxy (which sets them on the writer's map after
// the body); its PAYMENT-RESPONSE trailer does not.
func TestSettleBeforeUpstreamTrailersArriveThroughReverseProxy(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Trailer", "X-Checksum")
		io.WriteString(w, `{"paid_content":true}`)
		w.Header().Set("X-Checksum", "abc")
		w.Header().Set(http.TrailerPrefix+"X-Late", "late")
		w.Header().Set(http.TrailerPrefix+x402.HeaderPaymentResponse, "upstream-own")
	}))
	t.Cleanup(up.Close)
	url := startCaddy(t, gateSite(up.URL, fac, 0, "settle before")) + "/verify/schema"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "paid_content") {
		t.Fatalf("answer %d %s", resp.StatusCode, b)
	}
	if got := resp.Trailer.Get("X-Checksum"); got != "abc" {
		t.Errorf("trailer X-Checksum %q, want \"abc\"", got)
	}
	if got := resp.Trailer.Get("X-Late"); got != "late" {
		t.Errorf("trailer X-Late %q, want \"late\"", got)
	}
	if got := resp.Trailer.Values(x402.HeaderPaymentResponse); len(got) != 0 {
		t.Errorf("the upstream's PAYMENT-RESPONSE trailer %q reached the buyer", got)
	}
}
