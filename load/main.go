// Command load measures the whole stack under a bounded, closed-loop load
// and prints one report anyone can rerun on their own machine: for each
// scenario and concurrency, requests per second, latency percentiles and
// the CPU time each process spent per request (its threads' time on a CPU,
// read from /proc/<pid>/task/<tid>/schedstat before and after the phase).
//
// Scenarios, all with the same verification request (by default the SPEC §10
// invoice, corrected so it passes):
//
//	free         POST /verify/schema through the gateway, served from the free allowance
//	baseline     the same through a plain Caddy reverse_proxy to the same verifierd
//	direct       the same straight to verifierd
//	durable      the same straight to a verifierd of the run's own (-durable),
//	             started on an empty history: every history write synced, as
//	             verifierd runs by default
//	nosync       the same straight to a second such verifierd run with
//	             -no-sync (-nosync): durable's rate as a share of this one is
//	             what the synced history writes cost, the two alike in all
//	             else (binary, keys, a history as long)
//	mcp          the MCP tool verify_schema through the gateway
//	mcp-baseline the same MCP call through the plain reverse_proxy: what the
//	             gateway's MCP path is compared with, since MCP (JSON-RPC over
//	             Streamable HTTP, the MCP SDK in verifierd) costs verifierd
//	             more than the REST call does whatever the gate does
//	paid         POST /verify/schema through the gateway with a fresh x402
//	             payment per request, verified and settled on the devnet
//	             (its rate is the devnet's: one block a second)
//	facilitator  the devnet facilitator's POST /verify alone (its own cost
//	             per payment check; settlement waits for blocks)
//	paid-solana  POST /verify/schema through the gateway with a fresh SVM
//	             exact payment per request from the local Solana chain's
//	             funded wallets (-solana-chain), verified and settled on that
//	             chain: no block time bounds it, so its rate is compared with
//	             the plain reverse_proxy's (skipped without the chain)
//
// The report sets free against baseline, mcp against mcp-baseline and
// durable against nosync. When both of such a pair run, their phases
// alternate in -rounds slices of the duration (five by default), so that
// background work of a shared process (a Badger compaction in the verifierd
// both reach, the machine's other load) falls on both alike instead of on
// whichever ran when it struck.
//
// With a -pid facilitator=PID (the facilitator in a process of its own, as
// scripts/load.sh runs it), a paid call's CPU is measured apart: Caddy's is
// the gateway's alone, set beside the baseline Caddy's per call.
//
//	go run ./load                                  # against `make run` on the default ports
//	go run ./load -c 8,32 -d 10s -pid caddy=123 -pid verifierd=456
//	scripts/load.sh                                # what `make load` runs
//
// It is a measuring tool for one's own machine, not a stress or attack tool:
// it talks only to loopback addresses, and concurrency and duration are
// capped. It is not a benchmark harness either: numbers depend on the host,
// and nothing here fails on them; compare ratios within one run.
package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
	"github.com/valyala/fasthttp"
)

// invoice is the default request body: the SPEC §10 worked example with the
// total corrected to 129.5, so every request passes and is signed, recorded
// under the reserved "test-" agent id that never enters a trust score.
//
//go:embed invoice.json
var invoice []byte

// Bounds on what one run may do to the machine.
const (
	maxConcurrency = 256
	maxDuration    = 5 * time.Minute
	maxBodyBytes   = 1 << 20
	// maxRounds and minSlice bound how finely a pair's phases alternate:
	// each switch leaves the connections of the other scenario idle.
	maxRounds = 100
	minSlice  = 100 * time.Millisecond
	// maxSamples bounds the memory the latency samples take per phase.
	maxSamples = 20_000_000
)

// Scenario names, in the order they run.
var allScenarios = []string{"free", "baseline", "direct", "durable", "nosync", "mcp", "mcp-baseline", "paid", "facilitator", "paid-solana"}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
}

// config is one run's settings, checked by parseFlags.
type config struct {
	gateway, baseline, direct *url.URL // nil: not measured
	// durable and nosync are two more verifierds, the second run with
	// -no-sync, both started on an empty history (nil: not measured).
	durable, nosync *url.URL
	path            string
	body            []byte
	concurrency     []int
	duration        time.Duration
	warmup          time.Duration
	// rounds is how many alternating slices a pair's phases are cut into.
	rounds    int
	scenarios []string
	procs     []proc
	// allowanceMode names the gateway's free-allowance mode (durable or
	// batched) for the report; the caller reads it from the gateway.
	allowanceMode string
	// idle is how long the processes' CPU is read before any load, for
	// their CPU without requests (0: not measured).
	idle time.Duration
	// solanaChain is the local Solana chain's wallet file, for
	// paid-solana ("": that scenario is skipped).
	solanaChain string
}

