package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// cluster is two gateways and two verifierd on one Redis and one
// PostgreSQL, with one certd signing for both verifierd. Gateway A runs the
// devnet chain and serves its facilitator; gateway B settles through it
// (facilitator http), so both settle on one chain.
type cluster struct {
	redis     *servers.Redis
	pg        *servers.Postgres
	gateways  [2]string // host:port
	verifierd [2]string
	certd     *stack
}

const (
	multiPerDay = 5
	payTo       = "0xa0Ee7A142d267C1f36714E4a8F75612F20a79720"
)

func newCluster(t *testing.T) *cluster {
	t.Helper()
	c := &cluster{
		// AOF with fsync on every write: a Redis killed with SIGKILL
		// comes back with every acknowledged claim and counted call.
		redis: servers.StartRedis(t, "--appendonly", "yes", "--appendfsync", "always"),
		pg:    servers.StartPostgres(t),
	}
	dir := t.TempDir()
	c.gateways = [2]string{freeAddr(t), freeAddr(t)}
	s := &stack{
		dir: dir, keys: filepath.Join(dir, "keys"), sock: filepath.Join(dir, "certd", "sign.sock"),
		certdPublic: freeAddr(t), caddyAddr: c.gateways[0],
	}
	c.certd = s
	for _, d := range []string{"keys", "certd", "v0", "v1", "caddy0", "caddy1"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	s.token = "e2e-multi-token-0123456789abcdef0123456789abcdef"
	if err := os.WriteFile(s.tokenFile(), []byte(s.token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := len(s.procs) - 1; i >= 0; i-- {
			s.procs[i].stop(t)
		}
		if t.Failed() {
			for _, p := range s.procs {
				t.Logf("---- %s output (tail) ----\n%s", p.name, p.tail(4000))
			}
		}
	})
	s.startCertd(t, true)
	for i := range 2 {
		c.verifierd[i] = freeAddr(t)
		s.track(startProc(t, fmt.Sprintf("verifierd%d", i), dir, nil, bin.verifierd,
			"-listen", c.verifierd[i], "-admin-listen", "",
			"-data", filepath.Join(dir, fmt.Sprintf("v%d", i)),
			"-history", c.pg.DSN,
			"-signer-socket", s.sock, "-gateway-token-file", s.tokenFile(),
			"-public-base-url", "http://"+c.gateways[0]))
	}
	rpc := freeAddr(t)
	for i := range 2 {
		facilitator := fmt.Sprintf("facilitator http {\n\t\t\t\turl http://%s/facilitator\n\t\t\t}", c.gateways[0])
		facilitatorRoute := ""
		if i == 0 {
			facilitator = fmt.Sprintf("facilitator evm {\n\t\t\t\tdevnet {\n\t\t\t\t\trpc_listen %s\n\t\t\t\t}\n\t\t\t}", rpc)
			facilitatorRoute = fmt.Sprintf("handle_path /facilitator/* {\n\t\tx402_facilitator {\n\t\t\tpay_to %s\n\t\t\tdevnet {\n\t\t\t\trpc_listen %s\n\t\t\t}\n\t\t}\n\t}", payTo, rpc)
		}
		_, port, _ := net.SplitHostPort(c.gateways[i])
		cfg := fmt.Sprintf(`{
	admin %[1]s
	auto_https off
	servers {
		trusted_proxies static 127.0.0.1/32
		trusted_proxies_strict
	}
}
http://:%[2]s {
	bind 127.0.0.1
	handle /verify/schema {
		wallet_auth optional {
			store redis %[3]s {
				prefix e2e
			}
			# One site name for both: they stand behind one load balancer.
			domains %[10]s
		}
		x402 {
			accept devnet $0.02 %[4]s {
				asset 0x5FbDB2315678afecb367f032d93F642f64180aa3
				asset_name "USD Coin"
				asset_version 2
				asset_decimals 6
			}
			route "POST /verify/schema"
			validate verify_request
			%[5]s
			store redis %[3]s {
				prefix e2e
			}
			free_allowance {
				pool verify
				per_day %[6]d
				key ip
			}
		}
		reverse_proxy %[7]s {
			header_up X-Aov-Gateway-Token %[8]s
		}
	}
	handle /reputation/* {
		reverse_proxy %[7]s
	}
	%[9]s
}
`, freeAddr(t), port, c.redis.Addr, payTo, facilitator, multiPerDay, c.verifierd[i], s.token, facilitatorRoute,
			c.gateways[0]+" "+c.gateways[1])
		path := filepath.Join(dir, fmt.Sprintf("Caddyfile%d", i))
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		env := []string{
			"XDG_DATA_HOME=" + filepath.Join(dir, fmt.Sprintf("caddy%d", i)),
			"XDG_CONFIG_HOME=" + filepath.Join(dir, fmt.Sprintf("caddy%d", i)),
		}
		p := s.track(startProc(t, fmt.Sprintf("caddy%d", i), dir, env, bin.caddy, "run", "--config", path, "--adapter", "caddyfile"))
		waitFor(t, fmt.Sprintf("gateway %d", i), func() error {
			if !p.running() {
				return errStopped
			}
			return httpOK("http://" + c.gateways[i] + "/reputation/nobody")
		})
	}
	return c
}

// call sends one verification to gateway g as client ip (X-Forwarded-For,
// trusted from loopback) with Host set to gateway A's, as a load balancer
// in front of both would.
func (c *cluster) call(g int, ip string, body []byte, header map[string]string) (response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.gateways[g]+"/verify/schema", bytes.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Host = c.gateways[0]
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: b}, err
}

