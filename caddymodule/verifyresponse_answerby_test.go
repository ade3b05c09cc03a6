package caddymodule

import (
	"net/http"
	"testing"
	"time"
)

// verify_response tells verifierd when it stops waiting (X-Aov-Answer-By,
// beside the gateway token), as the gate tells its upstream: verifierd
// bounds its history store's wait by it, so a stalled store answers with
// verifierd's own 503 while the gateway still listens, and records no
// verification whose answer would come after the gateway gave up. (Before:
// none was sent; verifierd's store wait (10 s) was as long as the default
// verifier_timeout, so the gateway always gave up first.)
func TestVerifyResponseTellsVerifierdWhenItStopsWaiting(t *testing.T) {
	buildBinaries(t)
	vf := startVerifier(t)
	agent := startAgent(t)
	base := startCaddy(t, ":{port} {"+
		sellerRoute("/default", agent, vf, "")+
		sellerRoute("/short", agent, vf, "verifier_timeout 3s")+"}\n")

	for _, c := range []struct {
		path string
		wait time.Duration
	}{
		{"/default", defaultVerifierTimeout},
		{"/short", 3 * time.Second},
	} {
		t.Run(c.path, func(t *testing.T) {
			vf.answerBy.Store(0)
			before := time.Now()
			resp, body := getBody(t, base+c.path+"/invoices/INV-7731", nil)
			after := time.Now()
			if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderVerificationStatus) != "pass" {
				t.Fatalf("status %d, verification %q: %.200s", resp.StatusCode, resp.Header.Get(HeaderVerificationStatus), body)
			}
			got := time.UnixMilli(vf.answerBy.Load())
			if lo, hi := before.Add(c.wait).Truncate(time.Millisecond), after.Add(c.wait); got.Before(lo) || got.After(hi) {
				t.Fatalf("X-Aov-Answer-By %v, want the call's deadline, between %v and %v", got, lo, hi)
			}
		})
	}
}
