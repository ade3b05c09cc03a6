package caddymodule

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/aovhq/aov/x402"
)

// An answer held for an unknown settlement goes to any retry that presents
// the same payment for the same method, URI and body (paidFor: no header or
// cookie of the buyer's names it), and the payment is public once on chain:
// it keeps only the header fields that describe its content and its
// verification (keptHeader), never the Set-Cookie the upstream issued to
// the buyer. (Before: the whole header was kept, and a stranger who copied
// the authorization from the chain got the buyer's session cookie.)
func TestHeldAnswerKeepsNoSetCookie(t *testing.T) {
	sharedDevnet(t)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.SetCookie(w, &http.Cookie{Name: "session", Value: "issued-to-the-buyer-" + r.Header.Get("X-Buyer"), HttpOnly: true})
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(up.Close)
	site := fmt.Sprintf(`:{port} {
	route /api/* {
		x402 {
			accept devnet $0.05 %[2]s
			facilitator faulty_devnet lose_reply
			store badger {data}/gate
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), payTo.Hex())
	base := startCaddy(t, site)
	resp, _ := getBody(t, base+"/api/report", nil)
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Fatalf("unpaid: %d", resp.StatusCode)
	}
	sig := signFor(t, paymentRequired(t, resp), 5)
	resp, body := getBody(t, base+"/api/report", map[string]string{x402.HeaderPaymentSignature: sig, "X-Buyer": "alice"})
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try (reply lost): %d %s", resp.StatusCode, body)
	}
	// A stranger: same URL, the payment as published on chain, no X-Buyer,
	// no cookie.
	for i := 0; i < 2; i++ {
		resp, body = getBody(t, base+"/api/report", map[string]string{x402.HeaderPaymentSignature: sig})
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("stranger #%d: %d %s; want the held answer", i+1, resp.StatusCode, body)
		}
		if resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("stranger #%d got %d %s with the buyer's Set-Cookie %q; want no cookie issued to the buyer replayed to another party, and its Content-Type",
				i+1, resp.StatusCode, body, resp.Header.Get("Set-Cookie"))
		}
	}
}

// keptHeader keeps what describes the content and its verification, the
// receipt under the name verify_response gave it, and nothing else.
func TestKeptHeaderAllowList(t *testing.T) {
	bw := &bufferedWriter{header: http.Header{
		"Content-Type":           {"application/json"},
		"Content-Language":       {"en"},
		"Content-Encoding":       {"gzip"},
		"Content-Range":          {"bytes 10-14/20"},
		"Etag":                   {`"v1"`},
		"Last-Modified":          {"Mon, 07 Dec 2026 00:00:00 GMT"},
		"Verification-Receipt":   {"r"},
		"Verification-Status":    {"pass"},
		"X-Receipt":              {"custom"},
		"X-Content-Type-Options": {"nosniff"},
		"Set-Cookie":             {"session=buyer"},
		"Content-Location":       {"/users/alice"},
		"Link":                   {"</next>; rel=next"},
		"Refresh":                {"0; url=/x"},
		"Location":               {"/elsewhere"},
		"X-Session":              {"buyer"},
		"Content-Length":         {"2"},
		"Date":                   {"Mon, 07 Dec 2026 00:00:00 GMT"},
	}, buf: new(bytes.Buffer)}
	bw.buf.WriteString("{}")
	h, ok := keptHeader(bw, 1<<20, "X-Receipt")
	if !ok {
		t.Fatal("not kept")
	}
	var got []string
	for k := range h {
		got = append(got, k)
	}
	slices.Sort(got)
	want := []string{"Content-Encoding", "Content-Language", "Content-Range", "Content-Type", "Etag", "Last-Modified", "Verification-Receipt", "Verification-Status", "X-Content-Type-Options", "X-Receipt"}
	if !slices.Equal(got, want) {
		t.Errorf("kept %q, want %q", got, want)
	}
	if h, _ := keptHeader(bw, 1<<20, ""); h.Get("X-Receipt") != "" {
		t.Errorf("kept X-Receipt although no verify_response named it its receipt")
	}
}
