package caddymodule

import (
	"bytes"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/aovhq/aov/internal/signflip"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// The gate compiles a request's schema to tell 422 from 402, unpaid, so
// everything the compiler does before it answers is work anyone can ask
// for. Each of these schemas made it do far more than its size; each is
// now refused before the compiler sees it, for a bounded allocation.
func TestUnpaidSchemasCostlyToCompileAreRefusedCheaply(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 5, ""))

	// The compiler deduplicates required before it checks that it holds
	// strings: 200 sign-flipped arrays of 200 numbers (80 KB) cost it 1 s
	// of CPU and 314 MiB.
	required := strings.Replace(signFlipEnumRequest(200), `{"$schema":"http://json-schema.org/draft-04/schema#","enum":`, `{"required":`, 1)

	// 25,000 subschemas under const, which is data, reached by a $ref
	// (664 KB): the compiler compiled them all, 4.3 s of CPU and 202 MiB,
	// and the gate answered 402.
	var hidden strings.Builder
	hidden.WriteString(`{"task_id":"t","expected_schema":{"$ref":"#/const/a","const":{"a":{"properties":{`)
	for i := range 25_000 {
		if i > 0 {
			hidden.WriteByte(',')
		}
		hidden.WriteString(`"p` + strconv.Itoa(i) + `":{"type":"string"}`)
	}
	hidden.WriteString(`}}}},"submitted_output":{}}`)

	// An enum of 110 arrays of 40 long numbers differing only in signs
	// (102 KB): each comparison parses both sides into big.Rat, and at one
	// step a number it cost 0.8 s of CPU and 446 MiB within the budget.
	num := "1.234567890123456e-300"
	longNumbers := `{"task_id":"t","expected_schema":{"$schema":"http://json-schema.org/draft-07/schema#","enum":` + signflip.Rows(num, 110, 40) + `},"submitted_output":1}`

	for _, tc := range []struct {
		name, body, field, problem string
	}{
		{"required of sign flips", required, "expected_schema/required", "checking the schema's required values for duplicates"},
		{"subschemas under const", hidden.String(), "expected_schema", "more than 5000 objects"},
		{"enum of long numbers", longNumbers, "expected_schema/enum", "checking the schema's enum values for duplicates"},
	} {
		var status int
		var answer []byte
		c := measure(t, func() {
			resp := post(t, base+"/verify/schema", tc.body, nil)
			status = resp.StatusCode
			answer, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
		})
		t.Logf("%s: %d bytes, status %d, CPU %v, allocated %d MiB, peak heap +%d MiB", tc.name, len(tc.body), status, c.cpu, c.allocated>>20, c.peakHeap>>20)
		if c.allocated > 64<<20 {
			t.Errorf("%s: the gate allocated %d MiB for one unpaid %d-byte request", tc.name, c.allocated>>20, len(tc.body))
		}
		var e struct {
			Code   string `json:"code"`
			Fields []struct {
				Field   string `json:"field"`
				Problem string `json:"problem"`
			} `json:"fields"`
		}
		if err := json.Unmarshal(answer, &e); status != http.StatusUnprocessableEntity || err != nil || e.Code != "invalid_request" ||
			len(e.Fields) != 1 || e.Fields[0].Field != tc.field || !strings.Contains(e.Fields[0].Problem, tc.problem) {
			t.Errorf("%s: status %d, %.300s; want 422 invalid_request naming %s", tc.name, status, answer, tc.field)
		}
	}
	if up.calls.Load() != 0 {
		t.Errorf("the upstream ran %d times", up.calls.Load())
	}
}

