package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestLoopbackURL(t *testing.T) {
	tests := []struct {
		desc string
		raw  string
		ok   bool
	}{
		{"localhost by name is accepted", "http://localhost:8080", true},
		{"an IPv4 loopback address is accepted", "http://127.0.0.1:8081", true},
		{"any address in 127.0.0.0/8 is accepted", "http://127.9.9.9:1", true},
		{"the IPv6 loopback address is accepted", "http://[::1]:8080", true},
		{"a public address is refused", "http://93.184.216.34:80", false},
		{"a private network address is refused", "http://10.0.0.1:8080", false},
		{"the unspecified address is refused", "http://0.0.0.0:8080", false},
		{"a host name other than localhost is refused", "http://example.com", false},
		{"a name that merely starts with localhost is refused", "http://localhost.example.com", false},
		{"https is refused", "https://127.0.0.1:8443", false},
		{"a URL without a scheme is refused", "127.0.0.1:8080", false},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			_, err := loopbackURL(tc.raw)
			if (err == nil) != tc.ok {
				t.Fatalf("loopbackURL(%q) error = %v, want ok=%v", tc.raw, err, tc.ok)
			}
		})
	}
}

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		out := make([]time.Duration, len(v))
		for i, x := range v {
			out[i] = time.Duration(x) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	tests := []struct {
		desc    string
		samples []time.Duration
		p       float64
		want    time.Duration
	}{
		{"no samples give zero", nil, 50, 0},
		{"one sample is every percentile", ms(7), 99, 7 * time.Millisecond},
		{"p50 of 1..100 ms is 50 ms by nearest rank", ms(hundred...), 50, 50 * time.Millisecond},
		{"p99 of 1..100 ms is 99 ms", ms(hundred...), 99, 99 * time.Millisecond},
		{"p100 is the maximum", ms(hundred...), 100, 100 * time.Millisecond},
		{"p50 of four samples is the second", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			if got := percentile(tc.samples, tc.p); got != tc.want {
				t.Fatalf("percentile(p%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		desc      string
		args      []string
		wantErr   string
		scenarios []string
		conns     []int
	}{
		{"the defaults measure the gateway and verifierd at 8 and 32", nil, "", []string{"free", "direct", "mcp", "paid", "facilitator", "paid-solana"}, []int{8, 32}},
		{"a baseline adds its scenario", []string{"-baseline", "http://127.0.0.1:8090"}, "", []string{"free", "baseline", "direct", "mcp", "mcp-baseline", "paid", "facilitator", "paid-solana"}, []int{8, 32}},
		{"an empty -direct measures the gateway only", []string{"-direct", "", "-c", "4"}, "", []string{"free", "mcp", "paid", "facilitator", "paid-solana"}, []int{4}},
		{"the durability pair adds its scenarios after direct", []string{"-durable", "http://127.0.0.1:8091", "-nosync", "http://127.0.0.1:8092", "-scenarios", "free,direct,durable,nosync"}, "", []string{"free", "direct", "durable", "nosync"}, []int{8, 32}},
		{"durable and nosync are skipped without their verifierds", []string{"-scenarios", "direct,durable,nosync"}, "", []string{"direct"}, []int{8, 32}},
		{"a non-loopback -nosync verifierd is refused", []string{"-nosync", "http://192.0.2.1:8091"}, "loopback", nil, nil},
		{"a non-loopback -durable verifierd is refused", []string{"-durable", "http://192.0.2.1:8091"}, "loopback", nil, nil},
		{"scenarios can be chosen", []string{"-scenarios", "free,direct", "-c", "1,2,3"}, "", []string{"free", "direct"}, []int{1, 2, 3}},
		{"an unknown scenario is refused", []string{"-scenarios", "free,nope"}, "unknown scenario", nil, nil},
		{"no target at all is refused", []string{"-direct", "", "-gateway", ""}, "no target", nil, nil},
		{"concurrency above the cap is refused", []string{"-c", "8,257"}, "-c must be", nil, nil},
		{"zero concurrency is refused", []string{"-c", "0"}, "-c must be", nil, nil},
		{"a concurrency that is not a number is refused", []string{"-c", "8,x"}, "-c must be", nil, nil},
		{"a duration above the cap is refused", []string{"-d", "6m"}, "-d must be", nil, nil},
		{"a non-loopback target is refused", []string{"-direct", "http://10.1.2.3:8081"}, "loopback", nil, nil},
		{"a non-loopback baseline is refused", []string{"-baseline", "http://example.com"}, "loopback", nil, nil},
		{"a path without a leading slash is refused", []string{"-path", "verify"}, "-path", nil, nil},
		{"a malformed -pid is refused", []string{"-pid", "caddy"}, "name=PID", nil, nil},
		{"a negative -idle is refused", []string{"-idle", "-1s"}, "-idle must be", nil, nil},
		{"an -idle above the cap is refused", []string{"-idle", "6m"}, "-idle must be", nil, nil},
		{"a stray argument is refused", []string{"extra"}, "unexpected argument", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.desc, func(t *testing.T) {
			cfg, err := parseFlags(tc.args, io.Discard)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.scenarios, tc.scenarios) || !slices.Equal(cfg.concurrency, tc.conns) {
				t.Fatalf("scenarios %v at %v, want %v at %v", cfg.scenarios, cfg.concurrency, tc.scenarios, tc.conns)
			}
		})
	}
}

func TestParseStatReadsUserAndSystemTime(t *testing.T) {
	// A command name with spaces and a parenthesis, as the kernel allows.
	line := []byte("4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 8 0 12345 0 0\n")
	got, ok := parseStat(line)
	if !ok || got != 325*clockTick {
		t.Fatalf("parseStat = %v, %v; want %v", got, ok, 325*clockTick)
	}
	if _, ok := parseStat([]byte("garbage")); ok {
		t.Fatal("a line without fields parsed")
	}
}

// A process's CPU time is read per thread in nanoseconds, so a short
// stretch of work shows as what it cost, not as 0 or 10 ms ticks.
func TestCPUTimesResolveNanoseconds(t *testing.T) {
	if got, ok := parseSchedstat([]byte("1846156 482788 12\n")); !ok || got != 1846156*time.Nanosecond {
		t.Fatalf("parseSchedstat = %v, %v", got, ok)
	}
	if _, ok := parseSchedstat([]byte("")); ok {
		t.Fatal("an empty schedstat parsed")
	}
	self := []proc{{name: "self", pid: os.Getpid()}}
	before := cpuTimes(self)
	if len(before["self"]) < 2 {
		t.Skipf("no per-thread schedstat on this kernel: %v", before)
	}
	for end := time.Now().Add(15 * time.Millisecond); time.Now().Before(end); {
	}
	d, ok := cpuTimes(self).since(before)["self"]
	if !ok || d <= 0 || d > time.Second || d%clockTick == 0 {
		t.Fatalf("own CPU time over a 15 ms spin: %v (%v), want a positive figure finer than a tick", d, ok)
	}
	// A thread that was not there before counts whole; one gone since
	// is not subtracted.
	then := cpuSnapshot{"p": {1: 10 * time.Millisecond, 2: 5 * time.Millisecond}}
	now := cpuSnapshot{"p": {1: 12 * time.Millisecond, 3: time.Millisecond}, "q": {1: time.Second}}
	if got := now.since(then); len(got) != 1 || got["p"] != 3*time.Millisecond {
		t.Fatalf("since = %v, want p: 3ms and nothing for a process not read before", got)
	}
}

// The embedded request is the SPEC §10 invoice with the corrected total, so
// a load run exercises the whole pass path (checks, signing, recording).
func TestInvoiceIsTheCorrectedWorkedExample(t *testing.T) {
	var req struct {
		AgentID string `json:"agent_id"`
		Output  struct {
			InvoiceID string `json:"invoice_id"`
			Items     []struct {
				LineTotal float64 `json:"line_total"`
			} `json:"line_items"`
			Total float64 `json:"total"`
		} `json:"submitted_output"`
		EnforceRules bool `json:"enforce_rules"`
	}
	if err := json.Unmarshal(invoice, &req); err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, it := range req.Output.Items {
		sum += it.LineTotal
	}
	if req.Output.InvoiceID != "INV-7731" || sum != 129.5 || req.Output.Total != 129.5 || !req.EnforceRules {
		t.Fatalf("invoice is not the corrected SPEC §10 example: %+v", req)
	}
	if !strings.HasPrefix(req.AgentID, "test-") {
		t.Fatalf("agent_id %q must be a reserved test- id so load never enters a trust score", req.AgentID)
	}
}

// A phase counts every answered request, separates failures from
// successes, and keeps a latency sample for each success.
func TestPhaseCountsAnswersAndFailures(t *testing.T) {
	var served, failed atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !bytes.Equal(body, invoice) || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		if served.Add(1)%4 == 0 {
			failed.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte(`{"result":"pass"}`))
	}))
	defer srv.Close()

	endpoint := srv.URL + "/verify/schema"
	w := workload{
		next:  func(context.Context) (request, error) { return post(endpoint, invoice), nil },
		check: want200,
	}
	st := phase(context.Background(), newClient(4), w, 4, 300*time.Millisecond)
	if st.requests == 0 {
		t.Fatal("no requests were sent")
	}
	// A request under way at the end of the phase is waited for and
	// counted: the phase reports exactly what the server answered.
	if got := int64(st.requests); got != served.Load() {
		t.Fatalf("phase counted %d requests, server answered %d; first error %s", got, served.Load(), st.firstErr)
	}
	if st.errors == 0 || int64(st.errors) > failed.Load() {
		t.Fatalf("phase counted %d errors, server failed %d", st.errors, failed.Load())
	}
	if len(st.lat) != st.requests-st.errors {
		t.Fatalf("%d latency samples for %d successes", len(st.lat), st.requests-st.errors)
	}
	if !strings.Contains(st.firstErr, "503") {
		t.Fatalf("first error %q does not name the status", st.firstErr)
	}
	if st.rate() <= 0 {
		t.Fatalf("rate %v", st.rate())
	}
}

