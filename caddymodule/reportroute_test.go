package caddymodule

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
	"github.com/caddyserver/caddy/v2"
)

// slowReportUpstream is reportingUpstream whose report endpoint takes
// 300 ms (a verifierd under load), so reports queue behind one another.
type slowReportUpstream struct {
	*httptest.Server
	name    string
	mu      sync.Mutex
	reports []string
	n       atomic.Int64
}

func newSlowReportUpstream(t *testing.T, name string) *slowReportUpstream {
	u := &slowReportUpstream{name: name}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/gateway/settlement" {
			time.Sleep(300 * time.Millisecond)
			b, _ := io.ReadAll(r.Body)
			u.mu.Lock()
			u.reports = append(u.reports, string(b))
			u.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
			return
		}
		id := fmt.Sprintf("%s-%d", name, u.n.Add(1))
		if r.Header.Get(HeaderUpstreamSettlement) == "pending" {
			w.Header().Set(headerSettlementReport, "/v1/gateway/settlement")
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"verification_id": id, "paid_content": true})
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *slowReportUpstream) got() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return strings.Join(u.reports, " ")
}

// One gate serves two hosts, and host matchers after it choose each
// tenant's upstream. The outcomes the background pass resolves together
// are batched, and a batch goes through its leader's request: each tenant's
// upstream gets only its own verifications' outcomes. (Before: reports were
// batched by gate and path alone, and tenant B's outcomes went in tenant
// A's batch to A's upstream, while B's records stayed pending.)
func TestBatchedReportsGoOnlyWithReportsOfTheirHost(t *testing.T) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = 300 * time.Millisecond
	_, _ = sharedDevnet(t)
	release := stallChain(t)
	a, b := newSlowReportUpstream(t, "tenantA"), newSlowReportUpstream(t, "tenantB")
	site := faultyGateSite("lose_reply_stall", gateDir(t), twoTenants(a.URL, b.URL), "public_base_url https://gateway.test")
	url := startCaddy(t, site) + "/verify/schema"
	for _, host := range []string{"a.test", "b.test", "a.test", "b.test"} {
		paidCallHeld(t, url, map[string]string{"Host": host}, host+"'s paid call")
	}
	close(release)
	time.Sleep(8 * time.Second)
	t.Logf("tenant A's upstream got: %s", a.got())
	t.Logf("tenant B's upstream got: %s", b.got())
	if strings.Contains(a.got(), "tenantB-") || strings.Contains(b.got(), "tenantA-") {
		t.Error("a tenant's upstream was sent the other tenant's verification ids and outcomes; want each only its own")
	}
	for _, u := range []*slowReportUpstream{a, b} {
		for i := 1; i <= 2; i++ {
			if id := fmt.Sprintf(`"%s-%d"`, u.name, i); !strings.Contains(u.got(), id) {
				t.Errorf("%s's upstream got no report of %s; want each of its own", u.name, id)
			}
		}
	}
}

// resolvedAfterReloadGoesToItsHost holds tenant A's payment unknown
// under a gate whose upstream is chosen per request by what pick puts
// after it, reloads the very same config (or, restart true, stops Caddy
// and starts it again: the way back is then the held record's), has
// tenant B call the new gate first, and lets the chain answer: A's
// outcome goes to A's upstream alone, through a request made A's again,
// never B's (which would learn A's verification id while A's record
// stayed pending).
func resolvedAfterReloadGoesToItsHost(t *testing.T, pick string, restart bool) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = time.Hour // the first config's pass runs only at its start
	_, _ = sharedDevnet(t)
	release := stallChain(t)
	a, b := newReportingUpstream(t), newReportingUpstream(t)
	site := faultyGateSite("lose_reply_stall", gateDir(t), strings.NewReplacer("{A}", strings.TrimPrefix(a.URL, "http://"), "{B}", strings.TrimPrefix(b.URL, "http://")).Replace(pick), "public_base_url https://gateway.test")
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	loadCaddyServers(t, port, "", logFile, site)
	t.Cleanup(func() { caddy.Stop() })
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	url := base + "/verify/schema"
	paidCallHeld(t, url, map[string]string{"Host": "a.test"}, "tenant A's paid call")
	// The operator reloads the same config; tenant B's client calls (a
	// 402 is enough for the new gate to learn its way); the chain answers.
	resolveInterval = 300 * time.Millisecond
	if restart {
		if err := caddy.Stop(); err != nil {
			t.Fatal(err)
		}
	}
	loadCaddyServers(t, port, "", logFile, site)
	readAll(t, post(t, url, "", map[string]string{"Host": "b.test"}))
	close(release)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && len(a.got())+len(b.got()) == 0; time.Sleep(100 * time.Millisecond) {
	}
	time.Sleep(500 * time.Millisecond)
	for _, l := range logLines(t, logFile) {
		if l["level"] != "info" {
			t.Logf("log: %v", l)
		}
	}
	if got := b.got(); len(got) != 0 {
		t.Errorf("tenant B's upstream was sent tenant A's outcome: %q; want nothing", got)
	}
	if got := a.got(); len(got) != 1 {
		t.Errorf("tenant A's upstream (which recorded the verification) got %q; want its one report", got)
	}
}

