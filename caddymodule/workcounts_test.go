package caddymodule

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/aovhq/aov/x402"
)

// A call counts for the work it made run (workRan). These tests hold the
// gate to that from both sides: a call the upstream worked for and that
// settled nothing is bounded by rate_limit, whatever ended it (an error
// answer no verify_response checked, upstream_timeout), and a call for
// which nothing could run (the upstream not listening) never rate limits
// the buyer retrying it.

// stallUpstream makes up work past a 200ms upstream_timeout on each call
// (400ms, or until the test ends).
func stallUpstream(t *testing.T, up *upstream) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	up.during = func() {
		select {
		case <-release:
		case <-time.After(400 * time.Millisecond):
		}
	}
}

// workCases are the ways an upstream can work for a call without a
// billable answer: the extra gate lines and request headers of each.
var workCases = []struct {
	name  string
	extra string
	hdr   map[string]string
	stall bool
}{
	{"upstream 500", "rate_limit 3 1m", map[string]string{"X-Test-Status": "500"}, false},
	{"upstream_timeout", "rate_limit 3 1m\n\t\t\tupstream_timeout 200ms", nil, true},
}

// freezeClock stops the rate limit's refill for the rest of the test.
func freezeClock(t *testing.T) {
	t0 := time.Now()
	now = func() time.Time { return t0 }
	t.Cleanup(func() { now = time.Now })
}

// TestFreeCallsTheUpstreamWorkedForKeepTheirFreeBudget: a free call whose
// upstream answered 500 (no verify_response checked it) or ran past
// upstream_timeout gets its free unit back, but the upstream worked, so
// the call keeps its event of the free budget and counts as a refusal.
// With per_day 1 and rate_limit 3, the upstream runs three times; every
// call after is refused 429 with Retry-After before it is forwarded.
func TestFreeCallsTheUpstreamWorkedForKeepTheirFreeBudget(t *testing.T) {
	_, fac := sharedDevnet(t)
	for _, tc := range workCases {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			if tc.stall {
				stallUpstream(t, up)
			}
			url := startCaddy(t, gateSite(up.URL, fac, 1, tc.extra)) + "/verify/schema"
			freezeClock(t)
			var statuses []int
			var last *http.Response
			for range 10 {
				last = post(t, url, validRequest, tc.hdr)
				statuses = append(statuses, last.StatusCode)
			}
			if n := up.calls.Load(); n != 3 {
				t.Fatalf("free calls with per_day 1 and rate_limit 3 ran the upstream %d times (statuses %v), want 3", n, statuses)
			}
			if last.StatusCode != http.StatusTooManyRequests || last.Header.Get("Retry-After") == "" {
				t.Fatalf("after three calls the upstream worked for: %d, Retry-After %q (statuses %v); want 429 with Retry-After",
					last.StatusCode, last.Header.Get("Retry-After"), statuses)
			}
		})
	}
}

// TestOneUnsettledPaymentIsBoundedByRateLimit: one signed payment whose
// calls never settle (the upstream answers 500, or runs past
// upstream_timeout) has its claim released each time, and each call counts
// against rate_limit: with 3 events, the unpaid probe for the price and two
// such calls use the budget, three more its debt (a payment passes while
// its refusal keeps the debt within events: rateZone.arrival), and the
// payment runs the upstream no more.
func TestOneUnsettledPaymentIsBoundedByRateLimit(t *testing.T) {
	_, fac := sharedDevnet(t)
	for i, tc := range workCases {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t)
			if tc.stall {
				stallUpstream(t, up)
			}
			url := startCaddy(t, gateSite(up.URL, fac, 0, tc.extra)) + "/verify/schema"
			freezeClock(t)
			hdr := map[string]string{x402.HeaderPaymentSignature: signFor(t, paymentRequired(t, post(t, url, "", nil)), 4+i)}
			for k, v := range tc.hdr {
				hdr[k] = v
			}
			var statuses []int
			var last *http.Response
			for range 10 {
				last = post(t, url, validRequest, hdr)
				statuses = append(statuses, last.StatusCode)
			}
			if n := up.calls.Load(); n != 5 {
				t.Fatalf("one unsettled payment ran the upstream %d times (statuses %v); want 5 with rate_limit 3 after the probe (2 and 3 of debt)", n, statuses)
			}
			if last.StatusCode != http.StatusTooManyRequests || last.Header.Get("Retry-After") == "" {
				t.Fatalf("last status %d, Retry-After %q (statuses %v); want 429 with Retry-After", last.StatusCode, last.Header.Get("Retry-After"), statuses)
			}
		})
	}
}

