package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/crypto"
	dto "github.com/prometheus/client_model/go"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/plugins/redisstore"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// faultyFacilitator is a FAKE FOR A FAULT that cannot otherwise be caused on
// demand: a facilitator that loses track of a settlement. Around the real
// devnet facilitator, its Settle either sends the settlement and then
// reports an unknown outcome (mode "lose_reply": the transfer happens, the
// reply is lost, as when a facilitator times out after sending), or reports
// an unknown outcome without sending (mode "lose_request"), or refuses the
// settlement without sending (mode "refuse": a settlement that fails for
// sure, as when the payer spent the funds between verify and settle); in
// mode "verify_pending" its Verify answers that a settlement of the
// payment is pending there. Otherwise Verify and SettlementStatus are the
// real facilitator's.
type faultyFacilitator struct {
	Mode string `json:"mode"`
	f    *evmfacilitator.Facilitator
}

func init() { caddy.RegisterModule(&faultyFacilitator{}) }

func (*faultyFacilitator) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.faulty_devnet", New: func() caddy.Module { return new(faultyFacilitator) }}
}

// faultyRelayer is the relayer of the faulty facilitators: its own account,
// so its transaction nonces never race the shared facilitator's.
const faultyRelayer = 6

func (m *faultyFacilitator) Provision(caddy.Context) error {
	if devnet == nil {
		return errors.New("faulty_devnet needs the shared devnet")
	}
	f, err := evmfacilitator.New(evmfacilitator.Config{Chain: devnet.Client(), Network: evmfacilitator.DevnetNetwork,
		RelayerKey: evmfacilitator.DevKey(faultyRelayer), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 30 * time.Second})
	m.f = f
	return err
}

// Cleanup closes the facilitator with its configuration, as the evm
// module's does (through its pool): its settlements pending go to the
// next facilitator of the key, and nothing of it outlives the test.
func (m *faultyFacilitator) Cleanup() error {
	if m.f == nil {
		return nil
	}
	return m.f.Close()
}

func (m *faultyFacilitator) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if !d.NextArg() {
		return d.ArgErr()
	}
	m.Mode = d.Val()
	return nil
}

func (m *faultyFacilitator) Verify(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.VerifyResponse, error) {
	if m.Mode == "verify_pending" {
		// The facilitator holds a settlement of this payment whose
		// outcome is not known yet (the evm facilitator's answer near
		// validBefore, evmfacilitator's own tests), which a gate meets
		// when another gate or client settled the same payment there.
		return x402.VerifyResponse{InvalidReason: x402.ReasonSettlementPending}, nil
	}
	return m.f.Verify(ctx, p, req)
}

func (m *faultyFacilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	if m.Mode == "none" {
		return m.f.Settle(ctx, p, req)
	}
	if m.Mode == "refuse" {
		return x402.SettleResponse{Success: false, ErrorReason: "insufficient_funds", Network: req.Network}, nil
	}
	if m.Mode == "lose_reply" || m.Mode == "lose_reply_stall" {
		if _, err := m.f.Settle(ctx, p, req); err != nil {
			return x402.SettleResponse{}, err
		}
	}
	if m.Mode == "pending_named" {
		// Sent, and the facilitator says so, naming its transaction.
		sr, err := m.f.Settle(ctx, p, req)
		if err != nil {
			return x402.SettleResponse{}, err
		}
		reply := x402.SettleResponse{ErrorReason: x402.ReasonSettlementPending, Transaction: sr.Transaction, Network: req.Network}
		return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Reply: &reply, Err: errors.New("fault injected: " + m.Mode)}
	}
	return x402.SettleResponse{}, &x402.UnknownOutcomeError{Op: "settle", Err: errors.New("fault injected: " + m.Mode)}
}

func (m *faultyFacilitator) Supported(ctx context.Context) (x402.SupportedResponse, error) {
	return m.f.Supported(ctx)
}

func (m *faultyFacilitator) SettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettlementStatus, error) {
	m.stall(ctx)
	return m.f.SettlementStatus(ctx, p, req)
}

// chainStall holds the chain checks of a faulty_devnet in mode
// "lose_reply_stall" (the chain read stalls) until release is closed or
// the check's deadline passes, and logs the order things happened in.
var chainStall struct {
	sync.Mutex
	release chan struct{}
	events  []string
}

func chainStallEvent(e string) {
	chainStall.Lock()
	chainStall.events = append(chainStall.events, e)
	chainStall.Unlock()
}

func (m *faultyFacilitator) stall(ctx context.Context) {
	if m.Mode != "lose_reply_stall" {
		return
	}
	chainStall.Lock()
	release := chainStall.release
	chainStall.Unlock()
	select {
	case <-release:
	case <-ctx.Done():
	}
	chainStallEvent("chain answered")
}

// sentSeen records the transactions the gate judged held records by.
var sentSeen struct {
	sync.Mutex
	list []string
}

// SentSettlementStatus records the transaction the gate names and judges
// as the real facilitator does.
func (m *faultyFacilitator) SentSettlementStatus(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements, sent x402.SentSettlement) (x402.SettlementStatus, error) {
	sentSeen.Lock()
	sentSeen.list = append(sentSeen.list, sent.Transaction)
	sentSeen.Unlock()
	m.stall(ctx)
	return m.f.SentSettlementStatus(ctx, p, req, sent)
}

// pendingSite is a paid route whose facilitator loses settlements (mode),
// with its store in storeDir (so a restart keeps it). Its public_base_url
// (as those of killSite, landedSite and solanaSite) is the one origin of a
// deployment: a gateway restarted here listens on a new port, and sites on
// other Hosts stand for its other gateways, while a held payment is
// resolved only on the resource it paid for (pricedHere).
func pendingSite(up, mode, storeDir, extra string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator faulty_devnet %[2]s
			store badger %[4]s
			public_base_url https://gateway.test
			%[5]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), mode, payTo.Hex(), storeDir, extra)
}

func charged(t *testing.T, d *evmfacilitator.Devnet, payer common.Address, before *big.Int) *big.Int {
	t.Helper()
	return new(big.Int).Sub(before, balance(t, d, payer))
}

// restartedPayment is a payment whose answer a gateway lost, the transfer
// made, before that gateway restarted on the same store: what a restart
// test retries and counts against.
type restartedPayment struct {
	url      string // the paid route of the restarted gateway
	sig      string // the payment's PAYMENT-SIGNATURE
	payer    common.Address
	before   *big.Int  // the payer's balance before it paid
	signedAt time.Time // when it signed: its validBefore is counted from then
}

// payThenRestart is the opening every restart test shares: a gateway on
// site is paid by development key key, the answer is lost as lose says,
// the payer is charged the one transfer, and the gateway stops; restart
// then starts the next one on the same store and returns its base URL.
// The restart is the test's own, as what it reads the held record with
// (the facilitator, a rpc, a log) is what each test is about.
func payThenRestart(t *testing.T, d *evmfacilitator.Devnet, site string, key int, lose func(t *testing.T, url, sig string), restart func() string) restartedPayment {
	t.Helper()
	url := startCaddy(t, site) + "/verify/schema"
	p := restartedPayment{payer: evmfacilitator.DevAccounts()[key].Address}
	p.before = balance(t, d, p.payer)
	p.sig = signFor(t, paymentRequired(t, post(t, url, "", nil)), key)
	p.signedAt = time.Now()
	lose(t, url, p.sig)
	if got := charged(t, d, p.payer, p.before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v before the restart, want the one transfer (20000)", got)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	p.url = restart() + "/verify/schema"
	return p
}

// replyLost pays url with sig through a facilitator that sends the
// settlement and loses its reply: the answer is 503 and nothing is served.
func replyLost(t *testing.T, url, sig string) {
	t.Helper()
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(string(b), "paid_content") {
		t.Fatalf("first try: status %d: %s", resp.StatusCode, b)
	}
}

// killedMidSettlement pays url with sig through a facilitator that kills
// the request after the settlement was sent (killedFacilitator,
// fakeKilledHTTP): no answer at all.
func killedMidSettlement(t *testing.T, url, sig string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(validRequest))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(x402.HeaderPaymentSignature, sig)
	if resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("the killed request was answered: %d", resp.StatusCode)
	}
}

// A settlement whose reply was lost (the transfer happened): the buyer's
// retry with the same payment gets the answer that was held back, with
// PAYMENT-RESPONSE, and is charged once; the held answer survives a restart
// of the gateway; further retries get the same answer and no new charge.
func TestUnknownSettlementResolvedOnRetry(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	site := pendingSite(up.URL, "lose_reply", gateDir(t), "")
	// The gateway restarts before the buyer retries.
	p := payThenRestart(t, d, site, 7, replyLost, func() string { return startCaddy(t, site) })
	calls := up.calls.Load()

	for i := range 2 {
		resp := post(t, p.url, validRequest, map[string]string{x402.HeaderPaymentSignature: p.sig})
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("retry %d: status %d: %s", i+1, resp.StatusCode, b)
		}
		var sr x402.SettleResponse
		if err := x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr); err != nil || !sr.Success || !strings.EqualFold(sr.Payer, p.payer.Hex()) {
			t.Fatalf("retry %d: PAYMENT-RESPONSE (%v) %+v", i+1, err, sr)
		}
		paidBy(t, d, sr.Transaction)
		if m := readJSON(t, resp); m["paid_content"] != true || m["payment"] != "paid" {
			t.Fatalf("retry %d: body %v", i+1, m)
		}
	}
	if n := up.calls.Load(); n != calls {
		t.Fatalf("the upstream ran %d more times; the held answer should have been served", n-calls)
	}
	if got := charged(t, d, p.payer, p.before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v after the retries, want exactly one transfer", got)
	}
}

// paidBy checks that tx, named in a PAYMENT-RESPONSE, is a successful
// transaction moving test USDC to payTo.
func paidBy(t *testing.T, d *evmfacilitator.Devnet, tx string) {
	t.Helper()
	if len(common.FromHex(tx)) != common.HashLength {
		t.Fatalf("PAYMENT-RESPONSE names the transaction %q, want the settlement's hash", tx)
	}
	r, err := d.Client().TransactionReceipt(context.Background(), common.HexToHash(tx))
	if err != nil || r.Status != 1 {
		t.Fatalf("the transaction %s named as the payment: receipt %+v, %v", tx, r, err)
	}
	transfer := crypto.Keccak256Hash([]byte("Transfer(address,address,uint256)"))
	for _, l := range r.Logs {
		if l.Address == d.Token() && len(l.Topics) == 3 && l.Topics[0] == transfer && common.BytesToAddress(l.Topics[2].Bytes()) == payTo {
			return
		}
	}
	t.Fatalf("the transaction %s named as the payment pays nothing to payTo", tx)
}