// compileHeavyRequest is a valid request whose schema is costly to compile
// but within every documented limit (4,900 subschemas < MaxSchemas 5,000):
// the gate must compile it to tell 422 from 402, unpaid. seed makes the
// schema (and so its hash) distinct, so the compile cache and its single
// flight do not share work between requests.
func compileHeavyRequest(seed int) string {
	var b strings.Builder
	b.WriteString(`{"task_id":"t","expected_schema":{"type":"object","properties":{`)
	for i := range 4_900 {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"s` + strconv.Itoa(seed) + `_` + strconv.Itoa(i) + `":{"type":"string"}`)
	}
	b.WriteString(`}},"submitted_output":{}}`)
	return b.String()
}

// README (x402 rate_limit): "however many requests one client holds open
// at once, work is done for at most `events` of them at a time, their
// refusals put the budget at most `events` in debt". With validate
// verify_request every unpaid 402 costs a schema compile, so each compile
// takes one of the client's slots before it runs, and a request finding
// none is answered 429, nothing counted. (Before: the compile ran before
// any slot was taken, while the budget still had an event left, so one
// client's 24 concurrent requests under rate_limit 2 1m were all compiled
// at once: 24 402s, 3.8 s of CPU, +217 MiB of peak heap.)
func TestUnpaidSchemaCompilesAreBoundedPerClient(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	const events = 2
	base := startCaddy(t, gateSite(up.URL, fac, 0, "rate_limit "+strconv.Itoa(events)+" 1m"))
	url := base + "/verify/schema"

	one := measure(t, func() {
		resp := post(t, url, compileHeavyRequest(-1), nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Fatalf("one unpaid request: status %d, want 402", resp.StatusCode)
		}
	})
	t.Logf("one unpaid request (%d bytes): CPU %v, allocated %d MiB, peak heap +%d MiB", len(compileHeavyRequest(-1)), one.cpu, one.allocated>>20, one.peakHeap>>20)

	const n = 24
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = compileHeavyRequest(i)
	}
	statuses := make([]int, n)
	retryAfter := make([]string, n)
	c := measure(t, func() {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() {
				<-start
				resp := post(t, url, bodies[i], nil)
				statuses[i], retryAfter[i] = resp.StatusCode, resp.Header.Get("Retry-After")
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			})
		}
		close(start)
		wg.Wait()
	})
	counts := map[int]int{}
	for i, s := range statuses {
		counts[s]++
		if s == http.StatusTooManyRequests && retryAfter[i] == "" {
			t.Errorf("a 429 without Retry-After")
		}
	}
	t.Logf("%d concurrent unpaid requests from one client (rate_limit %d 1m): statuses %v; CPU %v, allocated %d MiB, peak heap +%d MiB",
		n, events, counts, c.cpu, c.allocated>>20, c.peakHeap>>20)
	if counts[http.StatusTooManyRequests]+counts[http.StatusPaymentRequired] != n {
		t.Errorf("statuses %v: want only 402 and 429", counts)
	}
	// Every 402 here is a compiled schema. The budget allows work for at
	// most events at a time and a debt of events: 2*events at the very most.
	if worked := counts[http.StatusPaymentRequired] + counts[http.StatusUnprocessableEntity]; worked > 2*events {
		t.Errorf("one client had %d unpaid schema compiles done (%d concurrent requests) with rate_limit %d: want at most %d (events at a time, events in debt); peak heap +%d MiB vs +%d MiB for one",
			worked, n, events, 2*events, c.peakHeap>>20, one.peakHeap>>20)
	}
}

// The per-client slots bound one address; the gateway's own bound
// (precheckSlots, verifierd's default -max-concurrent-verifications) holds
// however many addresses ask at once.
//
// A request that finds every one of the gateway's compile slots busy for
// precheckSlotWait is answered without the request check: the 402 with
// the offer, its message saying the request was not checked, counted in
// aov_x402_offers_unchecked_total. The check only spares a buyer the offer
// of an invalid request, and the paid call for one is still refused 422,
// nothing charged: under settle before by the gate's own check (a verified
// payment's, which takes none of those slots), under settle after by
// verifierd. (Before: it waited precheckWait, 5 s, and was answered 503
// verification_timeout without PAYMENT-REQUIRED, so sixteen IPv6 /64s,
// each compiling one request at a time, kept every other client from
// learning the price.)
func TestBusyCompileSlotsOfferTheRequestUnchecked(t *testing.T) {
	d, fac := sharedDevnet(t)
	payer := evmfacilitator.DevAccounts()[6]
	for _, settle := range []string{"settle after", "settle before"} {
		t.Run(settle, func(t *testing.T) {
			base := startCaddy(t, restVerifierSite(startVerifier(t), fac, 0, settle))
			url := base + "/verify/schema"
			shortenPrecheckWait(t, 3*time.Second)
			holdCompileSlots(t)
			unchecked := uncheckedOffers(t)

			t0 := time.Now()
			resp := post(t, url, invalidRequest, nil)
			took := time.Since(t0)
			readAll(t, resp)
			if resp.StatusCode != http.StatusPaymentRequired || took < precheckSlotWait || took > precheckWait/2 {
				t.Fatalf("an invalid unpaid request, every compile slot busy: %d after %v; want 402 after precheckSlotWait (%v), long before precheckWait (%v)",
					resp.StatusCode, took, precheckSlotWait, precheckWait)
			}
			pr := paymentRequired(t, resp)
			if !strings.Contains(pr.Error, "too busy to check this request") {
				t.Errorf("the unchecked offer's message %q does not say the request was not checked", pr.Error)
			}
			if n := uncheckedOffers(t) - unchecked; n != 1 {
				t.Errorf("aov_x402_offers_unchecked_total grew by %v, want 1", n)
			}

			before := balance(t, d, payer.Address)
			paid := post(t, url, invalidRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, payer.Index)})
			body := readAll(t, paid)
			if paid.StatusCode != http.StatusUnprocessableEntity || !bytes.Contains(body, []byte(`"charged":false`)) || paid.Header.Get(x402.HeaderPaymentResponse) != "" {
				t.Errorf("the paid call for the invalid request: %d %s (PAYMENT-RESPONSE %q); want 422, charged false, unsettled",
					paid.StatusCode, body, paid.Header.Get(x402.HeaderPaymentResponse))
			}
			if got := charged(t, d, payer.Address, before); got.Cmp(big.NewInt(0)) != 0 {
				t.Errorf("charged %v for an invalid request, want 0", got)
			}
		})
	}
}

// A refusal of the payment itself (here a PAYMENT-SIGNATURE that does not
// decode) is answered as it is, whatever the unpaid compiles hold: the
// request check only tells 422 from 402 for a request the gate would offer
// for sale, so this answer neither compiles the schema nor waits for one of
// precheckSlots. (Before: it waited precheckWait for a slot and was
// answered 503 verification_timeout, retryable, instead of the 400 that
// says the payment is unusable.)
func TestAPaymentRefusalDoesNotWaitForUnpaidCompiles(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	checks := countRequestChecks(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, ""))
	url := base + "/verify/schema"
	defer func(w time.Duration) { precheckWait = w }(precheckWait)
	precheckWait = 300 * time.Millisecond
	for range cap(precheckSlots) {
		precheckSlots <- struct{}{}
	}
	defer func() {
		for range cap(precheckSlots) {
			<-precheckSlots
		}
	}()
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: "not-a-payment"})
	var body struct {
		Code string `json:"code"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(x402.HeaderPaymentRequired) == "" {
		t.Errorf("unreadable payment with the precheck slots busy: %d %q; want 400 with PAYMENT-REQUIRED", resp.StatusCode, body.Code)
	}
	if n := checks.Load(); n != 0 {
		t.Errorf("request checks run for a payment's refusal: %d, want 0", n)
	}
}

