package caddymodule

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// proxiedClients is the server options of a test whose clients are named
// by X-Forwarded-For (from): the loopback proxy trusted, strictly (the
// rightmost untrusted address is the client).
const proxiedClients = "\t\ttrusted_proxies static 127.0.0.1/32\n\t\ttrusted_proxies_strict"

// startCaddyServers is startCaddy with server options (the body of the
// global `servers { … }` block) and the default logger writing to logFile
// ("" discards it).
func startCaddyServers(t *testing.T, servers, logFile, sites string) string {
	t.Helper()
	port := freePort(t)
	loadCaddyServers(t, port, servers, logFile, sites)
	t.Cleanup(func() { caddy.Stop() })
	return fmt.Sprintf("http://127.0.0.1:%d", port)
}

// loadCaddyServers is loadCaddy with server options and a logger, as
// startCaddyServers: its first load, or a reload with the same options.
func loadCaddyServers(t *testing.T, port int, servers, logFile, sites string) {
	t.Helper()
	output := "discard"
	if logFile != "" {
		output = "file " + logFile
	}
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\thttp_port %d\n\tstorage file_system %s\n\tlog {\n\t\toutput %s\n\t}\n\tservers {\n%s\n\t}\n}\n",
		port, t.TempDir(), output, servers)
	cfg += strings.NewReplacer("{port}", fmt.Sprint(port), "{data}", dataDir(t)).Replace(sites)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatalf("adapting: %v", err)
	}
	if err := caddy.Load(js, true); err != nil {
		t.Fatal(err)
	}
	testClient.CloseIdleConnections()
	waitServing(t, port)
}

// servedFree reports whether resp is a call served from the allowance.
func servedFree(resp *http.Response) bool {
	return resp.StatusCode == http.StatusOK && resp.Header.Get(HeaderFreeRemaining) != ""
}

// An IPv6 client is its /64 for the free allowance, as for the rate limit:
// one /64 holds 2^64 addresses, so counting each address would hand one
// client as many allowances as it likes. An IPv4-mapped IPv6 address is the
// IPv4 client. (Before: one /64 got 20 free calls with per_day 1.)
func TestFreeAllowanceCountsAnIPv6ClientPer64(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32", "", gateSite(up.URL, fac, 1, ""))
	url := base + "/verify/schema"
	served := 0
	for i := 1; i <= 20; i++ {
		if servedFree(post(t, url, validRequest, map[string]string{"X-Forwarded-For": fmt.Sprintf("2001:db8:1:2::%x", i)})) {
			served++
		}
	}
	if served != 1 {
		t.Errorf("one /64 got %d free calls with per_day 1", served)
	}
	if !servedFree(post(t, url, validRequest, map[string]string{"X-Forwarded-For": "2001:db8:1:3::1"})) {
		t.Error("the next /64 is another client, yet it got no free call")
	}
	if !servedFree(post(t, url, validRequest, map[string]string{"X-Forwarded-For": "::ffff:203.0.113.9"})) {
		t.Fatal("an IPv4-mapped client got no free call")
	}
	if servedFree(post(t, url, validRequest, map[string]string{"X-Forwarded-For": "203.0.113.9"})) {
		t.Error("203.0.113.9 got a second free call after using its allowance as ::ffff:203.0.113.9")
	}
}

// The documented setup behind a load balancer that appends the peer's
// address to the client's own X-Forwarded-For (nginx
// $proxy_add_x_forwarded_for, AWS ALB, Google Cloud LB): trusted_proxies
// with trusted_proxies_strict, which reads the header right to left, so the
// client is the address the balancer appended, whatever it wrote itself.
// (Before: without strict, one client got 10 free calls with
// per_day 1 by writing a new leftmost address each time.)
func TestFreeAllowanceBehindAnAppendingProxyIsTheAppendedAddress(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, fac, 1, ""))
	url := base + "/verify/schema"
	served := 0
	for i := 1; i <= 10; i++ {
		// What the trusted balancer forwards: the client's own header,
		// then the client's real address (198.51.100.7) appended.
		if servedFree(post(t, url, validRequest, map[string]string{"X-Forwarded-For": fmt.Sprintf("203.0.113.%d, 198.51.100.7", i)})) {
			served++
		}
	}
	if served != 1 {
		t.Errorf("one real client (198.51.100.7) got %d free calls with per_day 1", served)
	}
}

// A gate that keys by client IP warns, once, at the first request a trusted
// proxy forwarded, when its server reads X-Forwarded-For left to right
// (trusted_proxies without trusted_proxies_strict); with strict it says
// nothing.
func TestGateWarnsOfNonStrictTrustedProxies(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	for _, tc := range []struct {
		desc, servers string
		warn          bool
	}{
		{"non-strict", "\t\ttrusted_proxies static 127.0.0.1/32", true},
		{"strict", proxiedClients, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			base := startCaddyServers(t, tc.servers, logFile, gateSite(up.URL, fac, 1, ""))
			for i := 1; i <= 3; i++ {
				post(t, base+"/verify/schema", validRequest, map[string]string{"X-Forwarded-For": fmt.Sprintf("203.0.113.%d, 198.51.100.7", i)})
			}
			caddy.Stop()
			log, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			n := strings.Count(string(log), `"msg":"`+msgLeftmostClientIP+`"`)
			switch {
			case tc.warn && n != 1:
				t.Errorf("the warning was logged %d times, want once:\n%s", n, log)
			case !tc.warn && n != 0:
				t.Errorf("a strict server got the warning:\n%s", log)
			}
		})
	}
}

