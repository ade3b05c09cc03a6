package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// outcome is one request of the fault load.
type outcome struct {
	paid     bool
	status   int
	settled  bool // a 2xx with a successful PAYMENT-RESPONSE
	free     bool // a 2xx served from the free allowance
	retry    bool // the same payment again, after settlement_pending
	start    time.Time
	took     time.Duration
	body     []byte
	transErr error
}

// Paid and free verifications run through Caddy while verifierd, certd and
// the facilitator (its own process here, examples/facilitator/Caddyfile
// with the devnet inside it; the gate reaches it with AOV_FACILITATOR=remote)
// are stalled (SIGSTOP), killed (SIGKILL) and restarted. A buyer told
// settlement_pending retries the same payment, as the answer says, until it
// is served or refused. Afterwards the books balance: the test USDC that
// left the payers is exactly the price of the answers delivered with
// PAYMENT-RESPONSE, the free calls counted are the free answers delivered,
// every 2xx carries a receipt that verifies, no request waited longer than
// its deadlines plus a margin, and verifierd's history counts as paid
// exactly the settled calls.
func TestBooksBalanceUnderFaults(t *testing.T) {
	const (
		freePerDay = 1000
		workers    = 4
		agent      = "e2e-fault-load"
		price      = 20000
	)
	fac := startFacilitator(t)
	s := faultStack(t, append(fac.remoteFacilitatorEnv(), "AOV_FREE_PER_DAY="+strconv.Itoa(freePerDay), "AOV_GATE_RATE=1000000000")...)
	s.devnetRPC = fac.rpc // the chain is the facilitator's
	body := bytes.Replace(example(t, "invoice-fixed.json"), []byte(`"test-seller-1"`), []byte(`"`+agent+`"`), 1)
	req, resource := offer(t, s)
	payers := evmfacilitator.DevAccounts()[1 : 1+workers]
	before := make([]*big.Int, len(payers))
	for i, p := range payers {
		before[i] = usdc(t, s, req.Asset, p.Address)
	}

	// Payments valid for 30 s: one whose settlement never went out is
	// released (and refused with 402) soon after, rather than pending for
	// the default minute.
	short := req
	short.MaxTimeoutSeconds = 30
	ctx, stop := context.WithCancel(context.Background())
	var mu sync.Mutex
	var outs []outcome
	var pendingRetries, unresolved int
	var wg sync.WaitGroup
	send := func(hdr map[string]string, retry bool) outcome {
		o := outcome{paid: hdr[x402.HeaderPaymentSignature] != "", retry: retry}
		r, _ := http.NewRequest(http.MethodPost, s.url("/verify/schema"), bytes.NewReader(body))
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		start := time.Now()
		resp, err := client.Do(r)
		if err == nil {
			o.body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			o.status = resp.StatusCode
			if o.status < 300 {
				var sr x402.SettleResponse
				if x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr) == nil && sr.Success {
					o.settled = true
				} else if resp.Header.Get("Free-Allowance-Remaining") != "" {
					o.free = true
				}
			}
		}
		o.start, o.took, o.transErr = start, time.Since(start), err
		mu.Lock()
		outs = append(outs, o)
		mu.Unlock()
		return o
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				hdr := map[string]string{"Content-Type": "application/json"}
				if i%2 == 0 {
					send(hdr, false)
					continue
				}
				p, err := x402.SignExactEVM(payers[w].Key(), short, &resource, time.Now())
				if err != nil {
					panic(err)
				}
				sig, _ := x402.EncodeHeader(p)
				hdr[x402.HeaderPaymentSignature] = sig
				first := time.Now()
				for o := send(hdr, false); o.status == http.StatusServiceUnavailable && bytes.Contains(o.body, []byte(`"settlement_pending"`)); o = send(hdr, true) {
					if time.Since(first) > 90*time.Second {
						mu.Lock()
						unresolved++
						mu.Unlock()
						break
					}
					mu.Lock()
					pendingRetries++
					mu.Unlock()
					time.Sleep(time.Second)
				}
			}
		}()
	}

	// The faults, one after another, with service in between.
	step := func(d time.Duration) { time.Sleep(d) }
	step(2 * time.Second)
	s.verifierd.pause(t)
	step(4 * time.Second)
	s.verifierd.resume(t)
	step(2 * time.Second)
	s.certd.pause(t)
	step(4 * time.Second)
	s.certd.resume(t)
	step(2 * time.Second)
	s.verifierd.kill(t) // crashes; the test restarts it as a supervisor would
	step(time.Second)
	s.startVerifierd(t)
	s.certd.kill(t)
	step(time.Second)
	s.startCertd(t, false)
	step(3 * time.Second)
	fac.p.pause(t)
	step(5 * time.Second)
	fac.p.resume(t)
	step(3 * time.Second)
	fac.p.kill(t) // crashes (its chain is on disk); restarted as a supervisor would
	step(time.Second)
	fac.start(t)
	step(4 * time.Second)
	stop()
	wg.Wait()

	var settled, free, unavailable, released, other int
	var maxFree, maxPaid time.Duration
	delivered := map[string]bool{} // verification ids of the free answers
	for i, o := range outs {
		if o.transErr != nil {
			t.Errorf("request %d: %v", i, o.transErr)
			continue
		}
		switch {
		case o.settled:
			settled++
		case o.free:
			free++
			delivered[decodeID(t, o.body)] = true
		case o.status == http.StatusServiceUnavailable:
			unavailable++
		case o.status == http.StatusPaymentRequired && o.retry:
			// Its settlement never went out and it expired: released,
			// nothing charged, the buyer asked for a new payment.
			released++
		default:
			other++
			t.Errorf("request %d (paid %v): status %d: %.200s", i, o.paid, o.status, o.body)
		}
		if o.paid {
			maxPaid = max(maxPaid, o.took)
		} else {
			maxFree = max(maxFree, o.took)
		}
		if o.status < 300 {
			if out, code := verifyReceipt(t, s, fmt.Sprintf("r%d.json", i), o.body); code != 0 {
				t.Errorf("request %d: the receipt does not verify: %s", i, out)
			}
		}
	}
	// A free call waits at most the upstream deadline (certd's signer
	// deadline inside it); a paid one also waits for the facilitator's
	// verify and settle, each bounded by the facilitator deadline (a
	// retry's chain read too).
	if limit := testUpstreamTimeout + deadlineMargin; maxFree > limit {
		t.Errorf("a free call waited %v, over %v", maxFree, limit)
	}
	if limit := testUpstreamTimeout + 2*testFacilitatorTimeout + deadlineMargin; maxPaid > limit {
		t.Errorf("a paid call waited %v, over %v", maxPaid, limit)
	}
	if unresolved != 0 {
		t.Errorf("%d payments were still settlement_pending after 90 s of retries", unresolved)
	}

	var spent int64
	for i, p := range payers {
		spent += new(big.Int).Sub(before[i], usdc(t, s, req.Asset, p.Address)).Int64()
	}
	// One more free call tells how many the gateway counted.
	last := post(t, s.url("/verify/schema"), body)
	mustStatus(t, last, http.StatusOK)
	remaining, _ := strconv.Atoi(last.header.Get("Free-Allowance-Remaining"))
	counted := freePerDay - remaining - 1

	// Outcome reports the upstream could not take while it was down are
	// retried by the gateway for up to 15 s: wait, up to twice that (a
	// loaded machine runs the retries late), until the gateway has had a
	// paid report taken for each settled call. Reading the history stops
	// verifierd, so it is read once, after.
	for deadline := time.Now().Add(30 * time.Second); s.gatewayOutcomes(t, "reported_paid") < settled; time.Sleep(200 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Logf("the gateway had %d paid reports taken for %d settled calls after 30 s", s.gatewayOutcomes(t, "reported_paid"), settled)
			break
		}
	}
	var historyPaid, historyPending int
	kinds := map[string]int{}
	var undelivered []store.Verification
	lastID := decodeID(t, last.body)
	for _, v := range s.historyAll(t, agent) {
		kinds[v.Payment]++
		if v.Payment == store.PaymentFree && !delivered[v.ID] && v.ID != lastID {
			undelivered = append(undelivered, v)
		}
		switch v.Payment {
		case store.PaymentPaid:
			historyPaid++
		case store.PaymentPending:
			historyPending++
		}
	}
	t.Logf("history by payment: %v", kinds)
	t.Logf("requests %d: settled %d, free %d, 503 %d (of which settlement_pending retried with the same payment: %d), released after pending %d, other %d; max wait free %v, paid %v",
		len(outs), settled, free, unavailable, pendingRetries, released, other, maxFree, maxPaid)
	t.Logf("on chain %d atomic units = %d x %d; free calls counted %d for %d delivered; history paid %d (pending, never delivered: %d)",
		spent, spent/price, price, counted, free, historyPaid, historyPending)
	if settled == 0 || free == 0 || unavailable == 0 {
		t.Errorf("the load did not see service and faults: settled %d, free %d, 503 %d", settled, free, unavailable)
	}
	if spent != int64(settled)*price {
		t.Errorf("the payers paid %d, but %d answers were delivered paid (%d)", spent, settled, int64(settled)*price)
	}
	if counted != free {
		t.Errorf("the gateway counted %d free calls, %d were delivered", counted, free)
	}
	if historyPaid != settled {
		t.Errorf("history has %d paid calls, %d were settled", historyPaid, settled)
	}
	// Free verifications a stalled verifierd finished after the gateway gave
	// up are not recorded (X-Aov-Answer-By, checked again when the write is
	// made): history holds the free answers delivered, plus the one that
	// read the count, plus records whose commit was already under way when
	// the gateway stopped waiting (verifierd stopped or killed mid-write, or
	// a write that committed at its deadline on a starved machine). Each of
	// those belongs to its own free call that the gateway answered 503, and
	// was verified while that call waited.
	if got := kinds[store.PaymentFree]; got != free+1+len(undelivered) {
		t.Errorf("history has %d free calls: %d delivered, %d not (+1 that read the count)", got, free, len(undelivered))
	}
	var refused []outcome // free calls answered 503, by when they ended
	for _, o := range outs {
		if !o.paid && o.status == http.StatusServiceUnavailable {
			refused = append(refused, o)
		}
	}
	slices.SortFunc(refused, func(a, b outcome) int { return a.start.Add(a.took).Compare(b.start.Add(b.took)) })
	slices.SortFunc(undelivered, func(a, b store.Verification) int { return a.VerifiedAt.Compare(b.VerifiedAt) })
	for _, v := range undelivered {
		// The waiting call that ends first takes the record: for points in
		// order, that matches as many as any assignment can.
		i := slices.IndexFunc(refused, func(o outcome) bool {
			return !v.VerifiedAt.Before(o.start) && !v.VerifiedAt.After(o.start.Add(o.took))
		})
		if i < 0 {
			t.Errorf("free call %s verified at %v was recorded but not delivered, and no free call answered 503 was waiting then",
				v.ID, v.VerifiedAt)
			continue
		}
		refused = slices.Delete(refused, i, i+1)
	}
	t.Logf("free calls recorded but answered 503 (their commit under way when the gateway gave up): %d", len(undelivered))
}