// precheckSlots and each address's turn bound the compiles done for
// unpaid answers. A paid call's own check (settle before: before its
// payment settles) has bounds of its own (paidCheckSlots, its payer's
// turn) and takes none of them: with every slot and its address's turn
// held by unpaid requests, a funded valid payment is served and charged at
// once. (Before: it waited precheckWait for one and was refused 503
// verification_timeout.)
func TestAPaidCallsCheckTakesNoUnpaidCompileSlot(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "settle before"))
	url := base + "/verify/schema"
	pr := paymentRequired(t, post(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[8].Address
	before := balance(t, d, payer)
	defer func(w time.Duration) { precheckWait = w }(precheckWait)
	precheckWait = 300 * time.Millisecond
	for range cap(precheckSlots) {
		precheckSlots <- struct{}{}
	}
	defer func() {
		for range cap(precheckSlots) {
			<-precheckSlots
		}
	}()
	holdTurn(t, "127.0.0.1")
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, pr, 8)})
	var body struct {
		Code string `json:"code"`
	}
	json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("paid valid request (settle before) with every unpaid compile slot and its address's turn held: %d %q; want 200", resp.StatusCode, body.Code)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Errorf("charged %v, want 20000", got)
	}
}

// One client compiles at most one unpaid request's schema at a time over
// the gateway (precheckTurns); its others wait behind it within the same
// deadline. So one address bursting compile-heavy requests, up to the
// shipped rate_limit 120 1m (Caddyfile.example), holds one of
// precheckSlots, and another address's first request is answered 402 at
// once, round after round. (Before: the burst held every slot and its
// queue, and the other address waited 5 s and was answered 503
// verification_timeout.)
func TestOneClientHoldsOneGatewayCompileSlot(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	const events = 120 // Caddyfile.example: rate_limit {$AOV_GATE_RATE:120} 1m
	base := startCaddyServers(t, proxiedClients, "", gateSite(up.URL, fac, 0, "rate_limit "+strconv.Itoa(events)+" 1m"))
	url := base + "/verify/schema"

	bodies := make([]string, events)
	for i := range bodies {
		bodies[i] = compileHeavyRequest(1000 + i)
	}
	for round := 1; round <= 2; round++ {
		var wg sync.WaitGroup
		var mu sync.Mutex
		start := make(chan struct{})
		burst := map[int]int{}
		for i := range events {
			wg.Go(func() {
				<-start
				resp := post(t, url, bodies[i], from("198.51.100.7"))
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				burst[resp.StatusCode]++
				mu.Unlock()
			})
		}
		close(start)
		time.Sleep(150 * time.Millisecond)
		t0 := time.Now()
		resp := post(t, url, validRequest, from("203.0.113."+strconv.Itoa(round)))
		took := time.Since(t0)
		var body struct {
			Code string `json:"code"`
		}
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		wg.Wait()
		t.Logf("round %d: one address's burst (rate_limit %d 1m): statuses %v; another address: %d %q after %v", round, events, burst, resp.StatusCode, body.Code, took)
		if resp.StatusCode != http.StatusPaymentRequired || took > 2*time.Second {
			t.Errorf("round %d: another address's first unpaid request while one address bursts compile-heavy requests: %d %q after %v; want 402 within 2 s", round, resp.StatusCode, body.Code, took)
		}
	}
}