// TestADeadUpstreamDoesNotRateLimitARetryingBuyer: while nothing listens
// at the upstream's address (the operator's outage), nothing runs for a
// call: a free call gets its unit and its free budget's event back, a paid
// call its claim, and neither counts, so a buyer retrying far more often
// than rate_limit allows is answered 502 each time, never 402 or 429, and
// is served once the upstream is back.
func TestADeadUpstreamDoesNotRateLimitARetryingBuyer(t *testing.T) {
	_, fac := sharedDevnet(t)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	url := startCaddy(t, gateSite("http://"+addr, fac, 1, "rate_limit 3 1m")) + "/verify/schema"
	freezeClock(t)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 6) // the probe: one event of three
	var statuses []int
	for range 8 {
		statuses = append(statuses, post(t, url, validRequest, nil).StatusCode)
		statuses = append(statuses, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}).StatusCode)
	}
	for _, s := range statuses {
		if s != http.StatusBadGateway {
			t.Fatalf("free and paid calls to an upstream nothing listens on: statuses %v, want 502 only", statuses)
		}
	}

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t)
	back := httptest.NewUnstartedServer(up.Config.Handler)
	back.Listener.Close()
	back.Listener = ln
	back.Start()
	t.Cleanup(back.Close)
	if resp := post(t, url, validRequest, nil); resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderFreeRemaining) != "0" {
		t.Fatalf("the free call once the upstream is back: %d, remaining %q; want 200 with the day's one unit", resp.StatusCode, resp.Header.Get(HeaderFreeRemaining))
	}
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK {
		t.Fatalf("the same payment once the upstream is back: %d, want 200", resp.StatusCode)
	}
}

// TestMCPToolCallsCountByTheWorkTheyMadeRun: the same rule over MCP. Free
// tool calls to a tool server nothing listens on are each answered
// upstream_unavailable and never rate limited; free calls the tool worked
// on until upstream_timeout keep their free budget's event, so with
// rate_limit 2 the third is a demand for payment, and once two of those
// refusals are counted the fifth is refused rate_limited.
func TestMCPToolCallsCountByTheWorkTheyMadeRun(t *testing.T) {
	_, fac := sharedDevnet(t)
	const free = "rate_limit 2 1m\n\t\t\tupstream_timeout 200ms\n\t\t\tfree_allowance {\n\t\t\t\tpool verify\n\t\t\t\tper_day 100\n\t\t\t}"
	code := func(body []byte) string {
		switch {
		case bytes.Contains(body, []byte(`"rate_limited"`)):
			return "rate_limited"
		case bytes.Contains(body, []byte(`"upstream_unavailable"`)):
			return "upstream_unavailable"
		case bytes.Contains(body, []byte(`free calls are used for now`)):
			return "payment_required"
		}
		return string(body)
	}
	t.Run("tool server down", func(t *testing.T) {
		url := startCaddy(t, faultSite(fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), fac, free)) + "/mcp"
		freezeClock(t)
		for i := range 5 {
			if _, body := postCall(t, url, nil); code(body) != "upstream_unavailable" {
				t.Fatalf("call %d to a tool server nothing listens on: %s, want upstream_unavailable", i+1, body)
			}
		}
	})
	t.Run("tool stalled", func(t *testing.T) {
		up := newAnswerFault(t)
		up.stall.Store(true)
		url := startCaddy(t, faultSite(up.URL, fac, free)) + "/mcp"
		freezeClock(t)
		var got []string
		for range 5 {
			_, body := postCall(t, url, nil)
			got = append(got, code(body))
		}
		if fmt.Sprint(got) != "[upstream_unavailable upstream_unavailable payment_required payment_required rate_limited]" {
			t.Fatalf("free calls of a tool that runs past upstream_timeout: %v, want two upstream_unavailable, two payment_required, then rate_limited", got)
		}
	})
}

// TestFreeAgentCallsCountWhileVerifierdIsDown: verify_response asks
// verifierd only once the upstream (the seller agent) answered, so with
// verifierd and the agent card at an address nothing listens on every free
// call still runs the agent. Each is withheld 503 upstream_unavailable and
// keeps its free budget's event: with per_day 1 and rate_limit 3 the
// agent runs three times, and the calls after are not forwarded.
func TestFreeAgentCallsCountWhileVerifierdIsDown(t *testing.T) {
	_, fac := sharedDevnet(t)
	schema, _ := filepath.Abs("../examples/seller-agent/invoice.schema.json")
	rules, _ := filepath.Abs("../examples/seller-agent/invoice.rules.json")
	up := newUpstream(t)
	site := fmt.Sprintf(`:{port} {
	handle /job/* {
		x402 {
			accept devnet $0.05 %[2]s
			facilitator http %[1]s
			store badger {data}/work
			rate_limit 3 1m
			free_allowance {
				pool work
				per_day 1
			}
		}
		verify_response {
			schema %[3]s
			rules %[4]s
			verifier_url http://127.0.0.1:%[6]d
			card_url http://127.0.0.1:%[6]d/.well-known/agent-card.json
		}
		reverse_proxy %[5]s
	}
}
`, fac, payTo.Hex(), schema, rules, up.Listener.Addr().String(), freePort(t))
	url := startCaddy(t, site) + "/job/x"
	freezeClock(t)
	var statuses []int
	for range 10 {
		resp, _ := getBody(t, url, nil)
		statuses = append(statuses, resp.StatusCode)
	}
	if n := up.calls.Load(); n != 3 {
		t.Fatalf("free calls (per_day 1, rate_limit 3) with verifierd unreachable ran the agent %d times (statuses %v); want 3", n, statuses)
	}
	if fmt.Sprint(statuses[:3]) != "[503 503 503]" {
		t.Fatalf("statuses %v; want the first three withheld 503", statuses)
	}
}

