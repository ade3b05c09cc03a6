package caddymodule

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// Gateways before the one that names a paid request by the URL the client
// sent (sentRequest) named it by what handle_path left of it. A record or
// binding such a gateway wrote, found after the upgrade, must still give
// the buyer what it paid for. These tests write them that way into the
// store, as the older gateway did.

// rewrittenName is the name an older gateway gave a request for path
// with body: the same parts, the path as handle_path left it. A request
// outside a Caddy server has no original request, so requestName names it
// by its own URL, which is what the older gateway did.
func rewrittenName(t *testing.T, method, path, body string) string {
	t.Helper()
	g := &Gate{MaxBody: 1 << 20}
	name, err := g.requestName(httptest.NewRequest(method, "http://example.com"+path, strings.NewReader(body)), g.readBody)
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// strippedPendingSite is pendingSite behind handle_path /api/*: the gate
// sees /verify/schema for the public /api/verify/schema.
func strippedPendingSite(up, mode, storeDir, extra string) string {
	return fmt.Sprintf(`:{port} {
	handle_path /api/* {
		x402 {
			accept devnet $0.02 %[3]s
			facilitator faulty_devnet %[2]s
			store badger %[4]s
			%[5]s
		}
		reverse_proxy %[1]s
	}
}
`, strings.TrimPrefix(up, "http://"), mode, payTo.Hex(), storeDir, extra)
}

// A held record whose answer was not kept (settle before, the reply lost),
// written by an older gateway naming the stripped path: after the upgrade
// the buyer's identical retry through the public URL is served, once, and
// charged once. Before, it was refused as a payment made for another
// request: charged, never served.
func TestUpgradeHeldRecordNamedByTheRewrittenPath(t *testing.T) {
	d, _ := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := filepath.Join(t.TempDir(), "gate")
	base := startCaddy(t, strippedPendingSite(up.URL, "lose_reply", storeDir, "settle before"))
	url := base + "/api/verify/schema"
	payer := evmfacilitator.DevAccounts()[7].Address
	before := balance(t, d, payer)
	sig := signFor(t, paymentRequired(t, post(t, url, "", nil)), 7)
	resp := post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if b, _ := io.ReadAll(resp.Body); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("first try: %d %s; want settlement_pending", resp.StatusCode, b)
	}
	calls := up.calls.Load()
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}

	// Name the request in the record as the older gateway did.
	db, err := store.Open(storeDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := db.Claims().Lookup(ctx, claimKeyOf(sig))
	if err != nil {
		t.Fatal(err)
	}
	h := decodeOrFail(t, st.Note)
	old := rewrittenName(t, http.MethodPost, "/verify/schema", validRequest)
	if h.Request == "" || !h.RequestBody || h.Request == old {
		t.Fatalf("the record names %q (body %v); want the public request, not %q", h.Request, h.RequestBody, old)
	}
	var note map[string]json.RawMessage
	if err := json.Unmarshal([]byte(st.Note), &note); err != nil {
		t.Fatal(err)
	}
	note["request"], _ = json.Marshal(old)
	oldNote, _ := json.Marshal(note)
	if err := db.Claims().(store.HeldClaims).Hold(ctx, h.claim(), string(oldNote)); err != nil {
		t.Fatal(err)
	}
	db.Close()

	base = startCaddy(t, strippedPendingSite(up.URL, "lose_reply", storeDir, "settle before"))
	url = base + "/api/verify/schema"
	other := strings.Replace(validRequest, "t-1", "t-other", 1)
	if resp := post(t, url, other, map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusPaymentRequired || reasonOf(t, resp) != x402.ReasonPaymentAlreadyUsed {
		t.Fatalf("retry with another body after the upgrade: status %d, want payment_already_used", resp.StatusCode)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if m := readJSON(t, resp); resp.StatusCode != http.StatusOK || m["paid_content"] != true || m["payment"] != "paid" {
		t.Fatalf("the identical retry after the upgrade: %d %v; want it served", resp.StatusCode, m)
	}
	resp = post(t, url, validRequest, map[string]string{x402.HeaderPaymentSignature: sig})
	if resp.StatusCode != http.StatusPaymentRequired || reasonOf(t, resp) != x402.ReasonPaymentAlreadyUsed {
		t.Fatalf("a second retry: status %d, want payment_already_used", resp.StatusCode)
	}
	if n := up.calls.Load() - calls; n != 1 {
		t.Fatalf("the upstream ran %d more times, want once", n)
	}
	if got := charged(t, d, payer, before); got.Cmp(big.NewInt(20000)) != 0 {
		t.Fatalf("charged %v, want one transfer", got)
	}
}

// A payment identifier binding saved by an older gateway (its fingerprint
// over the stripped path): after the upgrade the same payment's retry
// through the public URL gets the saved answer, not a conflict, and is not
// charged again.
func TestUpgradePaymentIDBoundByTheRewrittenPath(t *testing.T) {
	d, fac := sharedDevnet(t)
	up := newUpstream(t)
	storeDir := filepath.Join(t.TempDir(), "gate")
	site := func(window string) string {
		return strings.ReplaceAll(strippedSite(up.URL, fac, "payment_identifier {\n\t\t\t\twindow "+window+"\n\t\t\t}"), "{data}/gate", storeDir)
	}
	base := startCaddy(t, site("1s"))
	url := base + "/api/score/agent-1"
	pr := paymentRequired(t, getWith(t, url, "", nil))
	payer := evmfacilitator.DevAccounts()[6]
	before := balance(t, d, payer.Address)
	const id = "pay_upgrade_rewritten_0001"
	sig := signWithID(t, pr, payer.Key(), id)
	first := getWith(t, url, "", map[string]string{x402.HeaderPaymentSignature: sig})
	body := readAll(t, first)
	if first.StatusCode != http.StatusOK {
		t.Fatalf("paid call: %d %s", first.StatusCode, body)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}

	// Once the 1s binding has lapsed (the payment's claim has not), save
	// the answer again under the fingerprint the older gateway gave it.
	db, err := store.Open(storeDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := db.PaymentIDs().Lookup(ctx, id)
	if err != nil || !st.Done {
		t.Fatalf("binding: %+v %v", st, err)
	}
	g := &Gate{MaxBody: 1 << 20}
	oldFP, err := g.fingerprint(httptest.NewRequest(http.MethodGet, "http://example.com/score/agent-1", nil), sig)
	if err != nil || oldFP == st.Fingerprint {
		t.Fatalf("old fingerprint %q (%v), the binding's %q: want two", oldFP, err, st.Fingerprint)
	}
	for _, err := db.PaymentIDs().Lookup(ctx, id); err == nil; _, err = db.PaymentIDs().Lookup(ctx, id) {
		time.Sleep(100 * time.Millisecond)
	}
	if err := db.PaymentIDs().Save(ctx, id, oldFP, st.Answer, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	db.Close()

	base = startCaddy(t, site("1h"))
	if resp := getWith(t, base+"/api/score/agent-1", "", map[string]string{x402.HeaderPaymentSignature: sig}); resp.StatusCode != http.StatusOK || string(readAll(t, resp)) != string(body) {
		t.Fatalf("retry after the upgrade: status %d, want 200 with the saved answer", resp.StatusCode)
	}
	if got := new(big.Int).Sub(before, balance(t, d, payer.Address)); got.Cmp(big.NewInt(10000)) != 0 {
		t.Fatalf("payer charged %v, want one payment of 10000", got)
	}
	if up.calls.Load() != 1 {
		t.Fatalf("upstream ran %d times, want 1", up.calls.Load())
	}
}