// A settlement that never went out: while the authorization is valid the
// retry is told the outcome is pending (never asked to pay again); once it
// has expired unused, the claim is released and the retry is told to sign
// a new payment; nothing was charged and nothing was served.
func TestUnknownSettlementReleasedOnceExpired(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_request", gateDir(t), ""))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	sig := signExpiring(t, d, paymentRequired(t, post(t, url, "", nil)), 6, 8)
	var pl x402.PaymentPayload
	if err := x402.DecodeHeader(sig, &pl); err != nil {
		t.Fatal(err)
	}
	var ev x402.ExactEVMPayload
	if err := json.Unmarshal(pl.Payload, &ev); err != nil {
		t.Fatal(err)
	}

	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: status %d", resp.StatusCode)
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if e := readJSON(t, resp); resp.StatusCode != http.StatusServiceUnavailable || e["code"] != "settlement_pending" {
		t.Fatalf("retry while valid: status %d %v", resp.StatusCode, e)
	}
	// Wait until the chain's head is past validBefore (idle blocks come
	// every 2 s).
	var vb int64
	fmt.Sscan(ev.Authorization.ValidBefore, &vb)
	deadline := time.Now().Add(40 * time.Second)
	for {
		h, err := d.Client().HeaderByNumber(context.Background(), nil)
		if err == nil && int64(h.Time) >= vb {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the chain did not reach validBefore")
		}
		time.Sleep(200 * time.Millisecond)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || strings.Contains(string(b), "paid_content") {
		t.Fatalf("retry after expiry: status %d: %s", resp.StatusCode, b)
	}
	if got := charged(t, d, payer, before); got.Sign() != 0 {
		t.Fatalf("charged %v for a settlement that never happened", got)
	}
}

// The background pass resolves an unknown settlement without any retry:
// the claim is marked settled, and a later retry is served from it.
func TestUnknownSettlementResolvedInTheBackground(t *testing.T) {
	old := resolveInterval
	resolveInterval = 100 * time.Millisecond
	t.Cleanup(func() { resolveInterval = old })
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), ""))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[5].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 5)
	resolved := func() float64 { return counterValue(t, "unknown_resolved_settled") }
	start := resolved()
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: status %d", resp.StatusCode)
	}
	deadline := time.Now().Add(10 * time.Second)
	for resolved() == start {
		if time.Now().After(deadline) {
			t.Fatal("the background pass did not resolve the settlement")
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("retry: status %d", resp.StatusCode)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want exactly one transfer", got)
	}
}

// The background pass sends the outcomes it resolved in the background:
// while verifierd stalls, it does not wait a report's attempt
// (reportTimeout, 5 s) per record it resolves before it resolves the next.
// (Before: it sent each report itself, so each held record after the
// first was resolved 5 s later than the one before.)
func TestResolvePassDoesNotWaitForItsReports(t *testing.T) {
	old := resolveInterval
	resolveInterval = 300 * time.Millisecond
	t.Cleanup(func() { resolveInterval = old })
	_, _ = sharedDevnet(t)
	up := newReportingUpstream(t)
	up.stall.Store(true)
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), ""))
	url := base + "/verify/schema"
	offer := paymentRequired(t, post(t, url, "", nil))
	resolved := func() float64 { return counterValue(t, "unknown_resolved_settled") }
	start := resolved()
	for _, key := range []int{3, 4} {
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: signFor(t, offer, key)})
		if b := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("paid call: %d %.300s; want 503 settlement_pending", resp.StatusCode, b)
		}
	}
	var first time.Time
	for deadline := time.Now().Add(20 * time.Second); resolved() < start+2; time.Sleep(20 * time.Millisecond) {
		if first.IsZero() && resolved() >= start+1 {
			first = time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the background pass resolved %v of the 2 held payments", resolved()-start)
		}
	}
	if !first.IsZero() {
		if gap := time.Since(first); gap > 3*time.Second {
			t.Errorf("the second held payment was resolved %v after the first; want within a pass or two, not after the first one's report to the stalled upstream", gap.Round(100*time.Millisecond))
		}
	}
}

// After a reload that moves the upstream, an outcome the background pass
// resolves goes to neither upstream: not through the unloaded config's
// chain, and not to the upstream the live config names, which never
// recorded the verification, even once the new gate has served a request.
// It is kept, with a Warning naming it, for a gate whose route leads to
// the upstream that recorded it. (Before: the report went to the upstream
// the live config names once its gate served a request, and that
// upstream learned a verification id not its own.)
func TestResolvedOutcomeAfterAReloadMovingTheUpstreamGoesToNoOtherUpstream(t *testing.T) {
	old := resolveInterval
	resolveInterval = time.Hour // the first config's pass runs only at its start
	t.Cleanup(func() { resolveInterval = old })
	d, _ := sharedDevnet(t)
	before, after := newReportingUpstream(t), newReportingUpstream(t)
	storeDir := gateDir(t)
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	loadCaddyServers(t, port, "", logFile, pendingSite(before.URL, "lose_request", storeDir, ""))
	t.Cleanup(func() { caddy.Stop() })
	url := fmt.Sprintf("http://127.0.0.1:%d/verify/schema", port)
	sig := signExpiring(t, d, paymentRequired(t, post(t, url, "", nil)), 5, 8)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if b := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("paid call: %d %.300s; want 503 settlement_pending", resp.StatusCode, b)
	}
	resolveInterval = 200 * time.Millisecond
	loadCaddyServers(t, port, "", logFile, pendingSite(after.URL, "lose_request", storeDir, ""))
	// The authorization expires unsettled: the new config's pass resolves
	// the payment as never settling.
	never := func() float64 { return counterValue(t, "unknown_resolved_released") }
	start := never()
	for deadline := time.Now().Add(40 * time.Second); never() == start; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the background pass did not resolve the expired payment")
		}
	}
	readAll(t, post(t, url, "", nil)) // the new gate's first request
	time.Sleep(time.Second)
	if got := before.got(); len(got) != 0 {
		t.Errorf("reports through the unloaded config's chain: %v; want none", got)
	}
	if got := after.got(); len(got) != 0 {
		t.Errorf("reports to the upstream the reload moved to, which never recorded the verification: %v; want none", got)
	}
	kept := false
	for _, line := range logLines(t, logFile) {
		kept = kept || line["level"] == "warn" && line["verification_id"] == "v-1" && strings.HasPrefix(line["msg"].(string), "settlement outcome kept unreported")
	}
	if !kept {
		t.Error("no Warning names the outcome kept unreported")
	}
}

// An outcome the background pass resolves after a reload goes only to the
// upstream that recorded the verification: here the reload leaves the
// config as it was, so the report goes through the call's own route, to
// that upstream, although the live config's gate of that route has served
// nothing yet. Another route with the same offer, `route` and
// `mcp_tool` but another upstream never gets it. (Before: the report went
// through any live gate with the same offer and `route`, here the other
// route's, whose upstream was sent the verification id and its outcome,
// and verifierd's record stayed pending for ever.)
func TestResolvedReportAfterAReloadGoesOnlyToItsOwnUpstream(t *testing.T) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = 300 * time.Millisecond
	_, _ = sharedDevnet(t)
	fakeHistoryReset()
	fakeOtherGot.Lock()
	fakeOtherGot.got = nil
	fakeOtherGot.Unlock()
	site := fmt.Sprintf(`:{port} {
	route /v1/* {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply
			store badger %[2]s
			public_base_url https://gateway.test
		}
		test_fake_history
	}
	route /api/* {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply
			store badger %[2]s
			public_base_url https://gateway.test
		}
		test_fake_other_upstream
	}
}
`, payTo.Hex(), gateDir(t))
	base := paidCallLosingItsReply(t, site, 9, `{"x":4}`)
	port := portOf(t, base)
	// The operator reloads the same config (any change to the server
	// would count as a move) before the pass resolves it; someone then
	// calls the other route (a 402 is enough to learn it).
	loadCaddy(t, port, site)
	r2 := post(t, base+"/api/thing", "", nil)
	readAll(t, r2)
	var pays []string
	var reports []string
	for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		_, pays, reports = fakeHistoryRecords()
		if len(pays) == 1 && pays[0] != "pending" {
			break
		}
	}
	fakeOtherGot.Lock()
	other := slices.Clone(fakeOtherGot.got)
	fakeOtherGot.Unlock()
	if len(pays) != 1 || pays[0] != "paid" {
		t.Errorf("verifierd's record of a call whose transfer the pass found after a reload: %v (reports it received %q); want paid", pays, reports)
	}
	if len(other) != 0 {
		t.Errorf("the other route's upstream was sent %q; want nothing (its route's one request was answered 402)", other)
	}
}

// A gate written alone in its `route`, its upstream in a later route, is
// named by everything after it, its server's name and listeners among it:
// two sites alike but for their upstreams name their gates apart, and an
// outcome the background pass resolves after a reload goes to the
// upstream that recorded the verification, never the other site's. (Before:
// the name hashed only the gate's own `route` block, alike in both sites,
// and site A's outcome went through site B's gate to B's upstream, while
// A's verifierd record stayed pending.)
func TestResolvedReportOfAGateAloneInItsRouteGoesToNoOtherSitesUpstream(t *testing.T) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = time.Hour // the first config's pass runs only at its start
	_, _ = sharedDevnet(t)
	fakeHistoryReset()
	resetOtherUpstream()
	release := stallChain(t)
	port2 := freePort(t)
	gate := fmt.Sprintf(`x402 {
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply_stall
			store badger %[2]s
			public_base_url https://gateway.test
		}`, payTo.Hex(), gateDir(t))
	site := fmt.Sprintf(`:{port} {
	route /v1/* {
		%[1]s
	}
	route /v1/* {
		test_fake_history
	}
}
:%[2]d {
	route /v1/* {
		%[1]s
	}
	route /v1/* {
		test_fake_other_upstream
	}
}
`, gate, port2)
	base := paidCallLosingItsReply(t, site, 9, `{"x":4}`)
	// The operator reloads the same config; someone calls site B (a 402
	// is enough for its gate to learn its way); then the chain answers.
	resolveInterval = 300 * time.Millisecond
	loadCaddy(t, portOf(t, base), site)
	readAll(t, post(t, fmt.Sprintf("http://127.0.0.1:%d/v1/thing", port2), "", nil))
	close(release)
	var pays, reports []string
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, pays, reports = fakeHistoryRecords(); len(pays) == 1 && pays[0] != "pending" || len(otherUpstreamReports()) > 0 {
			break
		}
	}
	if got := otherUpstreamReports(); len(got) != 0 {
		t.Errorf("site B's upstream was sent site A's outcome: %q; want nothing", got)
	}
	if len(pays) != 1 || pays[0] != "paid" {
		t.Errorf("site A's verifierd record: %v (reports %q); want paid", pays, reports)
	}
}