// proc is a process whose CPU time the report splits per request.
type proc struct {
	name string
	pid  int
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gateway := fs.String("gateway", "http://127.0.0.1:8080", "base URL of the gateway (Caddy with the x402 modules; empty: skip its scenarios)")
	baseline := fs.String("baseline", "", "base URL of a plain Caddy reverse_proxy to the same verifierd (empty: skip)")
	direct := fs.String("direct", "http://127.0.0.1:8081", "base URL of verifierd itself (empty: skip)")
	durable := fs.String("durable", "", "base URL of a verifierd started on an empty history, for the durable scenario (empty: skip)")
	nosync := fs.String("nosync", "", "base URL of a verifierd like -durable's but run with -no-sync, for the nosync scenario (empty: skip)")
	path := fs.String("path", "/verify/schema", "request path of the REST scenarios")
	bodyFile := fs.String("body", "", "file with the JSON request body (default: the SPEC §10 invoice, passing)")
	cs := fs.String("c", "8,32", fmt.Sprintf("concurrent connections, a comma-separated list, each 1..%d", maxConcurrency))
	d := fs.Duration("d", 5*time.Second, fmt.Sprintf("measured duration per phase, at most %s", maxDuration))
	warmup := fs.Duration("warmup", time.Second, "unmeasured warm-up per phase")
	rounds := fs.Int("rounds", 5, fmt.Sprintf("alternating slices each phase of a compared pair (free and baseline, mcp and mcp-baseline, durable and nosync) is cut into, 1..%d (fewer when a slice of -d would be under %s)", maxRounds, minSlice))
	idle := fs.Duration("idle", time.Second, "how long to read the processes' CPU without load before the scenarios (0: skip)")
	mode := fs.String("allowance-mode", "", "the gateway's free-allowance mode, printed with the results (scripts/load.sh reads it from Caddy's admin API)")
	solanaChain := fs.String("solana-chain", "", "the local Solana chain's wallet file (make run writes $data/solana-chain.json), for paid-solana (empty: skip it)")
	scen := fs.String("scenarios", strings.Join(allScenarios, ","), "scenarios to run, comma-separated")
	var procs []proc
	fs.Func("pid", "name=PID of a process to account CPU time to (repeatable)", func(v string) error {
		name, p, ok := strings.Cut(v, "=")
		pid, err := strconv.Atoi(p)
		if !ok || name == "" || err != nil || pid <= 0 {
			return errors.New("want name=PID")
		}
		procs = append(procs, proc{name: name, pid: pid})
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := config{path: *path, body: invoice, duration: *d, warmup: *warmup, rounds: *rounds, idle: *idle, procs: procs, allowanceMode: *mode, solanaChain: *solanaChain}
	for _, f := range strings.Split(*cs, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || c < 1 || c > maxConcurrency {
			return config{}, fmt.Errorf("-c must be a list of numbers between 1 and %d", maxConcurrency)
		}
		cfg.concurrency = append(cfg.concurrency, c)
	}
	if cfg.duration <= 0 || cfg.duration > maxDuration {
		return config{}, fmt.Errorf("-d must be positive and at most %s", maxDuration)
	}
	if cfg.rounds < 1 || cfg.rounds > maxRounds {
		return config{}, fmt.Errorf("-rounds must be between 1 and %d", maxRounds)
	}
	// A slice is at least minSlice: a short -d gets fewer of them.
	cfg.rounds = max(1, min(cfg.rounds, int(cfg.duration/minSlice)))
	if cfg.warmup < 0 || cfg.warmup > maxDuration {
		return config{}, fmt.Errorf("-warmup must be between 0 and %s", maxDuration)
	}
	if cfg.idle < 0 || cfg.idle > maxDuration {
		return config{}, fmt.Errorf("-idle must be between 0 and %s", maxDuration)
	}
	if !strings.HasPrefix(cfg.path, "/") {
		return config{}, errors.New("-path must start with /")
	}
	if *bodyFile != "" {
		b, err := readBounded(*bodyFile, maxBodyBytes)
		if err != nil {
			return config{}, fmt.Errorf("reading -body: %w", err)
		}
		cfg.body = b
	}
	for _, t := range []struct {
		flag string
		raw  string
		dst  **url.URL
	}{{"gateway", *gateway, &cfg.gateway}, {"baseline", *baseline, &cfg.baseline}, {"direct", *direct, &cfg.direct}, {"durable", *durable, &cfg.durable}, {"nosync", *nosync, &cfg.nosync}} {
		if t.raw == "" {
			continue
		}
		u, err := loopbackURL(t.raw)
		if err != nil {
			return config{}, fmt.Errorf("-%s: %w", t.flag, err)
		}
		*t.dst = u
	}
	for _, s := range strings.Split(*scen, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allScenarios, s) {
			return config{}, fmt.Errorf("-scenarios: unknown scenario %q (known: %s)", s, strings.Join(allScenarios, ", "))
		}
		if cfg.targetOf(s) != nil {
			cfg.scenarios = append(cfg.scenarios, s)
		}
	}
	if len(cfg.scenarios) == 0 {
		return config{}, errors.New("no target: set -gateway, -baseline and/or -direct for the chosen scenarios")
	}
	return cfg, nil
}

// targetOf is the base URL a scenario talks to, nil when it is not set.
func (cfg config) targetOf(scenario string) *url.URL {
	switch scenario {
	case "baseline", "mcp-baseline":
		return cfg.baseline
	case "direct":
		return cfg.direct
	case "durable":
		return cfg.durable
	case "nosync":
		return cfg.nosync
	default:
		return cfg.gateway
	}
}

func readBounded(name string, limit int64) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return b, nil
}

