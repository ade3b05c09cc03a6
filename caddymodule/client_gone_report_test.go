package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// deafReporter is a fake verifierd-like upstream handler that does not
// watch its context (deafUpstream): it records a paid call pending and
// answers after a pause, naming its verification and asking for a report
// (X-Aov-Settlement-Report); the reports it is sent are kept in
// deafReports.
type deafReporter struct{}

var deafReports struct {
	sync.Mutex
	got []string
}

func (deafReporter) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_deaf_reporter", New: func() caddy.Module { return new(deafReporter) }}
}

func (deafReporter) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.URL.Path == "/v1/gateway/settlement" {
		b, _ := io.ReadAll(r.Body)
		deafReports.Lock()
		deafReports.got = append(deafReports.got, string(b))
		deafReports.Unlock()
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	time.Sleep(1500 * time.Millisecond)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Aov-Settlement-Report", "/v1/gateway/settlement")
	_, err := fmt.Fprintf(w, `{"verification_id":"ver_%d","passed":true,"settlement":%q}`, time.Now().UnixNano(), r.Header.Get(HeaderUpstreamSettlement))
	return err
}

func init() {
	caddy.RegisterModule(deafReporter{})
	httpcaddyfile.RegisterHandlerDirective("test_deaf_reporter", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return deafReporter{}, nil
	})
}

// A paid call in front of verifierd is recorded payment "pending", and the
// gate reports how it ended. When the client leaves after the upstream
// began and before the answer is settled (serveCharged's client-gone path),
// nothing is charged and the gate reports it unpaid, as it does a
// settlement that failed. (Before: the payment was released and nothing
// reported, so the record stayed pending for ever: the retry with the same
// payment records a new verification.)
func TestClientGoneReportsUnpaid(t *testing.T) {
	_, fac := sharedDevnet(t)
	deafReports.Lock()
	deafReports.got = nil
	deafReports.Unlock()
	site := fmt.Sprintf(`:{port} {
	route /v1/* {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator http %[1]s
			store badger {data}/gate
		}
		test_deaf_reporter
	}
}
`, fac, payTo.Hex())
	base := startCaddy(t, site)
	resp, _ := getBody(t, base+"/v1/verify", nil)
	sig := signFor(t, paymentRequired(t, resp), 2)
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/verify", nil)
	req.Header.Set(x402.HeaderPaymentSignature, sig)
	impatient := &http.Client{Timeout: 500 * time.Millisecond}
	if resp, err := impatient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("answered before the client left: %d", resp.StatusCode)
	}
	reports := func() []string {
		deafReports.Lock()
		defer deafReports.Unlock()
		return slices.Clone(deafReports.got)
	}
	// The upstream answers after the client left; the report goes after it,
	// in the background.
	waitFor(t, "the report of the call whose client left", func() bool { return len(reports()) >= 1 })
	if got := reports(); len(got) != 1 || !strings.Contains(got[0], `"payment":"unpaid"`) {
		t.Errorf("reports %q; want one report {\"payment\":\"unpaid\"} for the call whose client left", got)
	}
	// The same payment, sent again, is settled and reported paid.
	resp, body := getBody(t, base+"/v1/verify", map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the retry with the same payment: %d %.200s", resp.StatusCode, body)
	}
	waitFor(t, "the report of the settled retry", func() bool { return len(reports()) >= 2 })
	if got := reports(); len(got) != 2 || !strings.Contains(got[1], `"payment":"paid"`) {
		t.Errorf("reports %q; want the settled retry reported paid after the unpaid call", got)
	}
}