// A reload that moves only the upstream behind a gate written alone in its
// `route` renames the gate: the outcome the background pass resolves is
// kept, with a Warning, and never sent to the new upstream, which never
// recorded the verification. (Before: the gate kept its name, and the
// outcome went to the new upstream.)
func TestReloadMovingTheUpstreamAfterAGateAloneInItsRouteKeepsTheOutcome(t *testing.T) {
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = time.Hour
	_, _ = sharedDevnet(t)
	fakeHistoryReset()
	resetOtherUpstream()
	release := stallChain(t)
	site := fmt.Sprintf(`:{port} {
	route /v1/* {
		x402 {
			accept devnet $0.02 %[1]s
			facilitator faulty_devnet lose_reply_stall
			store badger %[2]s
			public_base_url https://gateway.test
		}
	}
	route /v1/* {
		test_fake_history
	}
}
`, payTo.Hex(), gateDir(t))
	base := paidCallLosingItsReply(t, site, 8, `{"x":5}`)
	resolveInterval = 300 * time.Millisecond
	loadCaddy(t, portOf(t, base), strings.Replace(site, "test_fake_history", "test_fake_other_upstream", 1))
	readAll(t, post(t, base+"/v1/thing", "", nil)) // the new gate's first request
	resolved := counterValue(t, "unknown_resolved_settled")
	close(release)
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end) && counterValue(t, "unknown_resolved_settled") == resolved; time.Sleep(100 * time.Millisecond) {
	}
	time.Sleep(time.Second)
	if got := otherUpstreamReports(); len(got) != 0 {
		t.Errorf("the upstream the reload moved to, which never recorded the verification, was sent %q; want nothing (the outcome kept with a Warning)", got)
	}
}

// A gate's name stays across a reload of the same config, whatever the
// matchers of its server's routes (each set is loaded from a map, in no
// order), and changes with anything after the gate that decides where its
// requests go: a later route's handler, or a matcher within a `not`.
func TestGateNameIsItsPlaceInItsServer(t *testing.T) {
	site := fmt.Sprintf(`:{port} {
	@other {
		path /a/* /b/*
		path_regexp ^/c
		header X-A b
		header_regexp X-B ^c
		method GET POST
		query a=b
		not path /z
		expression {http.request.uri.path}.startsWith("/v")
		remote_ip 10.0.0.0/8
		client_ip 10.0.0.0/8
		protocol http
		vars {x} y
	}
	handle /v1/* {
		route {
			x402 {
				accept devnet $0.02 %s
				facilitator http http://127.0.0.1:1
				store badger %s
			}
		}
		reverse_proxy 127.0.0.1:2
	}
	handle @other {
		reverse_proxy 127.0.0.1:1
	}
}
`, payTo.Hex(), t.TempDir())
	name := func() string { return loneGateName(t) }
	base := startCaddy(t, site)
	port := portOf(t, base)
	first := name()
	for range 3 {
		loadCaddy(t, port, site)
		if got := name(); got != first {
			t.Fatalf("a reload of the same config renamed the gate: %s, then %s", first, got)
		}
	}
	for what, edit := range map[string][2]string{
		"a later route's upstream": {"reverse_proxy 127.0.0.1:1", "reverse_proxy 127.0.0.1:3"},
		"a matcher within a not":   {"not path /z", "not path /y"},
		"the gate's own route's":   {"reverse_proxy 127.0.0.1:2", "reverse_proxy 127.0.0.1:4"},
	} {
		loadCaddy(t, port, strings.Replace(site, edit[0], edit[1], 1))
		if name() == first {
			t.Errorf("a reload changing %s kept the gate's name", what)
		}
	}
	// A gate's own settings decide whether a call is served, never where
	// it goes on to: changing its facilitator keeps its name.
	loadCaddy(t, port, strings.Replace(site, "facilitator http http://127.0.0.1:1", "facilitator http http://127.0.0.1:5", 1))
	if got := name(); got != first {
		t.Errorf("a reload changing only the gate's facilitator renamed it: %s, then %s", first, got)
	}
}

// loneGateName is the name (gateID) of the one gate loaded.
func loneGateName(t *testing.T) string {
	t.Helper()
	resolvers.Lock()
	defer resolvers.Unlock()
	var names []string
	for g := range resolvers.stop {
		if others := g.others.name(); others == "" || strings.HasPrefix(g.upstream, "unnamed") || strings.HasPrefix(others, "unnamed") {
			t.Fatalf("gate named %q, its Caddy's other servers %q; want it named by its place", g.upstream, others)
		}
		names = append(names, g.gateID())
	}
	if len(names) != 1 {
		t.Fatalf("gate names %q; want one", names)
	}
	return names[0]
}

// With automatic HTTPS on (Caddy's default), Caddy puts a route
// redirecting HTTP to HTTPS into the server on the HTTP port, its host
// list in Go map order. A gate of an http:// site keeps its name across
// reloads of the same config, and changes it when the redirected hosts
// change (they decide which requests reach the gate). (Before: 8 loads
// named the gate 4 ways, and a reload kept its held outcomes unreported
// with a Warning that their upstream had moved.)
func TestGateNameStaysAcrossReloadsWithAutomaticHTTPSRedirects(t *testing.T) {
	httpPort, httpsPort, dir := freePort(t), freePort(t), t.TempDir()
	config := func(hosts string) []byte {
		return autoHTTPSConfig(t, httpPort, httpsPort, hosts+` {
	respond "tls"
}
`, dir)
	}
	t.Cleanup(func() { caddy.Stop() })
	hosts := "a.localhost, b.localhost, c.localhost, d.localhost, e.localhost"
	names := gateNamesOverLoads(t, config(hosts), 8)
	if err := caddy.Load(config(strings.Replace(hosts, "e.localhost", "f.localhost", 1)), true); err != nil {
		t.Fatal(err)
	}
	if names[loneGateName(t)] {
		t.Error("a reload redirecting another host kept the gate's name")
	}
}

// autoHTTPSConfig is a Caddy config, adapted from a Caddyfile, with
// automatic HTTPS on (local certificates) on httpPort and httpsPort:
// tlsSites, then an http:// site on httpPort whose /v1/* is paid through
// a gate storing in dir.
func autoHTTPSConfig(t *testing.T, httpPort, httpsPort int, tlsSites, dir string) []byte {
	t.Helper()
	cfg := fmt.Sprintf(`{
	admin off
	persist_config off
	http_port %d
	https_port %d
	local_certs
	skip_install_trust
	storage file_system %s
	log {
		output discard
	}
}
%s
http://:%d {
	route /v1/* {
		x402 {
			accept devnet $0.02 %s
			facilitator http http://127.0.0.1:1
			store badger %s
		}
		respond "ok"
	}
}
`, httpPort, httpsPort, caddyStorage, tlsSites, httpPort, payTo.Hex(), dir)
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// gateNamesOverLoads loads js n times, failing unless every load names
// the one gate alike, and returns that name (as a set, for a later load
// to be checked against).
func gateNamesOverLoads(t *testing.T, js []byte, n int) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	for range n {
		if err := caddy.Load(js, true); err != nil {
			t.Fatal(err)
		}
		names[loneGateName(t)] = true
	}
	if len(names) != 1 {
		t.Fatalf("%d loads of the same config named the gate %d ways; want one name", n, len(names))
	}
	return names
}

// With sites on two HTTPS ports, automatic HTTPS puts one redirect route
// per port into the server on the HTTP port, ordered by the first host of
// each one's host list, which Caddy builds in Go map order. A gate of an
// http:// site keeps its name across loads of the same config. (Before: 10
// loads named it 2 ways, as the name read the routes' matchers in order.)
func TestGateNameStaysWithRedirectsToTwoHTTPSPorts(t *testing.T) {
	httpPort, httpsPort, otherPort, dir := freePort(t), freePort(t), freePort(t), t.TempDir()
	js := autoHTTPSConfig(t, httpPort, httpsPort, fmt.Sprintf(`a.localhost, bbbbbbbbbbbbbbbbbbbb.localhost {
	respond "tls"
}
cccccccc.localhost:%d {
	respond "tls2"
}
`, otherPort), dir)
	t.Cleanup(func() { caddy.Stop() })
	gateNamesOverLoads(t, js, 10)
}

// A gate's proxy goes on to another site of the same Caddy (one of its own
// listeners), whose proxy reaches the verifierd. A reload that points that
// site at another verifierd renames the gate, and the outcome of a call
// the first recorded is kept, not sent to the second. (Before: the gate's
// name read its own server alone, and the second verifierd was sent a
// verification id it never had, while the first's stayed pending.)
func TestGateNameChangesWhenItsUpstreamMovesBehindAnotherSite(t *testing.T) {
	inner := freePort(t)
	upstreamMovesBehindAnotherSite(t, inner, func(backend string) string {
		return fmt.Sprintf(`:%d {
	reverse_proxy %s
}
`, inner, backend)
	})
}

// Like TestGateNameChangesWhenItsUpstreamMovesBehindAnotherSite, but the
// other site reaches the verifierd through a named route (`invoke`).
// (Before: the other servers were named by their routes alone, `invoke`
// by the name it calls, so pointing the named route at B kept the gate's
// name, and B was sent A's verification id and outcome.)
func TestGateNameChangesWhenItsUpstreamMovesBehindAnotherSitesNamedRoute(t *testing.T) {
	inner := freePort(t)
	upstreamMovesBehindAnotherSite(t, inner, func(backend string) string {
		return fmt.Sprintf(`&(backend) {
	reverse_proxy %s
}
:%d {
	invoke backend
}
`, backend, inner)
	})
}

// upstreamMovesBehindAnotherSite runs a gate whose proxy goes on to
// another site of the same Caddy, on port inner, which other(backend)
// writes out as reaching backend (host:port). An unchanged reload keeps
// the gate's name; a reload pointing the other site from verifierd A to B
// renames it, and the outcome of a call A recorded is kept, not sent to B.
func upstreamMovesBehindAnotherSite(t *testing.T, inner int, other func(backend string) string) {
	t.Helper()
	defer func(d time.Duration) { resolveInterval = d }(resolveInterval)
	resolveInterval = time.Hour
	_, _ = sharedDevnet(t)
	release := stallChain(t)
	a, b := newReportingUpstream(t), newReportingUpstream(t)
	dir := t.TempDir()
	site := func(u *reportingUpstream) string {
		return faultyGateSite("lose_reply_stall", dir, fmt.Sprintf("reverse_proxy 127.0.0.1:%d", inner)) + other(strings.TrimPrefix(u.URL, "http://"))
	}
	logFile := filepath.Join(t.TempDir(), "caddy.log")
	port := freePort(t)
	loadCaddyServers(t, port, "", logFile, site(a))
	t.Cleanup(func() { caddy.Stop() })
	first := loneGateName(t)
	loadCaddyServers(t, port, "", logFile, site(a))
	if loneGateName(t) != first {
		t.Fatal("a reload of the same config renamed the gate")
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/verify/schema", port)
	paidCallHeld(t, url, nil, "paid call")
	resolveInterval = 300 * time.Millisecond
	loadCaddyServers(t, port, "", logFile, site(b)) // the other site now goes to B
	if loneGateName(t) == first {
		t.Error("moving the gate's upstream behind the other site kept the gate's name")
	}
	readAll(t, post(t, url, "", nil)) // the reloaded gate learns its way
	close(release)
	kept := false
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end) && !kept; time.Sleep(100 * time.Millisecond) {
		for _, l := range logLines(t, logFile) {
			kept = kept || l["msg"] == orphanKept
		}
	}
	time.Sleep(300 * time.Millisecond) // a report sent to B would be in by now
	if got := b.got(); len(got) != 0 {
		t.Errorf("B, which the upstream moved to, was sent A's outcome %q; want it kept", got)
	}
	if !kept {
		t.Errorf("no %q logged", orphanKept)
	}
}