// settledPending reports whether r is the answer to a copy of a payment
// that settled, within its attempt span: 503 settlement_pending, charged.
func settledPending(r response) bool {
	var e struct {
		Code    string `json:"code"`
		Charged bool   `json:"charged"`
	}
	return r.status == http.StatusServiceUnavailable && json.Unmarshal(r.body, &e) == nil && e.Code == "settlement_pending" && e.Charged
}

// burst sends n concurrent calls as ip, alternating gateways, and counts
// the answers by status.
func (c *cluster) burst(t *testing.T, ip string, n int, body []byte, header map[string]string) map[int]int {
	t.Helper()
	var mu sync.Mutex
	got := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.call(i%2, ip, body, header)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				got[-1]++
				return
			}
			got[r.status]++
			if r.status == http.StatusServiceUnavailable && r.header.Get("Retry-After") == "" {
				t.Errorf("a 503 without Retry-After: %s", r.body)
			}
		}()
	}
	wg.Wait()
	return got
}

func TestMultiInstance(t *testing.T) {
	c := newCluster(t)
	agent := "e2e-multi-agent"
	body := bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1)

	t.Run("exactly per_day free calls per IP across both gateways", func(t *testing.T) {
		var wg sync.WaitGroup
		results := make([]map[int]int, 4)
		for i := range results {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = c.burst(t, fmt.Sprintf("198.51.100.%d", i+1), 24, body, nil)
			}()
		}
		wg.Wait()
		for i, got := range results {
			if got[http.StatusOK] != multiPerDay || got[http.StatusPaymentRequired] != 24-multiPerDay {
				t.Errorf("IP %d: answers %v, want exactly %d × 200 and the rest 402", i+1, got, multiPerDay)
			}
		}
	})

	// The payment is signed against gateway A's offer; both gateways make
	// the same offer.
	r, err := c.call(0, "198.51.100.1", body, nil)
	if err != nil || r.status != http.StatusPaymentRequired {
		t.Fatalf("want a 402 for the exhausted IP: %d, %v", r.status, err)
	}
	var required x402.PaymentRequired
	if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentRequired), &required); err != nil || len(required.Accepts) == 0 {
		t.Fatalf("PAYMENT-REQUIRED: %v", err)
	}
	payer := evmfacilitator.DevAccounts()[3]
	sign := func() string {
		t.Helper()
		p, err := x402.SignExactEVM(payer.Key(), required.Accepts[0], &required.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		h, err := x402.EncodeHeader(p)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}

	t.Run("50 concurrent copies of one payment over both gateways settle exactly once", func(t *testing.T) {
		sig := sign()
		var mu sync.Mutex
		var settled []string
		got := map[int]int{}
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := c.call(i%2, "198.51.100.1", body, map[string]string{x402.HeaderPaymentSignature: sig})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					got[-1]++
					return
				}
				got[r.status]++
				if r.status == http.StatusServiceUnavailable && !settledPending(r) {
					t.Errorf("a copy of the payment: %d %s; want settlement_pending, charged", r.status, r.body)
				}
				if r.status == http.StatusOK {
					var sr x402.SettleResponse
					if err := x402.DecodeHeader(r.header.Get(x402.HeaderPaymentResponse), &sr); err == nil && sr.Success {
						settled = append(settled, sr.Transaction)
					}
				}
			}()
		}
		wg.Wait()
		// A copy that comes after the settlement, within the attempt
		// span, is settlement_pending: the store cannot tell it from the
		// retry of a settlement whose gateway has not recorded it yet.
		if got[http.StatusOK] != 1 || len(settled) != 1 || got[http.StatusPaymentRequired]+got[http.StatusServiceUnavailable] != 49 {
			t.Fatalf("answers %v, settlements %v; want one 200 with one settlement and 49 × 402 or settlement_pending", got, settled)
		}
		for g := range 2 {
			if r, _ := c.call(g, "198.51.100.1", body, map[string]string{x402.HeaderPaymentSignature: sig}); r.status != http.StatusServiceUnavailable || !settledPending(r) {
				t.Errorf("the settled payment again on gateway %d, within its attempt span: %d %s, want 503 settlement_pending, charged", g, r.status, r.body)
			}
		}
	})

	t.Run("a wallet-proof nonce used on one gateway is refused on the other", func(t *testing.T) {
		wallet := evmfacilitator.DevAccounts()[4]
		keyFile := writeFile(t, "wallet.hex", []byte(wallet.PrivateKeyHex+"\n"))
		proof, code := aov(t, "wallet-auth", "--key-file", keyFile, "--method", "POST", "--url", "http://"+c.gateways[0]+"/verify/schema")
		if code != 0 {
			t.Fatalf("aov wallet-auth: %s", proof)
		}
		hdr := map[string]string{"X-Wallet-Auth": strings.TrimSpace(proof)}
		if r, err := c.call(0, "198.51.100.9", body, hdr); err != nil || r.status != http.StatusOK {
			t.Fatalf("first use on gateway A: %d %v %.300s", r.status, err, r.body)
		}
		if r, err := c.call(1, "198.51.100.9", body, hdr); err != nil || r.status != http.StatusUnauthorized {
			t.Fatalf("the same proof on gateway B: %d %v, want 401", r.status, err)
		}
	})

	t.Run("reputation and score agree on both verifierd", func(t *testing.T) {
		var reps [2]map[string]any
		for g := range 2 {
			r := get(t, "http://"+c.gateways[g]+"/reputation/"+agent)
			mustStatus(t, r, http.StatusOK)
			if err := json.Unmarshal(r.body, &reps[g]); err != nil {
				t.Fatal(err)
			}
		}
		a, _ := json.Marshal(reps[0])
		b, _ := json.Marshal(reps[1])
		if !bytes.Equal(a, b) {
			t.Fatalf("reputation differs:\n A %s\n B %s", a, b)
		}
		var scores [2]struct {
			Score  float64         `json:"score"`
			Counts json.RawMessage `json:"counts"`
		}
		for v := range 2 {
			// Straight at each verifierd, as the gateway would ask it.
			r := do(t, http.MethodGet, "http://"+c.verifierd[v]+"/score/"+agent, nil,
				map[string]string{"X-Aov-Gateway-Token": c.certd.token})
			mustStatus(t, r, http.StatusOK)
			if err := json.Unmarshal(r.body, &scores[v]); err != nil {
				t.Fatal(err)
			}
		}
		if math.Abs(scores[0].Score-scores[1].Score) > 1e-6 || !bytes.Equal(scores[0].Counts, scores[1].Counts) || scores[0].Score == 0 {
			t.Fatalf("scores differ or are empty: %+v / %+v", scores[0], scores[1])
		}
		if !strings.Contains(string(scores[0].Counts), fmt.Sprint(4*multiPerDay+2)) {
			t.Errorf("counts %s do not hold the %d recorded calls", scores[0].Counts, 4*multiPerDay+2)
		}
	})

	t.Run("Redis down: 503s, no over-grant, no double settlement; recovery when it returns", func(t *testing.T) {
		const ip = "203.0.113.7"
		first := c.burst(t, ip, 3, body, nil)
		if first[http.StatusOK] != 3 {
			t.Fatalf("before the outage: %v, want 3 × 200", first)
		}
		c.redis.Stop()
		down := c.burst(t, ip, 20, body, nil)
		if down[http.StatusServiceUnavailable] != 20 {
			t.Fatalf("with Redis down: %v, want 20 × 503", down)
		}
		sigDown := sign()
		if r, _ := c.call(1, ip, body, map[string]string{x402.HeaderPaymentSignature: sigDown}); r.status != http.StatusServiceUnavailable {
			t.Fatalf("a payment with Redis down: %d, want 503 (never unguarded)", r.status)
		}
		c.redis.Start()
		var after map[int]int
		waitFor(t, "the gateways to use Redis again", func() error {
			after = c.burst(t, ip, 1, body, nil)
			if after[http.StatusServiceUnavailable] > 0 {
				return fmt.Errorf("still 503")
			}
			return nil
		})
		rest := c.burst(t, ip, 10, body, nil)
		served := first[http.StatusOK] + after[http.StatusOK] + rest[http.StatusOK]
		if served != multiPerDay {
			t.Fatalf("%d free calls served to %s in all, want exactly %d", served, ip, multiPerDay)
		}
		got := c.burst(t, ip, 6, body, map[string]string{x402.HeaderPaymentSignature: sigDown})
		if got[http.StatusOK] != 1 || got[http.StatusPaymentRequired]+got[http.StatusServiceUnavailable] != 5 {
			t.Fatalf("the payment refused during the outage, sent 6 times after: %v, want it settled exactly once (the others 402, or settlement_pending once it settled)", got)
		}
	})
}
