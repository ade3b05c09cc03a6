package redisstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/aovhq/aov/internal/servers"
)

// A free call's Reserve while Redis stalls (accepts, never answers) fails
// within a bounded wait (the gateway answers 503). The script was sent and
// runs late when Redis resumes, and the undo cannot follow it (its
// connection's handshake stalls too): the client has one unit fewer, for
// one reservation lifetime after Redis answers again, and never more.
func TestAStalledReserveCostsOneUnitForOneLifetime(t *testing.T) {
	srv := servers.StartRedis(t)
	rdb := moduleClient(t, srv.Addr)
	ctx := context.Background()
	const ttl, limit = 2 * time.Second, 3
	s, err := New(ctx, rdb, Options{Prefix: "stall", ReservationTTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	al := s.Allowance()
	// Loads the script: a late EVALSHA of a script the server lacks
	// would do nothing.
	r, err := al.Reserve(ctx, "verify", "c", time.Now(), limit)
	if err != nil {
		t.Fatal(err)
	}
	if err := al.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	start := time.Now()
	_, err = al.Reserve(ctx, "verify", "c", time.Now(), limit)
	took := time.Since(start)
	if err == nil {
		t.Fatal("Reserve succeeded with Redis stalled")
	}
	if took > 5*time.Second {
		t.Errorf("Reserve with Redis stalled took %v", took)
	}
	srv.Resume()
	resumed := time.Now()
	time.Sleep(100 * time.Millisecond)
	n, rerr := al.Remaining(ctx, "verify", "c", time.Now(), limit)
	if rerr != nil || n < limit-1 {
		t.Fatalf("after Redis resumed: %d remaining, %v; at most one unit may be held", n, rerr)
	}
	t.Logf("Reserve failed after %v (%v); %d of %d remaining once Redis resumed", took, err, n, limit)
	// The late script's reservation lapses a lifetime after it ran, once
	// Redis resumed: polled for until half a lifetime more, as a loaded
	// machine may run Redis late.
	time.Sleep(time.Until(resumed.Add(ttl)))
	for deadline := resumed.Add(ttl + ttl/2); ; time.Sleep(20 * time.Millisecond) {
		n, err := al.Remaining(ctx, "verify", "c", time.Now(), limit)
		if err == nil && n == limit {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("a reservation lifetime after Redis resumed: %d remaining, %v; want %d", n, err, limit)
			break
		}
	}
}

// stallTimeout is moduleClient's timeout (the module's default).
const stallTimeout = time.Second

// moduleClient is a client on addr as the Caddy module makes it with its
// default timeouts (module.go).
func moduleClient(t *testing.T, addr string) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: stallTimeout, ReadTimeout: stallTimeout,
		WriteTimeout: stallTimeout, MaxRetries: 2, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// A gateway that has served concurrent calls keeps idle connections, and
// go-redis resends a timed-out script on the next one. With Redis stalled,
// a free call's Reserve still fails within one timeout, its resends
// included, plus the undo's 0.5 s (README: timeout + 0.5 s), not a
// timeout per connection tried. The undo, sent on an idle connection
// whose handshake is done, is on its way, and runs when Redis resumes.
// The client's timeouts are 3 s here, not the module's 1 s: one timeout
// per try would then take 9.5 s against a bound of 5.5 s, where with 1 s
// the two were 3.5 s and 1.7 s, 0.2 s of it slack for a loaded machine.
func TestAStalledReserveOnAWarmPoolTakesOneTimeout(t *testing.T) {
	srv := servers.StartRedis(t)
	const timeout = 3 * time.Second
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, DialTimeout: timeout, ReadTimeout: timeout,
		WriteTimeout: timeout, MaxRetries: 2, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	const limit = 3
	s, err := New(ctx, rdb, Options{Prefix: "stallwarm"})
	if err != nil {
		t.Fatal(err)
	}
	al := s.Allowance()
	// Eight calls at once leave eight idle connections.
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { rdb.BLPop(ctx, 200*time.Millisecond, "stallwarm:none") })
	}
	wg.Wait()
	r, err := al.Reserve(ctx, "verify", "c", time.Now(), limit) // loads the script
	if err != nil {
		t.Fatal(err)
	}
	if err := al.Release(ctx, r); err != nil {
		t.Fatal(err)
	}
	if n := rdb.PoolStats().IdleConns; n < 3 {
		t.Fatalf("%d idle connections; the test needs one per try (MaxRetries 2)", n)
	}
	srv.Pause()
	start := time.Now()
	_, err = al.Reserve(ctx, "verify", "c", time.Now(), limit)
	took := time.Since(start)
	srv.Resume()
	if err == nil {
		t.Fatal("Reserve succeeded with Redis stalled")
	}
	t.Logf("Reserve failed after %v (%v)", took, err)
	if bound := timeout + undoTimeout + 2*time.Second; took > bound {
		t.Errorf("Reserve with Redis stalled took %v; want at most timeout + undo (%v, with slack)", took, bound)
	}
	time.Sleep(100 * time.Millisecond)
	n, err := al.Remaining(ctx, "verify", "c", time.Now(), limit)
	t.Logf("%d of %d remaining once Redis resumed (%v)", n, limit, err)
	if err != nil || n < limit-1 {
		t.Errorf("after Redis resumed: %d remaining, %v; at most one unit may be held", n, err)
	}
}
