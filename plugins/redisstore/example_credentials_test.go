package redisstore

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// examples/multi-instance/Caddyfile's free routes (/reputation/*, /health)
// have no gate and no wallet_auth to take a client's PAYMENT-SIGNATURE,
// X-Wallet-Auth and SIGN-IN-WITH-X off the request, and verifierd reads
// none of them. Its (verifierd) snippet drops them, as Caddyfile.example's
// does, so they reach no upstream (nor reverse_proxy's DEBUG log of the
// headers it sends). Before, verifierd received all three.
func TestMultiInstanceExampleFreeRoutesPassNoClientCredentials(t *testing.T) {
	sentinel, _, _ := sentinelRedis(t)
	var mu sync.Mutex
	got := map[string]string{}
	seen := map[string]bool{}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if r.Header.Get("X-Forwarded-For") != "" { // a client's call, not the active health check
			seen[r.URL.Path] = true
		}
		for _, h := range []string{"Payment-Signature", "X-Wallet-Auth", "Sign-In-With-X"} {
			if v := r.Header.Get(h); v != "" {
				got[r.URL.Path+" "+h] = v
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{}`))
	}))
	defer up.Close()
	base := runExample(t, sentinel, []string{strings.TrimPrefix(up.URL, "http://")}, nil)
	for _, path := range []string{"/reputation/seller-7", "/health"} {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("X-Forwarded-For", "10.9.0.1")
		req.Header.Set("X-Wallet-Auth", "WALLETPROOF-MARK")
		req.Header.Set("PAYMENT-SIGNATURE", "PAYSIG-MARK")
		req.Header.Set("SIGN-IN-WITH-X", "SIWX-MARK")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", path, resp.StatusCode)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, path := range []string{"/reputation/seller-7", "/health"} {
		if !seen[path] {
			t.Errorf("verifierd never got the client's GET %s; the test proves nothing", path)
		}
	}
	if len(got) > 0 {
		t.Errorf("verifierd behind examples/multi-instance/Caddyfile received the client's credentials: %v", got)
	}
}
