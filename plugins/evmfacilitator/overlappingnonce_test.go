package evmfacilitator

import (
	"context"
	"fmt"
	"math/big"
	"strconv"
	"testing"

	"github.com/ethereum/go-ethereum/crypto"

	"github.com/aovhq/aov/x402"
)

// Two authorizations of one nonce (same payer, payTo and value) whose
// validity windows overlap: A and B differ only in validBefore. Both
// verify. A settles. B never executed (the nonce is used once, by A):
// its settle, through the facilitator that settled A or another relayer's,
// is refused naming no transaction, and its status, asked with or without
// A's transaction, is never done. (Before: B was judged by A's Transfer,
// which lies in B's window too, and answered settled by A's transaction:
// one transfer answered two payments.)
func TestAuthorizationIsNotSettledByAnotherOfItsNonceWithAnOverlappingWindow(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	f := relayerOn(t, d.Client(), 0, 0)
	req := e.requirements(payee, amount)
	a := auth(payer, req)
	b := a
	vb, _ := strconv.ParseInt(a.ValidBefore, 10, 64)
	b.ValidBefore = fmt.Sprint(vb + 120) // another window, overlapping A's
	pa, pb := sign(t, payer, a, req, req), sign(t, payer, b, req, req)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, d, from)

	// Both verify while the nonce is unused (two resource servers, or two
	// calls of one buyer, each verifying before it serves and settles).
	for name, p := range map[string]x402.PaymentPayload{"A": pa, "B": pb} {
		if vr, err := f.Verify(context.Background(), p, req); err != nil || !vr.IsValid {
			t.Fatalf("verify %s = %+v, %v", name, vr, err)
		}
	}
	ra, err := f.Settle(context.Background(), pa, req)
	if err != nil || !ra.Success {
		t.Fatalf("settle A = %+v, %v", ra, err)
	}
	spent := new(big.Int).Sub(before, usdcBalance(t, d, from))
	t.Logf("payer charged %s once (amount %s), by A's %s", spent, amount, ra.Transaction)

	for _, c := range []struct {
		who string
		f   *Facilitator
	}{{"the facilitator that settled A", f}, {"another relayer's facilitator", relayerOn(t, d.Client(), 1, 0)}} {
		r, err := c.f.Settle(context.Background(), pb, req)
		if err != nil || r.Success || r.Transaction != "" {
			t.Errorf("%s: settle of B (never executed; A's %s used the nonce) = %+v, %v; want a refusal naming no transaction", c.who, ra.Transaction, r, err)
		}
		for _, sent := range []x402.SentSettlement{{}, {Transaction: ra.Transaction}} {
			st, err := c.f.SentSettlementStatus(context.Background(), pb, req, sent)
			if err != nil || st.State == x402.SettlementDone {
				t.Errorf("%s: status of B given %+v = %+v, %v; want never (B never executed: A's transfer is A's)", c.who, sent, st, err)
			}
		}
	}
}

// The same two authorizations (one nonce, overlapping windows) sent
// at once through two facilitators on different relayer keys (two
// gateways, or a gateway and a resource server): one transaction lands,
// the other reverts. Exactly one settle answers success, and the other
// does not name the winner's transaction as its own payment. (Before:
// both answered success naming the winner's.)
func TestTwoAuthorizationsOfOneNonceSettledAtOnceAnswerOneSuccess(t *testing.T) {
	d := startDevnet(t, DevnetConfig{})
	e := &testEnv{d: d}
	f0, f1 := relayerOn(t, d.Client(), 0, 0), relayerOn(t, d.Client(), 3, 0)
	req := e.requirements(payee, amount)
	a := auth(payer, req)
	b := a
	vb, _ := strconv.ParseInt(a.ValidBefore, 10, 64)
	b.ValidBefore = fmt.Sprint(vb + 120)
	pa, pb := sign(t, payer, a, req, req), sign(t, payer, b, req, req)
	from := crypto.PubkeyToAddress(payer.PublicKey)
	before := usdcBalance(t, d, from)
	type res struct {
		r   x402.SettleResponse
		err error
	}
	ca, cb := make(chan res, 1), make(chan res, 1)
	go func() { r, err := f0.Settle(context.Background(), pa, req); ca <- res{r, err} }()
	go func() { r, err := f1.Settle(context.Background(), pb, req); cb <- res{r, err} }()
	ra, rb := <-ca, <-cb
	spent := new(big.Int).Sub(before, usdcBalance(t, d, from))
	t.Logf("A: %+v, %v", ra.r, ra.err)
	t.Logf("B: %+v, %v", rb.r, rb.err)
	t.Logf("payer charged %s (amount %s)", spent, amount)
	paid := 0
	for _, r := range []res{ra, rb} {
		if r.err == nil && r.r.Success {
			paid++
		}
	}
	if paid > 1 || (ra.r.Transaction != "" && ra.r.Transaction == rb.r.Transaction) {
		t.Errorf("both authorizations answered by one transfer: A %+v, B %+v; charged %s", ra.r, rb.r, spent)
	}
}