// An unpaid request that waited for its client's compile turn (another
// of its requests compiling, precheckTurns) and timed out cost the
// gateway a wait, as a 402 costs a compile: it counts against its
// client's rate_limit, so a client cannot hold requests open against its
// own turn for free, round after round. (Before: a 503
// verification_timeout counted nothing.)
func TestATimedOutUnpaidCompileCountsAgainstItsClient(t *testing.T) {
	_, fac := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, gateSite(up.URL, fac, 0, "rate_limit 2 1h"))
	url := base + "/verify/schema"
	shortenPrecheckWait(t, 100*time.Millisecond)
	holdTurn(t, "127.0.0.1")
	var got []int
	for range 3 {
		resp := post(t, url, validRequest, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got = append(got, resp.StatusCode)
	}
	if want := []int{http.StatusServiceUnavailable, http.StatusServiceUnavailable, http.StatusTooManyRequests}; !slices.Equal(got, want) {
		t.Errorf("three unpaid requests, the client's compile turn taken, rate_limit 2 1h: %v; want %v (each timed-out wait counted)", got, want)
	}
}

// holdCompileSlots takes every one of the gateway's unpaid compile slots
// (precheckSlots) until the test ends, as requests of other addresses
// compiling their schemas would.
func holdCompileSlots(t *testing.T) {
	t.Helper()
	for range cap(precheckSlots) {
		precheckSlots <- struct{}{}
	}
	t.Cleanup(func() {
		for range cap(precheckSlots) {
			<-precheckSlots
		}
	})
}

// shortenPrecheckWait sets precheckWait to d until the test ends.
func shortenPrecheckWait(t *testing.T, d time.Duration) {
	t.Helper()
	old := precheckWait
	precheckWait = d
	t.Cleanup(func() { precheckWait = old })
}

// holdTurn takes client's compile turn (precheckTurns) until the test
// ends, as one of its requests compiling would.
func holdTurn(t *testing.T, client string) {
	t.Helper()
	turn := precheckTurns.join(client)
	turn.c <- struct{}{}
	t.Cleanup(func() {
		<-turn.c
		precheckTurns.leave(client, turn)
	})
}

// uncheckedOffers reads aov_x402_offers_unchecked_total.
func uncheckedOffers(t *testing.T) float64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.uncheckedOffers.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