// measure is measureRounds for one scenario in one round.
func measure(ctx context.Context, cfg config, scenario string, c int) (stats, error) {
	sts, err := measureRounds(ctx, cfg, []string{scenario}, c, 1)
	if err != nil {
		return stats{}, err
	}
	return sts[0], nil
}

// A compared pair's phases alternate in rounds: the gateway's slice, then
// the baseline's, and so on, each slice's calls answered before the next
// slice starts; each scenario's stats add up its own slices.
func TestPairsAlternateInRounds(t *testing.T) {
	var mu sync.Mutex
	var order []string
	served := map[string]int{}
	server := func(name string) *url.URL {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			mu.Lock()
			order = append(order, name)
			served[name]++
			mu.Unlock()
			w.Write([]byte(`{"result":"pass"}`))
		}))
		t.Cleanup(srv.Close)
		u, err := loopbackURL(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	const rounds = 4
	cfg := config{gateway: server("gateway"), baseline: server("baseline"), path: "/verify/schema", body: invoice, duration: 400 * time.Millisecond}
	sts, err := measureRounds(context.Background(), cfg, []string{"free", "baseline"}, 2, rounds)
	if err != nil {
		t.Fatal(err)
	}
	runs := 0
	for i := range order {
		if i == 0 || order[i] != order[i-1] {
			runs++
		}
	}
	// The two first requests, then a slice of each per round.
	if want := 2 + 2*rounds; runs != want {
		t.Fatalf("the servers saw %d runs of calls, want %d (alternating slices)", runs, want)
	}
	for i, name := range []string{"gateway", "baseline"} {
		if st := sts[i]; st.requests+1 != served[name] || st.errors != 0 || len(st.lat) != st.requests {
			t.Fatalf("%s: %d requests, %d errors, %d samples counted; %s served %d (one of them the first request)", st.name, st.requests, st.errors, len(st.lat), name, served[name])
		}
		if !slices.IsSorted(sts[i].lat) {
			t.Fatalf("%s: latencies not sorted", sts[i].name)
		}
	}
}

