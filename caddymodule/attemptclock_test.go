package caddymodule

import (
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aovhq/aov/internal/servers"
	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/x402"
)

// Two gateways on one Redis store, gateway B's clock ahead of A's (and of
// Redis's) by more than A's attempt span. A's paid call is live: its
// transfer is on chain, the facilitator's reply not yet back. B, asked for
// the same payment meanwhile, must leave A's record to A (payment_in_flight,
// nothing run): on Redis the span is judged by the server's clock, which
// every gateway shares. Before, B judged A's stamp (A's clock) by its own,
// took the record for abandoned, resolved it from the chain and ran the
// upstream again: the upstream ran twice for one payment, and the buyer's
// original request, the one that had run it first, was refused
// (payment_already_used).
//
// One process holds both gateways, so two FAKES stand in for what only two
// processes have: slow_reply_devnet moves the process's clock past the span
// once the transfer is sent (A stamped its record with the true time and
// reads no clock until its reply comes: the moved clock is B's), and
// asIfAnotherGateway makes B forget the claims A is working on.
func TestAttemptSpanIsJudgedByTheSharedStoresClock(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	srv := servers.StartRedis(t)
	site := func(host string) string {
		return fmt.Sprintf(`http://%[1]s:{port} {
	route /verify/schema {
		x402 {
			accept devnet $0.02 %[2]s
			facilitator slow_reply_devnet
			store redis %[3]s {
				prefix skew
			}
		}
		reverse_proxy %[4]s
	}
}
`, host, payTo.Hex(), srv.Addr, strings.TrimPrefix(up.URL, "http://"))
	}
	base := startCaddy(t, site("a.test")+site("b.test"))
	on := func(host, sig string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, base+"/verify/schema", strings.NewReader(validRequest))
		req.Host = host
		req.Header.Set("Content-Type", "application/json")
		if sig != "" {
			req.Header.Set(x402.HeaderPaymentSignature, sig)
		}
		resp, err := testClient.Do(req)
		if err != nil {
			t.Error(err)
			return nil
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	const payerIdx = 3
	payer := evmfacilitator.DevAccounts()[payerIdx].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, on("a.test", "")), payerIdx)

	slowReply.sent, slowReply.resume = make(chan struct{}), make(chan struct{})
	slowReply.advance = spanOfDefaultGate() + time.Minute // B's clock: past A's span
	resume := sync.OnceFunc(func() { close(slowReply.resume) })
	t.Cleanup(func() { resume(); now = time.Now })
	first := make(chan *http.Response, 1)
	go func() { first <- on("a.test", sig) }()
	select {
	case <-slowReply.sent:
	case resp := <-first:
		t.Fatalf("the paid call through A was answered before it settled: %v", resp)
	}
	calls := up.calls.Load()
	asIfAnotherGateway()

	resp := on("b.test", sig)
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPaymentRequired || !strings.Contains(string(b)+resp.Header.Get(x402.HeaderPaymentRequired), reasonPaymentInFlight) {
		t.Errorf("the same payment through B, its clock ahead, while A works on it: %d %.200s; want payment_in_flight", resp.StatusCode, b)
	}
	resume()
	orig := <-first
	ob, _ := io.ReadAll(orig.Body)
	if orig.StatusCode != http.StatusOK || !strings.Contains(string(ob), `"payment":"paid"`) {
		t.Errorf("the original through A: %d %.200s; want the paid answer", orig.StatusCode, ob)
	}
	if n := up.calls.Load() - calls; n != 0 {
		t.Errorf("one payment: the upstream ran %d more time(s) after the transfer", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Errorf("charged %v, want 20000 once", got)
	}
}