// decodeID is the verification_id of an answer.
func decodeID(t *testing.T, body []byte) string {
	t.Helper()
	id := decode[result](t, response{body: body}).VerificationID
	if id == "" {
		t.Fatalf("an answer without a verification_id: %.200s", body)
	}
	return id
}

// historyAll is every record verifierd holds for agent, all pages.
// gatewayOutcomes is the gateway's count of outcome (its
// aov_x402_outcomes_total metric, read from Caddy's admin endpoint); 0 when
// it cannot be read.
func (s *stack) gatewayOutcomes(t *testing.T, outcome string) int {
	t.Helper()
	resp, err := http.Get("http://" + s.adminAddr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	prefix := []byte(`aov_x402_outcomes_total{outcome="` + outcome + `"} `)
	for line := range bytes.Lines(b) {
		if v, ok := bytes.CutPrefix(line, prefix); ok {
			n, _ := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64)
			return int(n)
		}
	}
	return 0
}

func (s *stack) historyAll(t *testing.T, agent string) []store.Verification {
	t.Helper()
	s.verifierd.stop(t)
	db, err := store.Open(s.historyDir(), store.Options{})
	if err != nil {
		t.Fatalf("opening verifierd's history: %v", err)
	}
	defer db.Close()
	var all []store.Verification
	for cursor := ""; ; {
		recs, next, err := db.Verifications(context.Background(), agent, cursor, store.MaxPageSize)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, recs...)
		if next == "" {
			return all
		}
		cursor = next
	}
}