// TestARetryEndingInADialErrorCountsTheWorkBeforeIt: reverse_proxy keeps
// only the last attempt's error. Here each free GET reaches a working
// upstream that runs past response_header_timeout, and is retried on a
// second upstream nothing listens on (round_robin, which starts at the
// second listed and takes two turns a call; lb_retries 1): the last
// error is a dial error, yet the request was written to the first
// upstream, which worked. Each call counts: with per_day 1 and rate_limit
// 3 the working upstream runs three times.
func TestARetryEndingInADialErrorCountsTheWorkBeforeIt(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	stallUpstream(t, up)
	dead := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	site := fmt.Sprintf(`:{port} {
	handle /job/* {
		x402 {
			accept devnet $0.05 %[2]s
			facilitator http %[1]s
			store badger {data}/work
			rate_limit 3 1m
			free_allowance {
				pool work
				per_day 1
			}
		}
		reverse_proxy %[4]s %[3]s {
			lb_policy round_robin
			lb_retries 1
			transport http {
				dial_timeout 1s
				response_header_timeout 200ms
			}
		}
	}
}
`, fac, payTo.Hex(), up.Listener.Addr().String(), dead)
	url := startCaddy(t, site) + "/job/x"
	freezeClock(t)
	var statuses []int
	for range 10 {
		resp, _ := getBody(t, url, nil)
		statuses = append(statuses, resp.StatusCode)
	}
	if n := up.calls.Load(); n != 3 {
		t.Fatalf("free GETs (per_day 1, rate_limit 3) retried from a working upstream to a dead one ran the upstream %d times (statuses %v); want 3", n, statuses)
	}
}

// TestFreeCallsThatFailedNeverRefuseALaterPayment: a free call the
// upstream answered 500 counts once, in the client's free budget (it keeps
// the event it took), never in the budget a payment must pass. After the
// price probe and three such free calls (rate_limit 4), the buyer's first
// payment is served, not refused 429.
func TestFreeCallsThatFailedNeverRefuseALaterPayment(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	url := startCaddy(t, gateSite(up.URL, fac, 100, "rate_limit 4 1m")) + "/verify/schema"
	freezeClock(t)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 7) // the probe: one refusal
	var statuses []int
	for range 3 {
		statuses = append(statuses, post(t, url, validRequest, map[string]string{"X-Test-Status": "500"}).StatusCode)
	}
	if fmt.Sprint(statuses) != "[500 500 500]" {
		t.Fatalf("free calls the upstream answered 500: statuses %v, want [500 500 500]", statuses)
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("paid call after three free calls the upstream answered 500: %d, Retry-After %q; want 200 (a payment is never refused for the free calls used)",
			resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestAnUpstreamThatAcceptsAndClosesRateLimitsARetryingBuyer: an upstream
// down behind something that still accepts connections (docker's userland
// proxy, a TCP balancer with no backend) closes each connection after the
// gate wrote its request. That the request reached nothing behind it the
// gate cannot know: the request was written, so the call counts, as
// README's rate_limit row says. One payment retried through such an outage
// is answered 502 until the budget is spent (the probe and two calls of
// rate_limit 3) and its debt (three more: rateZone.arrival), then 429 with
// Retry-After: back-pressure.
func TestAnUpstreamThatAcceptsAndClosesRateLimitsARetryingBuyer(t *testing.T) {
	_, fac := sharedDevnet(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	url := startCaddy(t, gateSite("http://"+ln.Addr().String(), fac, 0, "rate_limit 3 1m")) + "/verify/schema"
	freezeClock(t)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8) // the probe
	var statuses []int
	var last *http.Response
	for range 7 {
		last = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		statuses = append(statuses, last.StatusCode)
	}
	if fmt.Sprint(statuses) != "[502 502 502 502 502 429 429]" || last.Header.Get("Retry-After") == "" {
		t.Fatalf("one payment retried while the upstream accepts and closes connections: statuses %v, last Retry-After %q; want [502 502 502 502 502 429 429] with Retry-After",
			statuses, last.Header.Get("Retry-After"))
	}
}