// loopbackURL accepts only http URLs whose host is localhost or a loopback
// IP literal, so the tool cannot be pointed at someone else's service.
func loopbackURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" {
		return nil, errors.New("only http:// URLs are supported (loopback only)")
	}
	host := u.Hostname()
	if host == "localhost" {
		return u, nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return nil, errors.New("the host must be localhost or a loopback address (127.0.0.0/8, ::1)")
	}
	return u, nil
}

func run(args []string, stdout io.Writer) error {
	cfg, err := parseFlags(args, os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	fmt.Fprintf(stdout, "POST %s, %d bytes; %s per phase after %s warm-up (a compared pair's phases alternate in %d slices); connections %v\n",
		cfg.path, len(cfg.body), cfg.duration, cfg.warmup, cfg.rounds, cfg.concurrency)
	if cfg.allowanceMode != "" {
		fmt.Fprintf(stdout, "gateway free allowance: %s\n", cfg.allowanceMode)
	}
	var results []stats
	if len(cfg.procs) > 0 && cfg.idle > 0 {
		results = append(results, idleCPU(ctx, cfg.procs, cfg.idle))
	}
	done := map[string]bool{}
	for _, s := range cfg.scenarios {
		if done[s] {
			continue
		}
		group, rounds := []string{s}, 1
		if p := partner(s); p != "" && slices.Contains(cfg.scenarios, p) {
			group, rounds = append(group, p), cfg.rounds
		}
		for _, g := range group {
			done[g] = true
		}
		for _, c := range cfg.concurrency {
			sts, err := measureRounds(ctx, cfg, group, c, rounds)
			var skip skipped
			if errors.As(err, &skip) {
				fmt.Fprintf(stdout, "%s: skipped: %s\n", s, skip.why)
				break
			}
			if err != nil {
				return err
			}
			results = append(results, sts...)
		}
	}
	report(stdout, results, cfg.procs)
	return nil
}

// pairs are the scenarios the report compares: a gateway path and its
// baseline, the synced history and the unsynced one.
var pairs = [][2]string{{"free", "baseline"}, {"mcp", "mcp-baseline"}, {"durable", "nosync"}}

// partner is the scenario s is compared with ("" when none).
func partner(s string) string {
	for _, p := range pairs {
		switch s {
		case p[0]:
			return p[1]
		case p[1]:
			return p[0]
		}
	}
	return ""
}

// stats is what one measured phase produced.
type stats struct {
	name        string
	concurrency int
	requests    int
	errors      int
	elapsed     time.Duration
	lat         []time.Duration // successful requests only, sorted
	firstErr    string
	cpu         map[string]time.Duration // process name → CPU time during the phase
	// self is the load generator's own CPU time during the phase: it
	// shares the cores with the stack, so what it spends per request
	// is what the stack could not.
	self time.Duration
}

func (s stats) ok() int { return s.requests - s.errors }

// add counts phase p, one slice of s's phase, in s (its latencies
// unsorted: the caller sorts once all are in).
func (s *stats) add(p stats) {
	s.requests += p.requests
	s.errors += p.errors
	s.elapsed += p.elapsed
	s.lat = append(s.lat, p.lat...)
	if s.firstErr == "" {
		s.firstErr = p.firstErr
	}
}

func (s stats) rate() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.ok()) / s.elapsed.Seconds()
}

// percentile returns the p-th percentile (0 < p ≤ 100) of sorted samples by
// the nearest-rank method; 0 when there are none.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(p/100*float64(len(sorted))+0.999999999) - 1
	rank = max(0, min(rank, len(sorted)-1))
	return sorted[rank]
}

// workload is one scenario: next builds the next request of a phase, check
// judges its answer.
type workload struct {
	next  func(ctx context.Context) (request, error)
	check func(status int, body []byte) error
	// paid: its requests carry a payment, so a 402 is a refused payment,
	// not a used-up free allowance.
	paid bool
}

// request is one POST of a workload: its URL, body and extra headers
// (name, value pairs); Content-Type is application/json unless the body
// is nil (the discovery probe).
type request struct {
	url    string
	body   []byte
	header []string
}

func post(endpoint string, body []byte, header ...string) request {
	return request{url: endpoint, body: body, header: header}
}

// client sends a phase's requests. It is fasthttp's, not net/http's: the
// load generator shares the machine's cores with the stack it measures,
// and net/http's client spent about 200 µs of CPU per request here
// (a goroutine hand-off each way, header maps, a fresh body reader),
// as much as the gateway itself, so it held every scenario's rate down.
// fasthttp reuses its request, response and buffers, as wrk, the
// reference HTTP load tool, does in C.
type client struct{ fc *fasthttp.Client }

// maxHeaderBytes bounds an answer's header block.
const maxHeaderBytes = 64 << 10

// requestTimeout bounds one request, whatever the phase's deadline.
const requestTimeout = 30 * time.Second

