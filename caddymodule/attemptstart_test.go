package caddymodule

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aovhq/aov/plugins/evmfacilitator"
	"github.com/aovhq/aov/store"
	"github.com/aovhq/aov/x402"
)

// A paid call's attempt is dated from when its Settle was asked for,
// however long what follows takes: the time every record of its outcome
// keeps (holdUnknown's held record, a kept unrecorded settlement's,
// reportOutcome's read of a claim the store lost) and a read by the chain
// alone dates the attempt by. Here the claim is made at t0, Settle asked
// at t0+0.5 s, and the record of its outcome written at t0+13.6 s, as
// after recordSettled's four tries against a stalled store (`store redis {
// wait_replicas 1 wait_timeout 2s }`: 4 x 2.5 s, and settleWriteWaits'
// 2.6 s), with a settle wait of 5 s (`facilitator http { timeout 5s }`).
// The gate's clock (now) is moved rather than waited on. (Before: the
// attempt was dated now less the settle wait, 8.6 s after the claim, when
// the transfer had landed seconds before; the chain read, which takes a
// transfer landed over 5 s before the attempt for another settlement's,
// answered the gate's own duplicate_settlement: the claim released, the
// charged buyer refused 402, and verifierd told unpaid.)
func TestAttemptIsDatedFromItsSettleNotFromItsRecord(t *testing.T) {
	defer func(w time.Duration) { maxFacilitatorWait = w }(maxFacilitatorWait)
	maxFacilitatorWait = 5 * time.Second
	g, offer := directGate(t, store.Options{NoSync: true}, nil)
	t0 := time.Now()
	now = func() time.Time { return t0 }
	defer func() { now = time.Now }()
	pp, err := x402.SignExactEVM(evmfacilitator.DevKey(1), offer, &x402.Resource{URL: "http://example.com/verify/schema"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	c := claimSigned(t, g, offer, pp)
	req, claim, pay, note := c.req, c.claim, c.pay, c.note
	p := &paidCharge{g: g, claimed: t0, claim: claim, pay: pay, offer: offer, offerJS: g.liveOffers().offerJSON(0), note: note}
	asked := t0.Add(500 * time.Millisecond)
	now = func() time.Time { return asked }
	if end := p.settleOnce(httptest.NewRecorder(), req, nil); end != settleDone {
		t.Fatalf("settle: %v; want done", end)
	}
	now = func() time.Time { return t0.Add(time.Second + 4*2500*time.Millisecond + 2600*time.Millisecond) }
	if got := p.sentAfter(); !got.Equal(asked) {
		t.Errorf("the attempt is dated %s after the claim; want %s, when its Settle was asked for", got.Sub(t0), asked.Sub(t0))
	}
}
