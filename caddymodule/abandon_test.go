package caddymodule

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestAnAbandonedCallIsReleasedAndCounted: a client that goes away while
// the upstream is still working gets nothing and pays nothing, so its free
// unit is given back (Caddy's proxy ends such a call with 499, no answer).
// The abandoned call took the upstream's work and brought nothing, so it
// keeps the event of the client's free budget it took: without that, a
// client could have unlimited work done free by leaving just before each
// answer. With a budget of 3, two abandoned calls leave one free call (the
// unit came back both times); then calls are 402, three refusals, and 429.
func TestAnAbandonedCallIsReleasedAndCounted(t *testing.T) {
	_, fac := sharedDevnet(t)
	var hold atomic.Bool
	hold.Store(true)
	held := make(chan struct{}, 1)
	var served atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if hold.Load() {
			held <- struct{}{}
			<-r.Context().Done() // the gateway gives up when its client does
			return
		}
		served.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"result":"pass"}`)
	}))
	t.Cleanup(up.Close)
	base := startCaddy(t, gateSite(up.URL, fac, 1, "rate_limit 3 1m"))
	url := base + "/verify/schema"
	t0 := time.Now()
	now = func() time.Time { return t0 } // no refill during the test
	t.Cleanup(func() { now = time.Now })

	abandon := func() {
		t.Helper()
		before := counterValue(t, "upstream_error_not_settled")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(validRequest))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		done := make(chan error, 1)
		go func() {
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		select {
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatal("the call never reached the upstream")
		}
		cancel()
		if err := <-done; err == nil {
			t.Fatal("the abandoned call was answered")
		}
		// The gate answers nobody now; wait (bounded) until it has judged
		// the call.
		for deadline := time.Now().Add(10 * time.Second); counterValue(t, "upstream_error_not_settled") == before; {
			if time.Now().After(deadline) {
				t.Fatal("the gate never finished the abandoned call")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	abandon()
	abandon()
	hold.Store(false)
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("after two abandoned calls with a free allowance of 1: %d, want the free call served", resp.StatusCode)
	}
	// Two abandoned calls and the free call are the free budget of 3; the
	// 402s past it are the budget of 3 for refusals.
	for i := range 3 {
		if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("call %d past the free budget: %d, want 402", i+1, resp.StatusCode)
		}
	}
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("after the free budget and three 402s with a budget of 3: %d, want 429", resp.StatusCode)
	}
	if got := served.Load(); got != 1 {
		t.Fatalf("upstream served %d calls, want the one free call", got)
	}
}