// The calls under way when a phase ends are answered, not abandoned: a
// gateway counts an abandoned call against the client's rate limit, so a
// run of many phases would otherwise end in 429s.
func TestPhaseWaitsForTheCallsUnderWay(t *testing.T) {
	var started, abandoned atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		started.Add(1)
		select {
		case <-time.After(40 * time.Millisecond):
			w.Write([]byte(`{"result":"pass"}`))
		case <-r.Context().Done():
			abandoned.Add(1)
		}
	}))
	defer srv.Close()
	w := workload{
		next:  func(context.Context) (request, error) { return post(srv.URL+"/verify/schema", invoice), nil },
		check: want200,
	}
	st := phase(context.Background(), newClient(4), w, 4, 100*time.Millisecond)
	srv.Close() // waits for the handlers: every abandoned call is counted
	if abandoned.Load() != 0 {
		t.Fatalf("%d of %d calls were abandoned at the end of the phase", abandoned.Load(), started.Load())
	}
	if int64(st.requests) != started.Load() || st.errors != 0 {
		t.Fatalf("phase counted %d requests (%d errors, first %q), the server started %d", st.requests, st.errors, st.firstErr, started.Load())
	}
}

// A target that does not answer 200 to the first request is reported with a
// hint instead of being measured; a gateway that wants payment is reported
// with what to do about it.
func TestMeasureRefusesATargetThatDoesNotServeTheRequest(t *testing.T) {
	for _, tc := range []struct {
		desc   string
		status int
		body   string
		want   string
	}{
		{"a 404 is named", http.StatusNotFound, "", "404"},
		{"a 402 says how to raise the free allowance", http.StatusPaymentRequired, "", "AOV_FREE_PER_DAY"},
		{"an error answer is quoted", http.StatusServiceUnavailable, `{"code":"upstream_unavailable"}`, `503; the answer: {"code":"upstream_unavailable"}`},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			u, err := loopbackURL(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			cfg := config{gateway: u, path: "/verify/schema", body: invoice, duration: 100 * time.Millisecond}
			_, err = measure(context.Background(), cfg, "free", 1)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestReportPrintsRatesCPUAndRatios(t *testing.T) {
	mk := func(name string, c, n int, lat time.Duration, cpu time.Duration) stats {
		s := stats{name: name, concurrency: c, requests: n, elapsed: time.Second, cpu: map[string]time.Duration{"caddy": cpu},
			self: time.Duration(n) * 10 * time.Microsecond}
		for range n {
			s.lat = append(s.lat, lat)
		}
		return s
	}
	var out bytes.Buffer
	reportCores(&out, []stats{
		mk("free", 8, 2700, 3*time.Millisecond, 270*time.Millisecond),
		mk("baseline", 8, 3000, 2*time.Millisecond, 150*time.Millisecond),
		mk("direct", 8, 3375, 2*time.Millisecond, 0),
		mk("durable", 8, 3375, 2*time.Millisecond, 0),
		mk("nosync", 8, 4500, time.Millisecond, 0),
		mk("paid", 8, 10, time.Second, 30*time.Millisecond),
		mk("facilitator", 8, 1000, 5*time.Millisecond, 1000*time.Millisecond),
	}, []proc{{name: "caddy", pid: 1}, {name: "certd", pid: 2}}, 2)
	// 100 µs of stack CPU per request is 20,000 req/s on two cores; a phase
	// without CPU figures has none. The load generator's own CPU per
	// request (10 µs in each phase here) comes last, outside the stack's.
	for _, want := range []string{"caddy CPU/req", "2700", "3.00ms", "100µs", "50µs",
		"stack CPU/req", "req/s on 2 cores at that CPU", "load generator CPU/req",
		"paid at 8: 10 req/s, bound by the devnet's blocks (one a second); caddy CPU/req 3000µs, of which the facilitator's own payment check ≈ 1000µs",
		"free at 8: 2700 req/s, 0.90x the plain reverse_proxy", "1.00x of 2.5 x 1,080", "baseline at 8: 0.89x direct",
		"durable at 8: 3375 req/s with every history write synced, 0.75x the 4500 req/s of the same verifierd with -no-sync (target >= 0.7x)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	lastTwo := map[string]string{"free": "100µs 20000 10µs", "baseline": "50µs 40000 10µs", "direct": "- - 10µs"}
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if want, ok := lastTwo[f[0]]; ok {
			if got := strings.Join(f[len(f)-3:], " "); got != want {
				t.Errorf("%s: stack CPU, rate and the load generator's CPU %q, want %q:\n%s", f[0], got, want, out.String())
			}
			delete(lastTwo, f[0])
		}
	}
	if len(lastTwo) > 0 {
		t.Errorf("no table line for %v:\n%s", lastTwo, out.String())
	}
}

// With the facilitator in its own process, the paid line sets the
// gateway's Caddy CPU per paid call beside the baseline Caddy's per call
// and the facilitator's own, each measured, and never compares the paid
// rate (the chain's) with the proxy's.
func TestReportPaidWithARemoteFacilitator(t *testing.T) {
	mk := func(name string, n int, cpu map[string]time.Duration) stats {
		s := stats{name: name, concurrency: 32, requests: n, elapsed: time.Second, cpu: cpu}
		for range n {
			s.lat = append(s.lat, time.Millisecond)
		}
		return s
	}
	procs := []proc{{name: "caddy", pid: 1}, {name: "facilitator", pid: 2}, {name: "baseline", pid: 3}}
	var out bytes.Buffer
	reportCores(&out, []stats{
		mk("baseline", 1000, map[string]time.Duration{"caddy": 10 * time.Millisecond, "facilitator": 0, "baseline": 300 * time.Millisecond}),
		mk("paid", 20, map[string]time.Duration{"caddy": 8 * time.Millisecond, "facilitator": 30 * time.Millisecond, "baseline": 0}),
		mk("facilitator", 100, map[string]time.Duration{"caddy": 10 * time.Millisecond, "facilitator": 50 * time.Millisecond}),
	}, procs, 2)
	want := "paid at 32: 20 req/s, bound by the devnet's blocks (one a second); gateway caddy CPU/req 400µs; the facilitator in its own process, for its verify and settle: 1500µs; the plain reverse_proxy's caddy 300µs per call: 0.75x (target >= 0.9x)"
	if !strings.Contains(out.String(), want) {
		t.Errorf("report lacks %q:\n%s", want, out.String())
	}
	if strings.Contains(out.String(), "payment check ≈") || strings.Contains(out.String(), "paid at 32: 20 req/s, 0.") {
		t.Errorf("the paid line estimates or compares rates although the facilitator was measured:\n%s", out.String())
	}

	// With the CPU the processes spend with no load (2 ms and 10 ms a
	// second; the paid phase lasts a second for 20 calls), the paid figures
	// beyond it are shown too and the ratio is taken from them; the idle
	// phase is no table row.
	idle := stats{name: idleName, elapsed: 2 * time.Second, cpu: map[string]time.Duration{"caddy": 4 * time.Millisecond, "facilitator": 20 * time.Millisecond}}
	out.Reset()
	reportCores(&out, []stats{idle,
		mk("baseline", 1000, map[string]time.Duration{"caddy": 10 * time.Millisecond, "baseline": 300 * time.Millisecond}),
		mk("paid", 20, map[string]time.Duration{"caddy": 8 * time.Millisecond, "facilitator": 30 * time.Millisecond}),
	}, procs, 2)
	for _, want := range []string{
		"with no load (2.0s before the scenarios), CPU per second: caddy 2.0ms facilitator 10.0ms",
		"gateway caddy CPU/req 400µs (300µs beyond its CPU with no load); the facilitator in its own process, for its verify and settle: 1500µs (1000µs beyond its CPU with no load); the plain reverse_proxy's caddy 300µs per call: 1.00x (target >= 0.9x)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), idleName+" ") {
			t.Errorf("the idle phase has a table row: %q", line)
		}
	}
}

// The MCP path is compared with the plain reverse_proxy carrying the same
// MCP call, by rate and by Caddy's CPU per call, and the MCP transport's
// own cost (the same call over MCP and over REST, both through the plain
// proxy) is printed apart; without mcp-baseline the MCP line says that its
// ratio includes the transport.
func TestReportMCPAgainstTheSameCallProxied(t *testing.T) {
	mk := func(name string, n int, cpu map[string]time.Duration) stats {
		s := stats{name: name, concurrency: 8, requests: n, elapsed: time.Second, cpu: cpu}
		for range n {
			s.lat = append(s.lat, time.Millisecond)
		}
		return s
	}
	procs := []proc{{name: "caddy", pid: 1}, {name: "verifierd", pid: 2}, {name: "baseline", pid: 3}}
	baseline := mk("baseline", 2000, map[string]time.Duration{"caddy": 0, "verifierd": 400 * time.Millisecond, "baseline": 500 * time.Millisecond})
	gateway := mk("mcp", 1000, map[string]time.Duration{"caddy": 600 * time.Millisecond, "verifierd": 550 * time.Millisecond, "baseline": 0})
	proxied := mk("mcp-baseline", 1100, map[string]time.Duration{"caddy": 0, "verifierd": 605 * time.Millisecond, "baseline": 330 * time.Millisecond})
	var out bytes.Buffer
	reportCores(&out, []stats{baseline, gateway, proxied}, procs, 2)
	for _, want := range []string{
		"mcp at 8: 1000 req/s, 0.91x the plain reverse_proxy carrying the same MCP call (target >= 0.9x), 0.37x of 2.5 x 1,080 req/s; gateway caddy CPU/req 600µs against the plain reverse_proxy's 300µs for the same call (0.50x)",
		"mcp-baseline at 8: 1100 req/s, 0.55x the REST baseline: the MCP transport's own cost (verifierd CPU/req 550µs over MCP against 200µs over REST, +350µs)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "carrying the REST call") {
		t.Errorf("the MCP line is set against the REST call although the same MCP call was proxied:\n%s", out.String())
	}

	out.Reset()
	reportCores(&out, []stats{baseline, gateway}, procs, 2)
	want := "mcp at 8: 1000 req/s, 0.50x the plain reverse_proxy carrying the REST call (the MCP transport's own cost included; run mcp-baseline for the gate's alone), 0.37x of 2.5 x 1,080 req/s"
	if !strings.Contains(out.String(), want) || strings.Contains(out.String(), "mcp-baseline at 8") {
		t.Errorf("report lacks %q or has a transport line without mcp-baseline:\n%s", want, out.String())
	}
}
