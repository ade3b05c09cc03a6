package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
)

// forgedTrailer is the value an upstream's own Payment-Response,
// Verification-Receipt or Verification-Status trailer carries.
const forgedTrailer = "upstream-own"

// uncheckedTrailers is an upstream whose answers verify_response does not
// check (text/plain), streamed, with trailers after the body: at
// /announced all announced before the body (reverse_proxy sets them on the
// writer's map under their names), at /unannounced none announced (it
// sets them under http.TrailerPrefix). Each answer carries X-Checksum,
// which is the upstream's to send, and Payment-Response,
// Verification-Receipt and Verification-Status trailers, which only the
// gateway speaks.
func uncheckedTrailers(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		names := []string{"X-Checksum", x402.HeaderPaymentResponse, HeaderVerificationReceipt, HeaderVerificationStatus}
		h := w.Header()
		h.Set("Content-Type", "text/plain")
		announced := strings.HasSuffix(r.URL.Path, "/announced")
		if announced {
			h.Set("Trailer", strings.Join(names, ", "))
		}
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "streamed text, not json")
		w.(http.Flusher).Flush()
		for _, k := range names {
			v := forgedTrailer
			if k == "X-Checksum" {
				v = "abc123"
			}
			if !announced {
				k = http.TrailerPrefix + k
			}
			h.Set(k, v)
		}
	}))
	t.Cleanup(up.Close)
	return up
}

// wantUpstreamTrailers fails t unless resp, an answer of uncheckedTrailers,
// carries its X-Checksum trailer and none of the gateway's names as a
// trailer or a header.
func wantUpstreamTrailers(t *testing.T, what string, resp *http.Response, body []byte) {
	t.Helper()
	if resp.StatusCode != http.StatusOK || string(body) != "streamed text, not json" {
		t.Fatalf("%s: status %d body %q", what, resp.StatusCode, body)
	}
	if got := resp.Trailer.Get("X-Checksum"); got != "abc123" {
		t.Errorf("%s: trailer X-Checksum %q (Trailer header %q, trailers %v), want the upstream's \"abc123\"", what, got, resp.Header.Get("Trailer"), resp.Trailer)
	}
	for _, k := range []string{x402.HeaderPaymentResponse, HeaderVerificationReceipt, HeaderVerificationStatus} {
		if v := resp.Trailer.Get(k); v == forgedTrailer {
			t.Errorf("%s: the upstream's %s trailer reached the client", what, k)
		}
		if v := resp.Header.Get(k); v == forgedTrailer {
			t.Errorf("%s: the upstream's %s trailer reached the client as a header", what, k)
		}
	}
}

// An answer verify_response does not check (another status or content
// type) goes through unchanged, trailers included, as on a route without
// verify_response; trailers only the gateway speaks (x402's, the
// verification's) are dropped. (Before: the passing writer handed the proxy
// its own header map, copied to the client at the header only, so the
// trailers the proxy set after the body never reached the client.)
func TestVerifyResponseUncheckedAnswerKeepsItsTrailers(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	up := uncheckedTrailers(t)
	base := startCaddy(t, ":{port} {"+
		sellerRoute("/vr", up.URL, vf, "")+
		fmt.Sprintf("\thandle_path /plain/* {\n\t\treverse_proxy %s\n\t}\n", strings.TrimPrefix(up.URL, "http://"))+
		"}\n")
	for _, path := range []string{"/announced", "/unannounced"} {
		resp, body := getBody(t, base+"/plain"+path, nil)
		if resp.Trailer.Get("X-Checksum") != "abc123" {
			t.Fatalf("control %s (no verify_response): trailers %v body %q", path, resp.Trailer, body)
		}
		resp, body = getBody(t, base+"/vr"+path, nil)
		wantUpstreamTrailers(t, "through verify_response "+path, resp, body)
	}
}

// A settle before gate streams its answer with the upstream's trailers
// (README), also one verify_response in its route lets through unchecked;
// an upstream's Payment-Response trailer does not reach the buyer, who
// gets the gate's PAYMENT-RESPONSE header. (Before: such an answer lost
// every trailer.)
func TestSettleBeforeWithVerifyResponseKeepsUncheckedTrailers(t *testing.T) {
	_, fac := sharedDevnet(t)
	buildBinaries(t)
	vf := startVerifier(t)
	up := uncheckedTrailers(t)
	base := startCaddy(t, fmt.Sprintf(`:{port} {
	handle /stream/* {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http %[1]s
			store badger {data}/gate
			settle before
		}
		verify_response {
			schema %[4]s
			verifier_url %[5]s
			card_url %[6]s
		}
		reverse_proxy %[3]s
	}
}
`, fac, payTo.Hex(), strings.TrimPrefix(up.URL, "http://"), binaries.schemaPath, vf.srv.URL, vf.cardURL))
	for _, path := range []string{"/stream/announced", "/stream/unannounced"} {
		resp, _ := getBody(t, base+path, nil)
		sig := signFor(t, paymentRequired(t, resp), 7)
		resp, body := getBody(t, base+path, map[string]string{x402.HeaderPaymentSignature: sig})
		wantUpstreamTrailers(t, "settle before "+path, resp, body)
		if sr := settlementOf(t, resp); !sr.Success {
			t.Fatalf("%s: PAYMENT-RESPONSE %+v, want the settlement", path, sr)
		}
	}
}
