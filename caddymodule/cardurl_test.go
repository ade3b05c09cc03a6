package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/apierr"
)

// verifierdWithoutCard fronts the verifier fixture as verifierd itself
// is reached: /verify/schema served, /.well-known/agent-card.json answered
// 404 as verifierd answers every path it does not route (the fixture
// serves the card beside verifierd's handler; verifierd does not).
func verifierdWithoutCard(t *testing.T, vf *verifierFixture) *verifierFixture {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/.well-known/agent-card.json" {
			apierr.Write(w, apierr.NotFound("endpoint"))
			return
		}
		req, _ := http.NewRequest(r.Method, vf.srv.URL+r.URL.Path, r.Body)
		req.Header = r.Header.Clone()
		resp, err := testClient.Do(req)
		if err != nil {
			http.Error(w, "unreachable", http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	}))
	t.Cleanup(srv.Close)
	return &verifierFixture{srv: srv}
}

// A verify_response whose card_url answers no card (here the default,
// <verifier_url>/.well-known/agent-card.json, with verifier_url pointing
// at verifierd, which does not serve the card) cannot trust any receipt.
// The operator is told once, at error level, which option to set; each
// buyer gets a 503 saying the receipt keys are unavailable (not that the
// verification service is), without the URL.
func TestCardURLWithoutACardIsLoggedOnceAndNamedToTheBuyer(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	vd := verifierdWithoutCard(t, vf)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	base := startCaddyServers(t, "", logFile, ":{port} {"+sellerRoute("/s", agent, vd, "")+"}")
	for i := range 3 {
		if i > 0 {
			time.Sleep(cardRefetchEvery + 100*time.Millisecond) // a fresh read of the card each time
		}
		resp, body := getBody(t, base+"/s/invoices/INV-7731", nil)
		var e apierr.Error
		json.Unmarshal(body, &e)
		if resp.StatusCode != http.StatusServiceUnavailable || e.Code != apierr.CodeUpstreamUnavailable ||
			!strings.Contains(e.Message, "receipt keys") || strings.Contains(string(body), vd.srv.URL) || resp.Header.Get(HeaderVerificationReceipt) != "" {
			t.Fatalf("call %d: status %d: %.300s", i, resp.StatusCode, body)
		}
	}
	caddy.Stop()
	var logged []map[string]any
	for _, l := range logLines(t, logFile) {
		if l["level"] == "error" && strings.Contains(fmt.Sprint(l["msg"]), "card_url") {
			logged = append(logged, l)
		}
	}
	if len(logged) != 1 || !strings.Contains(fmt.Sprint(logged[0]["msg"]), "certd") ||
		!strings.Contains(fmt.Sprint(logged[0]["card_url"]), vd.srv.URL+"/.well-known/agent-card.json") {
		t.Fatalf("want one error naming card_url, the URL and certd; got %v", logged)
	}
}