// Another site's routes within its handlers count as its routes do: a
// reload changing where a proxy's `handle_response` routes go renames the
// gate, and an unchanged reload of a site using Caddy's common handlers
// (and such routes) keeps its name. (Before: a proxy was named by its own
// settings, whose `handle_response` routes read as empty once loaded, so
// pointing them elsewhere kept the gate's name.)
func TestGateNameCoversRoutesWithinAnotherSitesHandlers(t *testing.T) {
	_, _ = sharedDevnet(t)
	dir, www := t.TempDir(), t.TempDir()
	inner := freePort(t)
	site := func(onError string) string {
		return faultyGateSite("lose_reply", dir, fmt.Sprintf("reverse_proxy 127.0.0.1:%d", inner)) + fmt.Sprintf(`:%[1]d {
	encode gzip zstd
	header X-A {http.request.uuid}
	basic_auth /admin/* {
		bob $2a$14$Zkx19XLiW6VYouLHR5NmfOFU0z2GTNmpkT/5qqR7hx4IjWJPDhjvG
	}
	map {host} {backend} {
		a.example 127.0.0.1:1
		default 127.0.0.1:2
	}
	@re path_regexp ^/x/(.*)$
	rewrite @re /y/{re.1}
	templates
	file_server /files/* browse {
		root %[2]s
	}
	reverse_proxy /dyn/* {
		dynamic a example.invalid 80
		lb_policy cookie
		health_uri /health
		health_interval 1h
	}
	reverse_proxy /lb/* 127.0.0.1:3 127.0.0.1:4 {
		lb_policy random_choose 2
	}
	forward_auth /fa/* 127.0.0.1:5 {
		uri /auth
	}
	intercept /i/* {
		@gone status 410
		handle_response @gone {
			respond "gone"
		}
	}
	respond /r "hi {http.request.host}"
	reverse_proxy 127.0.0.1:6 {
		@failed status 5xx
		handle_response @failed {
			reverse_proxy %[3]s
		}
	}
}
`, inner, www, onError)
	}
	port := freePort(t)
	loadCaddyServers(t, port, "", "", site("127.0.0.1:7"))
	t.Cleanup(func() { caddy.Stop() })
	first := loneGateName(t)
	for i := range 3 {
		loadCaddyServers(t, port, "", "", site("127.0.0.1:7"))
		if n := loneGateName(t); n != first {
			t.Fatalf("reload %d of the same config renamed the gate: %q then %q", i+1, first, n)
		}
	}
	loadCaddyServers(t, port, "", "", site("127.0.0.1:8"))
	if loneGateName(t) == first {
		t.Error("pointing the other site's handle_response routes at another upstream kept the gate's name")
	}
}

// The routes after the gate in its own server that its request may reach
// through a named route (`invoke`) or a proxy's `handle_response` count
// as well: a reload changing where they go renames the gate, an unchanged
// one keeps its name.
func TestGateNameCoversItsOwnServersNamedAndResponseRoutes(t *testing.T) {
	_, _ = sharedDevnet(t)
	sites := map[string]func(dir, backend string) string{
		"named route": func(dir, backend string) string {
			return fmt.Sprintf(`&(backend) {
	reverse_proxy %s
}
`, backend) + faultyGateSite("lose_reply", dir, "invoke backend")
		},
		"handle_response": func(dir, backend string) string {
			return faultyGateSite("lose_reply", dir, fmt.Sprintf(`reverse_proxy 127.0.0.1:6 {
			@failed status 5xx
			handle_response @failed {
				reverse_proxy %s
			}
		}`, backend))
		},
	}
	t.Cleanup(func() { caddy.Stop() })
	for what, site := range sites {
		dir, port := t.TempDir(), freePort(t)
		load := func(backend string) string {
			t.Helper()
			loadCaddyServers(t, port, "", "", site(dir, backend))
			return loneGateName(t)
		}
		first := load("127.0.0.1:7")
		if load("127.0.0.1:7") != first {
			t.Errorf("%s: a reload of the same config renamed the gate", what)
		}
		if load("127.0.0.1:8") == first {
			t.Errorf("%s: pointing it at another upstream kept the gate's name", what)
		}
	}
}

// A matcher's alternatives (hosts, paths, methods, a header's or a query
// key's values, IP ranges: any one matches) are named in no order: a
// reload listing those of a route before the gate's in another order
// keeps the gate's name, and one changing an alternative renames it.
func TestGateNameTakesAMatchersAlternativesInAnyOrder(t *testing.T) {
	port := freePort(t)
	cfg := fmt.Sprintf("{\n\tadmin off\n\tauto_https off\n\tpersist_config off\n\tstorage file_system %s\n\tlog {\n\t\toutput discard\n\t}\n}\n"+`:%d {
	x402 {
		accept devnet $0.02 %s
		facilitator http http://127.0.0.1:1
		store badger %s
	}
	respond "ok"
}
`, caddyStorage, port, payTo.Hex(), t.TempDir())
	js, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(cfg), map[string]any{"filename": "Caddyfile"})
	if err != nil {
		t.Fatal(err)
	}
	// load puts a route matching other before the gate's.
	load := func(other string) string {
		t.Helper()
		var c map[string]any
		if err := json.Unmarshal(js, &c); err != nil {
			t.Fatal(err)
		}
		srv := c["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["srv0"].(map[string]any)
		var route any
		if err := json.Unmarshal([]byte(`{"match":[`+other+`],"handle":[{"handler":"static_response","body":"other"}]}`), &route); err != nil {
			t.Fatal(err)
		}
		srv["routes"] = append([]any{route}, srv["routes"].([]any)...)
		b, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := caddy.Load(b, true); err != nil {
			t.Fatal(err)
		}
		return loneGateName(t)
	}
	t.Cleanup(func() { caddy.Stop() })
	matchers := map[string][2]string{
		"host":      {`"host":["a.example","b.example"]`, `"host":["b.example","a.example"]`},
		"path":      {`"path":["/a/*","/b/*"]`, `"path":["/b/*","/a/*"]`},
		"method":    {`"method":["GET","POST"]`, `"method":["POST","GET"]`},
		"header":    {`"header":{"X-A":["b","c"]}`, `"header":{"X-A":["c","b"]}`},
		"query":     {`"query":{"a":["b","c"]}`, `"query":{"a":["c","b"]}`},
		"remote_ip": {`"remote_ip":{"ranges":["10.0.0.0/8","192.168.0.0/16"]}`, `"remote_ip":{"ranges":["192.168.0.0/16","10.0.0.0/8"]}`},
		"client_ip": {`"client_ip":{"ranges":["10.0.0.0/8","192.168.0.0/16"]}`, `"client_ip":{"ranges":["192.168.0.0/16","10.0.0.0/8"]}`},
	}
	set := func(reordered string) string {
		var ms []string
		for m, lists := range matchers {
			ms = append(ms, lists[0])
			if m == reordered {
				ms[len(ms)-1] = lists[1]
			}
		}
		return "{" + strings.Join(ms, ",") + "}"
	}
	first := load(set(""))
	for m := range matchers {
		if got := load(set(m)); got != first {
			t.Errorf("a reload listing the %s matcher's alternatives in another order renamed the gate", m)
		}
	}
	if load(strings.Replace(set(""), "b.example", "c.example", 1)) == first {
		t.Error("a reload changing a host the route before the gate's matches kept the gate's name")
	}
}

// paidCallLosingItsReply starts Caddy on site and pays a call to its
// /v1/verify (body, signed by payer) whose settlement reply the faulty
// facilitator loses: 503 settlement_pending, the outcome left for the
// background pass to resolve. It returns Caddy's base URL.
func paidCallLosingItsReply(t *testing.T, site string, payer int, body string) string {
	t.Helper()
	base := startCaddy(t, site)
	url := base + "/v1/verify"
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), payer)
	resp := post(t, url, body, map[string]string{x402.HeaderPaymentSignature: sig})
	if b := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("paid call: %d %.200s; want 503 settlement_pending (reply lost)", resp.StatusCode, b)
	}
	return base
}

// stallChain holds the chain reads of lose_reply_stall until the channel
// it returns is closed (at the test's end at the latest).
func stallChain(t *testing.T) chan struct{} {
	release := make(chan struct{})
	chainStall.Lock()
	chainStall.release = release
	chainStall.Unlock()
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	return release
}

func resetOtherUpstream() {
	fakeOtherGot.Lock()
	fakeOtherGot.got = nil
	fakeOtherGot.Unlock()
}

// otherUpstreamReports is the settlement reports fakeOtherUpstream got.
func otherUpstreamReports() []string {
	fakeOtherGot.Lock()
	defer fakeOtherGot.Unlock()
	var sent []string
	for _, o := range fakeOtherGot.got {
		if strings.Contains(o, "gateway/settlement") {
			sent = append(sent, o)
		}
	}
	return sent
}

// fakeOtherUpstream is a FAKE upstream of another route: it keeps what it
// is sent.
type fakeOtherUpstream struct{}

var fakeOtherGot struct {
	sync.Mutex
	got []string
}

func (fakeOtherUpstream) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "http.handlers.test_fake_other_upstream", New: func() caddy.Module { return new(fakeOtherUpstream) }}
}

func (fakeOtherUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	b, _ := io.ReadAll(r.Body)
	fakeOtherGot.Lock()
	fakeOtherGot.got = append(fakeOtherGot.got, r.Method+" "+r.URL.Path+" "+string(b))
	fakeOtherGot.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_, err := io.WriteString(w, `{"other_upstream":true}`)
	return err
}

func init() {
	caddy.RegisterModule(fakeOtherUpstream{})
	httpcaddyfile.RegisterHandlerDirective("test_fake_other_upstream", func(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
		h.Next()
		return fakeOtherUpstream{}, nil
	})
}

// counterValue reads the gate's outcome counter for outcome.
func counterValue(t *testing.T, outcome string) float64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.outcomes.WithLabelValues(outcome).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// reportingUpstream stands in for verifierd's side of settlement reports: it
// asks for a report on paid calls the gate marks pending, and records the
// reports it gets.
type reportingUpstream struct {
	*httptest.Server
	mu      sync.Mutex
	reports []string // "id=payment"
	n       atomic.Int64
	stall   atomic.Bool // hold each report until its attempt gives up
}

