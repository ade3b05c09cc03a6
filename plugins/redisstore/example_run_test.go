package redisstore

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/apierr"
	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/keystore"
	"github.com/aovhq/aov/signer"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/verifierd/server"
	"github.com/aovhq/aov/verify"
)

// The tests below run examples/multi-instance/Caddyfile itself in this
// process: its routes, gates, wallet_auth and reverse proxies as written,
// on a real Redis primary with a replica under a Sentinel (the example
// asks for wait_replicas 1) and real verifierd handlers sharing one
// history, as the instances behind a load balancer share PostgreSQL. Only
// the example's environment variables are set, and the listener moved to
// a free loopback port without TLS and the admin API turned off.

const exampleToken = "example-gateway-token-0123456789abcdef"

// sentinelRedis starts a primary, a replica linked to it and one Sentinel
// watching it as "aov", and returns the Sentinel's address and the primary
// and replica.
func sentinelRedis(t *testing.T, extra ...string) (sentinel string, primary, replica *servers.Redis) {
	t.Helper()
	ctx := context.Background()
	primary = servers.StartRedis(t, extra...)
	host, port, _ := strings.Cut(primary.Addr, ":")
	replica = servers.StartRedis(t, append([]string{"--replicaof", host, port}, extra...)...)
	rr := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer rr.Close()
	pr := redis.NewClient(&redis.Options{Addr: primary.Addr})
	defer pr.Close()
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(rr.Info(ctx, "replication").Val(), "master_link_status:up") ||
		!strings.Contains(pr.Info(ctx, "replication").Val(), "state=online"); {
		if time.Now().After(deadline) {
			t.Fatal("replica never linked")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A freshly linked replica can take a moment before it acknowledges
	// writes within the example's wait_timeout (100ms): wait until it does.
	for deadline := time.Now().Add(10 * time.Second); ; {
		pr.Set(ctx, "linked", "1", time.Minute)
		if n, _ := pr.Wait(ctx, 1, 100*time.Millisecond).Result(); n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the replica never acknowledged a write")
		}
	}
	s := servers.StartSentinel(t, primary, "aov", 5*time.Second)
	// The Sentinel learns the replica from the primary's INFO (every 10 s
	// at first); the store only needs the primary from it.
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer sc.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := sc.GetMasterAddrByName(ctx, "aov").Result(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Sentinel never named the primary")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return s.Addr, primary, replica
}

// verifierds starts n verifierd handlers on loopback listeners, signing in
// process with one key set and recording in one shared history.
func verifierds(t *testing.T, n int) []*liveVerifierd {
	t.Helper()
	dir := t.TempDir()
	keys, err := keystore.Open(filepath.Join(dir, "keys"), keystore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Generate(); err != nil {
		t.Fatal(err)
	}
	keys.Close()
	sig, err := signer.NewLocal(filepath.Join(dir, "keys"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sig.Close() })
	db, err := store.Open(filepath.Join(dir, "history"), store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var vs []*liveVerifierd
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		h, err := server.New(server.Config{
			Verifier:      verify.New(verify.Config{VerifierVersion: "test"}),
			Signer:        sig,
			History:       db,
			PublicBaseURL: "http://verify.example.com",
			GatewayToken:  exampleToken,
		})
		if err != nil {
			t.Fatal(err)
		}
		v := &liveVerifierd{addr: ln.Addr().String(), srv: &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}}
		go v.srv.Serve(ln)
		t.Cleanup(v.stop)
		vs = append(vs, v)
	}
	return vs
}

type liveVerifierd struct {
	addr string
	srv  *http.Server
}

// stop closes the listener and every connection: what a killed verifierd
// looks like to the gateway (connections refused).
func (v *liveVerifierd) stop() { v.srv.Close() }

// stalledListener is a fault: a listener that accepts connections and
// never answers, as a verifierd or a Redis replica stuck in a deadlock or
// a GC storm, or a machine whose kernel still accepts for a hung process,
// looks to the gateway. It is a fake because a real server cannot be made
// to stall on demand at an address another server announces.
func stalledListener(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never read or answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// runExample loads examples/multi-instance/Caddyfile with env set (on top
// of what every run needs) and returns the gateway's base URL.
func runExample(t *testing.T, sentinel string, upstreams []string, env map[string]string) string {
	t.Helper()
	port := servers.FreePort(t, false)
	dir := t.TempDir()
	t.Setenv("XDG_DATA_HOME", dir)
	t.Setenv("XDG_CONFIG_HOME", dir)
	for k, v := range map[string]string{
		"AOV_SITE":          fmt.Sprintf("127.0.0.1:%d", port),
		"AOV_LB_CIDR":       "127.0.0.1/32",
		"AOV_SENTINELS":     sentinel,
		"AOV_REDIS_MASTER":  "aov",
		"AOV_VERIFIERDS":    strings.Join(upstreams, " "),
		"AOV_PAY_TO":        "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720",
		"AOV_GATEWAY_TOKEN": exampleToken,
	} {
		t.Setenv(k, v)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	b, err := os.ReadFile("../../examples/multi-instance/Caddyfile")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(b, map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["admin"] = map[string]any{"disabled": true, "config": map[string]any{"persist": false}}
	cfg["storage"] = map[string]any{"module": "file_system", "root": dir}
	logFile := filepath.Join(dir, "caddy.log")
	cfg["logging"] = map[string]any{"logs": map[string]any{"default": map[string]any{
		"writer": map[string]any{"output": "file", "filename": logFile}, "level": "DEBUG"}}}
	srvs := cfg["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)
	if len(srvs) != 1 {
		t.Fatalf("the example has %d servers, want 1", len(srvs))
	}
	for _, s := range srvs {
		s := s.(map[string]any)
		s["listen"] = []any{fmt.Sprintf("127.0.0.1:%d", port)}
		s["automatic_https"] = map[string]any{"disable": true}
		delete(s, "tls_connection_policies")
	}
	js, _ := json.Marshal(cfg)
	if err := caddy.Load(js, true); err != nil {
		t.Fatalf("loading the example: %v", err)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Logf("stopping Caddy: %v", err)
		}
		if t.Failed() {
			if b, err := os.ReadFile(logFile); err == nil {
				t.Logf("Caddy's log:\n%s", b)
			}
		}
	})
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

type answer struct {
	status int
	header http.Header
	body   []byte
	took   time.Duration
}

// send makes one request as client 10.9.0.1 (X-Forwarded-For, trusted from
// loopback as from the load balancer), on a fresh connection.
func send(t *testing.T, method, url string, body []byte) answer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-For", "10.9.0.1")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, resp.Header, b, time.Since(start)}
}

func verifyRequest(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("../../scripts/examples/invoice-fixed.json")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMultiInstanceExampleSurvivesAStoppedVerifierd: with one of two
// verifierd stopped, every request through the example succeeds, free
// routes and free-allowance verifications (POSTs) alike: the proxy
// retries a connection that could not be made on the other instance and
// stops choosing the dead one. Each verification is recorded once (a POST
// is retried only when it never reached an upstream).
func TestMultiInstanceExampleSurvivesAStoppedVerifierd(t *testing.T) {
	sentinel, _, _ := sentinelRedis(t)
	vs := verifierds(t, 2)
	vs[1].stop()
	base := runExample(t, sentinel, []string{vs[0].addr, vs[1].addr}, nil)

	body := verifyRequest(t)
	const rounds = 6
	for i := range rounds {
		for _, c := range []struct{ method, path string }{
			{"GET", "/health"}, {"GET", "/reputation/test-seller-1"}, {"POST", "/verify/schema"},
		} {
			var b []byte
			if c.method == "POST" {
				b = body
			}
			a := send(t, c.method, base+c.path, b)
			if a.status != http.StatusOK {
				t.Errorf("round %d: %s %s with one verifierd stopped: %d %s, want 200", i, c.method, c.path, a.status, a.body)
			}
		}
	}
	// The shared history holds exactly the verifications made.
	a := send(t, "GET", base+"/reputation/test-seller-1", nil)
	var rep struct {
		Counts struct {
			Total int `json:"total"`
		} `json:"counts"`
	}
	if err := json.Unmarshal(a.body, &rep); err != nil || a.status != 200 {
		t.Fatalf("reputation: %d %s", a.status, a.body)
	}
	if rep.Counts.Total != rounds {
		t.Errorf("the history holds %d verifications of test-seller-1, want %d (one per call): %s", rep.Counts.Total, rounds, a.body)
	}
}

// TestMultiInstanceExampleBoundsAStalledVerifierd: a verifierd that
// accepts connections and never answers costs a request at most the
// upstream deadline. Alone, it makes the free routes a 503
// upstream_unavailable in the service's error shape, within the deadline
// plus the retry window, never a hang; next to a live instance, the free
// (GET) routes are answered by the live one.
func TestMultiInstanceExampleBoundsAStalledVerifierd(t *testing.T) {
	sentinel, _, _ := sentinelRedis(t)
	stalled := stalledListener(t)
	vs := verifierds(t, 1)
	env := map[string]string{"AOV_UPSTREAM_TIMEOUT": "1s"}

	t.Run("alone", func(t *testing.T) {
		base := runExample(t, sentinel, []string{stalled}, env)
		want, _ := json.Marshal(apierr.Unavailable("backend service", 5, nil))
		for _, path := range []string{"/health", "/reputation/test-seller-1"} {
			a := send(t, "GET", base+path, nil)
			if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") != "5" {
				t.Errorf("GET %s on a stalled verifierd: %d (Retry-After %q) %s, want 503 with Retry-After 5", path, a.status, a.header.Get("Retry-After"), a.body)
			}
			if !sameJSON(a.body, want) {
				t.Errorf("GET %s on a stalled verifierd answered\n%s\nwant the service's error shape\n%s", path, a.body, want)
			}
			// An answer at all is the point: without a deadline the
			// request would hang until send's 60 s client deadline
			// failed the test.
			t.Logf("GET %s on a stalled verifierd answered in %v", path, a.took)
		}
	})
	t.Run("beside a live one", func(t *testing.T) {
		base := runExample(t, sentinel, []string{stalled, vs[0].addr}, env)
		for i := range 4 {
			for _, path := range []string{"/health", "/reputation/test-seller-1"} {
				if a := send(t, "GET", base+path, nil); a.status != http.StatusOK {
					t.Errorf("round %d: GET %s beside a stalled verifierd: %d %s, want 200", i, path, a.status, a.body)
				}
			}
		}
		// A verification (POST) that reached the stalled instance is not
		// sent again (it may have been recorded there): it is a 503 in
		// the error shape; by now the stalled instance is out of
		// rotation, so the live one answers.
		body := verifyRequest(t)
		for i := range 4 {
			a := send(t, "POST", base+"/verify/schema", body)
			if a.status == http.StatusOK {
				continue
			}
			var e apierr.Error
			if err := json.Unmarshal(a.body, &e); err != nil || a.status != http.StatusServiceUnavailable ||
				e.Code != apierr.CodeUpstreamUnavailable || e.Charged || !e.Retryable {
				t.Errorf("round %d: POST /verify/schema beside a stalled verifierd: %d %s, want 200 or 503 upstream_unavailable", i, a.status, a.body)
			}
		}
	})
}

func sameJSON(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xb, _ := json.Marshal(x)
	yb, _ := json.Marshal(y)
	return bytes.Equal(xb, yb)
}
