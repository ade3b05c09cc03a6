package caddymodule

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// sendAtOnce sends n requests together (request(i) says what each is) and
// returns how many got each status.
func sendAtOnce(t *testing.T, n int, request func(i int) (method, url, body string, hdr map[string]string)) map[int]int {
	t.Helper()
	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		method, url, body, hdr := request(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			resp, _ := send(t, method, url, body, hdr)
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return statuses
}

// unfundedPayments signs n payments for pr's first offer, each by a new
// wallet that holds nothing: the facilitator's /verify refuses them.
func unfundedPayments(t *testing.T, pr x402.PaymentRequired, n int) []x402.PaymentPayload {
	t.Helper()
	ps := make([]x402.PaymentPayload, n)
	for i := range ps {
		key, _ := crypto.GenerateKey()
		p, err := x402.SignExactEVM(key, pr.Accepts[0], &pr.Resource, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		ps[i] = p
	}
	return ps
}

// One client sends many refused payments at once (unfunded wallets, each
// a facilitator /verify): the rate limit bounds the /verify calls to its
// events per window, concurrent or not, and the rest are 429 before any
// work. A second wave once one event has refilled gets one /verify. (From
// the audit: the budget was checked before the work and counted after it,
// so all 16 in flight passed the check: 16 /verify calls.)
func TestConcurrentRefusedPaymentsAreBoundedByTheRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	facURL, verifies := countingFacilitator(t, fac, 400*time.Millisecond)
	up := newUpstream(t)
	base := startCaddyServers(t, "\t\ttrusted_proxies static 127.0.0.1/32\n\t\ttrusted_proxies_strict", "", gateSite(up.URL, facURL, 0, "rate_limit 2 4s"))
	u := base + "/verify/schema"
	pr := paymentRequired(t, post(t, u, validRequest, from("192.0.2.200")))

	const n = 16
	wave := func() (map[int]int, int64) {
		hdrs := make([]map[string]string, n)
		for i, p := range unfundedPayments(t, pr, n) {
			h, _ := x402.EncodeHeader(p)
			hdrs[i] = map[string]string{"X-Forwarded-For": "198.51.100.9", x402.HeaderPaymentSignature: h}
		}
		before := verifies.Load()
		st := sendAtOnce(t, n, func(i int) (string, string, string, map[string]string) {
			return http.MethodPost, u, validRequest, hdrs[i]
		})
		return st, verifies.Load() - before
	}
	s1, v1 := wave()
	// One event refills in 2 s; the whole window is 4 s.
	time.Sleep(2100 * time.Millisecond)
	s2, v2 := wave()
	if v1 != 2 || v2 != 1 || s1[http.StatusTooManyRequests] != n-2 || s2[http.StatusTooManyRequests] != n-1 {
		t.Errorf("one client, rate_limit 2 4s, two waves of %d concurrent refused payments 2.1 s apart: %d then %d /verify calls (statuses %v, %v); want 2 then 1, the rest 429", n, v1, v2, s1, s2)
	}
}
