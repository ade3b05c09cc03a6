package caddymodule

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

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
	on := func(host, sig string) *http.Response { return postPaidOn(t, base+"/verify/schema", host, sig) }
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

// A reload points the gateway at a new store while it keeps a settlement
// the old store did not record, and the old store stays down (landed_blip:
// the write landed, every further one fails). The kept settlement holds
// the old config's store open, but only for a bounded time after the
// reload (unrecordedAfterUnload, the attempt span; shortened here): then it
// is given up with an Error naming the transaction, payer, amount and
// network, so the operator can make it good, and the old config's
// cleanup runs (Badger's folder lock is released). Before, it kept trying
// every 5 s until the claim lapsed (up to 7 days), holding the old
// config's store, facilitator and modules open all that while.
func TestReloadGivesUpAnUnrecordedSettlementWithinABound(t *testing.T) {
	defer func(w []time.Duration, a func(*Gate) time.Duration) {
		unrecordedWaits, unrecordedAfterUnload = w, a
	}(unrecordedWaits, unrecordedAfterUnload)
	unrecordedWaits = []time.Duration{20 * time.Millisecond}
	unrecordedAfterUnload = func(*Gate) time.Duration { return 300 * time.Millisecond }
	sharedDevnet(t)
	up := newUpstream(t)
	oldDir, newDir := t.TempDir(), t.TempDir()
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	loadCaddyServers(t, port, "", logFile, landedSite(up.URL, "landed_blip_badger "+filepath.Join(oldDir, "gate"), "after"))
	t.Cleanup(func() { caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/verify/schema", port)
	payer := evmfacilitator.DevAccounts()[6].Address
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 6)

	startLandedOutage(t) // and it lasts: the old store never comes back
	wantSettledUnrecorded(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	var tx string
	for _, line := range logLines(t, logFile) {
		if line["level"] == "error" && strings.HasPrefix(line["msg"].(string), "payment settled but not recorded") {
			tx, _ = line["transaction"].(string)
		}
	}
	if tx == "" {
		t.Fatal("the settlement the store did not record was not logged with its transaction")
	}

	loadCaddyServers(t, port, "", logFile, landedSite(up.URL, "badger "+filepath.Join(newDir, "gate"), "after"))
	openClosed(t, filepath.Join(oldDir, "gate")) // the old config's cleanup ran

	var given map[string]any
	for _, line := range logLines(t, logFile) {
		if line["level"] == "error" && line["transaction"] == tx && strings.Contains(line["msg"].(string), "given up") && strings.Contains(line["msg"].(string), "unloaded") {
			given = line
		}
	}
	if given == nil || !strings.EqualFold(given["payer"].(string), payer.Hex()) || given["amount"] != "20000" || given["network"] != "eip155:1337" {
		t.Fatalf("no Error naming the settlement given up (transaction %s, payer, amount, network): %v", tx, given)
	}
	sum := sha256.Sum256([]byte(sig))
	if findUnrecorded(claimPayloadPrefix+hex.EncodeToString(sum[:])) != nil {
		t.Fatal("the settlement given up is still kept")
	}
}

// logLines reads the JSON log lines Caddy wrote to file.
func logLines(t *testing.T, file string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var lines []map[string]any
	for _, l := range bytes.Split(b, []byte("\n")) {
		var m map[string]any
		if json.Unmarshal(l, &m) == nil {
			lines = append(lines, m)
		}
	}
	return lines
}

// wipedUnderPaidCall makes a paid call through host on base whose store,
// a real Redis without persistence, dies while the upstream runs (after
// the claim, before the settlement is recorded) and comes back empty, as
// a restart without its data or a failover to a replica the claim had not
// reached leaves it: the transfer is made, the gateway keeps it
// unrecorded (503 settlement_pending, charged), and the store has no
// claim of the payment left. It returns the payment.
func wipedUnderPaidCall(t *testing.T, srv *servers.Redis, up *upstream, base, host string, payerIdx int) string {
	t.Helper()
	sig := signFor(t, paymentRequired(t, postPaidOn(t, base+"/verify/schema", host, "")), payerIdx)
	var kill atomic.Bool
	kill.Store(true)
	up.during = func() {
		if kill.CompareAndSwap(true, false) {
			srv.Stop()
		}
	}
	wantSettledUnrecorded(t, postPaidOn(t, base+"/verify/schema", host, sig))
	srv.Start() // empty
	return sig
}

// The store loses the claim of a settlement this gateway keeps unrecorded
// (Redis restarts empty). The buyer's retry on this gateway is served the
// answer held for it, with its settlement; the upstream does not run
// again and nothing more is charged. The background writer is kept out of
// the way (an hour between its tries): the retry itself writes the
// claim again, before it claims anything. Before, the kept settlement was
// dropped ("make it good by hand") and the retry claimed the spent payment
// afresh: 402 nonce already used, on every retry, to a buyer who paid.
func TestUnrecordedSettlementSurvivesAWipedStore(t *testing.T) {
	defer func(w []time.Duration) { unrecordedWaits = w }(unrecordedWaits)
	unrecordedWaits = []time.Duration{time.Hour}
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	srv := servers.StartRedis(t)
	base := startCaddy(t, strings.Replace(landedSite(up.URL, "redis "+srv.Addr+" {\n\t\t\t\tprefix wiped\n\t\t\t}", "after"), ":{port}", "http://a.test:{port}", 1))
	payer := evmfacilitator.DevAccounts()[5].Address
	before := balance(t, d, payer)
	sig := wipedUnderPaidCall(t, srv, up, base, "a.test", 5)
	calls := up.calls.Load()

	var first []byte
	for i := range 2 {
		resp := postPaidOn(t, base+"/verify/schema", "a.test", sig)
		b := readAll(t, resp)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || !strings.Contains(string(b), `"payment":"paid"`) ||
			(first != nil && !bytes.Equal(b, first)) {
			t.Fatalf("retry %d once the store is back empty: %d %.300s; want the paid answer held for it", i, resp.StatusCode, b)
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

// The same, with the buyer's retries reaching another gateway on the same
// Redis, which keeps nothing of the first one's memory
// (asIfAnotherGateway). A retry that comes before the first gateway has
// written the claim again claims the spent payment afresh and is refused,
// uncharged, running nothing; the first gateway's writer never overwrites
// that claim, and writes its record once it is released. Then the retry
// is served the held answer, on any gateway, and the upstream ran once:
// one delivery for one payment.
func TestUnrecordedSettlementSurvivesAWipedStoreElsewhere(t *testing.T) {
	defer func(w []time.Duration) { unrecordedWaits = w }(unrecordedWaits)
	unrecordedWaits = []time.Duration{50 * time.Millisecond}
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	srv := servers.StartRedis(t)
	site := func(host string) string {
		return strings.Replace(landedSite(up.URL, "redis "+srv.Addr+" {\n\t\t\t\tprefix wiped2\n\t\t\t}", "after"), ":{port}", "http://"+host+":{port}", 1)
	}
	base := startCaddy(t, site("a.test")+site("b.test"))
	payer := evmfacilitator.DevAccounts()[7].Address
	before := balance(t, d, payer)
	written := counterValue(t, "settled_unrecorded_written")
	sig := wipedUnderPaidCall(t, srv, up, base, "a.test", 7)
	calls := up.calls.Load()
	asIfAnotherGateway()

	served := 0
	for deadline := time.Now().Add(20 * time.Second); served < 2; {
		if time.Now().After(deadline) {
			t.Fatal("the retries through B were never served the answer A held")
		}
		resp := postPaidOn(t, base+"/verify/schema", "b.test", sig)
		b := readAll(t, resp)
		switch {
		case resp.StatusCode == http.StatusOK && strings.Contains(string(b), `"payment":"paid"`) && resp.Header.Get(x402.HeaderPaymentResponse) != "":
			served++
		case resp.StatusCode == http.StatusOK:
			t.Fatalf("a 200 without the paid answer: %.300s", b)
		default:
			time.Sleep(20 * time.Millisecond) // refused as the spent payment it is, or pending: never charged again
		}
	}
	if counterValue(t, "settled_unrecorded_written") < written+1 {
		t.Fatal("served, but not from the record A wrote again")
	}
	if n := up.calls.Load() - calls; n != 0 {
		t.Fatalf("the upstream ran %d more time(s); the answer was held", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v in all, want 20000 once", got)
	}
}

// One payment counts as one paid verification (README: "so one payment
// counts once"), also when its settlement went through and the store did
// not record it (settled_unrecorded): nothing is delivered then (503
// settlement_pending), and an answer over maxHeldAnswer is not kept for
// the retry, which runs the upstream again, a verification verifierd
// records paid of its own. So the first one is reported unpaid, the one
// rule of heldPayment. (Before: it was reported paid at once, and the run
// again was a second paid verification of one payment.)
func TestUnrecordedSettlementWhoseAnswerIsNotKeptCountsOnce(t *testing.T) {
	defer func(w []time.Duration) { unrecordedWaits = w }(unrecordedWaits)
	unrecordedWaits = []time.Duration{20 * time.Millisecond}
	_, _ = sharedDevnet(t)
	fakeHistoryReset()
	fakeHistoryBig.Store(true)
	defer fakeHistoryBig.Store(false)
	base := startCaddy(t, fakeHistorySite("landed_blip_badger "+gateDir(t), "faulty_devnet none"))
	url := base + "/v1/verify"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 6)

	startLandedOutage(t)
	resp := post(t, url, `{"x":1}`, map[string]string{x402.HeaderPaymentSignature: sig})
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %d %.200s; want 503 (settled, unrecorded)", resp.StatusCode, b)
	}
	written := counterValue(t, "settled_unrecorded_written")
	landedOutage.Store(0)
	waitUnrecordedWritten(t, written)

	resp = post(t, url, `{"x":1}`, map[string]string{x402.HeaderPaymentSignature: sig})
	b = readAll(t, resp)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("retry: %d %.200s; want 200", resp.StatusCode, b)
	}
	waitFor(t, "both calls' reports", func() bool { // they go in the background
		_, pays, _ := fakeHistoryRecords()
		return len(pays) >= 2 && !slices.Contains(pays, "pending")
	})
	ids, pays, reports := fakeHistoryRecords()
	paid := 0
	for _, p := range pays {
		if p == "paid" {
			paid++
		}
	}
	if paid != 1 {
		t.Errorf("one payment, %d paid verifications: records %v %v, reports %q; want exactly one paid (the undelivered first one unpaid, as heldPayment rules)", paid, ids, pays, reports)
	}
}

// A settlement that went through unrecorded delivers nothing (503
// settlement_pending, charged), so no history can be behind it: its report
// goes in the background, and a stalled verifierd does not hold the
// buyer's answer. (Before: the paid report was sent before the 503, which
// waited reportTimeout, 5 s, more.)
func TestUnrecordedSettlementAnswerDoesNotWaitForItsReport(t *testing.T) {
	defer func(w []time.Duration) { unrecordedWaits = w }(unrecordedWaits)
	unrecordedWaits = []time.Duration{20 * time.Millisecond}
	_, _ = sharedDevnet(t)
	fakeHistoryReset()
	base := startCaddy(t, fakeHistorySite("landed_blip_badger "+gateDir(t), "faulty_devnet none"))
	url := base + "/v1/verify"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	defer func(d time.Duration) { reportTimeout = d }(reportTimeout)
	reportTimeout = 60 * time.Second // a report waited for would hold the answer a minute
	fakeHistoryStall.Store(int64(90 * time.Second))
	defer fakeHistoryStall.Store(0)

	startLandedOutage(t)
	start := time.Now()
	resp := post(t, url, `{"x":3}`, map[string]string{x402.HeaderPaymentSignature: sig})
	b := readAll(t, resp)
	took := time.Since(start)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first call: %d %.200s; want 503 (settled, unrecorded)", resp.StatusCode, b)
	}
	// settleWriteWaits add 2.6 s; a report waited for would add a minute.
	if took > 30*time.Second {
		t.Errorf("the 503 settlement_pending (nothing delivered) took %v: held by the paid report to a stalled verifierd; want it at once, the report in the background", took.Round(100*time.Millisecond))
	}
}