// The tenant's upstream chosen by host matchers after the gate, in the
// gate's own route. (Before: A's outcome went through tenant B's request,
// the first the new gate served, to B's upstream.)
func TestResolvedOutcomeAfterAReloadGoesToItsHostsUpstream(t *testing.T) {
	resolvedAfterReloadGoesToItsHost(t, `@a host a.test
		reverse_proxy @a {A}
		@b host b.test
		reverse_proxy @b {B}`, false)
}

// The same after a restart: the held record names the host that asked.
// (Before: it named none, and A's outcome went through B's request.)
func TestResolvedOutcomeAfterARestartGoesToItsHostsUpstream(t *testing.T) {
	resolvedAfterReloadGoesToItsHost(t, `@a host a.test
		reverse_proxy @a {A}
		@b host b.test
		reverse_proxy @b {B}`, true)
}

// The upstream chosen by a request placeholder (a map on {host}): the
// report request's placeholders read its own Host. (Before: it ran with a
// fresh replacer holding no request placeholders, {host} was empty,
// reverse_proxy dialed ":0" and the outcome was never reported.)
func TestResolvedOutcomeOfAPlaceholderUpstreamIsReported(t *testing.T) {
	resolvedAfterReloadGoesToItsHost(t, `map {host} {backend} {
			a.test {A}
			b.test {B}
		}
		reverse_proxy {backend}`, false)
}

// A gate's request is made the request a held record names only in what
// the record keeps (Host, addresses); one that differs in anything else
// the route after the gate reads (here TLS), or a record that names none
// (written before records did), makes no way to its upstream: the
// outcome waits rather than ride another request's route.
func TestAReportIsMadeOnlyTheRequestItsRecordNames(t *testing.T) {
	learned := httptest.NewRequest(http.MethodPost, "http://b.test/verify/schema", nil)
	learned.RemoteAddr = "192.0.2.7:4711"
	asked := httptest.NewRequest(http.MethodPost, "http://a.test/verify/schema", nil)
	asked.RemoteAddr = "198.51.100.3:5000"
	way := &reporter{base: learned}
	rt := routeOf(asked)
	got := way.as(&rt)
	if got == nil {
		t.Fatal("a request of the same protocol made no way to the asking host's upstream")
	}
	if got.base.Host != "a.test" || routeOf(got.base) != rt {
		t.Errorf("the way goes as host %q, route %+v; want a.test, %+v", got.base.Host, routeOf(got.base), rt)
	}
	if learned.Host != "b.test" || learned.RemoteAddr != "192.0.2.7:4711" {
		t.Errorf("the learned request was changed: %s %s", learned.Host, learned.RemoteAddr)
	}
	if way.as(nil) != nil {
		t.Error("a record naming no request made a way through another request")
	}
	tlsAsked := httptest.NewRequest(http.MethodPost, "https://a.test/verify/schema", nil)
	tlsRT := routeOf(tlsAsked)
	if way.as(&tlsRT) != nil {
		t.Error("a request over TLS was made from one without it")
	}
}