// walletRateSite is a route with wallet_auth before a gate whose rate
// limit allows two refusals a minute.
func walletRateSite(up, fac string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		wallet_auth optional {
			store badger {data}/gate
			domains 127.0.0.1:{port}
		}
		x402 {
			accept devnet $0.02 %[3]s
			route "POST /verify/schema"
			facilitator http {
				url %[2]s
			}
			store badger {data}/gate
			rate_limit 2 1m
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex())
}

// A client over the gate's rate limit is refused 429 before wallet_auth
// does any work: no proof is verified (ecrecover, eth_call) and no nonce
// claimed (a synced write). A valid proof sent while limited is therefore
// still unused once the budget refills.
func TestWalletAuthHonoursTheGateRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddyServers(t, "", "", walletRateSite(up.URL, fac))
	url := base + "/verify/schema"
	for i := 0; i < 2; i++ {
		if resp := post(t, url, "", nil); resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("unpaid probe %d: %d", i, resp.StatusCode)
		}
	}
	if resp := post(t, url, "", nil); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("client not rate limited after two refusals: %d", resp.StatusCode)
	}
	for i := 0; i < 5; i++ {
		resp := post(t, url, "", map[string]string{"X-Wallet-Auth": "e30="})
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("garbage proof %d from a rate-limited client: %d, want 429 with Retry-After", i, resp.StatusCode)
		}
	}
	h := walletProof(t, walletKey(1), "POST", url, nil)
	if resp := post(t, url, "", map[string]string{"X-Wallet-Auth": h}); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("valid proof from a rate-limited client: %d, want 429", resp.StatusCode)
	}
	// A minute later the budget has refilled: the same proof is accepted
	// (the gate then asks for payment), so it was never claimed.
	now = func() time.Time { return time.Now().Add(time.Minute) }
	t.Cleanup(func() { now = time.Now })
	resp := post(t, url, "", map[string]string{"X-Wallet-Auth": h})
	if resp.StatusCode != http.StatusPaymentRequired {
		t.Errorf("the proof sent while limited, sent again after the refill: %d %v, want 402 (accepted, then asked to pay)", resp.StatusCode, readJSON(t, resp)["message"])
	}
}

// wallet_auth's refusals count against the client's rate limit like the
// gate's own: a client sending bad proofs is limited after the budget's
// number of them.
func TestWalletAuthRefusalsCountAgainstTheRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddyServers(t, "", "", walletRateSite(up.URL, fac))
	url := base + "/verify/schema"
	for i := 0; i < 2; i++ {
		if resp := post(t, url, "", map[string]string{"X-Wallet-Auth": "e30="}); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("garbage proof %d: %d, want 401", i, resp.StatusCode)
		}
	}
	if resp := post(t, url, "", map[string]string{"X-Wallet-Auth": "e30="}); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("third garbage proof with a budget of two: %d, want 429", resp.StatusCode)
	}
	if resp := post(t, url, "", nil); resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("the gate after two wallet refusals: %d, want 429", resp.StatusCode)
	}
}

// Behind a proxy that forwards the client's X-Forwarded-For without
// appending the peer's address (a TCP balancer, docker's userland proxy),
// every client names itself, strict or not. A proxy that appends adds the
// header to every request, so a module that counts per client IP warns,
// once, at the first request a trusted proxy forwarded without any client
// IP header; behind an appending proxy it says nothing.
func TestClientIPWarnsOfATrustedProxyThatAppendsNothing(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	for _, tc := range []struct {
		desc, servers, site, path string
		appends, warn             bool
	}{
		{"a gate, strict, behind a proxy that appends nothing", proxiedClients, gateSite(up.URL, fac, 1, ""), "/verify/schema", false, true},
		{"a gate, non-strict, behind a proxy that appends nothing", "\t\ttrusted_proxies static 127.0.0.1/32", gateSite(up.URL, fac, 1, ""), "/verify/schema", false, true},
		{"aov_rate_limit, strict, behind a proxy that appends nothing", proxiedClients, freeRateSite(up.URL), "/health", false, true},
		{"a gate, strict, behind a proxy that appends", proxiedClients, gateSite(up.URL, fac, 1, ""), "/verify/schema", true, false},
		{"a gate, no trusted proxy", "", gateSite(up.URL, fac, 1, ""), "/verify/schema", false, false},
	} {
		t.Run(tc.desc, func(t *testing.T) {
			logFile := filepath.Join(t.TempDir(), "caddy.log")
			base := startCaddyServers(t, tc.servers, logFile, tc.site)
			for i := 1; i <= 3; i++ {
				// An honest client sends no header, another names itself.
				hdr := map[string]string{}
				if i == 2 {
					hdr["X-Forwarded-For"] = "203.0.113.2"
				}
				if tc.appends {
					hdr["X-Forwarded-For"] = strings.TrimPrefix(hdr["X-Forwarded-For"]+", 198.51.100.7", ", ")
				}
				send(t, http.MethodPost, base+tc.path, validRequest, hdr)
			}
			caddy.Stop()
			log, err := os.ReadFile(logFile)
			if err != nil {
				t.Fatal(err)
			}
			n := strings.Count(string(log), `"msg":"`+msgNoClientIPHeader+`"`)
			switch {
			case tc.warn && n != 1:
				t.Errorf("the warning was logged %d times, want once:\n%s", n, log)
			case !tc.warn && n != 0:
				t.Errorf("the warning was logged without cause:\n%s", log)
			}
		})
	}
}
