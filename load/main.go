// Command load measures the whole stack under a bounded, closed-loop load:
// requests per second and latency percentiles for one verification request
// (by default the SPEC §10 invoice, corrected so it passes), sent through
// Caddy and directly to verifierd in the same run, and the ratio of the two,
// which is what the gateway costs.
//
//	go run ./load                         # against `make run` on the default ports
//	go run ./load -c 16 -d 20s
//	go run ./load -via-caddy http://127.0.0.1:8080 -direct ""   # Caddy only
//
// It is a measuring tool for one's own machine, not a stress or attack tool:
// it talks only to loopback addresses, and concurrency and duration are
// capped. It is not a benchmark harness either: numbers depend on the host,
// and nothing here fails on them.
package main

import (
	"bytes"
	"context"
	_ "embed"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
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
	// maxSamples bounds the memory the latency samples take per target.
	maxSamples = 20_000_000
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "load:", err)
		os.Exit(2)
	}
}

// config is one run's settings, checked by parseFlags.
type config struct {
	targets     []target
	path        string
	body        []byte
	concurrency int
	duration    time.Duration
	warmup      time.Duration
}

// target is a named base URL requests go to.
type target struct {
	name string
	base *url.URL
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(stderr)
	viaCaddy := fs.String("via-caddy", "http://127.0.0.1:8080", "base URL of Caddy (empty: skip)")
	direct := fs.String("direct", "http://127.0.0.1:8081", "base URL of verifierd itself (empty: skip)")
	path := fs.String("path", "/verify/schema", "request path")
	bodyFile := fs.String("body", "", "file with the JSON request body (default: the SPEC §10 invoice, passing)")
	c := fs.Int("c", 8, fmt.Sprintf("concurrent connections, 1..%d", maxConcurrency))
	d := fs.Duration("d", 10*time.Second, fmt.Sprintf("measured duration per target, at most %s", maxDuration))
	warmup := fs.Duration("warmup", time.Second, "unmeasured warm-up per target")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	cfg := config{path: *path, body: invoice, concurrency: *c, duration: *d, warmup: *warmup}
	if cfg.concurrency < 1 || cfg.concurrency > maxConcurrency {
		return config{}, fmt.Errorf("-c must be between 1 and %d", maxConcurrency)
	}
	if cfg.duration <= 0 || cfg.duration > maxDuration {
		return config{}, fmt.Errorf("-d must be positive and at most %s", maxDuration)
	}
	if cfg.warmup < 0 || cfg.warmup > maxDuration {
		return config{}, fmt.Errorf("-warmup must be between 0 and %s", maxDuration)
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
	for _, t := range []struct{ name, raw string }{{"caddy", *viaCaddy}, {"direct", *direct}} {
		if t.raw == "" {
			continue
		}
		u, err := loopbackURL(t.raw)
		if err != nil {
			return config{}, fmt.Errorf("-%s: %w", map[string]string{"caddy": "via-caddy", "direct": "direct"}[t.name], err)
		}
		cfg.targets = append(cfg.targets, target{name: t.name, base: u})
	}
	if len(cfg.targets) == 0 {
		return config{}, errors.New("no target: set -via-caddy and/or -direct")
	}
	return cfg, nil
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

	fmt.Fprintf(stdout, "POST %s, %d bytes, %d connections, %s per target (after %s warm-up)\n",
		cfg.path, len(cfg.body), cfg.concurrency, cfg.duration, cfg.warmup)
	var results []stats
	for _, t := range cfg.targets {
		st, err := measure(ctx, cfg, t)
		if err != nil {
			return fmt.Errorf("%s: %w", t.name, err)
		}
		results = append(results, st)
	}
	report(stdout, results)
	return nil
}

// stats is what one target's measured phase produced.
type stats struct {
	name     string
	requests int
	errors   int
	elapsed  time.Duration
	lat      []time.Duration // successful requests only, sorted
	firstErr string
}

func (s stats) rate() float64 {
	if s.elapsed <= 0 {
		return 0
	}
	return float64(s.requests-s.errors) / s.elapsed.Seconds()
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

// measure checks the target answers the request with 200, warms it up,
// then runs cfg.concurrency closed-loop workers for cfg.duration.
func measure(ctx context.Context, cfg config, t target) (stats, error) {
	client := &http.Client{
		Timeout: 30 * time.Second,
		Transport: &http.Transport{
			Proxy:               nil, // loopback only: never through a proxy
			MaxIdleConns:        cfg.concurrency,
			MaxIdleConnsPerHost: cfg.concurrency,
			DisableCompression:  true,
		},
	}
	defer client.CloseIdleConnections()
	endpoint := t.base.JoinPath(cfg.path).String()

	if status, err := send(ctx, client, endpoint, cfg.body); err != nil {
		return stats{}, fmt.Errorf("first request: %w", err)
	} else if status == http.StatusPaymentRequired {
		return stats{}, errors.New("first request answered 402: the free allowance is used up; load requests are unpaid, so run the stack with a large one (AOV_FREE_PER_DAY=1000000000 make run)")
	} else if status != http.StatusOK {
		return stats{}, fmt.Errorf("first request answered %d, want 200: is the stack running (make run)?", status)
	}
	if cfg.warmup > 0 {
		phase(ctx, client, endpoint, cfg.body, cfg.concurrency, cfg.warmup)
	}
	st := phase(ctx, client, endpoint, cfg.body, cfg.concurrency, cfg.duration)
	st.name = t.name
	return st, ctx.Err()
}

// phase runs the closed loop: each worker sends the next request as soon as
// the previous answer is read.
func phase(ctx context.Context, client *http.Client, endpoint string, body []byte, workers int, d time.Duration) stats {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	perWorker := maxSamples / workers
	var (
		mu  sync.Mutex
		all stats
		wg  sync.WaitGroup
	)
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local stats
			local.lat = make([]time.Duration, 0, 1024)
			for ctx.Err() == nil {
				t0 := time.Now()
				status, err := send(ctx, client, endpoint, body)
				if ctx.Err() != nil {
					break // cut off by the end of the phase: not a sample
				}
				local.requests++
				switch {
				case err != nil:
					local.errors++
					if local.firstErr == "" {
						local.firstErr = err.Error()
					}
				case status != http.StatusOK:
					local.errors++
					if local.firstErr == "" {
						local.firstErr = fmt.Sprintf("status %d", status)
					}
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
		}()
	}
	wg.Wait()
	all.elapsed = time.Since(start)
	slices.Sort(all.lat)
	return all
}

// send posts body and reads the whole answer, so the connection is reused.
func send(ctx context.Context, client *http.Client, endpoint string, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

func report(w io.Writer, results []stats) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\trequests\terrors\treq/s\tp50\tp90\tp99\tmax\t")
	for _, s := range results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t%s\t%s\t%s\t\n", s.name, s.requests, s.errors, s.rate(),
			ms(percentile(s.lat, 50)), ms(percentile(s.lat, 90)), ms(percentile(s.lat, 99)), ms(percentile(s.lat, 100)))
	}
	tw.Flush()
	for _, s := range results {
		if s.errors > 0 {
			fmt.Fprintf(w, "%s: %d of %d requests failed; first: %s\n", s.name, s.errors, s.requests, s.firstErr)
		}
	}
	if len(results) == 2 && results[1].rate() > 0 {
		c, d := results[0], results[1]
		fmt.Fprintf(w, "through Caddy vs direct: %.2fx the throughput; p50 %+.2f ms, p99 %+.2f ms\n",
			c.rate()/d.rate(),
			msf(percentile(c.lat, 50)-percentile(d.lat, 50)),
			msf(percentile(c.lat, 99)-percentile(d.lat, 99)))
	}
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func ms(d time.Duration) string   { return fmt.Sprintf("%.2fms", msf(d)) }
