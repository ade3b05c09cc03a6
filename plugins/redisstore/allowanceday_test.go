package redisstore

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/store"
)

// serverDay is the UTC day by the Redis server's clock.
func serverDay(t *testing.T, rdb redis.UniversalClient) string {
	t.Helper()
	tm, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UTC().Format(time.DateOnly)
}

// Two gateways on one Redis whose clocks are on either side of a UTC
// midnight the server has not reached: every call of one client counts in
// the server's day, so the two together grant per_day, not per_day each.
func TestAllowanceDayIsTheServersWhateverTheGatewaysClock(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	a, err := New(ctx, rdb, Options{Prefix: "site"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(ctx, rdb, Options{Prefix: "site"})
	if err != nil {
		t.Fatal(err)
	}
	const perDay = 3
	midnight := time.Now().UTC().Truncate(24 * time.Hour).Add(24 * time.Hour)
	gateways := []struct {
		al  store.Allowance
		now time.Time
	}{
		{a.Allowance(), midnight.Add(time.Minute)},  // a minute ahead of the next midnight
		{b.Allowance(), midnight.Add(-time.Minute)}, // a minute before it
	}
	day := serverDay(t, rdb)
	granted := 0
	var last store.Reservation
	for range 2 * perDay {
		for _, g := range gateways {
			r, err := g.al.Reserve(ctx, "verify", "203.0.113.7", g.now, perDay)
			if errors.Is(err, store.ErrExhausted) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.Day != day {
				t.Errorf("reservation counted in day %s; the server's day is %s", r.Day, day)
			}
			granted++
			last = r
		}
	}
	if granted != perDay {
		t.Fatalf("one client got %d free calls from two gateways with skewed clocks; per_day is %d", granted, perDay)
	}
	for _, g := range gateways {
		if n, err := g.al.Remaining(ctx, "verify", "203.0.113.7", g.now, perDay); err != nil || n != 0 {
			t.Errorf("Remaining by a gateway whose clock says %v: %d, %v; want 0 (the server's day is used up)", g.now, n, err)
		}
	}
	// The unit a gateway took is given back to the day it was counted in,
	// by the other gateway too.
	if err := gateways[1].al.Release(ctx, last); err != nil {
		t.Fatalf("releasing through the other gateway: %v", err)
	}
	if n, err := gateways[0].al.Remaining(ctx, "verify", "203.0.113.7", gateways[0].now, perDay); err != nil || n != 1 {
		t.Errorf("after the release: %d remaining, %v; want 1", n, err)
	}
}

// A reservation taken just before the server's midnight (planted here: the
// server's clock cannot be moved) and finished after it goes to the day it
// was counted in, named by the reservation, not to the new day.
func TestAllowanceFinishGoesToTheReservationsDay(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s, err := New(ctx, rdb, Options{Prefix: "site"})
	if err != nil {
		t.Fatal(err)
	}
	al := s.Allowance().(allowance)
	tm, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	yesterday := tm.UTC().AddDate(0, 0, -1).Format(time.DateOnly)
	const id = "00112233445566778899aabbccddeeff"
	key := al.key("verify", "c", yesterday)
	if err := rdb.ZAdd(ctx, key, redis.Z{Score: float64(tm.Add(time.Minute).UnixMilli()), Member: id}).Err(); err != nil {
		t.Fatal(err)
	}
	r := store.Reservation{Pool: "verify", Client: "c", Day: yesterday, ID: id, Limit: 1}
	if err := al.Release(ctx, r); err != nil {
		t.Fatalf("releasing yesterday's reservation: %v", err)
	}
	if n, err := rdb.ZCard(ctx, key).Result(); err != nil || n != 0 {
		t.Errorf("yesterday's record holds %d units after the release (%v); want 0", n, err)
	}
	if n, err := al.Remaining(ctx, "verify", "c", tm, 1); err != nil || n != 1 {
		t.Errorf("today: %d remaining, %v; want 1 (nothing of yesterday's counts today)", n, err)
	}
}

// scriptRuns is the number of scripts the server has run by their hash.
func scriptRuns(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "cmdstat_evalsha:calls="); ok {
			n, err := strconv.Atoi(v[:strings.IndexByte(v, ',')])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// A gateway whose clock is days off the server's names the wrong day once:
// it remembers how far the server's clock is from its own, and its next
// calls name the server's day at once, one script run each (a skew of
// hours would cost the same for those hours of every day).
func TestASkewedGatewayNamesTheServersDayAfterOneTry(t *testing.T) {
	_, rdb := standalone(t)
	ctx := context.Background()
	s, err := New(ctx, rdb, Options{Prefix: "skew"})
	if err != nil {
		t.Fatal(err)
	}
	al := s.Allowance()
	for _, skew := range []time.Duration{48 * time.Hour, -30 * time.Hour} {
		call := func() {
			t.Helper()
			day := time.Now().Add(skew)
			r, err := al.Reserve(ctx, "verify", "c", day, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if err := al.Commit(ctx, r); err != nil {
				t.Fatal(err)
			}
			if _, err := al.Remaining(ctx, "verify", "c", day, 1000); err != nil {
				t.Fatal(err)
			}
		}
		call() // loads the scripts, and learns the server's clock
		const calls = 5
		before := scriptRuns(t, rdb)
		for range calls {
			call()
		}
		runs := scriptRuns(t, rdb) - before
		// One more run is a server's midnight passing meanwhile.
		if runs > 3*calls+1 {
			t.Errorf("a gateway %v off the server: %d script runs for %d reserve, commit and remaining; want %d", skew, runs, calls, 3*calls)
		}
	}
}
