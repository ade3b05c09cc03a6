package caddymodule

import (
	"encoding/json"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// Two gateways on one real Redis store: A's settling write lands, its
// reply is lost, and A stays cut off from Redis (landed_blip_redis: the
// fault is A's link alone) for longer than the buyer waits; B's link is
// fine (plain `store redis`). The buyer's retry reaches B, which keeps
// nothing of A's in memory: within the attempt span, by Redis's clock, a
// claim settled under its bare transaction may be A's unacknowledged one,
// so B answers 503 settlement_pending, charged (do not pay again), and
// runs nothing. Once A's link is back and A has written the settled
// record with the answer it held, B serves that answer, and the upstream
// does not run again. Before, B
// answered 402 payment_already_used ("sign a new one"): the buyer paid
// twice for one answer.
func TestSettleWriteLandedWhileOnlyItsGatewayIsCutOff(t *testing.T) {
	defer func(w []time.Duration) { unrecordedWaits = w }(unrecordedWaits)
	unrecordedWaits = []time.Duration{20 * time.Millisecond}
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	srv := servers.StartRedis(t)
	site := func(host, storeModule string) string {
		return strings.Replace(landedSite(up.URL, storeModule+" "+srv.Addr+" {\n\t\t\t\tprefix cutoff\n\t\t\t}", "after"), ":{port}", "http://"+host+":{port}", 1)
	}
	base := startCaddy(t, site("a.test", "landed_blip_redis")+site("b.test", "redis"))
	on := func(host, sig string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, base+"/verify/schema", strings.NewReader(validRequest))
		req.Host = host
		if sig != "" {
			req.Header.Set(x402.HeaderPaymentSignature, sig)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, on("a.test", "")), 6)

	startLandedOutage(t)
	wantSettledUnrecorded(t, on("a.test", sig))
	calls := up.calls.Load()
	asIfAnotherGateway() // B is another process: A's memory is not its own

	// A is still cut off: B's answer, twice (the buyer retries as told).
	for range 2 {
		resp := on("b.test", sig)
		b := readAll(t, resp)
		var e struct {
			Code      string `json:"code"`
			Retryable bool   `json:"retryable"`
			Charged   bool   `json:"charged"`
		}
		if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(b, &e) != nil || e.Code != "settlement_pending" ||
			!e.Retryable || !e.Charged || resp.Header.Get("Retry-After") == "" || resp.Header.Get(x402.HeaderPaymentResponse) != "" ||
			strings.Contains(string(b), `"payment":"paid"`) || strings.Contains(string(b), sig[:40]) {
			t.Fatalf("the retry through B while A is cut off: %d %.300s; want 503 settlement_pending, charged, retryable, nothing delivered", resp.StatusCode, b)
		}
	}
	if n := up.calls.Load() - calls; n != 0 {
		t.Fatalf("B ran the upstream %d time(s) while A held the answer", n)
	}

	written := counterValue(t, "settled_unrecorded_written")
	landedOutage.Store(0) // A's link is back: its writer converts the record
	waitUnrecordedWritten(t, written)

	// The answer A held, the one the payment bought (again on a further
	// retry, as any held answer is): the upstream does not run again.
	var first []byte
	for i := range 2 {
		resp := on("b.test", sig)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || !strings.Contains(string(b), `"payment":"paid"`) ||
			(first != nil && string(b) != string(first)) {
			t.Fatalf("retry %d through B once A wrote the record: %d %.300s; want the paid answer A held", i, resp.StatusCode, b)
		}
		first = b
	}
	if n := up.calls.Load() - calls; n != 0 {
		t.Fatalf("the upstream ran %d more time(s); the answer was held", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v in all, want 20000 once", got)
	}
}
