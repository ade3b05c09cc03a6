package redisstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aovhq/aov/store"
)

// README ("Clocks"): a gateway's clock may be off from Redis's without harm
// to claims: a claim lasts what the gateway asked for, measured from the
// call by the server's clock. Gateway A, 1.5 s behind the server, claims a
// payment for 2 s with a 10 s attempt span; 0.7 s later gateway B, on the
// server's time, must find A's claim and its attempt running. (Before: the
// script expired the key at A's absolute until by the server's clock, 0.5 s
// after the claim, and B claimed the payment A was still settling.)
func TestClaimHeldForItsDurationByTheServerClock(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s, err := New(ctx, rdb, Options{Prefix: "skew"})
	if err != nil {
		t.Fatal(err)
	}
	hc := s.Claims().(store.HeldClaims)
	const lag, hold, span = 1500 * time.Millisecond, 2 * time.Second, 10 * time.Second
	keys := []string{"x402/payload/abc", "x402/auth/base/usdc/0xpayer/0xnonce"}
	note := func(store.Claim) (string, error) { return "record of A's attempt", nil }
	gatewayClock(t, -lag) // A
	if _, err := hc.ClaimHeld(ctx, keys, now().Add(hold), span, note); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	now = time.Now // B
	_, err = hc.ClaimHeld(ctx, keys, now().Add(hold), span, note)
	var ce *store.ClaimedError
	if !errors.As(err, &ce) || ce.State.Attempt != store.AttemptRunning {
		t.Fatalf("gateway B 0.7 s into gateway A's 2 s claim: err=%v, want a ClaimedError with the attempt running", err)
	}
}

// Every lifetime the Redis backend writes is the one the gateway asked for,
// from the call by the server's clock, whether the gateway's clock is
// minutes behind the server's or ahead of it; only one already over by the
// gateway's clock is refused. (Before: a gateway 3 min behind could claim
// nothing, "claim expiry is not in the future", and one ahead held
// everything 3 min too long.)
func TestLifetimesAskedHeldWhateverTheGatewaysClock(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s, err := New(ctx, rdb, Options{Prefix: "skew"})
	if err != nil {
		t.Fatal(err)
	}
	c, p := s.Claims(), s.PaymentIDs()
	const life = 20 * time.Second
	ttl := func(what, key string, want time.Duration) {
		t.Helper()
		got, err := rdb.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got > want || got < want-2*time.Second {
			t.Errorf("%s: expires in %v, want %v", what, got, want)
		}
	}
	for i, skew := range []time.Duration{-3 * time.Minute, 3 * time.Minute} {
		gatewayClock(t, skew)
		k := func(name string) string { return "x402/" + name + "/" + string(rune('a'+i)) }
		cl, err := c.Claim(ctx, []string{k("claim")}, now().Add(life))
		if err != nil {
			t.Fatalf("skew %v: Claim: %v", skew, err)
		}
		ttl("Claim", s.claimPrefix+k("claim"), life)
		if err := c.Settle(ctx, cl, "settled", now().Add(2*life)); err != nil {
			t.Fatalf("skew %v: Settle: %v", skew, err)
		}
		ttl("Settle keeping it twice as long", s.claimPrefix+k("claim"), 2*life)
		if _, err := c.(store.HeldClaims).ClaimHeld(ctx, []string{k("held")}, now().Add(life), time.Second,
			func(store.Claim) (string, error) { return "note", nil }); err != nil {
			t.Fatalf("skew %v: ClaimHeld: %v", skew, err)
		}
		ttl("ClaimHeld", s.claimPrefix+k("held"), life)
		if err := c.Record(ctx, k("record"), "note", now().Add(life)); err != nil {
			t.Fatalf("skew %v: Record: %v", skew, err)
		}
		ttl("Record", s.claimPrefix+k("record"), life)
		id := "pid-" + k("")[5:]
		if _, _, err := p.Bind(ctx, id, "ff", now().Add(life)); err != nil {
			t.Fatalf("skew %v: Bind: %v", skew, err)
		}
		ttl("PaymentIDs Bind", paymentIDs{s}.key(id), life)
		if err := p.Save(ctx, id, "ff", []byte("answer"), now().Add(2*life)); err != nil {
			t.Fatalf("skew %v: Save: %v", skew, err)
		}
		ttl("PaymentIDs Save", paymentIDs{s}.key(id), 2*life)
		// Over by the gateway's clock: refused, whatever the server's says.
		if _, err := c.Claim(ctx, []string{k("late")}, now().Add(-time.Millisecond)); err == nil {
			t.Errorf("skew %v: a claim already over by the gateway's clock was taken", skew)
		}
		if err := c.Record(ctx, k("late"), "note", now().Add(-time.Millisecond)); err == nil {
			t.Errorf("skew %v: a record already over by the gateway's clock was taken", skew)
		}
		if _, _, err := p.Bind(ctx, id+"-late", "ff", now().Add(-time.Millisecond)); err == nil {
			t.Errorf("skew %v: a binding already over by the gateway's clock was taken", skew)
		}
	}
}