func newReportingUpstream(t *testing.T) *reportingUpstream {
	u := &reportingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/gateway/settlement" {
			if u.stall.Load() {
				// Read first: the server sees the client give up
				// (r's context done) only once the body is read.
				io.Copy(io.Discard, r.Body)
				<-r.Context().Done()
				return
			}
			var rep struct {
				VerificationID string `json:"verification_id"`
				Payment        string `json:"payment"`
			}
			if err := json.NewDecoder(r.Body).Decode(&rep); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			u.mu.Lock()
			u.reports = append(u.reports, rep.VerificationID+"="+rep.Payment)
			u.mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
			return
		}
		id := fmt.Sprintf("v-%d", u.n.Add(1))
		if r.Header.Get(HeaderUpstreamSettlement) == "pending" {
			w.Header().Set(headerSettlementReport, "/v1/gateway/settlement")
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"verification_id":%q,"paid_content":true}`, id)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *reportingUpstream) got() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.reports...)
}

// The gate reports each paid call's settlement outcome to an upstream that
// asks for it: paid once settled, and for an unknown outcome only when the
// retry resolves it; the request for a report never reaches the client.
func TestSettlementOutcomeIsReportedToTheUpstream(t *testing.T) {
	_, _ = sharedDevnet(t)
	t.Run("a settled call is reported paid", func(t *testing.T) {
		up := newReportingUpstream(t)
		base := startCaddy(t, pendingSite(up.URL, "none", gateDir(t), ""))
		url := base + "/verify/schema"
		sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 2)
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		if resp.StatusCode != http.StatusOK || resp.Header.Get(headerSettlementReport) != "" {
			t.Fatalf("status %d (%s), report header %q", resp.StatusCode, readJSONString(t, resp), resp.Header.Get(headerSettlementReport))
		}
		if got := up.got(); len(got) != 1 || got[0] != "v-1=paid" {
			t.Fatalf("reports %v", got)
		}
	})
	t.Run("an unknown outcome is reported when the retry resolves it", func(t *testing.T) {
		up := newReportingUpstream(t)
		base := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), ""))
		url := base + "/verify/schema"
		sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 2)
		if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("first try: %d", resp.StatusCode)
		}
		if got := up.got(); len(got) != 0 {
			t.Fatalf("reported before the outcome was known: %v", got)
		}
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		if resp.StatusCode != http.StatusOK || !strings.Contains(readJSONString(t, resp), `"v-1"`) {
			t.Fatalf("retry: %d", resp.StatusCode)
		}
		if got := up.got(); len(got) != 1 || got[0] != "v-1=paid" {
			t.Fatalf("reports %v", got)
		}
	})
}

func readJSONString(t *testing.T, resp *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// When the facilitator names the transaction it sent with its unknown
// outcome, the gate keeps that name with the held record (in the store:
// it survives a restart) and judges the record by it.
func TestUnknownSettlementIsJudgedByTheNamedTransaction(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	site := pendingSite(up.URL, "pending_named", gateDir(t), "")
	sentSeen.Lock()
	sentSeen.list = nil
	sentSeen.Unlock()
	p := payThenRestart(t, d, site, 1, replyLost, func() string { return startCaddy(t, site) })
	resp := post(t, p.url, validRequest, map[string]string{x402.HeaderPaymentSignature: p.sig})
	var sr x402.SettleResponse
	if resp.StatusCode != http.StatusOK || x402.DecodeHeader(resp.Header.Get(x402.HeaderPaymentResponse), &sr) != nil || !sr.Success {
		t.Fatalf("retry: status %d %+v", resp.StatusCode, sr)
	}
	sentSeen.Lock()
	seen := append([]string(nil), sentSeen.list...)
	sentSeen.Unlock()
	if len(seen) == 0 || !strings.HasPrefix(seen[len(seen)-1], "0x") || len(seen[len(seen)-1]) != 66 {
		t.Fatalf("the gate judged by %q, want the transaction hash the facilitator named", seen)
	}
	if got := charged(t, d, p.payer, p.before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want exactly one transfer", got)
	}
}

// signExpiring signs the first offer of pr with development key key, valid
// for seconds past the later of the wall clock and the chain's head time
// (which other tests may have pushed ahead): a payment that expires soon.
// The facilitator wants x402.ValidBeforeMargin (6 s) left when it verifies.
func signExpiring(t *testing.T, d *evmfacilitator.Devnet, pr x402.PaymentRequired, key int, seconds int) string {
	t.Helper()
	pr.Accepts[0].MaxTimeoutSeconds = seconds
	head, err := d.Client().HeaderByNumber(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	signAt := time.Unix(int64(head.Time), 0)
	if signAt.Before(time.Now()) {
		signAt = time.Now()
	}
	p, err := x402.SignExactEVM(evmfacilitator.DevKey(key), pr.Accepts[0], &pr.Resource, signAt)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := x402.EncodeHeader(p)
	if err != nil {
		t.Fatal(err)
	}
	return sig
}

// reason reads the x402 reason of a refusal: the body's reason member.
func reasonOf(t *testing.T, resp *http.Response) string {
	t.Helper()
	m := readJSON(t, resp)
	r, _ := m["reason"].(string)
	return r
}

// A settlement whose reply was lost, in settle before mode (no answer is
// kept): once the transfer is found, the upstream runs again for the
// buyer's retry, once, and only for the request the payment was made for.
// A retry with another request is refused and does not use up the run;
// every retry after the run is payment_already_used and runs nothing.
// (Before: each retry ran the upstream again, as paid.) The
// retry also carries a client's X-Aov-Settlement, on a site that does not
// strip X-Aov-* itself: the upstream must not see it.
func TestUnknownSettlementNotKeptRunsAgainOnce(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "settle before"))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[7].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 7)

	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusServiceUnavailable || strings.Contains(string(b), "paid_content") {
		t.Fatalf("first try: status %d: %s", resp.StatusCode, b)
	}
	calls := up.calls.Load()

	other := strings.Replace(validRequest, "t-1", "t-other", 1)
	resp = post(t, url, other, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusPaymentRequired || reasonOf(t, resp) != x402.ReasonPaymentAlreadyUsed {
		t.Fatalf("retry with another request: status %d", resp.StatusCode)
	}
	if n := up.calls.Load() - calls; n != 0 {
		t.Fatalf("the upstream ran %d times for another request under the payment", n)
	}

	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig,
		HeaderUpstreamSettlement: "pending", HeaderUpstreamAnswerBy: "1"})
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("retry: status %d: %s", resp.StatusCode, b)
	}
	var sr x402.SettleResponse
	if v := resp.Header.Values(x402.HeaderPaymentResponse); len(v) != 1 || x402.DecodeHeader(v[0], &sr) != nil || !sr.Success || !strings.EqualFold(sr.Payer, payer.Hex()) {
		t.Fatalf("retry: PAYMENT-RESPONSE %q", v)
	}
	// X-Aov-Answer-By is the gate's deadline for the answer's headers,
	// never the client's copy.
	if m := readJSON(t, resp); m["paid_content"] != true || m["payment"] != "paid" || m["settlement"] != "" || m["answer_by"] == "" || m["answer_by"] == "1" {
		t.Fatalf("retry: the upstream was told %v", m)
	}

	for i := range 4 {
		resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		if resp.StatusCode != http.StatusPaymentRequired || reasonOf(t, resp) != x402.ReasonPaymentAlreadyUsed {
			t.Fatalf("retry %d after the run: status %d", i+2, resp.StatusCode)
		}
	}
	if n := up.calls.Load() - calls; n != 1 {
		t.Fatalf("one payment ran the upstream %d times after its settlement was found", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v", got)
	}
}

// Retries of one such payment at once, the first of them resolving it: the
// upstream runs for exactly one of them.
func TestUnknownSettlementNotKeptRunsOnceForConcurrentRetries(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, pendingSite(up.URL, "lose_reply", gateDir(t), "settle before"))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[8].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 8)
	if resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: status %d", resp.StatusCode)
	}
	calls := up.calls.Load()

	const n = 8
	statuses := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
			io.Copy(io.Discard, resp.Body)
			statuses <- resp.StatusCode
		}()
	}
	wg.Wait()
	close(statuses)
	served := 0
	for s := range statuses {
		switch s {
		case http.StatusOK:
			served++
		case http.StatusPaymentRequired, http.StatusServiceUnavailable: // used, or lost the race to settle: retry later
		default:
			t.Errorf("status %d", s)
		}
	}
	if ran := up.calls.Load() - calls; served != 1 || ran != 1 {
		t.Fatalf("%d answers served, the upstream ran %d times; want one of each", served, ran)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v", got)
	}
}

// killedFacilitator is a FAKE FOR A FAULT that cannot otherwise be caused
// in one test process: a gateway killed mid-settlement. Its Settle settles
// for real on the devnet, then ends the request's goroutine
// (runtime.Goexit): nothing the gate would do after the facilitator's reply
// happens, as when the process is killed (a SIGKILL after the stop grace, a
// crash) after the transfer was sent and before the reply arrived. The
// request's deferred calls run, as the process's exit frees everything.
type killedFacilitator struct {
	f *evmfacilitator.Facilitator
}

func init() { caddy.RegisterModule(&killedFacilitator{}) }

func (*killedFacilitator) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.killed_devnet", New: func() caddy.Module { return new(killedFacilitator) }}
}

func (m *killedFacilitator) Provision(caddy.Context) error {
	if devnet == nil {
		return errors.New("killed_devnet needs the shared devnet")
	}
	f, err := evmfacilitator.New(evmfacilitator.Config{Chain: devnet.Client(), Network: evmfacilitator.DevnetNetwork,
		RelayerKey: evmfacilitator.DevKey(faultyRelayer), PollInterval: 20 * time.Millisecond, ReceiptTimeout: 30 * time.Second})
	m.f = f
	return err
}

// Cleanup closes the facilitator with its configuration (faultyFacilitator).
func (m *killedFacilitator) Cleanup() error {
	if m.f == nil {
		return nil
	}
	return m.f.Close()
}

func (m *killedFacilitator) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { d.Next(); return nil }
func (m *killedFacilitator) Verify(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.VerifyResponse, error) {
	return m.f.Verify(ctx, p, req)
}
func (m *killedFacilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	m.f.Settle(ctx, p, req)
	runtime.Goexit() // killed here: the reply never reaches the gate
	panic("unreachable")
}
func (m *killedFacilitator) Supported(ctx context.Context) (x402.SupportedResponse, error) {
	return m.f.Supported(ctx)
}

// killSite is a paid route whose store is in storeDir, settled by fac.
func killSite(up, fac, storeDir string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator %[2]s
			store badger %[4]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), fac, payTo.Hex(), storeDir)
}

// A gateway killed after the facilitator sent the transfer and before its
// reply: the payment's record was written with its claim, before the
// settlement was asked for, so the restarted gateway (a new opening of the
// same store) resolves it from the chain on the buyer's retry with the
// same payment: the transfer happened, so the upstream runs again, once,
// and the buyer gets the answer paid for. Before, the claim was bare: the
// retry was told payment_in_flight until the claim lapsed, and then the
// chain refused the used nonce: paid, never served.
//
// Run twice: resolved by the retry itself, and by the background pass
// before any retry (the retry then gets the run it is owed).
func TestKilledMidSettlementIsResolvedAfterRestart(t *testing.T) {
	t.Run("on the retry", func(t *testing.T) { testKilledMidSettlement(t, false) })
	t.Run("in the background", func(t *testing.T) { testKilledMidSettlement(t, true) })
}

func testKilledMidSettlement(t *testing.T, background bool) {
	if background {
		old := resolveInterval
		resolveInterval = 50 * time.Millisecond
		t.Cleanup(func() { resolveInterval = old })
	}
	resolved := counterValue(t, "unknown_resolved_settled")
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := gateDir(t)
	p := payThenRestart(t, d, killSite(up.URL, "killed_devnet", storeDir), 8, killedMidSettlement,
		func() string { return startCaddy(t, killSite(up.URL, "faulty_devnet none", storeDir)) })
	url, sig := p.url, p.sig
	if background {
		for deadline := time.Now().Add(10 * time.Second); counterValue(t, "unknown_resolved_settled") == resolved; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the background pass never resolved the payment of the killed request")
			}
		}
	}

	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("retry after the restart: %d %s (PAYMENT-RESPONSE %q); want the paid answer", resp.StatusCode, b, resp.Header.Get(x402.HeaderPaymentResponse))
	}
	if !strings.Contains(string(b), `"payment":"paid"`) {
		t.Fatalf("retry answered %s, want the upstream's answer to a paid call", b)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b)+resp.Header.Get(x402.HeaderPaymentRequired), x402.ReasonPaymentAlreadyUsed) {
		t.Fatalf("a second retry: %d %s; want payment_already_used (delivered once)", resp.StatusCode, b)
	}
	if got := charged(t, d, p.payer, p.before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v in all, want 20000 once", got)
	}
	if got := counterValue(t, "unknown_resolved_settled") - resolved; got != 1 {
		t.Fatalf("resolved as settled %v times, want once", got)
	}
}

func init() { caddy.RegisterModule(settleBlipStore{}) }

// settleBlipStore is a FAKE FOR A FAULT that cannot otherwise be caused in
// a test: the real Badger store, whose write marking a paid claim settled
// (Settle, or the Swap from the claim's record) fails while settleBlips is
// above zero, as a store blip right after the transfer landed would (a
// Redis failover, a timeout).
type settleBlipStore struct {
	BadgerStore
}

var settleBlips atomic.Int32

func (settleBlipStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.stores.settle_blip_badger", New: func() caddy.Module { return new(settleBlipStore) }}
}

func (s *settleBlipStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if !d.NextArg() {
		return d.ArgErr()
	}
	s.Path = d.Val()
	return nil
}

func (s *settleBlipStore) Claims() store.Claims {
	return settleBlip{s.BadgerStore.Claims().(heldClaims)}
}

type settleBlip struct{ heldClaims }

var errSettleBlip = errors.New("settle_blip: the store is unreachable")

func (c settleBlip) Settle(ctx context.Context, cl store.Claim, note string, keep time.Time) error {
	if settleBlips.Add(-1) >= 0 {
		return errSettleBlip
	}
	return c.heldClaims.Settle(ctx, cl, note, keep)
}

func (c settleBlip) Swap(ctx context.Context, cl store.Claim, old, note string) error {
	if settleBlips.Add(-1) >= 0 {
		return errSettleBlip
	}
	return c.heldClaims.Swap(ctx, cl, old, note)
}

// blipSite is a paid route settled by the faulty facilitator in mode none
// (it settles for real), its store settle_blip_badger in a new folder.
func blipSite(t *testing.T, up string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator faulty_devnet none
			store settle_blip_badger %[2]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), gateDir(t), payTo.Hex())
}

// spanOfDefaultGate is the attempt span a gate with the default timeouts
// writes on a paid claim's record.
func spanOfDefaultGate() time.Duration {
	return (&Gate{UpstreamTimeout: caddy.Duration(defaultUpstreamTimeout)}).attemptSpan()
}

// One payment, settled once; the store fails once to mark the claim settled
// right after. The gate tries the write again before it delivers, so the
// claim is marked settled and a later retry with the same payment is
// payment_already_used. Before, the gate logged the failure and delivered
// with the claim still carrying its claim-time record, which looks like a
// gateway that died mid-attempt: once the attempt span passed, the retry
// found the transfer on chain and ran the upstream again, a second delivery
// for one payment.
func TestSettleWriteBlipDoesNotDeliverTwice(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, blipSite(t, up.URL))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[5].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 5)

	settleBlips.Store(1)
	t.Cleanup(func() { settleBlips.Store(0) })
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("paid call: %d %s; want the paid answer once the write went through", resp.StatusCode, b)
	}
	calls := up.calls.Load()
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want 20000", got)
	}

	now = func() time.Time { return time.Now().Add(spanOfDefaultGate() + 5*time.Second) }
	t.Cleanup(func() { now = time.Now })

	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ = io.ReadAll(resp.Body)
	if n := up.calls.Load() - calls; n != 0 || resp.StatusCode != http.StatusPaymentRequired ||
		!strings.Contains(string(b)+resp.Header.Get(x402.HeaderPaymentRequired), x402.ReasonPaymentAlreadyUsed) {
		t.Fatalf("a retry of a payment already served: ran the upstream %d more time(s), answered %d %.200s; want payment_already_used", n, resp.StatusCode, b)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v in all, want 20000 once", got)
	}
}

// The store cannot mark the claim settled at all after the transfer landed
// (every try of the write fails): nothing is delivered on that request,
// which is answered 503 settlement_pending, as an unknown outcome is, and
// its record is kept as one. The buyer's retry with the same payment, once
// the store is back, is answered from the chain: the paid answer, once
// (the answer held back is served; the upstream does not run again).
func TestSettleWriteDownAnswersPendingThenDeliversOnce(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, blipSite(t, up.URL))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[5].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 5)

	settleBlips.Store(1000)
	t.Cleanup(func() { settleBlips.Store(0) })
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), `"settlement_pending"`) ||
		strings.Contains(string(b), `"payment":"paid"`) || resp.Header.Get(x402.HeaderPaymentResponse) != "" {
		t.Fatalf("paid call whose settlement could not be recorded: %d %s; want 503 settlement_pending and nothing delivered", resp.StatusCode, b)
	}
	calls := up.calls.Load()
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want 20000", got)
	}

	settleBlips.Store(0) // the store is back
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || !strings.Contains(string(b), `"payment":"paid"`) {
		t.Fatalf("the retry once the store is back: %d %s; want the paid answer", resp.StatusCode, b)
	}
	if n := up.calls.Load() - calls; n != 0 {
		t.Fatalf("the retry ran the upstream %d more time(s); the answer was held", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v in all, want 20000 once", got)
	}
}

func init() {
	caddy.RegisterModule(landedBlipStore{})
	caddy.RegisterModule(landedBlipRedis{})
}

// landedBlipStore is a FAKE FOR A FAULT that cannot otherwise be caused in
// a test: what redisstore does when a script ran on the server but its
// reply was lost and the server then stayed unreachable past go-redis's
// resends and the gate's settleWriteWaits (or when wait_replicas was not
// acknowledged in time). The real Badger store, whose first Swap while
// landedOutage is above zero writes and then reports an error; every
// further Swap, Hold and Lookup during the outage fails without touching
// the store. landedBlipRedis is the same around the real Redis store.
type landedBlipStore struct{ BadgerStore }

var landedOutage atomic.Int32
var landedWritten atomic.Bool

func (landedBlipStore) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.stores.landed_blip_badger", New: func() caddy.Module { return new(landedBlipStore) }}
}

func (s *landedBlipStore) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next()
	if !d.NextArg() {
		return d.ArgErr()
	}
	s.Path = d.Val()
	return nil
}

func (s *landedBlipStore) Claims() store.Claims {
	return landedBlip{s.BadgerStore.Claims().(heldClaims)}
}

// landedBlipRedis is landedBlipStore around the real Redis store (a FAKE
// FOR A FAULT, as above).
type landedBlipRedis struct{ redisstore.RedisStore }

func (landedBlipRedis) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.stores.landed_blip_redis", New: func() caddy.Module { return new(landedBlipRedis) }}
}

func (s *landedBlipRedis) Claims() store.Claims {
	return landedBlip{s.RedisStore.Claims().(heldClaims)}
}

type landedBlip struct{ heldClaims }

var errLandedBlip = errors.New("landed_blip: reply lost, then the store is unreachable")

// startLandedOutage starts the outage: the next Swap lands, its reply is
// lost.
func startLandedOutage(t *testing.T) {
	landedWritten.Store(false)
	landedOutage.Store(1)
	t.Cleanup(func() { landedOutage.Store(0) })
}

func (c landedBlip) Swap(ctx context.Context, cl store.Claim, old, note string) error {
	if landedOutage.Load() > 0 {
		if landedWritten.CompareAndSwap(false, true) {
			if err := c.heldClaims.Swap(ctx, cl, old, note); err != nil {
				return err
			}
		}
		return errLandedBlip
	}
	return c.heldClaims.Swap(ctx, cl, old, note)
}

func (c landedBlip) Hold(ctx context.Context, cl store.Claim, note string) error {
	if landedOutage.Load() > 0 {
		return errLandedBlip
	}
	return c.heldClaims.Hold(ctx, cl, note)
}

func (c landedBlip) Lookup(ctx context.Context, key string) (store.ClaimState, error) {
	if landedOutage.Load() > 0 {
		return store.ClaimState{}, errLandedBlip
	}
	return c.heldClaims.Lookup(ctx, key)
}

// landedSite is a paid route settled by the faulty facilitator in mode none
// (it settles for real), its store the given landed_blip store, settled in
// mode settle ("after" or "before").
func landedSite(up, storeLine, settle string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator faulty_devnet none
			store %[2]s
			public_base_url https://gateway.test
			settle %[4]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), storeLine, payTo.Hex(), settle)
}

// wantSettledUnrecorded checks the answer to a paid call whose settlement
// the store did not record: 503 settlement_pending, charged (the transfer
// was made), nothing delivered.
func wantSettledUnrecorded(t *testing.T, resp *http.Response) {
	t.Helper()
	b, _ := io.ReadAll(resp.Body)
	var e struct {
		Code      string `json:"code"`
		Retryable bool   `json:"retryable"`
		Charged   bool   `json:"charged"`
	}
	if resp.StatusCode != http.StatusServiceUnavailable || json.Unmarshal(b, &e) != nil || e.Code != "settlement_pending" ||
		!e.Retryable || !e.Charged || resp.Header.Get(x402.HeaderPaymentResponse) != "" || strings.Contains(string(b), `"payment":"paid"`) {
		t.Fatalf("paid call whose settlement was not recorded: %d %s; want 503 settlement_pending, charged, nothing delivered", resp.StatusCode, b)
	}
}

// waitUnrecordedWritten waits until the background has written n more
// settlements the store did not record than were written at from.
func waitUnrecordedWritten(t *testing.T, from float64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); counterValue(t, "settled_unrecorded_written") < from+1; {
		if time.Now().After(deadline) {
			t.Fatal("the settlement the store did not record was never written once the store was back")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The settling write lands but its reply is lost, and the store stays
// unreachable for the gate's tries: the request is answered 503
// settlement_pending, charged ("do not sign a new payment, retry later").
// Once the store is back, the buyer's retry with the same payment gets the
// answer that was paid for, from the answer held back (the upstream does
// not run again). Before, the claim read as settled and delivered (the
// bare transaction), and every retry was payment_already_used: charged,
// never served.
func TestSettleWriteLandedButReplyLostDeliversOnRetry(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, landedSite(up.URL, "landed_blip_badger "+gateDir(t), "after"))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 6)

	startLandedOutage(t)
	wantSettledUnrecorded(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	calls := up.calls.Load()
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want 20000", got)
	}

	landedOutage.Store(0) // the store is back
	for i := range 2 {
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || !strings.Contains(string(b), `"payment":"paid"`) {
			t.Fatalf("retry %d once the store is back: %d %.300s; want the paid answer", i, resp.StatusCode, b)
		}
	}
	if n := up.calls.Load() - calls; n != 0 {
		t.Fatalf("the retries ran the upstream %d more time(s); the answer was held", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v in all, want 20000 once", got)
	}
}

// The same in settle before mode (no answer is held: the upstream has not
// run when the payment settles), the record written by the background once
// the store is back, and the retry served by a gateway that keeps nothing
// of it in memory: the upstream runs once for the paid request, and the
// next retry is payment_already_used.
func TestSettleBeforeWriteLandedIsWrittenThenRunsOnce(t *testing.T) {
	defer func(w []time.Duration) { unrecordedWaits = w }(unrecordedWaits)
	unrecordedWaits = []time.Duration{20 * time.Millisecond}
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	base := startCaddy(t, landedSite(up.URL, "landed_blip_badger "+gateDir(t), "before"))
	url := base + "/verify/schema"
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 6)

	startLandedOutage(t)
	calls := up.calls.Load()
	wantSettledUnrecorded(t, post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig}))
	written := counterValue(t, "settled_unrecorded_written")
	landedOutage.Store(0)
	waitUnrecordedWritten(t, written)
	asIfAnotherGateway()

	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || !strings.Contains(string(b), `"payment":"paid"`) {
		t.Fatalf("the retry once the settlement is written: %d %.300s; want the paid answer", resp.StatusCode, b)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b)+resp.Header.Get(x402.HeaderPaymentRequired), x402.ReasonPaymentAlreadyUsed) {
		t.Fatalf("a second retry: %d %.200s; want payment_already_used (delivered once)", resp.StatusCode, b)
	}
	if n := up.calls.Load() - calls; n != 1 {
		t.Fatalf("the upstream ran %d time(s) for one payment, want once", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v in all, want 20000 once", got)
	}
}

// Two gateways sharing a Redis store (two sites of one Caddy): the
// settling write lands on Redis, its reply is lost and Redis stays
// unreachable past the tries. Once it is back, the gateway that settled
// writes the settlement with the answer it held, and the retry through the
// other gateway gets that answer; the upstream does not run again.
func TestSettleWriteLandedOnRedisIsServedByAnotherGateway(t *testing.T) {
	defer func(w []time.Duration) { unrecordedWaits = w }(unrecordedWaits)
	unrecordedWaits = []time.Duration{20 * time.Millisecond}
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	srv := servers.StartRedis(t)
	site := func(host string) string {
		return strings.Replace(landedSite(up.URL, "landed_blip_redis "+srv.Addr+" {\n\t\t\t\tprefix landed\n\t\t\t}", "after"), ":{port}", "http://"+host+":{port}", 1)
	}
	base := startCaddy(t, site("a.test")+site("b.test"))
	on := func(host, sig string) *http.Response { return postPaidOn(t, base+"/verify/schema", host, sig) }
	payer := evmfacilitator.DevAccounts()[6].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, on("a.test", "")), 6)

	startLandedOutage(t)
	wantSettledUnrecorded(t, on("a.test", sig))
	calls := up.calls.Load()
	written := counterValue(t, "settled_unrecorded_written")
	landedOutage.Store(0)
	waitUnrecordedWritten(t, written)

	resp := on("b.test", sig)
	b := readAll(t, resp)
	if resp.StatusCode != http.StatusOK || resp.Header.Get(x402.HeaderPaymentResponse) == "" || !strings.Contains(string(b), `"payment":"paid"`) {
		t.Fatalf("the retry through the other gateway: %d %.300s; want the paid answer", resp.StatusCode, b)
	}
	if n := up.calls.Load() - calls; n != 0 {
		t.Fatalf("the retry ran the upstream %d more time(s); the answer was held", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v in all, want 20000 once", got)
	}
}

func init() { caddy.RegisterModule(&slowReplyFacilitator{}) }

// slowReplyFacilitator is a FAKE FOR A FAULT that cannot otherwise be
// caused in a test: a facilitator whose reply comes after the attempt span
// the gate wrote on the payment's record. It settles for real on the
// devnet, moves the gate's clock past the span (as a verify_response
// verifier call or a slow facilitator would take it), tells the test
// (slowReply.sent) and waits for it (slowReply.resume) before replying.
type slowReplyFacilitator struct {
	faultyFacilitator
}

var slowReply struct {
	sent    chan struct{}
	resume  chan struct{}
	advance time.Duration
}

func (*slowReplyFacilitator) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.slow_reply_devnet", New: func() caddy.Module { return new(slowReplyFacilitator) }}
}

func (m *slowReplyFacilitator) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { d.Next(); return nil }

func (m *slowReplyFacilitator) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	sr, err := m.f.Settle(ctx, p, req)
	adv := slowReply.advance
	now = func() time.Time { return time.Now().Add(adv) }
	close(slowReply.sent)
	<-slowReply.resume
	return sr, err
}

// slowAttempt starts a paid call settled by slow_reply_devnet and returns
// once its transfer is on chain and its reply held back: the retry to make
// then, and the channel the original's status comes on once resumed.
type slowAttempt struct {
	d          *evmfacilitator.Devnet
	up         *upstream
	url, sig   string
	before     *big.Int
	calls      int64
	first      chan *http.Response
	payer      common.Address
	resumeOnce sync.Once
}

func startSlowAttempt(t *testing.T, payerIdx int) *slowAttempt {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	site := fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator slow_reply_devnet
			store badger %[2]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up.URL, "http://"), gateDir(t), payTo.Hex())
	base := startCaddy(t, site)
	a := &slowAttempt{d: d, up: up, url: base + "/verify/schema", payer: evmfacilitator.DevAccounts()[payerIdx].Address, first: make(chan *http.Response, 1)}
	a.before = balance(t, d, a.payer)
	a.sig = signFor(t, paymentRequired(t, post(t, a.url, "", nil)), payerIdx)
	slowReply.sent, slowReply.resume = make(chan struct{}), make(chan struct{})
	slowReply.advance = spanOfDefaultGate() + 5*time.Second // just past the span
	t.Cleanup(func() { a.resume(); now = time.Now })
	go func() {
		a.first <- post(t, a.url, validRequest, map[string]string{x402.HeaderPaymentSignature: a.sig})
	}()
	select {
	case <-slowReply.sent:
	case resp := <-a.first:
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("the paid call was answered before it settled: %d %.300s", resp.StatusCode, b)
	}
	a.calls = up.calls.Load()
	return a
}

func (a *slowAttempt) resume() { a.resumeOnce.Do(func() { close(slowReply.resume) }) }

// original resumes the held-back reply and returns the original request's
// answer.
func (a *slowAttempt) original() (*http.Response, string) {
	a.resume()
	resp := <-a.first
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// A live paid call that outlasts its attempt span: the transfer is on
// chain, the facilitator's reply not yet back. A retry with the same
// payment on the same gateway is told payment_in_flight, whatever the
// clock says (the claim is live in this process), and runs nothing; the
// original then delivers, once. Before, the retry found the record no
// longer "attempting", resolved it from the chain and ran the upstream
// again, and then the original delivered too: two deliveries.
func TestAttemptOutlivingItsSpanIsLeftToItsRequest(t *testing.T) {
	a := startSlowAttempt(t, 3)
	resp := post(t, a.url, validRequest, map[string]string{x402.HeaderPaymentSignature: a.sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b)+resp.Header.Get(x402.HeaderPaymentRequired), reasonPaymentInFlight) {
		t.Fatalf("a retry while the original works: %d %.200s; want payment_in_flight", resp.StatusCode, b)
	}
	orig, ob := a.original()
	if orig.StatusCode != http.StatusOK || !strings.Contains(ob, `"payment":"paid"`) {
		t.Fatalf("the original: %d %.200s; want the paid answer", orig.StatusCode, ob)
	}
	if n := a.up.calls.Load() - a.calls; n != 0 {
		t.Fatalf("one payment: the upstream ran %d more time(s) after the transfer", n)
	}
	if got := charged(t, a.d, a.payer, a.before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v", got)
	}
}

// asIfAnotherGateway is a FAKE FOR A FAULT that cannot otherwise be caused
// in one test process: the next retry is served by another gateway on the
// same shared store, which does not know the claims this one is working
// on, nor the settlements this one keeps unrecorded (unrecorded.go). It
// forgets both; a kept settlement's writer still writes it, as this
// gateway's would.
func asIfAnotherGateway() {
	liveClaims.Lock()
	clear(liveClaims.tokens)
	liveClaims.Unlock()
	unrecordedSettlements.Lock()
	clear(unrecordedSettlements.byKey)
	unrecordedSettlements.Unlock()
}

// The same, with the retry served by another gateway past the attempt span
// (a shared store, where the span is all a gateway has to go by): it
// resolves the payment from the chain and delivers. The original, whose
// reply comes after, finds its claim's record moved on (its settlement is a
// compare-and-swap from the record it wrote with the claim) and does not
// deliver a second time: payment_already_used. Before, its Settle
// overwrote the record and it delivered too.
func TestAttemptResolvedElsewhereIsNotDeliveredAgain(t *testing.T) {
	a := startSlowAttempt(t, 3)
	asIfAnotherGateway()
	resp := post(t, a.url, validRequest, map[string]string{x402.HeaderPaymentSignature: a.sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `"payment":"paid"`) {
		t.Fatalf("the retry elsewhere, past the span: %d %.200s; want the paid answer from the chain", resp.StatusCode, b)
	}
	orig, ob := a.original()
	if orig.StatusCode != http.StatusPaymentRequired || !strings.Contains(ob+orig.Header.Get(x402.HeaderPaymentRequired), x402.ReasonPaymentAlreadyUsed) {
		t.Fatalf("the original after the retry delivered: %d %.200s; want payment_already_used", orig.StatusCode, ob)
	}
	if n := a.up.calls.Load() - a.calls; n != 1 {
		t.Fatalf("one payment: the upstream ran %d time(s) after the transfer, want once", n)
	}
	if got := charged(t, a.d, a.payer, a.before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v", got)
	}
}

// The attempt span another gateway goes by counts every wait of a paid
// call's request, those past the upstream's deadline included: a
// verify_response call at its longest verifier_timeout, the EVM
// facilitator's chain reads after a failed send, the store's retries.
// Before, it counted verify, upstream and settle alone (2m30s), and a live
// request could outlast it. README gives the default (3 m 43 s).
func TestAttemptSpanCountsEveryWait(t *testing.T) {
	if got, want := spanOfDefaultGate(), 3*time.Minute+42600*time.Millisecond; got != want {
		t.Fatalf("span with the defaults %v, want %v (as README says)", got, want)
	}
	g := &Gate{UpstreamTimeout: caddy.Duration(2 * time.Minute)}
	if got, min := g.attemptSpan(), 2*defaultSettleTimeout+2*time.Minute+maxVerifierTimeout+facilitatorResolveTimeout; got <= min {
		t.Fatalf("span %v does not cover the waits it bounds (%v)", got, min)
	}
}

// The attempt span counts the verify and the settle as long as the
// facilitator lets them take (its own deadline, here facilitator http's
// timeout 90s), so another gateway does not take a settlement still
// running for abandoned. (Before: it counted the gate's fixed 30 s for
// each.)
func TestAttemptSpanCountsTheFacilitatorsOwnDeadline(t *testing.T) {
	slow := &HTTPFacilitator{f: x402.NewHTTPFacilitator(x402.HTTPFacilitatorConfig{URL: "http://127.0.0.1:1", Timeout: 90 * time.Second})}
	g := &Gate{UpstreamTimeout: caddy.Duration(defaultUpstreamTimeout), facilitator: slow}
	if got, want := g.attemptSpan()-spanOfDefaultGate(), 2*(90*time.Second-defaultSettleTimeout); got != want {
		t.Fatalf("a facilitator 60 s slower per call lengthens the span by %v, want %v", got, want)
	}
}

// The same, with the payment resolved from the chain by another gateway's
// background pass (settled, its delivery still owed) before the original's
// reply comes: the original takes that one delivery (the Swap to
// delivered, as a retry would) and answers; a retry after it is
// payment_already_used and runs nothing.
func TestAttemptResolvedInTheBackgroundIsDeliveredByItsRequest(t *testing.T) {
	old := resolveInterval
	resolveInterval = 50 * time.Millisecond
	t.Cleanup(func() { resolveInterval = old })
	resolved := counterValue(t, "unknown_resolved_settled")
	a := startSlowAttempt(t, 3)
	asIfAnotherGateway()
	for deadline := time.Now().Add(10 * time.Second); counterValue(t, "unknown_resolved_settled") == resolved; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the background pass never resolved the payment")
		}
	}
	orig, ob := a.original()
	if orig.StatusCode != http.StatusOK || !strings.Contains(ob, `"payment":"paid"`) || orig.Header.Get(x402.HeaderPaymentResponse) == "" {
		t.Fatalf("the original, its payment resolved meanwhile and not delivered: %d %.200s; want the paid answer", orig.StatusCode, ob)
	}
	resp := post(t, a.url, validRequest, map[string]string{x402.HeaderPaymentSignature: a.sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b)+resp.Header.Get(x402.HeaderPaymentRequired), x402.ReasonPaymentAlreadyUsed) {
		t.Fatalf("a retry after the original delivered: %d %.200s; want payment_already_used", resp.StatusCode, b)
	}
	if n := a.up.calls.Load() - a.calls; n != 0 {
		t.Fatalf("one payment: the upstream ran %d more time(s) after the transfer", n)
	}
	if got := charged(t, a.d, a.payer, a.before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v", got)
	}
}

// fakeKilledHTTP is a FAKE FOR A FAULT that cannot otherwise be caused in
// one test process (as killedFacilitator): a gateway killed mid-settlement,
// here with a remote `facilitator http` and no rpc. It is the real
// HTTPFacilitator (the remote devnet facilitator settles for real); after
// its /settle returns, the request's goroutine ends (runtime.Goexit), as if
// the process were killed between the facilitator's settlement and
// anything the gate does with its reply.
type fakeKilledHTTP struct {
	HTTPFacilitator
}

func init() { caddy.RegisterModule(&fakeKilledHTTP{}) }

func (*fakeKilledHTTP) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "x402.facilitators.killed_http", New: func() caddy.Module { return new(fakeKilledHTTP) }}
}

func (m *fakeKilledHTTP) Settle(ctx context.Context, p x402.PaymentPayload, req x402.PaymentRequirements) (x402.SettleResponse, error) {
	m.HTTPFacilitator.Settle(ctx, p, req)
	runtime.Goexit() // killed here: the reply never reaches the gate
	panic("unreachable")
}

// expiringSite is killSite with payments valid for maxTimeout, which
// bounds how long a held record's claim lasts, and an upstream_timeout of
// 5s.
func expiringSite(up, facilitator, storeDir, maxTimeout string) string {
	return fmt.Sprintf(`:{port} {
	route /verify/schema {
		x402 {
			accept {
				network devnet
				price $0.02
				pay_to %[3]s
				max_timeout %[5]s
			}
			upstream_timeout 5s
			facilitator %[2]s
			store badger %[4]s
			public_base_url https://gateway.test
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), facilitator, payTo.Hex(), storeDir, maxTimeout)
}