// newClient is one phase's HTTP client: keep-alive connections, one per
// worker, never through a proxy (fasthttp has none).
func newClient(concurrency int) *client {
	return &client{fc: &fasthttp.Client{
		MaxConnsPerHost:     concurrency,
		MaxResponseBodySize: maxAnswerBytes,
		// A 402's PAYMENT-REQUIRED header alone is several KiB (the
		// offers and the route's schema); fasthttp's default is 4 KiB.
		ReadBufferSize:           maxHeaderBytes,
		ReadTimeout:              requestTimeout,
		WriteTimeout:             requestTimeout,
		NoDefaultUserAgentHeader: true,
	}}
}

func (c *client) close() { c.fc.CloseIdleConnections() }

// send does one request, within requestTimeout, and reads the whole answer
// (at most maxAnswerBytes), so the connection is reused. The answer's body
// is a copy the caller keeps; want names a response header to return.
func (c *client) send(ctx context.Context, r request, want string) (status int, body []byte, header string, err error) {
	if err := ctx.Err(); err != nil {
		return 0, nil, "", err
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(r.url)
	req.Header.SetMethod(http.MethodPost)
	if r.body != nil {
		req.Header.SetContentType("application/json")
	}
	for i := 0; i+1 < len(r.header); i += 2 {
		req.Header.Set(r.header[i], r.header[i+1])
	}
	req.SetBodyRaw(r.body)
	if err := c.fc.DoTimeout(req, resp, requestTimeout); err != nil {
		return 0, nil, "", err
	}
	if want != "" {
		header = string(resp.Header.Peek(want))
	}
	return resp.StatusCode(), append([]byte(nil), resp.Body()...), header, nil
}

// measureRounds measures scenarios at c connections: it prepares each,
// checks that its first request succeeds and warms it up, then runs c
// closed-loop workers on each in turn for cfg.duration/rounds, rounds
// times, with the processes' CPU time read before and after each slice.
// Each scenario's slices add up to one phase of cfg.duration.
func measureRounds(ctx context.Context, cfg config, scenarios []string, c, rounds int) ([]stats, error) {
	type runner struct {
		client *client
		w      workload
	}
	runners := make([]runner, 0, len(scenarios))
	defer func() {
		for _, r := range runners {
			r.client.close()
		}
	}()
	out := make([]stats, len(scenarios))
	for i, s := range scenarios {
		client := newClient(c)
		runners = append(runners, runner{client: client})
		w, err := prepare(ctx, client, cfg, s)
		if err != nil {
			return nil, fmt.Errorf("%s at %d connections: %w", s, c, err)
		}
		if err := once(ctx, client, w); err != nil {
			return nil, fmt.Errorf("%s at %d connections: first request: %w", s, c, err)
		}
		runners[i].w = w
		out[i] = stats{name: s, concurrency: c, cpu: map[string]time.Duration{}}
	}
	if cfg.warmup > 0 {
		for _, r := range runners {
			phase(ctx, r.client, r.w, c, cfg.warmup)
		}
	}
	slice := cfg.duration / time.Duration(rounds)
	for range rounds {
		for i, r := range runners {
			before, selfBefore := cpuTimes(cfg.procs), selfCPU()
			st := phase(ctx, r.client, r.w, c, slice)
			for name, t := range cpuTimes(cfg.procs).since(before) {
				out[i].cpu[name] += t
			}
			out[i].self += selfCPU() - selfBefore
			out[i].add(st)
		}
	}
	for i := range out {
		slices.Sort(out[i].lat)
	}
	return out, ctx.Err()
}

// idleName names the phase without requests in the results.
const idleName = "idle"

// idleCPU reads the processes' CPU over d without sending anything: what
// they spend with no requests (timers, the devnet sealing empty blocks,
// background flushes), which a phase of few requests would otherwise count
// as the cost of its requests.
func idleCPU(ctx context.Context, procs []proc, d time.Duration) stats {
	before := cpuTimes(procs)
	start := time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	return stats{name: idleName, elapsed: time.Since(start), cpu: cpuTimes(procs).since(before)}
}

func once(ctx context.Context, client *client, w workload) error {
	req, err := w.next(ctx)
	if err != nil {
		return err
	}
	status, body, _, err := client.send(ctx, req, "")
	if err != nil {
		return err
	}
	if status == http.StatusPaymentRequired && w.paid {
		return fmt.Errorf("answered 402: the payment was refused: %.300s", body)
	}
	if status == http.StatusPaymentRequired {
		return errors.New("answered 402: the free allowance is used up; load requests are unpaid, so run the stack with a large one (AOV_FREE_PER_DAY=1000000000 make run)")
	}
	if err := w.check(status, body); err != nil {
		if len(bytes.TrimSpace(body)) == 0 {
			return fmt.Errorf("%w: is the stack running (make run)?", err)
		}
		// The stack answered: what it said (the contract's error code and
		// message) is the diagnosis, not a guess that nothing runs.
		return fmt.Errorf("%w; the answer: %.300s", err, bytes.TrimSpace(body))
	}
	return nil
}

// phase runs the closed loop: each worker sends the next request as soon as
// the previous answer is read, until d has passed. A request under way then
// is waited for (each is bounded by requestTimeout) and counted, not cut
// off: a gateway sees a request its client abandons as a 499, releases its
// charge and counts it against the client's rate limit (an abandoned call
// took work and paid nothing), so cutting off the calls in flight at every
// phase's end would make the later phases of one run answer 429.
func phase(ctx context.Context, client *client, w workload, workers int, d time.Duration) stats {
	end := time.Now().Add(d)
	perWorker := maxSamples / workers
	var (
		mu  sync.Mutex
		all stats
		wg  sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Go(func() {
			var local stats
			local.lat = make([]time.Duration, 0, 1024)
			fail := func(err error) {
				local.errors++
				if local.firstErr == "" {
					local.firstErr = err.Error()
				}
			}
			for ctx.Err() == nil && time.Now().Before(end) {
				req, err := w.next(ctx)
				if err != nil {
					local.requests++
					fail(err)
					continue
				}
				t0 := time.Now()
				status, body, _, err := client.send(ctx, req, "")
				if ctx.Err() != nil {
					break // the run was stopped: not a sample
				}
				local.requests++
				if err == nil {
					err = w.check(status, body)
				}
				switch {
				case err != nil:
					fail(err)
				case len(local.lat) < perWorker:
					local.lat = append(local.lat, time.Since(t0))
				}
			}
			mu.Lock()
			all.requests += local.requests
			all.errors += local.errors
			all.lat = append(all.lat, local.lat...)
			if all.firstErr == "" {
				all.firstErr = local.firstErr
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	all.elapsed = time.Since(start)
	slices.Sort(all.lat)
	return all
}

// maxAnswerBytes bounds what is kept of an answer for its check.
const maxAnswerBytes = 1 << 20

// paidWorkload posts body to endpoint with a fresh payment from pay in
// PAYMENT-SIGNATURE on every request: the paid scenarios of either chain.
func paidWorkload(endpoint string, body []byte, pay func(context.Context) (x402.PaymentPayload, error)) workload {
	return workload{
		next: func(ctx context.Context) (request, error) {
			p, err := pay(ctx)
			if err != nil {
				return request{}, err
			}
			sig, err := x402.EncodeHeader(p)
			if err != nil {
				return request{}, err
			}
			return post(endpoint, body, x402.HeaderPaymentSignature, sig), nil
		},
		check: want200,
		paid:  true,
	}
}

// want200 accepts a 200 answer.
func want200(status int, _ []byte) error {
	if status != http.StatusOK {
		return fmt.Errorf("status %d", status)
	}
	return nil
}

// prepare builds a scenario's workload; the paid ones first fetch the
// gateway's live payment requirements from its discovery probe.
func prepare(ctx context.Context, client *client, cfg config, scenario string) (workload, error) {
	base := cfg.targetOf(scenario)
	switch scenario {
	case "free", "baseline", "direct", "durable", "nosync":
		endpoint := base.JoinPath(cfg.path).String()
		return workload{
			next:  func(context.Context) (request, error) { return post(endpoint, cfg.body), nil },
			check: want200,
		}, nil
	case "mcp", "mcp-baseline":
		endpoint := base.JoinPath("/mcp").String()
		call := fmt.Appendf(nil, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"verify_schema","arguments":%s}}`, bytes.TrimSpace(cfg.body))
		return workload{
			next: func(context.Context) (request, error) {
				return post(endpoint, call, "Accept", "application/json, text/event-stream"), nil
			},
			check: func(status int, body []byte) error {
				if status != http.StatusOK {
					return fmt.Errorf("status %d", status)
				}
				if bytes.Contains(body, []byte(`"isError":true`)) || !bytes.Contains(body, []byte(`"attestation"`)) {
					return errors.New("the tool answered an error or no receipt")
				}
				return nil
			},
		}, nil
	case "paid-solana":
		return prepareSolana(ctx, client, cfg, base.JoinPath(cfg.path).String())
	}
	required, err := paymentRequired(ctx, client, base.JoinPath(cfg.path).String())
	if err != nil {
		return workload{}, err
	}
	offer := required.Accepts[0]
	// Payers rotate over the devnet's funded accounts 1..8, so no single
	// balance runs low; every payment has a fresh random nonce.
	var n atomic.Int64
	pay := func() (x402.PaymentPayload, error) {
		key := evmfacilitator.DevKey(1 + int(n.Add(1)%8))
		return x402.SignExactEVM(key, offer, &required.Resource, time.Now())
	}
	if scenario == "paid" {
		return paidWorkload(base.JoinPath(cfg.path).String(), cfg.body, func(context.Context) (x402.PaymentPayload, error) { return pay() }), nil
	}
	// facilitator: one signed payment, verified again and again (verify
	// never consumes it).
	p, err := pay()
	if err != nil {
		return workload{}, err
	}
	body, err := json.Marshal(map[string]any{"x402Version": 2, "paymentPayload": p, "paymentRequirements": offer})
	if err != nil {
		return workload{}, err
	}
	endpoint := base.JoinPath("/facilitator/verify").String()
	return workload{
		next: func(context.Context) (request, error) { return post(endpoint, body), nil },
		check: func(status int, b []byte) error {
			if status != http.StatusOK || !bytes.Contains(b, []byte(`"isValid":true`)) {
				return fmt.Errorf("status %d, not a valid verification", status)
			}
			return nil
		},
	}, nil
}

// paymentRequired sends the discovery probe (a POST with no body) and
// decodes the live PAYMENT-REQUIRED header of its 402.
func paymentRequired(ctx context.Context, client *client, endpoint string) (x402.PaymentRequired, error) {
	var required x402.PaymentRequired
	status, _, header, err := client.send(ctx, post(endpoint, nil), x402.HeaderPaymentRequired)
	if err != nil {
		return required, err
	}
	if status != http.StatusPaymentRequired {
		return required, fmt.Errorf("the discovery probe answered %d, want 402 with PAYMENT-REQUIRED", status)
	}
	if err := x402.DecodeHeader(header, &required); err != nil {
		return required, fmt.Errorf("PAYMENT-REQUIRED: %w", err)
	}
	if len(required.Accepts) == 0 {
		return required, errors.New("PAYMENT-REQUIRED offers no way to pay")
	}
	return required, nil
}

// cpuSnapshot is what each process's threads had run at one instant:
// process name → thread id → CPU time (user and system). It is read from
// /proc/<pid>/task/<tid>/schedstat, in nanoseconds: /proc/<pid>/stat
// counts in 10 ms ticks, which left a second's reading without load (what
// the paid figures are corrected by) off by up to 10 ms, as much as a
// thousand free calls cost. Where the kernel keeps no schedstat, the
// process's stat (its ticks) stands in as thread 0.
type cpuSnapshot map[string]map[int]time.Duration

// cpuTimes takes a cpuSnapshot of procs; a process that cannot be read is
// left out (the report then shows no figure for it).
func cpuTimes(procs []proc) cpuSnapshot {
	out := cpuSnapshot{}
	for _, p := range procs {
		if threads := threadTimes(p.pid); len(threads) > 0 {
			out[p.name] = threads
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
		if err != nil {
			continue
		}
		if t, ok := parseStat(b); ok {
			out[p.name] = map[int]time.Duration{0: t}
		}
	}
	return out
}

// threadTimes reads the schedstat of each of pid's threads (nil when there
// is none to read).
func threadTimes(pid int) map[int]time.Duration {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make(map[int]time.Duration, len(tasks))
	for _, task := range tasks {
		tid, err := strconv.Atoi(task.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(dir + "/" + task.Name() + "/schedstat")
		if err != nil {
			continue // the thread ended, or no schedstat
		}
		if t, ok := parseSchedstat(b); ok {
			out[tid] = t
		}
	}
	return out
}

// parseSchedstat returns the first field of a schedstat line: the
// nanoseconds the thread has run on a CPU.
func parseSchedstat(b []byte) (time.Duration, bool) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || ns < 0 {
		return 0, false
	}
	return time.Duration(ns), true
}

// since is the CPU time each process spent from earlier to s: over its
// threads, each one's time now less its time then. A thread started in
// between counts whole; one that ended in between loses what it ran after
// earlier, which no reading of a live process can give.
func (s cpuSnapshot) since(earlier cpuSnapshot) map[string]time.Duration {
	out := map[string]time.Duration{}
	for name, threads := range s {
		before, ok := earlier[name]
		if !ok {
			continue
		}
		var d time.Duration
		for tid, t := range threads {
			d += t - before[tid]
		}
		out[name] = d
	}
	return out
}

// clockTick is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every
// Linux architecture's user ABI.
const clockTick = 10 * time.Millisecond

// parseStat returns utime+stime (fields 14 and 15) of a /proc/<pid>/stat
// line. The command name (field 2) may hold spaces and parentheses, so the
// fields are counted from its last ')'.
func parseStat(b []byte) (time.Duration, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+s) * clockTick, true
}

// selfCPU is the load generator's own CPU time (user + system).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// targetRate is the throughput bar for the gateway: 2.5 × the ≈1,080 req/s of
// a Python peer built the way the original service is, on a 2-core machine.
const targetRate = 2.5 * 1080

func report(w io.Writer, results []stats, procs []proc) {
	reportCores(w, results, procs, runtime.NumCPU())
}

// reportCores is report for a machine of cores CPUs. Besides each
// process's CPU per request it prints their sum ("stack": the load
// generator excluded) and the rate that sum allows on all cores, which is
// what a run on a machine shared with other work still tells reliably.
func reportCores(w io.Writer, results []stats, procs []proc, cores int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	hdr := "scenario\tconns\trequests\terrors\treq/s\tp50\tp90\tp99\t"
	for _, p := range procs {
		hdr += p.name + " CPU/req\t"
	}
	if len(procs) > 0 {
		hdr += fmt.Sprintf("stack CPU/req\treq/s on %d cores at that CPU\t", cores)
	}
	hdr += "load generator CPU/req\t"
	fmt.Fprintln(tw, hdr)
	for _, s := range results {
		if s.name == idleName {
			continue
		}
		line := fmt.Sprintf("%s\t%d\t%d\t%d\t%.0f\t%s\t%s\t%s\t", s.name, s.concurrency, s.requests, s.errors, s.rate(),
			ms(percentile(s.lat, 50)), ms(percentile(s.lat, 90)), ms(percentile(s.lat, 99)))
		var sum time.Duration
		for _, p := range procs {
			per, ok := perRequest(s, p.name)
			if !ok {
				line += "-\t"
				continue
			}
			sum += s.cpu[p.name]
			line += fmt.Sprintf("%.0fµs\t", per)
		}
		if len(procs) > 0 {
			if sum > 0 && s.ok() > 0 {
				per := float64(sum.Microseconds()) / float64(s.ok())
				line += fmt.Sprintf("%.0fµs\t%.0f\t", per, float64(cores)*1e6/per)
			} else {
				line += "-\t-\t"
			}
		}
		if s.ok() > 0 {
			line += fmt.Sprintf("%.0fµs\t", float64(s.self.Microseconds())/float64(s.ok()))
		} else {
			line += "-\t"
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
	if idle, ok := idleOf(results); ok {
		line := fmt.Sprintf("with no load (%.1fs before the scenarios), CPU per second:", idle.elapsed.Seconds())
		for _, p := range procs {
			if t, ok := idle.cpu[p.name]; ok {
				line += fmt.Sprintf(" %s %.1fms", p.name, msf(t)/idle.elapsed.Seconds())
			}
		}
		fmt.Fprintln(w, line)
	}
	for _, s := range results {
		if s.errors > 0 {
			fmt.Fprintf(w, "%s at %d: %d of %d requests failed; first: %s\n", s.name, s.concurrency, s.errors, s.requests, s.firstErr)
		}
	}
	find := func(name string, c int) (stats, bool) { return phaseOf(results, name, c) }
	var cs []int
	for _, s := range results {
		if !slices.Contains(cs, s.concurrency) {
			cs = append(cs, s.concurrency)
		}
	}
	for _, c := range cs {
		base, hasBase := find("baseline", c)
		if s, ok := find("free", c); ok {
			line := fmt.Sprintf("free at %d: %.0f req/s", c, s.rate())
			if hasBase {
				line += fmt.Sprintf(", %.2fx the plain reverse_proxy (target >= 0.9x)", s.rate()/base.rate())
			}
			line += fmt.Sprintf(", %.2fx of 2.5 x 1,080 req/s", s.rate()/targetRate)
			fmt.Fprintln(w, line)
		}
		if line, ok := mcpLine(results, c); ok {
			fmt.Fprintln(w, line)
		}
		if d, ok := find("direct", c); ok && hasBase {
			fmt.Fprintf(w, "baseline at %d: %.2fx direct to verifierd\n", c, base.rate()/d.rate())
		}
		if d, ok := find("durable", c); ok {
			if n, ok := find("nosync", c); ok {
				fmt.Fprintf(w, "durable at %d: %.0f req/s with every history write synced, %.2fx the %.0f req/s of the same verifierd with -no-sync (target >= 0.7x)\n", c, d.rate(), d.rate()/n.rate(), n.rate())
			}
		}
		if line, ok := transportLine(results, c); ok {
			fmt.Fprintln(w, line)
		}
		if line, ok := paidLine(results, c); ok {
			fmt.Fprintln(w, line)
		}
		if line, ok := paidSolanaLine(results, c); ok {
			fmt.Fprintln(w, line)
		}
	}
}

// mcpLine compares the gateway's MCP path with the plain reverse_proxy
// carrying the same MCP call (mcp-baseline): both pay verifierd's MCP
// transport, so the ratio is the gate's cost alone, by rate and by Caddy's
// CPU per call. Without mcp-baseline it falls back to the REST baseline and
// says that the ratio then includes the transport.
func mcpLine(results []stats, c int) (string, bool) {
	s, ok := phaseOf(results, "mcp", c)
	if !ok {
		return "", false
	}
	line := fmt.Sprintf("mcp at %d: %.0f req/s", c, s.rate())
	mb, proxied := phaseOf(results, "mcp-baseline", c)
	if proxied {
		line += fmt.Sprintf(", %.2fx the plain reverse_proxy carrying the same MCP call (target >= 0.9x)", s.rate()/mb.rate())
	} else if base, ok := phaseOf(results, "baseline", c); ok {
		line += fmt.Sprintf(", %.2fx the plain reverse_proxy carrying the REST call (the MCP transport's own cost included; run mcp-baseline for the gate's alone)", s.rate()/base.rate())
	}
	line += fmt.Sprintf(", %.2fx of 2.5 x 1,080 req/s", s.rate()/targetRate)
	if proxied {
		gc, ok1 := perRequest(s, "caddy")
		bc, ok2 := perRequest(mb, "baseline")
		if ok1 && ok2 && gc > 0 {
			line += fmt.Sprintf("; gateway caddy CPU/req %.0fµs against the plain reverse_proxy's %.0fµs for the same call (%.2fx)", gc, bc, bc/gc)
		}
	}
	return line, true
}

// transportLine is what MCP itself costs, gate aside: the same verification
// as an MCP tools/call and as a REST request, both through the plain
// reverse_proxy, by rate and by verifierd's CPU per call (the difference is
// mostly the MCP SDK's work in verifierd).
func transportLine(results []stats, c int) (string, bool) {
	mb, ok1 := phaseOf(results, "mcp-baseline", c)
	base, ok2 := phaseOf(results, "baseline", c)
	if !ok1 || !ok2 {
		return "", false
	}
	line := fmt.Sprintf("mcp-baseline at %d: %.0f req/s, %.2fx the REST baseline: the MCP transport's own cost", c, mb.rate(), mb.rate()/base.rate())
	mv, ok1 := perRequest(mb, "verifierd")
	rv, ok2 := perRequest(base, "verifierd")
	if ok1 && ok2 {
		line += fmt.Sprintf(" (verifierd CPU/req %.0fµs over MCP against %.0fµs over REST, +%.0fµs)", mv, rv, mv-rv)
	}
	return line, true
}

// paidLine says what a paid call costs the gateway at c connections. Its
// rate is the devnet's, not the gateway's: each paid call waits for the
// block of its settlement (one a second), so it is not compared with the
// plain reverse_proxy's rate; its CPU per call is. A paid phase has so few
// calls that what a process spends with no load (the idle phase) is a large
// part of its CPU per call, so the figure beyond that is shown too, and it
// is the one compared.
//
// With the facilitator in its own process (a "facilitator" CPU column: make
// load's own stack, AOV_FACILITATOR=remote), Caddy's CPU per paid call is
// the gateway's alone (the gate, the proxy and its side of the two
// facilitator API calls), set beside the baseline Caddy's CPU per call of
// the same request unpaid, and the facilitator's verify and settle are
// shown apart, measured. With the facilitator inside Caddy only its payment
// check can be shown apart (the facilitator scenario); its settlement and
// the in-process devnet stay in Caddy's figure.
func paidLine(results []stats, c int) (string, bool) {
	find := func(name string) (stats, bool) { return phaseOf(results, name, c) }
	paid, ok := find("paid")
	if !ok {
		return "", false
	}
	pc, ok := perRequest(paid, "caddy")
	if !ok {
		return "", false
	}
	idle, hasIdle := idleOf(results)
	// cost is a process's CPU per paid call, and beyond its idle CPU.
	cost := func(name string, per float64) (string, float64) {
		if !hasIdle {
			return fmt.Sprintf("%.0fµs", per), per
		}
		t, ok := idle.cpu[name]
		if !ok {
			return fmt.Sprintf("%.0fµs", per), per
		}
		share := float64(t.Microseconds()) / idle.elapsed.Seconds() * paid.elapsed.Seconds() / float64(paid.ok())
		beyond := max(per-share, 0)
		return fmt.Sprintf("%.0fµs (%.0fµs beyond its CPU with no load)", per, beyond), beyond
	}
	head := fmt.Sprintf("paid at %d: %.0f req/s, bound by the devnet's blocks (one a second); ", c, paid.rate())
	if fc, ok := perRequest(paid, "facilitator"); ok {
		gw, gwCost := cost("caddy", pc)
		fac, _ := cost("facilitator", fc)
		line := head + fmt.Sprintf("gateway caddy CPU/req %s; the facilitator in its own process, for its verify and settle: %s", gw, fac)
		if base, ok := find("baseline"); ok {
			if bc, ok := perRequest(base, "baseline"); ok && gwCost > 0 {
				line += fmt.Sprintf("; the plain reverse_proxy's caddy %.0fµs per call: %.2fx (target >= 0.9x)", bc, bc/gwCost)
			}
		}
		return line, true
	}
	if fac, ok := find("facilitator"); ok {
		if fc, ok := perRequest(fac, "caddy"); ok {
			return head + fmt.Sprintf("caddy CPU/req %.0fµs, of which the facilitator's own payment check ≈ %.0fµs (the facilitator scenario); the gate, proxy, settlement and the in-process devnet the rest (AOV_FACILITATOR=remote measures the gateway alone)", pc, fc), true
		}
	}
	return "", false
}

// phaseOf is the phase of scenario name at c connections, when it served
// any request.
func phaseOf(results []stats, name string, c int) (stats, bool) {
	for _, s := range results {
		if s.name == name && s.concurrency == c && s.rate() > 0 {
			return s, true
		}
	}
	return stats{}, false
}

// idleOf is the phase without load, when there was one.
func idleOf(results []stats) (stats, bool) {
	for _, s := range results {
		if s.name == idleName && s.elapsed > 0 {
			return s, true
		}
	}
	return stats{}, false
}

// perRequest is a process's CPU time per successful request of a phase.
func perRequest(s stats, proc string) (float64, bool) {
	t, ok := s.cpu[proc]
	if !ok || s.ok() == 0 {
		return 0, false
	}
	return float64(t.Microseconds()) / float64(s.ok()), true
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func ms(d time.Duration) string   { return fmt.Sprintf("%.2fms", msf(d)) }