// Tenant A's paid call is held unknown under a gate serving two hosts.
// Once the chain has the transfer, a request carrying the same payment
// (public on chain once settled) but sent with Host b.test finds the
// settlement first: A's outcome goes to A's upstream, the one that
// recorded the verification, and B's upstream is sent nothing. (Before:
// the request that found it reported it through its own way, to tenant
// B's upstream, and dropped the way kept from A's call.)
func TestOutcomeFoundByAnotherHostsRequestGoesToTheAskingHost(t *testing.T) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = time.Hour // the pass runs only at start: a request finds the outcome
	_, _ = sharedDevnet(t)
	release := stallChain(t)
	a, b := newReportingUpstream(t), newReportingUpstream(t)
	site := faultyGateSite("lose_reply_stall", gateDir(t), twoTenants(a.URL, b.URL), "public_base_url https://gateway.test")
	url := startCaddy(t, site) + "/verify/schema"
	sig := paidCallHeld(t, url, map[string]string{"Host": "a.test"}, "tenant A's paid call")
	close(release)
	status := http.StatusServiceUnavailable
	for end := time.Now().Add(10 * time.Second); status == http.StatusServiceUnavailable && time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		r := post(t, url, `{"other":"request"}`, map[string]string{"Host": "b.test", x402.HeaderPaymentSignature: sig})
		readAll(t, r)
		status = r.StatusCode
	}
	if status != http.StatusPaymentRequired {
		t.Fatalf("another host's request with A's settled payment: %d; want 402 (not its payment)", status)
	}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end) && len(a.got()) == 0; time.Sleep(50 * time.Millisecond) {
	}
	time.Sleep(300 * time.Millisecond) // a report sent to B would be in by now
	if got := b.got(); len(got) != 0 {
		t.Errorf("tenant B's upstream was sent tenant A's outcome: %q; want nothing", got)
	}
	if got := a.got(); len(got) != 1 || got[0] != "v-1=paid" {
		t.Errorf("tenant A's upstream, which recorded the verification, got %q; want [v-1=paid]", got)
	}
}

// A site whose proxy tags each request with Caddy's request id (header_up
// X-Request-ID {http.request.uuid}, the way to correlate logs) and whose
// route sets a variable after the gate: an outcome the background pass
// resolves after a restart is reported through the first request the new
// gate serves, as the record's route is what the routes after the gate
// can choose by when the call came to it. (Before: the record's route
// digested the variables as they were once the call had been through the
// proxy, its own request id among them, so no request could be made as
// it, and the outcome was kept unreported.)
func TestResolvedOutcomeAfterRestartOfARouteTaggingItsRequestsIsReported(t *testing.T) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = time.Hour
	_, _ = sharedDevnet(t)
	release := stallChain(t)
	a := newReportingUpstream(t)
	site := faultyGateSite("lose_reply_stall", gateDir(t), `vars tagged {http.request.uuid}
		reverse_proxy `+strings.TrimPrefix(a.URL, "http://")+` {
			header_up X-Request-ID {http.request.uuid}
		}`)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	loadCaddyServers(t, port, "", logFile, site)
	t.Cleanup(func() { caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/verify/schema", port)
	paidCallHeld(t, url, nil, "paid call")
	resolveInterval = 300 * time.Millisecond
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	loadCaddyServers(t, port, "", logFile, site)
	readAll(t, post(t, url, "", nil)) // the restarted gate learns its way
	close(release)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && len(a.got()) == 0; time.Sleep(100 * time.Millisecond) {
	}
	if got := a.got(); len(got) != 1 || got[0] != "v-1=paid" {
		t.Errorf("the site's one upstream got %q after the restart; want [v-1=paid]", got)
	}
	for _, l := range logLines(t, logFile) {
		if l["msg"] == orphanKept {
			t.Errorf("logged %q", orphanKept)
		}
	}
}

// faultyGateSite is a Caddyfile site on {port} whose /verify/schema is paid
// through a gate on the faulty devnet facilitator answering as fault
// says, storing in dir, with settings added to its x402 block; then is
// what the route does after the gate.
func faultyGateSite(fault, dir, then string, settings ...string) string {
	extra := ""
	for _, s := range settings {
		extra += "\n\t\t\t" + s
	}
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %s
			facilitator faulty_devnet %s
			store badger %s%s
		}
		%s
	}
}
`, payTo.Hex(), fault, dir, extra, then)
}

// twoTenants is a gate's route on to tenant A's upstream (at a) for
// Host a.test and tenant B's (at b) for b.test.
func twoTenants(a, b string) string {
	return fmt.Sprintf(`@a host a.test
		reverse_proxy @a %s
		@b host b.test
		reverse_proxy @b %s`, strings.TrimPrefix(a, "http://"), strings.TrimPrefix(b, "http://"))
}

// paidCallHeld pays for a call to url (headers hdr, Host among them) and
// has the gate hold it, 503 settlement_pending as its settlement's
// outcome is not known (what names the call in the failure). It returns
// the payment.
func paidCallHeld(t *testing.T, url string, hdr map[string]string, what string) string {
	t.Helper()
	sig := signFor(t, paymentRequired(t, post(t, url, "", hdr)), 9)
	paid := map[string]string{x402.HeaderPaymentSignature: sig}
	for k, v := range hdr {
		paid[k] = v
	}
	resp := post(t, url, validRequest, paid)
	if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("%s: %d %.300s; want 503 settlement_pending", what, resp.StatusCode, body)
	}
	return sig
}