// A gateway with a remote facilitator and no rpc, killed after the remote
// settled and before its reply: the restarted gateway cannot read the
// chain, so the charged buyer's retry is answered settlement_pending for
// as long as the mark of an unresolvable payment lasts (7 days), after the
// claim lapses (validBefore plus claimGrace) too, never a 402 asking for a
// new payment. The mark is written by whoever first finds the record
// unresolvable after the restart: the retry, or the background pass before
// any retry. (Before: only the settling request wrote it, after the
// facilitator's reply; once the claim lapsed, the retry was told the
// facilitator's refusal of the spent authorization, with PAYMENT-REQUIRED.)
func TestKilledMidSettlementWithoutRPCIsNeverAskedToPayAgain(t *testing.T) {
	t.Run("found by the retry", func(t *testing.T) { testKilledMidSettlementWithoutRPC(t, false) })
	t.Run("found by the background pass", func(t *testing.T) { testKilledMidSettlementWithoutRPC(t, true) })
}

func testKilledMidSettlementWithoutRPC(t *testing.T, background bool) {
	grace := claimGrace
	claimGrace = 2 * time.Second // a minute by default: no need to wait it out
	t.Cleanup(func() { claimGrace = grace })
	if background {
		old := resolveInterval
		resolveInterval = 50 * time.Millisecond
		t.Cleanup(func() { resolveInterval = old })
	}
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := gateDir(t)
	site := func(facilitator string) string { return expiringSite(up.URL, facilitator, storeDir, "12s") }
	payerIdx := 7
	if background {
		payerIdx = 5
	}
	// The restarted gateway: the same store, the same remote, no rpc.
	p := payThenRestart(t, d, site("killed_http "+fac), payerIdx, killedMidSettlement,
		func() string { return startCaddy(t, site("http "+fac)) })
	url, sig := p.url, p.sig
	if !background {
		resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), codeSettlementPending) {
			t.Errorf("retry while the claim lasts: %d %.300s, want 503 settlement_pending", resp.StatusCode, b)
		}
	}
	// Past the claim's lifetime (validBefore = signing + 12 s, plus claimGrace).
	time.Sleep(time.Until(p.signedAt.Add(12*time.Second + claimGrace + 3*time.Second)))
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(b), codeSettlementPending) ||
		resp.Header.Get(x402.HeaderPaymentRequired) != "" {
		t.Errorf("retry of the charged payment after its claim lapsed: %d %.300s (PAYMENT-REQUIRED set: %v); want 503 settlement_pending",
			resp.StatusCode, b, resp.Header.Get(x402.HeaderPaymentRequired) != "")
	}
	if got := charged(t, d, p.payer, p.before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Errorf("charged %v in all, want 20000", got)
	}
}

// A multi whose http member has rpc for the network reads its settlements
// by configuration, whether or not the remote answers now: a payment held
// unknown (the gateway killed between the remote's settlement and its
// reply) is not marked unresolvable while the remote is briefly down, and
// its retry is served once it is back. (Before: the multi asked through
// the member it would send payments to, and a remote down at that moment
// read as "cannot read the chain": the background pass wrote the 7-day
// unresolvable mark and a Warning to configure the rpc that was
// configured.)
func TestMultiMemberWithRPCReadsSettlementsWhileItsRemoteIsDown(t *testing.T) {
	old := resolveInterval
	resolveInterval = 50 * time.Millisecond
	t.Cleanup(func() { resolveInterval = old })
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := t.TempDir() + "/gate"
	site := func(facilitator string) string { return expiringSite(up.URL, facilitator, storeDir, "30s") }
	logFile := t.TempDir() + "/caddy.log"
	var frontUp *atomic.Bool
	p := payThenRestart(t, d, site("killed_http "+fac), 3, killedMidSettlement, func() string {
		var front *httptest.Server
		front, frontUp = fakeFlakyFront(t, fac) // the remote, briefly unreachable (503)
		return startCaddyServers(t, "", logFile, site(fmt.Sprintf(`multi {
				http %s {
					rpc devnet %s
				}
			}`, front.URL, d.RPCURL())))
	})
	time.Sleep(1500 * time.Millisecond) // background passes while the remote is down
	frontUp.Store(true)
	logs, _ := os.ReadFile(logFile)
	if strings.Contains(string(logs), "cannot read it from the chain") {
		t.Errorf("with rpc devnet configured, a remote down for 1.5 s got the payment marked unresolvable: %s", logs)
	}
	var resp *http.Response
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		resp = post(t, p.url, validRequest, map[string]string{x402.HeaderPaymentSignature: p.sig})
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || time.Now().After(deadline) {
			break
		}
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the charged buyer's retry, 10 s after the remote came back: %d; want the paid answer", resp.StatusCode)
	}
	if got := charged(t, d, p.payer, p.before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Errorf("charged %v in all, want 20000", got)
	}
}
